// Pieces shared by the built-in kernel files: static registration, dtype
// dispatch, and the argument checks behind InferOutputs' error messages.
// Every check's error starts with "argument <i>: " and shows the argument
// with ArgSpec::ToString, e.g. "argument 0: expected rank 2, got
// float32[8] replicated".
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "plexus/common/types.h"
#include "plexus/executors/builtin/kernel.h"

namespace plexus::builtin::internal {

// Registers a default-constructed `K` under `name`, with its documentation,
// from a static initialiser, e.g.
// `const KernelRegistrar<AddKernel> kAdd("add", {.summary = ...});`.
template <typename K>
class KernelRegistrar {
 public:
  KernelRegistrar(const char* name, KernelDoc doc) {
    KernelRegistry::Global().Register(name, std::make_unique<K>(),
                                      std::move(doc));
  }
};

// The DType of a C++ element type.
template <typename T>
constexpr DType DTypeOf();
template <>
constexpr DType DTypeOf<float>() {
  return DType::kF32;
}
template <>
constexpr DType DTypeOf<double>() {
  return DType::kF64;
}
template <>
constexpr DType DTypeOf<int32_t>() {
  return DType::kI32;
}
template <>
constexpr DType DTypeOf<int64_t>() {
  return DType::kI64;
}

// Calls `fn(T{})`, T being the element type of `dtype`, and returns its
// status. Write `fn` as a generic lambda: [&](auto zero) { using T =
// decltype(zero); ... }.
template <typename Fn>
absl::Status VisitDType(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32:
      return fn(float{});
    case DType::kF64:
      return fn(double{});
    case DType::kI32:
      return fn(int32_t{});
    case DType::kI64:
      return fn(int64_t{});
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("built-in kernels compute in float32, float64, int32 "
                       "and int64, not ",
                       DTypeName(dtype)));
  }
}

absl::Status FloatOnlyError(absl::string_view kernel, DType dtype);

// VisitDType for float32 and float64; other dtypes are an error naming the
// kernel.
template <typename Fn>
absl::Status VisitFloatDType(absl::string_view kernel, DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32:
      return fn(float{});
    case DType::kF64:
      return fn(double{});
    default:
      return FloatOnlyError(kernel, dtype);
  }
}

// --- InferOutputs checks ----------------------------------------------------

// "argument <index>: <what>, got <arg>".
absl::Status ArgError(int index, const ArgSpec& arg, absl::string_view what);

// The argument count is `expected`, num_shards is positive, and every
// argument has a local shape over num_shards devices.
absl::Status CheckArgs(const std::vector<ArgSpec>& inputs, size_t expected,
                       int num_shards);

// inputs[index]'s dtype is one of `allowed`.
absl::Status CheckDType(const std::vector<ArgSpec>& inputs, int index,
                        std::initializer_list<DType> allowed);
absl::Status CheckFloat(const std::vector<ArgSpec>& inputs, int index);

absl::Status CheckRank(const std::vector<ArgSpec>& inputs, int index,
                       size_t rank);

// inputs[index] has the same global spec and sharding as inputs[other].
absl::Status CheckSameAs(const std::vector<ArgSpec>& inputs, int index,
                         int other);

// inputs[index] is not partial. The error reads "argument <i> is partial
// (<arg>); <why>".
absl::Status CheckNotPartial(const std::vector<ArgSpec>& inputs, int index,
                             absl::string_view why);

// The local spec of an argument that passed CheckArgs.
TensorSpec LocalOf(const ArgSpec& arg, int num_shards);

// --- Run helpers ------------------------------------------------------------

// The caller passed as many input and output buffers as the kernel takes.
absl::Status CheckRunArity(const KernelContext& ctx, absl::string_view kernel,
                           size_t inputs, size_t outputs);

// The call's attributes; empty when the caller passed none.
const Attrs& AttrsOf(const KernelContext& ctx);

// Copies input 0 to output 0 (same byte size required).
absl::Status CopyInputToOutput(const KernelContext& ctx);

}  // namespace plexus::builtin::internal
