// The elementwise kernels' bodies: add, mul, relu_grad, sgd_update (two
// arguments of one spec), scale, identity, relu (one argument), and
// bias_add. Their signatures are in signatures_elementwise.cc.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "plexus/executors/builtin/internal/elementwise_ops.h"
#include "plexus/executors/builtin/kernel_support.h"

namespace plexus::builtin::internal {
namespace {

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

// out[i] = Op::Apply(a[i], b[i], param) (elementwise_ops.h).
template <typename Op>
class BinaryBody : public KernelBody {
 public:
  absl::Status Run(const KernelContext& ctx) const override {
    if (auto s = CheckRunArity(ctx, Op::kName, 2, 1); !s.ok()) return s;
    if (auto s = CheckSpecsMatchOutput(ctx); !s.ok()) return s;
    auto param = Op::Param(AttrsOf(ctx));
    if (!param.ok()) return param.status();
    return VisitDType(ctx.outputs[0].spec.dtype, [&](auto zero) {
      using T = decltype(zero);
      if constexpr (Op::kFloatOnly && !std::is_floating_point_v<T>) {
        return FloatOnlyError(Op::kName, ctx.outputs[0].spec.dtype);
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

// out[i] = Op::Apply(x[i], param) (elementwise_ops.h).
template <typename Op>
class UnaryBody : public KernelBody {
 public:
  absl::Status Run(const KernelContext& ctx) const override {
    if (auto s = CheckRunArity(ctx, Op::kName, 1, 1); !s.ok()) return s;
    if (auto s = CheckSpecsMatchOutput(ctx); !s.ok()) return s;
    auto param = Op::Param(AttrsOf(ctx));
    if (!param.ok()) return param.status();
    return VisitDType(ctx.outputs[0].spec.dtype, [&](auto zero) {
      using T = decltype(zero);
      if constexpr (Op::kFloatOnly && !std::is_floating_point_v<T>) {
        return FloatOnlyError(Op::kName, ctx.outputs[0].spec.dtype);
      }
      const T* x = ctx.inputs[0].as<T>();
      T* out = ctx.outputs[0].as<T>();
      const int64_t n = ctx.outputs[0].spec.num_elements();
      for (int64_t i = 0; i < n; ++i) out[i] = Op::Apply(x[i], *param);
      return absl::OkStatus();
    });
  }
};

// bias_add(x[m, n], b[n]) = x + b broadcast over rows.
class BiasAddBody : public KernelBody {
 public:
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

}  // namespace

void AddElementwiseBodies(KernelBodies& bodies) {
  AddBody<BinaryBody<AddOp>>(bodies, "add");
  AddBody<BinaryBody<MulOp>>(bodies, "mul");
  AddBody<BinaryBody<ReluGradOp>>(bodies, "relu_grad");
  AddBody<BinaryBody<SgdUpdateOp>>(bodies, "sgd_update");
  AddBody<UnaryBody<ScaleOp>>(bodies, "scale");
  AddBody<UnaryBody<IdentityOp>>(bodies, "identity");
  AddBody<UnaryBody<ReluOp>>(bodies, "relu");
  AddBody<BiasAddBody>(bodies, "bias_add");
}

}  // namespace plexus::builtin::internal
