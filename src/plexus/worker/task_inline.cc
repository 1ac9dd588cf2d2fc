// TaskRunner::TryRunInline: a quick task runs on the reader that submits
// it, rather than waking its device's thread (task_runner.h says when).
#include <vector>

#include "absl/container/inlined_vector.h"
#include "plexus/worker/task_runner.h"

namespace plexus {

bool TaskRunner::TryRunInline(const std::shared_ptr<CallContext>& call) {
  const proto::Execute& exec = call->exec();
  LoadedProgram* program = call->program;
  // One task: the tasks of a call on several devices run side by side (an
  // island's wait for each other). No collective: it waits for its peers.
  if (program == nullptr || exec.tasks_size() != 1 ||
      call->collective != nullptr ||
      (program->kernel != nullptr &&
       program->kernel->signature().is_collective())) {
    return false;
  }
  const int device = exec.tasks(0).device();
  if (device < 0 || device >= static_cast<int>(devices_.size()) ||
      program->quick_device.load(std::memory_order_relaxed) != device) {
    return false;
  }
  // An XLA program's executable, resolved already: never a compile here.
  if (program->xla) {
    call->executable = xla_.ResolvedExecutable(*program, {device});
    if (call->executable == nullptr) return false;
  }
  // No donated input: whether its output needs memory of its own is
  // decided as it runs (TakeDonations), so room reserved ahead here (for
  // the output, MostBytes) would be counted beside the input it is written
  // over — three values' worth of a device's peak for one.
  for (const proto::InputBinding& binding : exec.tasks(0).inputs()) {
    if (binding.donate()) return false;
  }
  // Its inputs are ready (no wait for them), and stay so: what would let
  // them go comes through this reader.
  absl::InlinedVector<BufferKey, 8> inputs;
  for (const proto::InputBinding& binding : exec.tasks(0).inputs()) {
    for (const proto::Piece& piece : binding.pieces()) {
      inputs.push_back({piece.buffer_id(), piece.shard()});
    }
  }
  if (!store_.AllReady(inputs)) return false;
  // Its memory, reserved now or not at all (no wait for room).
  const int64_t bytes = MostBytes(*call);
  if (bytes > 0 && !store_.TryReserve(device, bytes)) return false;
  const bool ran = devices_[device]->RunIfIdle([&] {
    // Counted before the task publishes its outputs: whoever has seen them
    // (a client's fetch, then its status) sees it counted.
    tasks_inline_++;
    RunTask(call, 0, clock_->Now(), /*reserved_ahead=*/bytes);
  });
  if (!ran) {
    if (bytes > 0) store_.Unreserve(device, bytes);
    return false;
  }
  return true;
}

int64_t TaskRunner::MostBytes(const CallContext& call) const {
  const proto::Execute& exec = call.exec();
  int64_t bytes = 0;
  const LocalOutputs& outputs = *call.outputs;
  for (size_t o = 0; o < outputs.spec.size(); ++o) {
    if (outputs.error[o].ok()) bytes += outputs.spec[o].byte_size();
  }
  // An input may be assembled from pieces (memory of its own).
  for (const proto::InputBinding& binding : exec.tasks(0).inputs()) {
    auto local = FromProto(binding.local());
    if (local.ok()) bytes += local->byte_size();
  }
  if (call.executable != nullptr) bytes += call.executable->temp_bytes();
  return bytes;
}

}  // namespace plexus
