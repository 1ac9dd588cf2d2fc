#include "plexus/executors/builtin/kernel_support.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace plexus::builtin::internal {

absl::Status FloatOnlyError(absl::string_view kernel, DType dtype) {
  return absl::InvalidArgumentError(absl::StrCat(
      kernel, " supports float32 and float64, got ", DTypeName(dtype)));
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
