#include "plexus/executors/builtin/internal/misc_ops.h"

#include "absl/strings/str_cat.h"
#include "plexus/executors/builtin/attrs.h"

namespace plexus::builtin::internal {

absl::StatusOr<ArgSpec> CreatedArray(const Attrs& attrs, int num_shards) {
  auto shape = GetIntsAttr(attrs, "shape");
  if (!shape.ok()) return shape.status();
  for (int64_t d : *shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "attribute 'shape' has a negative dimension: ", ShapeString(*shape)));
    }
  }
  auto dtype_name = GetStringAttr(attrs, "dtype", "float32");
  if (!dtype_name.ok()) return dtype_name.status();
  auto dtype = ParseDType(*dtype_name);
  if (!dtype.ok()) return dtype.status();
  if (!IsArithmeticDType(*dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attribute 'dtype': built-in kernels compute in float32, float64, "
        "int32 and int64, not ",
        *dtype_name));
  }
  auto split_axis = GetIntAttr(attrs, "split_axis", -1);
  if (!split_axis.ok()) return split_axis.status();
  const int64_t rank = static_cast<int64_t>(shape->size());
  if (*split_axis < -1 || *split_axis >= rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attribute 'split_axis' must be -1 (replicated) or in [0, ", rank,
        ") for shape ", ShapeString(*shape), ", got ", *split_axis));
  }
  ArgSpec out{{*dtype, *shape},
              *split_axis < 0 ? Sharding::Replicated()
                              : Sharding::Split(static_cast<int>(*split_axis))};
  if (auto local = out.Local(num_shards); !local.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("output: ", local.status().message()));
  }
  return out;
}

absl::StatusOr<int64_t> WaitMicros(const Attrs& attrs) {
  auto micros = GetIntAttr(attrs, "micros");
  if (micros.ok() && *micros < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("attribute 'micros' must not be negative, got ", *micros));
  }
  return micros;
}

}  // namespace plexus::builtin::internal
