// Process-level helpers shared by plexus-server, plexus-worker and the
// client: the machine's identity, the open-file limit, termination signals.
#pragma once

#include <functional>
#include <string>

#include "absl/time/time.h"

namespace plexus {

// "hostname/boot-id": equal on processes that can share memory.
std::string LocalMachineId();

// The file `name` in the directory of the running executable (where
// plexus-server finds plexus-worker, and tests and benchmarks find both).
std::string SiblingBinary(const std::string& name);

// Every memfd-backed shard holds a descriptor open (so it can be sent
// again): raises RLIMIT_NOFILE's soft limit to its hard limit.
void RaiseOpenFileLimit();

// Waits (on a pidfd, without polling) until process `pid` has exited — a
// zombie counts — or `timeout` passes; true if it exited. Does not reap.
bool WaitForExit(int pid, absl::Duration timeout);

// Blocks SIGTERM and SIGINT in this thread and the threads it starts (call
// first thing in main), and ignores SIGPIPE (a dead peer is an error, not a
// death).
void BlockTerminationSignals();
// Starts a detached thread that waits for SIGTERM or SIGINT and then calls
// `on_signal` once, with the signal number.
void OnTerminationSignal(std::function<void(int)> on_signal);

}  // namespace plexus
