// The attribute parsing that the signatures (signatures_misc.cc) and
// bodies (kernels_misc.cc) of fill, iota, busy_wait and device_sleep
// share. Pure functions; thread-safe.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "plexus/common/types.h"

namespace plexus::builtin::internal {

// The global output of fill and iota, from attributes shape, dtype (default
// "float32") and split_axis (default -1: replicated) over `num_shards`.
absl::StatusOr<ArgSpec> CreatedArray(const Attrs& attrs, int num_shards);

// Attribute `micros` of busy_wait and device_sleep: required, not negative.
absl::StatusOr<int64_t> WaitMicros(const Attrs& attrs);

}  // namespace plexus::builtin::internal
