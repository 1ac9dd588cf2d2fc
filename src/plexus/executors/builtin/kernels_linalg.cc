// The linear algebra kernels' bodies: matmul (OpenBLAS gemm) and
// reduce_sum. Their signatures are in signatures_linalg.cc.
#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "plexus/executors/builtin/internal/linalg_ops.h"
#include "plexus/executors/builtin/kernel_support.h"

namespace plexus::builtin::internal {
namespace {

void Gemm(bool ta, bool tb, blasint m, blasint n, blasint k, const float* a,
          blasint lda, const float* b, blasint ldb, float* c, blasint ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
              tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, lda, b, ldb,
              0.0f, c, ldc);
}

void Gemm(bool ta, bool tb, blasint m, blasint n, blasint k, const double* a,
          blasint lda, const double* b, blasint ldb, double* c, blasint ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
              tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0, a, lda, b, ldb, 0.0,
              c, ldc);
}

// matmul(a[m, k], b[k, n]) -> [m, n] with OpenBLAS gemm.
class MatmulBody : public KernelBody {
 public:
  absl::Status Run(const KernelContext& ctx) const override {
    if (auto s = CheckRunArity(ctx, "matmul", 2, 1); !s.ok()) return s;
    auto axes = MatmulAxes::FromAttrs(AttrsOf(ctx));
    if (!axes.ok()) return axes.status();
    const TensorSpec& a = ctx.inputs[0].spec;
    const TensorSpec& b = ctx.inputs[1].spec;
    const TensorSpec& c = ctx.outputs[0].spec;
    if (a.shape.size() != 2 || b.shape.size() != 2 || a.dtype != b.dtype ||
        c.dtype != a.dtype || a.shape[axes->a_k] != b.shape[axes->b_k] ||
        c.shape != Shape{a.shape[axes->a_m], b.shape[axes->b_n]}) {
      return absl::InvalidArgumentError(
          absl::StrCat("matmul got a ", a.ToString(), ", b ", b.ToString(),
                       ", output ", c.ToString()));
    }
    const int64_t m = a.shape[axes->a_m];
    const int64_t k = a.shape[axes->a_k];
    const int64_t n = b.shape[axes->b_n];
    return VisitFloatDType("matmul", a.dtype, [&](auto zero) {
      using T = decltype(zero);
      if (k == 0) {  // An empty sum; gemm need not write C.
        std::fill_n(ctx.outputs[0].as<T>(), m * n, T{0});
        return absl::OkStatus();
      }
      if (m == 0 || n == 0) return absl::OkStatus();
      auto ld = [](int64_t cols) {
        return static_cast<blasint>(std::max<int64_t>(1, cols));
      };
      Gemm(axes->a_k == 0, axes->b_k == 1, static_cast<blasint>(m),
           static_cast<blasint>(n), static_cast<blasint>(k),
           ctx.inputs[0].as<T>(), ld(a.shape[1]), ctx.inputs[1].as<T>(),
           ld(b.shape[1]), ctx.outputs[0].as<T>(), ld(n));
      return absl::OkStatus();
    });
  }
};

// reduce_sum(x) over one axis or all of them.
class ReduceSumBody : public KernelBody {
 public:
  absl::Status Run(const KernelContext& ctx) const override {
    if (auto s = CheckRunArity(ctx, "reduce_sum", 1, 1); !s.ok()) return s;
    const TensorSpec& x = ctx.inputs[0].spec;
    auto axis = ReducedAxis(AttrsOf(ctx), x.shape.size());
    if (!axis.ok()) return axis.status();
    const TensorSpec expected{x.dtype, ReducedShape(x.shape, *axis)};
    if (ctx.outputs[0].spec != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          "reduce_sum of ", x.ToString(), " gives ", expected.ToString(),
          ", but the output is ", ctx.outputs[0].spec.ToString()));
    }
    // View x as [outer, len, inner], summing over len.
    int64_t outer = 1, len = x.num_elements(), inner = 1;
    if (*axis >= 0) {
      len = x.shape[*axis];
      for (int i = 0; i < *axis; ++i) outer *= x.shape[i];
      for (size_t i = *axis + 1; i < x.shape.size(); ++i) inner *= x.shape[i];
    }
    return VisitDType(x.dtype, [&](auto zero) {
      using T = decltype(zero);
      using Acc =
          std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
      const T* in = ctx.inputs[0].as<T>();
      T* out = ctx.outputs[0].as<T>();
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t i = 0; i < inner; ++i) {
          Acc sum = 0;
          for (int64_t l = 0; l < len; ++l) {
            sum += in[(o * len + l) * inner + i];
          }
          out[o * inner + i] = static_cast<T>(sum);
        }
      }
      return absl::OkStatus();
    });
  }
};

}  // namespace

void AddLinalgBodies(KernelBodies& bodies) {
  AddBody<MatmulBody>(bodies, "matmul");
  AddBody<ReduceSumBody>(bodies, "reduce_sum");
}

}  // namespace plexus::builtin::internal
