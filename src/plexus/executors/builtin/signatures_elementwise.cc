// The elementwise kernels' signatures: add, mul, relu_grad, sgd_update (two
// arguments of one spec), scale, identity, relu (one argument), and
// bias_add. Their bodies are in kernels_elementwise.cc.
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/executors/builtin/catalogue.h"
#include "plexus/executors/builtin/internal/elementwise_ops.h"
#include "plexus/executors/builtin/internal/registration.h"
#include "plexus/executors/builtin/internal/signature_checks.h"

namespace plexus::builtin::internal {
namespace {

// Two arguments with identical global specs and shardings; the output has
// their spec and sharding (see elementwise_ops.h for Op).
template <typename Op>
class BinarySignature : public KernelSignature {
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
};

// One argument; the output has its spec and sharding.
template <typename Op>
class UnarySignature : public KernelSignature {
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
};

// bias_add(x[m, n], b[n]) = x + b broadcast over rows. b is replicated; x
// is replicated or split along its rows.
class BiasAddSignature : public KernelSignature {
 public:
  absl::StatusOr<std::vector<ArgSpec>> InferOutputs(
      const std::vector<ArgSpec>& inputs, int num_shards,
      const Attrs&) const override {
    if (auto s = CheckArgs(inputs, 2, num_shards); !s.ok()) return s;
    if (auto s = CheckRank(inputs, 0, 2); !s.ok()) return s;
    if (auto s = CheckRank(inputs, 1, 1); !s.ok()) return s;
    const ArgSpec& x = inputs[0];
    const ArgSpec& b = inputs[1];
    if (!x.sharding.is_replicated() && x.sharding != Sharding::Split(0)) {
      return ArgError(0, x, "expected replicated or split(0)");
    }
    if (!b.sharding.is_replicated()) {
      return ArgError(1, b, "expected a replicated bias");
    }
    if (b.global.dtype != x.global.dtype ||
        b.global.shape[0] != x.global.shape[1]) {
      return ArgError(1, b,
                      absl::StrCat("expected ", DTypeName(x.global.dtype), "[",
                                   x.global.shape[1],
                                   "] to match the columns of argument "
                                   "0 (",
                                   x.ToString(), ")"));
    }
    return std::vector<ArgSpec>{x};
  }
};

}  // namespace

// One registration per kernel, each with its documentation written out for
// users: a table, long because the kernels are many, not because it does
// much.
void RegisterElementwiseSignatures(KernelCatalogue& catalogue) {
  catalogue.Register(
      "add", std::make_unique<BinarySignature<AddOp>>(),
      KernelDoc{
          "Elementwise sum of two arrays: a + b.",
          {},
          "Two arguments of one dtype (float32, float64, int32 or int64), "
          "shape "
          "and sharding: replicated, split(a) or partial.",
          "One array with the arguments' spec and sharding (the sum of two "
          "partial values is partial).",
          "x = s.put(np.arange(4, dtype=np.float32), plexus.split(0))\n"
          "y = s.program(\"add\", x, x)(x, x)\n"
          "assert np.asarray(y).tolist() == [0, 2, 4, 6]\n"});
  catalogue.Register(
      "mul", std::make_unique<BinarySignature<MulOp>>(),
      KernelDoc{"Elementwise product of two arrays: a * b.",
                {},
                "Two arguments of one dtype (float32, float64, int32 or "
                "int64), shape "
                "and sharding: replicated or split(a), not partial (the "
                "product is not "
                "linear in them; all_reduce first).",
                "One array with the arguments' spec and sharding.",
                "x = s.put(np.arange(4, dtype=np.int32), plexus.split(0))\n"
                "y = s.program(\"mul\", x, x)(x, x)\n"
                "assert np.asarray(y).tolist() == [0, 1, 4, 9]\n"});
  catalogue.Register(
      "relu_grad", std::make_unique<BinarySignature<ReluGradOp>>(),
      KernelDoc{"The gradient of relu: dy where x > 0, else 0.",
                {},
                "x and dy, float32 or float64, of one shape and sharding: "
                "replicated or "
                "split(a), not partial.",
                "One array with the arguments' spec and sharding.",
                "x = s.put(np.array([-1.0, 2.0], np.float32))\n"
                "dy = s.put(np.array([5.0, 7.0], np.float32))\n"
                "g = s.program(\"relu_grad\", x, dy)(x, dy)\n"
                "assert np.asarray(g).tolist() == [0, 7]\n"});
  catalogue.Register(
      "sgd_update", std::make_unique<BinarySignature<SgdUpdateOp>>(),
      KernelDoc{
          "One step of stochastic gradient descent: param - lr * grad.",
          {{"lr", "float", "", "the learning rate"}},
          "param and grad, float32 or float64, of one shape and sharding: "
          "replicated or split(a), not partial (all_reduce the gradient "
          "first).",
          "The new parameter, with param's spec and sharding.",
          "w = s.put(np.ones(2, np.float32))\n"
          "g = s.put(np.array([1.0, -2.0], np.float32))\n"
          "w2 = s.program(\"sgd_update\", w, g, lr=0.5)(w, g)\n"
          "assert np.asarray(w2).tolist() == [0.5, 2.0]\n"});
  catalogue.Register(
      "scale", std::make_unique<UnarySignature<ScaleOp>>(),
      KernelDoc{
          "Multiplies by a constant: x * factor, `repeat` times.",
          {{"factor", "float", "", "the multiplier"},
           {"repeat", "int", "1",
            "how many times to multiply (a chain of scales in one call)"}},
          "One argument, float32, float64, int32 or int64, any sharding (a "
          "partial value stays partial).",
          "One array with the argument's spec and sharding.",
          "x = s.put(np.arange(4, dtype=np.float32), plexus.split(0))\n"
          "y = s.program(\"scale\", x, factor=2.0, repeat=2)(x)\n"
          "assert np.asarray(y).tolist() == [0, 4, 8, 12]\n"});
  catalogue.Register(
      "identity", std::make_unique<UnarySignature<IdentityOp>>(),
      KernelDoc{
          "Returns its argument; the runtime hands out the input's buffer and "
          "runs nothing.",
          {},
          "One argument, float32, float64, int32 or int64, any sharding.",
          "The argument itself, same spec and sharding.",
          "x = s.put(np.arange(4, dtype=np.int64))\n"
          "y = s.program(\"identity\", x)(x)\n"
          "assert np.asarray(y).tolist() == [0, 1, 2, 3]\n"});
  catalogue.Register(
      "relu", std::make_unique<UnarySignature<ReluOp>>(),
      KernelDoc{"Elementwise max(x, 0).",
                {},
                "One argument, float32 or float64, replicated or split(a), not "
                "partial.",
                "One array with the argument's spec and sharding.",
                "x = s.put(np.array([-1.0, 0.5, -2.0, 3.0], np.float32), "
                "plexus.split(0))\n"
                "y = s.program(\"relu\", x)(x)\n"
                "assert np.asarray(y).tolist() == [0, 0.5, 0, 3]\n"});
  catalogue.Register(
      "bias_add", std::make_unique<BiasAddSignature>(),
      KernelDoc{"Adds a bias to every row: x[m, n] + b[n].",
                {},
                "x: rank 2, float32, float64, int32 or int64, replicated or "
                "split(0); "
                "b: rank 1 of x's dtype and length n, replicated.",
                "One array with x's spec and sharding.",
                "x = s.put(np.zeros((4, 2), np.float32), plexus.split(0))\n"
                "b = s.put(np.array([1.0, 2.0], np.float32))\n"
                "y = s.program(\"bias_add\", x, b)(x, b)\n"
                "assert np.asarray(y).tolist() == [[1, 2]] * 4\n"});
}

}  // namespace plexus::builtin::internal
