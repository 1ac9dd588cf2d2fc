// The linear algebra kernels' signatures: matmul and reduce_sum. Their
// bodies are in kernels_linalg.cc.
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/executors/builtin/catalogue.h"
#include "plexus/executors/builtin/internal/linalg_ops.h"
#include "plexus/executors/builtin/internal/registration.h"
#include "plexus/executors/builtin/internal/signature_checks.h"

namespace plexus::builtin::internal {
namespace {

// matmul(a[m, k], b[k, n]) -> [m, n]. Shardings, in logical axes: both
// replicated -> replicated; a split on m -> split(0); b split on n ->
// split(1); both split on k -> partial.
class MatmulSignature : public KernelSignature {
 public:
  absl::StatusOr<std::vector<ArgSpec>> InferOutputs(
      const std::vector<ArgSpec>& inputs, int num_shards,
      const Attrs& attrs) const override {
    if (auto s = CheckArgs(inputs, 2, num_shards); !s.ok()) return s;
    auto axes = MatmulAxes::FromAttrs(attrs);
    if (!axes.ok()) return axes.status();
    for (int i = 0; i < 2; ++i) {
      if (auto s = CheckFloat(inputs, i); !s.ok()) return s;
      if (auto s = CheckRank(inputs, i, 2); !s.ok()) return s;
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
};

// reduce_sum(x) over one axis or all of them. Reducing a split axis gives
// a partial result; a split on another axis survives, renumbered.
class ReduceSumSignature : public KernelSignature {
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
};

}  // namespace

void RegisterLinalgSignatures(KernelCatalogue& catalogue) {
  catalogue.Register(
      "matmul", std::make_unique<MatmulSignature>(),
      KernelDoc{
          "Matrix product a @ b (BLAS), either side optionally transposed.",
          {{"transpose_a", "int", "0", "1: use a's transpose ([k, m] given)"},
           {"transpose_b", "int", "0", "1: use b's transpose ([n, k] given)"}},
          "a [m, k] and b [k, n], rank 2, both float32 or both float64. "
          "Shardings: both replicated; a split on m with b replicated; a "
          "replicated with b split on n; or both split on k.",
          "c [m, n] of a's dtype: replicated, split(0), split(1) or partial "
          "(both split on k: each device holds an addend; all_reduce sums "
          "them), "
          "in the order of the input cases.",
          "a = s.put(np.ones((4, 3), np.float32), plexus.split(0))\n"
          "b = s.put(np.ones((3, 2), np.float32))\n"
          "c = s.program(\"matmul\", a, b)(a, b)\n"
          "assert c.sharding == \"split(0)\"\n"
          "assert np.asarray(c).tolist() == [[3, 3]] * 4\n"});
  catalogue.Register(
      "reduce_sum", std::make_unique<ReduceSumSignature>(),
      KernelDoc{
          "Sum over one axis, or over all of them.",
          {{"axis", "int", "-1", "the axis to sum over; -1: every axis"}},
          "One argument, float32, float64, int32 or int64, any sharding.",
          "The array without `axis` (a scalar for -1). Summing over the split "
          "axis (or all axes) of a split argument gives a partial value; a "
          "split "
          "on another axis stays, renumbered; partial stays partial.",
          "x = s.put(np.arange(4, dtype=np.float32), plexus.split(0))\n"
          "total = s.program(\"reduce_sum\", x)(x)\n"
          "assert total.sharding == \"partial\"\n"
          "assert float(np.asarray(total)) == 6.0  # fetching sums the "
          "addends\n"});
}

}  // namespace plexus::builtin::internal
