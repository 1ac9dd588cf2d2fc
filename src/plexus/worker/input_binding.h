// An argument of a shard task from its pieces (proto::InputBinding), as
// its kernel reads it: the one whole shard as it is stored, or the pieces
// of several shards assembled on the host. Used by the task runner.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/executors/builtin/kernel.h"
#include "plexus/proto/plexus.pb.h"
#include "plexus/store/object_store.h"

namespace plexus {

// Argument `binding` of a task on `device`, once its pieces are ready in
// `store` (it waits for them, each wait listed meanwhile by the store:
// ObjectStore::AwaitInput, the heartbeat's WorkerStats.awaiting_inputs):
// in host memory, or, where `in_device` is given and the argument is one
// whole shard in device memory, that shard as it is (*in_device set; the
// tensor's data is its host address, which may be null). What the tensor
// points into is appended to `keep`; memory reserved on `device` to
// assemble it is added to `reserved_bytes`. Errors are the pieces' own (an
// upstream failure, intact), or say which piece could not be copied.
// That memory is drawn first on `*reserved_ahead` (ObjectStore::Reserve),
// if given.
absl::StatusOr<builtin::ConstTensor> BindInput(
    ObjectStore& store, const proto::InputBinding& binding, int device,
    std::vector<std::shared_ptr<const Storage>>* keep, int64_t* reserved_bytes,
    const DeviceBuffer** in_device = nullptr,
    int64_t* reserved_ahead = nullptr);

}  // namespace plexus
