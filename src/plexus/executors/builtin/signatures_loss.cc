// The loss kernels' signatures: softmax_xent and its gradient. Their bodies
// are in kernels_loss.cc.
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/executors/builtin/catalogue.h"
#include "plexus/executors/builtin/internal/registration.h"
#include "plexus/executors/builtin/internal/signature_checks.h"

namespace plexus::builtin::internal {
namespace {

// Checks softmax_xent's arguments: logits[b, c] (float), labels[b] (int32),
// both split(0) or both replicated.
absl::Status CheckXentArgs(const std::vector<ArgSpec>& inputs, int num_shards) {
  if (auto s = CheckArgs(inputs, 2, num_shards); !s.ok()) return s;
  if (auto s = CheckFloat(inputs, 0); !s.ok()) return s;
  if (auto s = CheckRank(inputs, 0, 2); !s.ok()) return s;
  if (auto s = CheckDType(inputs, 1, {DType::kI32}); !s.ok()) {
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

// softmax_xent(logits[b, c], labels[b]) -> mean over the global batch of
// -log softmax(logits)[label]; a partial scalar when the batch is split.
class SoftmaxXentSignature : public KernelSignature {
 public:
  absl::StatusOr<std::vector<ArgSpec>> InferOutputs(
      const std::vector<ArgSpec>& inputs, int num_shards,
      const Attrs&) const override {
    if (auto s = CheckXentArgs(inputs, num_shards); !s.ok()) return s;
    const Sharding out = inputs[0].sharding.is_split() ? Sharding::Partial()
                                                       : Sharding::Replicated();
    return std::vector<ArgSpec>{{{inputs[0].global.dtype, {}}, out}};
  }
};

// softmax_xent_grad(logits, labels) -> (softmax(logits) - onehot(labels)) /
// global batch, laid out like logits.
class SoftmaxXentGradSignature : public KernelSignature {
 public:
  absl::StatusOr<std::vector<ArgSpec>> InferOutputs(
      const std::vector<ArgSpec>& inputs, int num_shards,
      const Attrs&) const override {
    if (auto s = CheckXentArgs(inputs, num_shards); !s.ok()) return s;
    return std::vector<ArgSpec>{inputs[0]};
  }
};

}  // namespace

void RegisterLossSignatures(KernelCatalogue& catalogue) {
  catalogue.Register(
      "softmax_xent", std::make_unique<SoftmaxXentSignature>(),
      KernelDoc{
          "Softmax cross-entropy: the mean over the global batch of "
          "-log softmax(logits)[label].",
          {},
          "logits [b, c], float32 or float64, and labels int32 [b]; both "
          "split(0) "
          "(a batch over the devices) or both replicated.",
          "A scalar of the logits' dtype: partial when the batch is split "
          "(each "
          "device's addend is its rows' share of the mean), else replicated.",
          "logits = s.put(np.zeros((4, 3), np.float32), plexus.split(0))\n"
          "labels = s.put(np.zeros(4, np.int32), plexus.split(0))\n"
          "loss = s.program(\"softmax_xent\", logits, labels)(logits, labels)\n"
          "assert abs(float(np.asarray(loss)) - np.log(3)) < 1e-6\n"});
  catalogue.Register(
      "softmax_xent_grad", std::make_unique<SoftmaxXentGradSignature>(),
      KernelDoc{
          "The gradient of softmax_xent with respect to the logits: "
          "(softmax(logits) - onehot(labels)) / global batch.",
          {},
          "As softmax_xent: logits [b, c] float32 or float64, labels int32 "
          "[b], "
          "both split(0) or both replicated.",
          "One array laid out like the logits (same spec and sharding).",
          "logits = s.put(np.zeros((4, 3), np.float32), plexus.split(0))\n"
          "labels = s.put(np.zeros(4, np.int32), plexus.split(0))\n"
          "g = s.program(\"softmax_xent_grad\", logits, labels)(logits, "
          "labels)\n"
          "want = (np.full((4, 3), 1 / 3) - np.eye(3)[[0, 0, 0, 0]]) / 4\n"
          "assert np.allclose(np.asarray(g), want)\n"});
}

}  // namespace plexus::builtin::internal
