#include "plexus/executors/builtin/kernel_support.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace plexus::builtin::internal {

absl::Status FloatOnlyError(absl::string_view kernel, DType dtype) {
  return absl::InvalidArgumentError(absl::StrCat(
      kernel, " supports float32 and float64, got ", DTypeName(dtype)));
}

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

absl::Status CheckRunArity(const KernelContext& ctx, absl::string_view kernel,
                           size_t inputs, size_t outputs) {
  if (ctx.inputs.size() == inputs && ctx.outputs.size() == outputs) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      kernel, " takes ", inputs, " inputs and ", outputs, " outputs, got ",
      ctx.inputs.size(), " and ", ctx.outputs.size()));
}

const Attrs& AttrsOf(const KernelContext& ctx) {
  static const Attrs* const kNoAttrs = new Attrs();
  return ctx.attrs != nullptr ? *ctx.attrs : *kNoAttrs;
}

absl::Status CopyInputToOutput(const KernelContext& ctx) {
  const ConstTensor& in = ctx.inputs[0];
  const MutableTensor& out = ctx.outputs[0];
  if (in.spec.byte_size() != out.spec.byte_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("output ", out.spec.ToString(), " does not match input ",
                     in.spec.ToString()));
  }
  if (in.spec.byte_size() > 0) {
    std::memcpy(out.data, in.data, in.spec.byte_size());
  }
  return absl::OkStatus();
}

}  // namespace plexus::builtin::internal
