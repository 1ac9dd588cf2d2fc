// Linear algebra kernels: matmul (OpenBLAS gemm) and reduce_sum.
#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "plexus/executors/builtin/kernel_support.h"

namespace plexus::builtin {
namespace {

using internal::ArgError;
using internal::CheckArgs;
using internal::CheckRunArity;
using internal::KernelRegistrar;

absl::StatusOr<bool> GetFlagAttr(const Attrs& attrs, const std::string& key) {
  auto value = GetIntAttr(attrs, key, 0);
  if (!value.ok()) return value.status();
  if (*value != 0 && *value != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("attribute '", key, "' must be 0 or 1, got ", *value));
  }
  return *value == 1;
}

// Where the logical axes of a[m, k] and b[k, n] are stored, given the
// transpose flags (a stored [k, m] when transpose_a, b stored [n, k] when
// transpose_b).
struct MatmulAxes {
  int a_m, a_k, b_k, b_n;
  static absl::StatusOr<MatmulAxes> FromAttrs(const Attrs& attrs) {
    auto ta = GetFlagAttr(attrs, "transpose_a");
    if (!ta.ok()) return ta.status();
    auto tb = GetFlagAttr(attrs, "transpose_b");
    if (!tb.ok()) return tb.status();
    return MatmulAxes{*ta ? 1 : 0, *ta ? 0 : 1, *tb ? 1 : 0, *tb ? 0 : 1};
  }
};

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

// matmul(a[m, k], b[k, n]) -> [m, n]. Shardings, in logical axes: both
// replicated -> replicated; a split on m -> split(0); b split on n ->
// split(1); both split on k -> partial.
class MatmulKernel : public Kernel {
 public:
  absl::StatusOr<std::vector<ArgSpec>> InferOutputs(
      const std::vector<ArgSpec>& inputs, int num_shards,
      const Attrs& attrs) const override {
    if (auto s = CheckArgs(inputs, 2, num_shards); !s.ok()) return s;
    auto axes = MatmulAxes::FromAttrs(attrs);
    if (!axes.ok()) return axes.status();
    for (int i = 0; i < 2; ++i) {
      if (auto s = internal::CheckFloat(inputs, i); !s.ok()) return s;
      if (auto s = internal::CheckRank(inputs, i, 2); !s.ok()) return s;
    }
    const ArgSpec& a = inputs[0];
    const ArgSpec& b = inputs[1];
    if (b.global.dtype != a.global.dtype) {
      return ArgError(1, b,
                      absl::StrCat("expected ", DTypeName(a.global.dtype),
                                   " like argument 0"));
    }
    const int64_t k = a.global.shape[axes->a_k];
    if (b.global.shape[axes->b_k] != k) {
      return ArgError(
          1, b,
          absl::StrCat("expected length ", k, " on axis ", axes->b_k,
                       " (the contraction axis) to match argument 0 (",
                       a.ToString(), ")"));
    }
    auto split_on = [](const ArgSpec& x, int axis) {
      return x.sharding == Sharding::Split(axis);
    };
    Sharding out;
    if (a.sharding.is_replicated() && b.sharding.is_replicated()) {
      out = Sharding::Replicated();
    } else if (split_on(a, axes->a_m) && b.sharding.is_replicated()) {
      out = Sharding::Split(0);
    } else if (a.sharding.is_replicated() && split_on(b, axes->b_n)) {
      out = Sharding::Split(1);
    } else if (split_on(a, axes->a_k) && split_on(b, axes->b_k)) {
      out = Sharding::Partial();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "matmul cannot combine argument 0 (", a.ToString(),
          ") with argument 1 (", b.ToString(),
          "); supported: both replicated, a split on m (axis ", axes->a_m,
          ") with b replicated, a replicated with b split on n (axis ",
          axes->b_n, "), or both split on k (axes ", axes->a_k, " and ",
          axes->b_k, ")"));
    }
    const int64_t m = a.global.shape[axes->a_m];
    const int64_t n = b.global.shape[axes->b_n];
    return std::vector<ArgSpec>{{{a.global.dtype, {m, n}}, out}};
  }

  absl::Status Run(const KernelContext& ctx) const override {
    if (auto s = CheckRunArity(ctx, "matmul", 2, 1); !s.ok()) return s;
    auto axes = MatmulAxes::FromAttrs(internal::AttrsOf(ctx));
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
    return internal::VisitFloatDType("matmul", a.dtype, [&](auto zero) {
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

// The reduced axis from attribute `axis`: -1 (the default) for all axes.
absl::StatusOr<int> ReducedAxis(const Attrs& attrs, size_t rank) {
  auto axis = GetIntAttr(attrs, "axis", -1);
  if (!axis.ok()) return axis.status();
  if (*axis < -1 || *axis >= static_cast<int64_t>(rank)) {
    return absl::InvalidArgumentError(
        absl::StrCat("attribute 'axis' must be -1 (all axes) or in [0, ", rank,
                     "), got ", *axis));
  }
  return static_cast<int>(*axis);
}

Shape ReducedShape(const Shape& shape, int axis) {
  if (axis < 0) return {};
  Shape out = shape;
  out.erase(out.begin() + axis);
  return out;
}

// reduce_sum(x) over one axis or all of them. Reducing a split axis gives
// a partial result; a split on another axis survives, renumbered.
class ReduceSumKernel : public Kernel {
 public:
  absl::StatusOr<std::vector<ArgSpec>> InferOutputs(
      const std::vector<ArgSpec>& inputs, int num_shards,
      const Attrs& attrs) const override {
    if (auto s = CheckArgs(inputs, 1, num_shards); !s.ok()) return s;
    const ArgSpec& x = inputs[0];
    auto axis = ReducedAxis(attrs, x.global.shape.size());
    if (!axis.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "argument 0 (", x.ToString(), "): ", axis.status().message()));
    }
    Sharding out = x.sharding;
    if (x.sharding.is_split()) {
      if (*axis < 0 || x.sharding.axis == *axis) {
        out = Sharding::Partial();
      } else if (x.sharding.axis > *axis) {
        out = Sharding::Split(x.sharding.axis - 1);
      }
    }
    return std::vector<ArgSpec>{
        {{x.global.dtype, ReducedShape(x.global.shape, *axis)}, out}};
  }

  absl::Status Run(const KernelContext& ctx) const override {
    if (auto s = CheckRunArity(ctx, "reduce_sum", 1, 1); !s.ok()) return s;
    const TensorSpec& x = ctx.inputs[0].spec;
    auto axis = ReducedAxis(internal::AttrsOf(ctx), x.shape.size());
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
    return internal::VisitDType(x.dtype, [&](auto zero) {
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

const KernelRegistrar<MatmulKernel> kMatmul(
    "matmul",
    {"Matrix product a @ b (BLAS), either side optionally transposed.",
     {{"transpose_a", "int", "0", "1: use a's transpose ([k, m] given)"},
      {"transpose_b", "int", "0", "1: use b's transpose ([n, k] given)"}},
     "a [m, k] and b [k, n], rank 2, both float32 or both float64. "
     "Shardings: both replicated; a split on m with b replicated; a "
     "replicated with b split on n; or both split on k.",
     "c [m, n] of a's dtype: replicated, split(0), split(1) or partial "
     "(both split on k: each device holds an addend; all_reduce sums them), "
     "in the order of the input cases.",
     "a = s.put(np.ones((4, 3), np.float32), plexus.split(0))\n"
     "b = s.put(np.ones((3, 2), np.float32))\n"
     "c = s.program(\"matmul\", a, b)(a, b)\n"
     "assert c.sharding == \"split(0)\"\n"
     "assert np.asarray(c).tolist() == [[3, 3]] * 4\n"});
const KernelRegistrar<ReduceSumKernel> kReduceSum(
    "reduce_sum",
    {"Sum over one axis, or over all of them.",
     {{"axis", "int", "-1", "the axis to sum over; -1: every axis"}},
     "One argument, float32, float64, int32 or int64, any sharding.",
     "The array without `axis` (a scalar for -1). Summing over the split "
     "axis (or all axes) of a split argument gives a partial value; a split "
     "on another axis stays, renumbered; partial stays partial.",
     "x = s.put(np.arange(4, dtype=np.float32), plexus.split(0))\n"
     "total = s.program(\"reduce_sum\", x)(x)\n"
     "assert total.sharding == \"partial\"\n"
     "assert float(np.asarray(total)) == 6.0  # fetching sums the addends\n"});

}  // namespace
}  // namespace plexus::builtin
