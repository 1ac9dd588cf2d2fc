// A gRPC deadline given as a timeout from now (a relative gpr_timespec,
// GPR_TIMESPAN), which gRPC measures itself: the client's RPCs and channel
// waits read no wall clock of their own, and its deadlines stay on its
// injected Clock (ClientOptions::clock). Stateless; thread-safe.
#pragma once

#include "absl/time/time.h"
#include "grpc/support/time.h"

namespace plexus {

inline gpr_timespec GrpcTimeout(absl::Duration timeout) {
  return gpr_time_from_millis(absl::ToInt64Milliseconds(timeout), GPR_TIMESPAN);
}

}  // namespace plexus
