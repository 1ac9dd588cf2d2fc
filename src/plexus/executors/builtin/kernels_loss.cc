// Softmax cross-entropy loss and its gradient. Both average over the global
// batch, so the loss of a batch split over shards is the sum of the shards'
// partial losses.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/executors/builtin/kernel_support.h"

namespace plexus::builtin {
namespace {

using internal::ArgError;
using internal::CheckRunArity;
using internal::KernelRegistrar;

// Checks softmax_xent's arguments: logits[b, c] (float), labels[b] (int32),
// both split(0) or both replicated.
absl::Status CheckXentArgs(const std::vector<ArgSpec>& inputs, int num_shards) {
  if (auto s = internal::CheckArgs(inputs, 2, num_shards); !s.ok()) return s;
  if (auto s = internal::CheckFloat(inputs, 0); !s.ok()) return s;
  if (auto s = internal::CheckRank(inputs, 0, 2); !s.ok()) return s;
  if (auto s = internal::CheckDType(inputs, 1, {DType::kI32}); !s.ok()) {
    return s;
  }
  const ArgSpec& logits = inputs[0];
  const ArgSpec& labels = inputs[1];
  if (labels.global.shape != Shape{logits.global.shape[0]}) {
    return ArgError(1, labels,
                    absl::StrCat("expected int32[", logits.global.shape[0],
                                 "], one label per row of argument 0 (",
                                 logits.ToString(), ")"));
  }
  const bool both_split = logits.sharding == Sharding::Split(0) &&
                          labels.sharding == Sharding::Split(0);
  const bool both_replicated =
      logits.sharding.is_replicated() && labels.sharding.is_replicated();
  if (!both_split && !both_replicated) {
    return absl::InvalidArgumentError(absl::StrCat(
        "logits and labels must be both split(0) or both replicated, got "
        "argument 0 (",
        logits.ToString(), ") and argument 1 (", labels.ToString(), ")"));
  }
  return absl::OkStatus();
}

// The local rows of one shard and where they sit in the global batch.
struct LocalBatch {
  int64_t rows = 0;
  int64_t classes = 0;
  int64_t first_row = 0;  // global index of local row 0
  int64_t global_rows = 0;
};

absl::StatusOr<LocalBatch> GetLocalBatch(const KernelContext& ctx,
                                         const char* kernel,
                                         const TensorSpec& expected_output) {
  if (auto s = CheckRunArity(ctx, kernel, 2, 1); !s.ok()) return s;
  const TensorSpec& logits = ctx.inputs[0].spec;
  const TensorSpec& labels = ctx.inputs[1].spec;
  if (logits.shape.size() != 2 || labels.dtype != DType::kI32 ||
      labels.shape != Shape{logits.shape[0]} ||
      ctx.outputs[0].spec != expected_output) {
    return absl::InvalidArgumentError(absl::StrCat(
        kernel, " got logits ", logits.ToString(), ", labels ",
        labels.ToString(), ", output ", ctx.outputs[0].spec.ToString()));
  }
  LocalBatch batch;
  batch.rows = logits.shape[0];
  batch.classes = logits.shape[1];
  batch.global_rows = batch.rows;
  if (ctx.num_shards > 1) {
    if (ctx.input_shardings.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          kernel, " over ", ctx.num_shards,
          " shards needs KernelContext::input_shardings to know the global "
          "batch"));
    }
    if (ctx.input_shardings[0].is_split()) {
      batch.first_row = ctx.shard * batch.rows;
      batch.global_rows = batch.rows * ctx.num_shards;
    }
  }
  return batch;
}

// Writes softmax(row) into `probs` and returns log(sum(exp(row))).
template <typename T>
double Softmax(const T* row, int64_t classes, double* probs) {
  double max = row[0];
  for (int64_t c = 1; c < classes; ++c) max = std::max<double>(max, row[c]);
  double sum = 0;
  for (int64_t c = 0; c < classes; ++c) {
    probs[c] = std::exp(static_cast<double>(row[c]) - max);
    sum += probs[c];
  }
  for (int64_t c = 0; c < classes; ++c) probs[c] /= sum;
  return max + std::log(sum);
}

// Visits the rows of a shard: fn(row_index, logits_row, label, probs,
// log_sum_exp). Fails on the first out-of-range label.
template <typename T, typename Fn>
absl::Status ForEachRow(const KernelContext& ctx, const LocalBatch& batch,
                        Fn&& fn) {
  const T* logits = ctx.inputs[0].as<T>();
  const int32_t* labels = ctx.inputs[1].as<int32_t>();
  std::vector<double> probs(batch.classes);
  for (int64_t r = 0; r < batch.rows; ++r) {
    const int32_t label = labels[r];
    if (label < 0 || label >= batch.classes) {
      return absl::InvalidArgumentError(
          absl::StrCat("label ", label, " in row ", batch.first_row + r,
                       " is out of range for ", batch.classes, " classes"));
    }
    const T* row = logits + r * batch.classes;
    const double lse = Softmax(row, batch.classes, probs.data());
    fn(r, row, label, probs.data(), lse);
  }
  return absl::OkStatus();
}

// softmax_xent(logits[b, c], labels[b]) -> mean over the global batch of
// -log softmax(logits)[label]; a partial scalar when the batch is split.
class SoftmaxXentKernel : public Kernel {
 public:
  absl::StatusOr<std::vector<ArgSpec>> InferOutputs(
      const std::vector<ArgSpec>& inputs, int num_shards,
      const Attrs&) const override {
    if (auto s = CheckXentArgs(inputs, num_shards); !s.ok()) return s;
    const Sharding out = inputs[0].sharding.is_split() ? Sharding::Partial()
                                                       : Sharding::Replicated();
    return std::vector<ArgSpec>{{{inputs[0].global.dtype, {}}, out}};
  }

  absl::Status Run(const KernelContext& ctx) const override {
    if (ctx.inputs.empty()) return CheckRunArity(ctx, "softmax_xent", 2, 1);
    const DType dtype = ctx.inputs[0].spec.dtype;
    auto batch = GetLocalBatch(ctx, "softmax_xent", {dtype, {}});
    if (!batch.ok()) return batch.status();
    return internal::VisitFloatDType("softmax_xent", dtype, [&](auto zero) {
      using T = decltype(zero);
      double total = 0;
      auto s = ForEachRow<T>(
          ctx, *batch,
          [&](int64_t, const T* row, int32_t label, const double*, double lse) {
            total += lse - static_cast<double>(row[label]);
          });
      if (!s.ok()) return s;
      const double n =
          static_cast<double>(std::max<int64_t>(1, batch->global_rows));
      *ctx.outputs[0].as<T>() = static_cast<T>(total / n);
      return absl::OkStatus();
    });
  }
};

// softmax_xent_grad(logits, labels) -> (softmax(logits) - onehot(labels)) /
// global batch, laid out like logits.
class SoftmaxXentGradKernel : public Kernel {
 public:
  absl::StatusOr<std::vector<ArgSpec>> InferOutputs(
      const std::vector<ArgSpec>& inputs, int num_shards,
      const Attrs&) const override {
    if (auto s = CheckXentArgs(inputs, num_shards); !s.ok()) return s;
    return std::vector<ArgSpec>{inputs[0]};
  }

  absl::Status Run(const KernelContext& ctx) const override {
    if (ctx.inputs.empty()) {
      return CheckRunArity(ctx, "softmax_xent_grad", 2, 1);
    }
    const TensorSpec logits = ctx.inputs[0].spec;
    auto batch = GetLocalBatch(ctx, "softmax_xent_grad", logits);
    if (!batch.ok()) return batch.status();
    return internal::VisitFloatDType(
        "softmax_xent_grad", logits.dtype, [&](auto zero) {
          using T = decltype(zero);
          T* grad = ctx.outputs[0].as<T>();
          const double n =
              static_cast<double>(std::max<int64_t>(1, batch->global_rows));
          const int64_t classes = batch->classes;
          return ForEachRow<T>(ctx, *batch,
                               [&](int64_t r, const T*, int32_t label,
                                   const double* probs, double) {
                                 for (int64_t c = 0; c < classes; ++c) {
                                   const double onehot = c == label ? 1.0 : 0.0;
                                   grad[r * classes + c] =
                                       static_cast<T>((probs[c] - onehot) / n);
                                 }
                               });
        });
  }
};

const KernelRegistrar<SoftmaxXentKernel> kSoftmaxXent(
    "softmax_xent",
    {"Softmax cross-entropy: the mean over the global batch of "
     "-log softmax(logits)[label].",
     {},
     "logits [b, c], float32 or float64, and labels int32 [b]; both split(0) "
     "(a batch over the devices) or both replicated.",
     "A scalar of the logits' dtype: partial when the batch is split (each "
     "device's addend is its rows' share of the mean), else replicated.",
     "logits = s.put(np.zeros((4, 3), np.float32), plexus.split(0))\n"
     "labels = s.put(np.zeros(4, np.int32), plexus.split(0))\n"
     "loss = s.program(\"softmax_xent\", logits, labels)(logits, labels)\n"
     "assert abs(float(np.asarray(loss)) - np.log(3)) < 1e-6\n"});
const KernelRegistrar<SoftmaxXentGradKernel> kSoftmaxXentGrad(
    "softmax_xent_grad",
    {"The gradient of softmax_xent with respect to the logits: "
     "(softmax(logits) - onehot(labels)) / global batch.",
     {},
     "As softmax_xent: logits [b, c] float32 or float64, labels int32 [b], "
     "both split(0) or both replicated.",
     "One array laid out like the logits (same spec and sharding).",
     "logits = s.put(np.zeros((4, 3), np.float32), plexus.split(0))\n"
     "labels = s.put(np.zeros(4, np.int32), plexus.split(0))\n"
     "g = s.program(\"softmax_xent_grad\", logits, labels)(logits, "
     "labels)\n"
     "want = (np.full((4, 3), 1 / 3) - np.eye(3)[[0, 0, 0, 0]]) / 4\n"
     "assert np.allclose(np.asarray(g), want)\n"});

}  // namespace
}  // namespace plexus::builtin
