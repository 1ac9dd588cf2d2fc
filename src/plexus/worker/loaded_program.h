// A program as loaded on this worker: a built-in kernel, or an XLA module
// with the executables of its islands. The op applier (op_applier.h) makes
// it from the server's LoadProgram and keeps the program table; calls
// (call_context.h) and ahead-of-time compiles hold their own references.
//
// Thread-safety: complete when the applier publishes it, and never
// modified after, except `executables` (under `xla_mu`), what its calls
// make once (under `first_use_mu`) and the atomic `quick_device`.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "plexus/executors/builtin/kernel.h"
#include "plexus/executors/xla/xla_executor.h"
#include "plexus/proto/plexus.pb.h"

namespace plexus {

// A program's outputs as one device holds them in a slice of `shards`
// devices (ArgSpec::Local of each): spec[o], or error[o] where the output
// cannot be split so (spec[o] then empty).
struct LocalOutputs {
  int shards = 0;
  std::vector<TensorSpec> spec;
  std::vector<absl::Status> error;

  // Output o's local spec, or why it has none.
  absl::StatusOr<const TensorSpec*> Of(size_t o) const {
    if (!error[o].ok()) return error[o];
    return &spec[o];
  }
};

struct LoadedProgram {
  uint64_t id = 0;  // LoadProgram.program_id
  std::string name;
  const builtin::Kernel* kernel = nullptr;
  Attrs attrs;
  std::vector<ArgSpec> inputs;
  std::vector<ArgSpec> outputs;

  // The device whose thread ran the program's last task here, done, within
  // TaskRunner::kInlineTask (an XLA program's run on the device too); -1
  // if it took longer, failed, or has not run.
  // Its next call there may run on the reader (TaskRunner::TryRunInline).
  std::atomic<int> quick_device{-1};

  std::unique_ptr<proto::XlaProgram> xla;  // set for kernel "xla"
  // The executables of `xla` by island (device indices), resolved through
  // the worker's content-addressed cache on the first call of each
  // (XlaPrograms::ExecutableFor).
  absl::Mutex xla_mu;
  absl::flat_hash_map<std::vector<int>,
                      std::shared_ptr<const xla::PjrtExecutable>>
      executables ABSL_GUARDED_BY(xla_mu);
  // What every call needs and is made once, not per call: the outputs'
  // local specs (OutputsOn); the run's name in its outputs' errors
  // ("program 'f' on worker 3"), for the worker id it was made under; the
  // executable and slice size whose compiled outputs were checked against
  // `outputs` (XlaPrograms::QueueRun). A lock of their own, held for no
  // more than a look or a swap: `xla_mu` is held through a compile, which
  // a call's op must not wait for on the ops connection's thread.
  absl::Mutex first_use_mu;
  std::shared_ptr<const LocalOutputs> local_outputs
      ABSL_GUARDED_BY(first_use_mu);
  std::shared_ptr<const std::string> run_name ABSL_GUARDED_BY(first_use_mu);
  int64_t run_name_worker ABSL_GUARDED_BY(first_use_mu) = -1;
  std::shared_ptr<const xla::PjrtExecutable> outputs_checked_for
      ABSL_GUARDED_BY(first_use_mu);
  int outputs_checked_shards ABSL_GUARDED_BY(first_use_mu) = -1;

  // The outputs' local specs in a slice of `shards` devices, made once per
  // slice size (every call of a program reads them: its outputs declared,
  // charged and checked). Never waits for a compile.
  std::shared_ptr<const LocalOutputs> OutputsOn(int shards);
};

}  // namespace plexus
