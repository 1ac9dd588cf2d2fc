#include "plexus/executors/builtin/internal/signature_checks.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace plexus::builtin::internal {

absl::Status ArgError(int index, const ArgSpec& arg, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("argument ", index, ": ", what, ", got ", arg.ToString()));
}

absl::Status CheckArgs(const std::vector<ArgSpec>& inputs, size_t expected,
                       int num_shards) {
  if (inputs.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected ", expected, expected == 1 ? " argument" : " arguments",
        ", got ", inputs.size()));
  }
  if (num_shards < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_shards must be at least 1, got ", num_shards));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto local = inputs[i].Local(num_shards);
    if (!local.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("argument ", i, ": ", local.status().message()));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckDType(const std::vector<ArgSpec>& inputs, int index,
                        std::initializer_list<DType> allowed) {
  for (DType dtype : allowed) {
    if (inputs[index].global.dtype == dtype) return absl::OkStatus();
  }
  std::vector<std::string> names;
  for (DType dtype : allowed) names.push_back(DTypeName(dtype));
  return ArgError(index, inputs[index],
                  absl::StrCat("expected ", absl::StrJoin(names, " or ")));
}

absl::Status CheckFloat(const std::vector<ArgSpec>& inputs, int index) {
  return CheckDType(inputs, index, {DType::kF32, DType::kF64});
}

absl::Status CheckRank(const std::vector<ArgSpec>& inputs, int index,
                       size_t rank) {
  if (inputs[index].global.shape.size() == rank) return absl::OkStatus();
  return ArgError(index, inputs[index], absl::StrCat("expected rank ", rank));
}

absl::Status CheckSameAs(const std::vector<ArgSpec>& inputs, int index,
                         int other) {
  if (inputs[index] == inputs[other]) return absl::OkStatus();
  return ArgError(index, inputs[index],
                  absl::StrCat("expected ", inputs[other].ToString(),
                               " like argument ", other));
}

absl::Status CheckNotPartial(const std::vector<ArgSpec>& inputs, int index,
                             absl::string_view why) {
  if (!inputs[index].sharding.is_partial()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("argument ", index, " is partial (",
                   inputs[index].ToString(), "); ", why));
}

TensorSpec LocalOf(const ArgSpec& arg, int num_shards) {
  auto local = arg.Local(num_shards);
  return local.ok() ? *local : arg.global;
}

}  // namespace plexus::builtin::internal
