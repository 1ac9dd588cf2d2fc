// Elementwise kernels: add, mul, relu_grad, sgd_update (two arguments of one
// spec), scale, identity, relu (one argument), and bias_add.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "plexus/executors/builtin/kernel_support.h"

namespace plexus::builtin {
namespace {

using internal::CheckArgs;
using internal::CheckFloat;
using internal::CheckNotPartial;
using internal::CheckRunArity;
using internal::CheckSameAs;
using internal::KernelRegistrar;
using internal::VisitDType;

constexpr char kNotLinear[] =
    "the kernel is not linear in it, all_reduce it first";

// Every input has output 0's local spec (guards the loops below against a
// caller that skipped InferOutputs).
absl::Status CheckSpecsMatchOutput(const KernelContext& ctx) {
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    if (ctx.inputs[i].spec != ctx.outputs[0].spec) {
      return absl::InvalidArgumentError(
          absl::StrCat("input ", i, " is ", ctx.inputs[i].spec.ToString(),
                       " but the output is ", ctx.outputs[0].spec.ToString()));
    }
  }
  return absl::OkStatus();
}

// A kernel of two arguments with identical global specs and shardings,
// computing out[i] = Op::Apply(a[i], b[i]). Op gives:
// kName, kFloatOnly, kPartialOk (the op is linear, so partial inputs give a
// partial output) with kPartialAdvice for when it is not, Param(attrs), and
// Apply(a, b, param).
template <typename Op>
class BinaryKernel : public Kernel {
 public:
  bool TakesMeshShardings() const override { return true; }
  absl::StatusOr<std::vector<ArgSpec>> InferOutputs(
      const std::vector<ArgSpec>& inputs, int num_shards,
      const Attrs& attrs) const override {
    if (auto s = CheckArgs(inputs, 2, num_shards); !s.ok()) return s;
    for (int i = 0; i < 2; ++i) {
      if constexpr (Op::kFloatOnly) {
        if (auto s = CheckFloat(inputs, i); !s.ok()) return s;
      }
      if constexpr (!Op::kPartialOk) {
        if (auto s = CheckNotPartial(inputs, i, Op::kPartialAdvice); !s.ok()) {
          return s;
        }
      }
    }
    if (auto s = CheckSameAs(inputs, 1, 0); !s.ok()) return s;
    if (auto param = Op::Param(attrs); !param.ok()) return param.status();
    return std::vector<ArgSpec>{inputs[0]};
  }

  absl::Status Run(const KernelContext& ctx) const override {
    if (auto s = CheckRunArity(ctx, Op::kName, 2, 1); !s.ok()) return s;
    if (auto s = CheckSpecsMatchOutput(ctx); !s.ok()) return s;
    auto param = Op::Param(internal::AttrsOf(ctx));
    if (!param.ok()) return param.status();
    return VisitDType(ctx.outputs[0].spec.dtype, [&](auto zero) {
      using T = decltype(zero);
      if constexpr (Op::kFloatOnly && !std::is_floating_point_v<T>) {
        return internal::FloatOnlyError(Op::kName, ctx.outputs[0].spec.dtype);
      }
      const T* a = ctx.inputs[0].as<T>();
      const T* b = ctx.inputs[1].as<T>();
      T* out = ctx.outputs[0].as<T>();
      const int64_t n = ctx.outputs[0].spec.num_elements();
      for (int64_t i = 0; i < n; ++i) out[i] = Op::Apply(a[i], b[i], *param);
      return absl::OkStatus();
    });
  }
};

absl::StatusOr<double> NoParam(const Attrs&) { return 0.0; }

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

// A kernel of one argument computing out[i] = Op::Apply(x[i], parameter);
// the output has the argument's spec and sharding.
template <typename Op>
class UnaryKernel : public Kernel {
 public:
  bool TakesMeshShardings() const override { return true; }
  absl::StatusOr<std::vector<ArgSpec>> InferOutputs(
      const std::vector<ArgSpec>& inputs, int num_shards,
      const Attrs& attrs) const override {
    if (auto s = CheckArgs(inputs, 1, num_shards); !s.ok()) return s;
    if constexpr (Op::kFloatOnly) {
      if (auto s = CheckFloat(inputs, 0); !s.ok()) return s;
    }
    if constexpr (!Op::kPartialOk) {
      if (auto s = CheckNotPartial(inputs, 0, kNotLinear); !s.ok()) return s;
    }
    if (auto param = Op::Param(attrs); !param.ok()) return param.status();
    return std::vector<ArgSpec>{inputs[0]};
  }

  int AliasedInput(int output) const override {
    return Op::kIdentity && output == 0 ? 0 : -1;
  }

  absl::Status Run(const KernelContext& ctx) const override {
    if (auto s = CheckRunArity(ctx, Op::kName, 1, 1); !s.ok()) return s;
    if (auto s = CheckSpecsMatchOutput(ctx); !s.ok()) return s;
    auto param = Op::Param(internal::AttrsOf(ctx));
    if (!param.ok()) return param.status();
    return VisitDType(ctx.outputs[0].spec.dtype, [&](auto zero) {
      using T = decltype(zero);
      if constexpr (Op::kFloatOnly && !std::is_floating_point_v<T>) {
        return internal::FloatOnlyError(Op::kName, ctx.outputs[0].spec.dtype);
      }
      const T* x = ctx.inputs[0].as<T>();
      T* out = ctx.outputs[0].as<T>();
      const int64_t n = ctx.outputs[0].spec.num_elements();
      for (int64_t i = 0; i < n; ++i) out[i] = Op::Apply(x[i], *param);
      return absl::OkStatus();
    });
  }
};

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

// bias_add(x[m, n], b[n]) = x + b broadcast over rows. b is replicated; x
// is replicated or split along its rows.
class BiasAddKernel : public Kernel {
 public:
  absl::StatusOr<std::vector<ArgSpec>> InferOutputs(
      const std::vector<ArgSpec>& inputs, int num_shards,
      const Attrs&) const override {
    if (auto s = CheckArgs(inputs, 2, num_shards); !s.ok()) return s;
    if (auto s = internal::CheckRank(inputs, 0, 2); !s.ok()) return s;
    if (auto s = internal::CheckRank(inputs, 1, 1); !s.ok()) return s;
    const ArgSpec& x = inputs[0];
    const ArgSpec& b = inputs[1];
    if (!x.sharding.is_replicated() && x.sharding != Sharding::Split(0)) {
      return internal::ArgError(0, x, "expected replicated or split(0)");
    }
    if (!b.sharding.is_replicated()) {
      return internal::ArgError(1, b, "expected a replicated bias");
    }
    if (b.global.dtype != x.global.dtype ||
        b.global.shape[0] != x.global.shape[1]) {
      return internal::ArgError(
          1, b,
          absl::StrCat("expected ", DTypeName(x.global.dtype), "[",
                       x.global.shape[1],
                       "] to match the columns of argument "
                       "0 (",
                       x.ToString(), ")"));
    }
    return std::vector<ArgSpec>{x};
  }

  absl::Status Run(const KernelContext& ctx) const override {
    if (auto s = CheckRunArity(ctx, "bias_add", 2, 1); !s.ok()) return s;
    const TensorSpec& x = ctx.inputs[0].spec;
    const TensorSpec& b = ctx.inputs[1].spec;
    if (x.shape.size() != 2 || b.shape.size() != 1 ||
        b.shape[0] != x.shape[1] || ctx.outputs[0].spec != x) {
      return absl::InvalidArgumentError(
          absl::StrCat("bias_add got x ", x.ToString(), ", b ", b.ToString(),
                       ", output ", ctx.outputs[0].spec.ToString()));
    }
    return VisitDType(x.dtype, [&](auto zero) {
      using T = decltype(zero);
      const T* xs = ctx.inputs[0].as<T>();
      const T* bs = ctx.inputs[1].as<T>();
      T* out = ctx.outputs[0].as<T>();
      const int64_t rows = x.shape[0];
      const int64_t cols = x.shape[1];
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          out[r * cols + c] = xs[r * cols + c] + bs[c];
        }
      }
      return absl::OkStatus();
    });
  }
};

const KernelRegistrar<BinaryKernel<AddOp>> kAdd(
    "add",
    {"Elementwise sum of two arrays: a + b.",
     {},
     "Two arguments of one dtype (float32, float64, int32 or int64), shape "
     "and sharding: replicated, split(a) or partial.",
     "One array with the arguments' spec and sharding (the sum of two "
     "partial values is partial).",
     "x = s.put(np.arange(4, dtype=np.float32), plexus.split(0))\n"
     "y = s.program(\"add\", x, x)(x, x)\n"
     "assert np.asarray(y).tolist() == [0, 2, 4, 6]\n"});
const KernelRegistrar<BinaryKernel<MulOp>> kMul(
    "mul",
    {"Elementwise product of two arrays: a * b.",
     {},
     "Two arguments of one dtype (float32, float64, int32 or int64), shape "
     "and sharding: replicated or split(a), not partial (the product is not "
     "linear in them; all_reduce first).",
     "One array with the arguments' spec and sharding.",
     "x = s.put(np.arange(4, dtype=np.int32), plexus.split(0))\n"
     "y = s.program(\"mul\", x, x)(x, x)\n"
     "assert np.asarray(y).tolist() == [0, 1, 4, 9]\n"});
const KernelRegistrar<BinaryKernel<ReluGradOp>> kReluGrad(
    "relu_grad",
    {"The gradient of relu: dy where x > 0, else 0.",
     {},
     "x and dy, float32 or float64, of one shape and sharding: replicated or "
     "split(a), not partial.",
     "One array with the arguments' spec and sharding.",
     "x = s.put(np.array([-1.0, 2.0], np.float32))\n"
     "dy = s.put(np.array([5.0, 7.0], np.float32))\n"
     "g = s.program(\"relu_grad\", x, dy)(x, dy)\n"
     "assert np.asarray(g).tolist() == [0, 7]\n"});
const KernelRegistrar<BinaryKernel<SgdUpdateOp>> kSgdUpdate(
    "sgd_update",
    {"One step of stochastic gradient descent: param - lr * grad.",
     {{"lr", "float", "", "the learning rate"}},
     "param and grad, float32 or float64, of one shape and sharding: "
     "replicated or split(a), not partial (all_reduce the gradient first).",
     "The new parameter, with param's spec and sharding.",
     "w = s.put(np.ones(2, np.float32))\n"
     "g = s.put(np.array([1.0, -2.0], np.float32))\n"
     "w2 = s.program(\"sgd_update\", w, g, lr=0.5)(w, g)\n"
     "assert np.asarray(w2).tolist() == [0.5, 2.0]\n"});
const KernelRegistrar<UnaryKernel<ScaleOp>> kScale(
    "scale", {"Multiplies by a constant: x * factor, `repeat` times.",
              {{"factor", "float", "", "the multiplier"},
               {"repeat", "int", "1",
                "how many times to multiply (a chain of scales in one call)"}},
              "One argument, float32, float64, int32 or int64, any sharding (a "
              "partial value stays partial).",
              "One array with the argument's spec and sharding.",
              "x = s.put(np.arange(4, dtype=np.float32), plexus.split(0))\n"
              "y = s.program(\"scale\", x, factor=2.0, repeat=2)(x)\n"
              "assert np.asarray(y).tolist() == [0, 4, 8, 12]\n"});
const KernelRegistrar<UnaryKernel<IdentityOp>> kIdentity(
    "identity",
    {"Returns its argument; the runtime hands out the input's buffer and "
     "runs nothing.",
     {},
     "One argument, float32, float64, int32 or int64, any sharding.",
     "The argument itself, same spec and sharding.",
     "x = s.put(np.arange(4, dtype=np.int64))\n"
     "y = s.program(\"identity\", x)(x)\n"
     "assert np.asarray(y).tolist() == [0, 1, 2, 3]\n"});
const KernelRegistrar<UnaryKernel<ReluOp>> kRelu(
    "relu", {"Elementwise max(x, 0).",
             {},
             "One argument, float32 or float64, replicated or split(a), not "
             "partial.",
             "One array with the argument's spec and sharding.",
             "x = s.put(np.array([-1.0, 0.5, -2.0, 3.0], np.float32), "
             "plexus.split(0))\n"
             "y = s.program(\"relu\", x)(x)\n"
             "assert np.asarray(y).tolist() == [0, 0.5, 0, 3]\n"});
const KernelRegistrar<BiasAddKernel> kBiasAdd(
    "bias_add",
    {"Adds a bias to every row: x[m, n] + b[n].",
     {},
     "x: rank 2, float32, float64, int32 or int64, replicated or split(0); "
     "b: rank 1 of x's dtype and length n, replicated.",
     "One array with x's spec and sharding.",
     "x = s.put(np.zeros((4, 2), np.float32), plexus.split(0))\n"
     "b = s.put(np.array([1.0, 2.0], np.float32))\n"
     "y = s.program(\"bias_add\", x, b)(x, b)\n"
     "assert np.asarray(y).tolist() == [[1, 2]] * 4\n"});

}  // namespace
}  // namespace plexus::builtin
