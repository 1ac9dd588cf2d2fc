// A program as loaded on this worker: a built-in kernel, or an XLA module
// with the executables of its islands. The op applier (op_applier.h) makes
// it from the server's LoadProgram and keeps the program table; calls
// (call_context.h) and ahead-of-time compiles hold their own references.
//
// Thread-safety: complete when the applier publishes it, and never
// modified after, except `executables`, under `xla_mu`, and the atomic
// `quick_device`.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "plexus/executors/builtin/kernel.h"
#include "plexus/executors/xla/xla_executor.h"
#include "plexus/proto/plexus.pb.h"

namespace plexus {

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
};

}  // namespace plexus
