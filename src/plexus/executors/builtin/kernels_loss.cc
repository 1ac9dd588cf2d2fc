// The bodies of softmax cross-entropy loss and its gradient. Both average
// over the global batch, so the loss of a batch split over shards is the
// sum of the shards' partial losses. Their signatures are in
// signatures_loss.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/executors/builtin/kernel_support.h"

namespace plexus::builtin::internal {
namespace {

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

// softmax_xent: the mean over the global batch of -log
// softmax(logits)[label]; this shard's rows' share of it.
class SoftmaxXentBody : public KernelBody {
 public:
  absl::Status Run(const KernelContext& ctx) const override {
    if (ctx.inputs.empty()) return CheckRunArity(ctx, "softmax_xent", 2, 1);
    const DType dtype = ctx.inputs[0].spec.dtype;
    auto batch = GetLocalBatch(ctx, "softmax_xent", {dtype, {}});
    if (!batch.ok()) return batch.status();
    return VisitFloatDType("softmax_xent", dtype, [&](auto zero) {
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

// softmax_xent_grad: (softmax(logits) - onehot(labels)) / global batch.
class SoftmaxXentGradBody : public KernelBody {
 public:
  absl::Status Run(const KernelContext& ctx) const override {
    if (ctx.inputs.empty()) {
      return CheckRunArity(ctx, "softmax_xent_grad", 2, 1);
    }
    const TensorSpec logits = ctx.inputs[0].spec;
    auto batch = GetLocalBatch(ctx, "softmax_xent_grad", logits);
    if (!batch.ok()) return batch.status();
    return VisitFloatDType("softmax_xent_grad", logits.dtype, [&](auto zero) {
      using T = decltype(zero);
      T* grad = ctx.outputs[0].as<T>();
      const double n =
          static_cast<double>(std::max<int64_t>(1, batch->global_rows));
      const int64_t classes = batch->classes;
      return ForEachRow<T>(
          ctx, *batch,
          [&](int64_t r, const T*, int32_t label, const double* probs, double) {
            for (int64_t c = 0; c < classes; ++c) {
              const double onehot = c == label ? 1.0 : 0.0;
              grad[r * classes + c] = static_cast<T>((probs[c] - onehot) / n);
            }
          });
    });
  }
};

}  // namespace

void AddLossBodies(KernelBodies& bodies) {
  AddBody<SoftmaxXentBody>(bodies, "softmax_xent");
  AddBody<SoftmaxXentGradBody>(bodies, "softmax_xent_grad");
}

}  // namespace plexus::builtin::internal
