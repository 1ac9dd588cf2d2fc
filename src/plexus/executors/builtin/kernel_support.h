// Pieces shared by the built-in kernel bodies (kernels_*.cc): their
// registration, dtype dispatch, and the checks of the buffers a body is
// given. (The signatures' argument checks are internal/signature_checks.h.)
// Pure functions and templates; thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "plexus/common/types.h"
#include "plexus/executors/builtin/attrs.h"
#include "plexus/executors/builtin/kernel.h"

namespace plexus::builtin::internal {

// The bodies of each kernels_*.cc file, called once when
// KernelRegistry::Builtin() is first built (no static initialisers, so the
// kernels library is an ordinary archive).
void AddElementwiseBodies(KernelBodies& bodies);
void AddLinalgBodies(KernelBodies& bodies);
void AddLossBodies(KernelBodies& bodies);
void AddMiscBodies(KernelBodies& bodies);
void AddParkBodies(KernelBodies& bodies);

// Adds a default-constructed body `B` under `name`.
template <typename B>
void AddBody(KernelBodies& bodies, const char* name) {
  bodies.emplace_back(name, std::make_unique<B>());
}

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

// The caller passed as many input and output buffers as the kernel takes.
absl::Status CheckRunArity(const KernelContext& ctx, absl::string_view kernel,
                           size_t inputs, size_t outputs);

// The call's attributes; empty when the caller passed none.
const Attrs& AttrsOf(const KernelContext& ctx);

// Copies input 0 to output 0 (same byte size required).
absl::Status CopyInputToOutput(const KernelContext& ctx);

}  // namespace plexus::builtin::internal
