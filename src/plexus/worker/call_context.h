// What the shard tasks of one call on this worker share: the Execute op,
// its program, its collective or XLA island, and what its tasks have
// done so far. Made by TaskRunner::Submit on the reader thread; each task
// (TaskRunner::RunTask, on its device's thread) holds a reference.
//
// Thread-safety: the fields above `tasks_left` are set before the first
// task is queued and only read after; the rest are atomics, or (the
// collective, the island) thread-safe themselves.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "plexus/proto/plexus.pb.h"
#include "plexus/worker/collective.h"
#include "plexus/worker/loaded_program.h"
#include "plexus/worker/xla_island.h"

namespace plexus {

struct CallContext {
  // The call's Execute op: a share of the OPS frame's arena it was parsed
  // onto, or its own (KeepOp, frame_arena.h).
  std::shared_ptr<const proto::Execute> op;
  const proto::Execute& exec() const { return *op; }
  LoadedProgram* program = nullptr;
  // Keeps the program alive if it is unloaded (its client left) meanwhile.
  std::shared_ptr<LoadedProgram> program_ref;
  // The program's outputs as this call's devices hold them (set with the
  // program; LoadedProgram::OutputsOn).
  std::shared_ptr<const LocalOutputs> outputs;
  std::unique_ptr<CallCollective> collective;  // collective kernels
  std::unique_ptr<IslandExecution> island;     // XLA programs
  // The island's executable, where it was resolved before the task ran
  // (TaskRunner::TryRunInline); else null, and RunPartition resolves it.
  std::shared_ptr<const xla::PjrtExecutable> executable;
  // Per task: why it cannot run, found when it was queued (an input that
  // is not on this worker); OK otherwise.
  std::vector<absl::Status> input_errors;
  // An input was pending from another device when the call was queued (a
  // transfer, or a shard computed on another device): its tasks may not
  // pass other clients' (worker/task_queue.h).
  bool awaits_another_device = false;
  std::atomic<int> tasks_left{0};
  // Device time of its tasks here so far: reported when the last ends.
  std::atomic<int64_t> busy_micros{0};
  // Time its tasks here waited in their device's queue, summed.
  std::atomic<int64_t> queued_micros{0};
  std::atomic<bool> failed{false};  // a task of it failed here
};

}  // namespace plexus
