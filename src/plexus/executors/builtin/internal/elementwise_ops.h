// The elementwise kernels' operations, in one place for their signatures
// (signatures_elementwise.cc) and their bodies (kernels_elementwise.cc).
// An Op gives: kName; kIdentity (the output is the argument, unchanged);
// kFloatOnly; kPartialOk (the op is linear, so partial inputs give a
// partial output) with, for binary ops, kPartialAdvice for when it is not;
// Param(attrs), the parsed attributes; and Apply(a, b, param) or
// Apply(x, param), one element's result. Stateless; thread-safe.
#pragma once

#include <algorithm>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "plexus/common/types.h"
#include "plexus/executors/builtin/attrs.h"

namespace plexus::builtin::internal {

inline constexpr char kNotLinear[] =
    "the kernel is not linear in it, all_reduce it first";

inline absl::StatusOr<double> NoParam(const Attrs&) { return 0.0; }

struct AddOp {
  static constexpr char kName[] = "add";
  static constexpr bool kIdentity = false;
  static constexpr bool kFloatOnly = false;
  static constexpr bool kPartialOk = true;
  static constexpr const char* kPartialAdvice = "";
  static absl::StatusOr<double> Param(const Attrs& a) { return NoParam(a); }
  template <typename T>
  static T Apply(T a, T b, double) {
    return a + b;
  }
};

struct MulOp {
  static constexpr char kName[] = "mul";
  static constexpr bool kIdentity = false;
  static constexpr bool kFloatOnly = false;
  static constexpr bool kPartialOk = false;
  static constexpr const char* kPartialAdvice = kNotLinear;
  static absl::StatusOr<double> Param(const Attrs& a) { return NoParam(a); }
  template <typename T>
  static T Apply(T a, T b, double) {
    return a * b;
  }
};

// relu_grad(x, dy) = dy where x > 0, else 0.
struct ReluGradOp {
  static constexpr char kName[] = "relu_grad";
  static constexpr bool kIdentity = false;
  static constexpr bool kFloatOnly = true;
  static constexpr bool kPartialOk = false;
  static constexpr const char* kPartialAdvice = kNotLinear;
  static absl::StatusOr<double> Param(const Attrs& a) { return NoParam(a); }
  template <typename T>
  static T Apply(T x, T dy, double) {
    return x > T{0} ? dy : T{0};
  }
};

// sgd_update(param, grad) = param - lr * grad.
struct SgdUpdateOp {
  static constexpr char kName[] = "sgd_update";
  static constexpr bool kIdentity = false;
  static constexpr bool kFloatOnly = true;
  static constexpr bool kPartialOk = false;
  static constexpr const char* kPartialAdvice =
      "sgd_update needs whole values, all_reduce it first";
  static absl::StatusOr<double> Param(const Attrs& a) {
    return GetFloatAttr(a, "lr");
  }
  template <typename T>
  static T Apply(T param, T grad, double lr) {
    return static_cast<T>(param - static_cast<T>(lr) * grad);
  }
};

// Ops of one argument.

// scale: x * factor, applied `repeat` times (default 1). repeat > 1 is the
// "fused" form of a chain of scales: the same multiplications, one call.
struct ScaleOp {
  static constexpr char kName[] = "scale";
  static constexpr bool kIdentity = false;
  static constexpr bool kFloatOnly = false;
  static constexpr bool kPartialOk = true;
  struct Scaling {
    double factor;
    int64_t repeat;
  };
  static absl::StatusOr<Scaling> Param(const Attrs& a) {
    auto factor = GetFloatAttr(a, "factor");
    if (!factor.ok()) return factor.status();
    auto repeat = GetIntAttr(a, "repeat", 1);
    if (!repeat.ok()) return repeat.status();
    if (*repeat < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("attribute 'repeat' must be at least 1, got ", *repeat));
    }
    return Scaling{*factor, *repeat};
  }
  template <typename T>
  static T Apply(T x, const Scaling& p) {
    for (int64_t r = 0; r < p.repeat; ++r) {
      x = static_cast<T>(static_cast<double>(x) * p.factor);
    }
    return x;
  }
};

struct IdentityOp {
  static constexpr char kName[] = "identity";
  static constexpr bool kIdentity = true;
  static constexpr bool kFloatOnly = false;
  static constexpr bool kPartialOk = true;
  static absl::StatusOr<double> Param(const Attrs& a) { return NoParam(a); }
  template <typename T>
  static T Apply(T x, double) {
    return x;
  }
};

struct ReluOp {
  static constexpr char kName[] = "relu";
  static constexpr bool kIdentity = false;
  static constexpr bool kFloatOnly = true;
  static constexpr bool kPartialOk = false;
  static absl::StatusOr<double> Param(const Attrs& a) { return NoParam(a); }
  template <typename T>
  static T Apply(T x, double) {
    return std::max(x, T{0});
  }
};

}  // namespace plexus::builtin::internal
