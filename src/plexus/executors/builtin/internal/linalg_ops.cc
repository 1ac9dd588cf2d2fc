#include "plexus/executors/builtin/internal/linalg_ops.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "plexus/executors/builtin/attrs.h"

namespace plexus::builtin::internal {
namespace {

absl::StatusOr<bool> GetFlagAttr(const Attrs& attrs, const std::string& key) {
  auto value = GetIntAttr(attrs, key, 0);
  if (!value.ok()) return value.status();
  if (*value != 0 && *value != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("attribute '", key, "' must be 0 or 1, got ", *value));
  }
  return *value == 1;
}

}  // namespace

absl::StatusOr<MatmulAxes> MatmulAxes::FromAttrs(const Attrs& attrs) {
  auto ta = GetFlagAttr(attrs, "transpose_a");
  if (!ta.ok()) return ta.status();
  auto tb = GetFlagAttr(attrs, "transpose_b");
  if (!tb.ok()) return tb.status();
  return MatmulAxes{*ta ? 1 : 0, *ta ? 0 : 1, *tb ? 1 : 0, *tb ? 0 : 1};
}

absl::StatusOr<int> ReducedAxis(const Attrs& attrs, size_t rank) {
  auto axis = GetIntAttr(attrs, "axis", -1);
  if (!axis.ok()) return axis.status();
  if (*axis < -1 || *axis >= static_cast<int64_t>(rank)) {
    return absl::InvalidArgumentError(
        absl::StrCat("attribute 'axis' must be -1 (all axes) or in [0, ", rank,
                     "), got ", *axis));
  }
  return static_cast<int>(*axis);
}

Shape ReducedShape(const Shape& shape, int axis) {
  if (axis < 0) return {};
  Shape out = shape;
  out.erase(out.begin() + axis);
  return out;
}

}  // namespace plexus::builtin::internal
