// Process-level helpers shared by plexus-server, plexus-worker and the
// client: the machine's identity, the open-file limit, process exits,
// termination signals.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"

namespace plexus {

// "hostname/boot-id/net:inode": equal on processes that can share memory
// over the data plane's unix socket. The boot id names the kernel; the
// network namespace is part of it because the data plane's unix socket is
// abstract, and an abstract socket is visible only inside its namespace
// (two containers, or pods on one node, share the kernel but not that).
// Workers register it; the client and other workers compare it with their
// own. The one place this identity is decided.
std::string LocalMachineId();

// The file `name` in the directory of the running executable (where
// plexus-server finds plexus-worker, and tests and benchmarks find both).
std::string SiblingBinary(const std::string& name);

// This process's environment with `name` set to `value` (replacing any
// value it had), as "NAME=value" strings for execve: how a launcher hands a
// child the cluster secret without putting it on its command line (which
// `ps` shows to every user). Build it before fork; the child only execs.
std::vector<std::string> EnvironmentWith(const std::string& name,
                                         const std::string& value);

// Every memfd-backed shard holds a descriptor open (so it can be sent
// again): raises RLIMIT_NOFILE's soft limit to its hard limit.
void RaiseOpenFileLimit();

// abseil's lock-order (deadlock) detection: kept, aborting on an inversion,
// in the checking builds (PLEXUS_CHECK_LOCK_ORDER: sanitizers,
// thread-safety, Debug); off in release builds, where it costs a graph
// lookup per lock on the hot path. Called once at start by the server, the
// worker and the client.
void UseLockOrderChecksOfThisBuild();

// Waits (on a pidfd, without polling) until process `pid` has exited — a
// zombie counts — or `timeout` passes; true if it exited. Does not reap.
bool WaitForExit(int pid, absl::Duration timeout);

// A waitpid() status in words: "exited with code 2", "was killed by signal
// 11 (SIGSEGV)".
std::string DescribeExit(int wait_status);
// True for a status that is "exited with code 0".
bool ExitedCleanly(int wait_status);

// Blocks SIGTERM and SIGINT in this thread and the threads it starts (call
// first thing in main), and ignores SIGPIPE (a dead peer is an error, not a
// death). A thread that a library started before main (OpenBLAS's pool)
// does not block them; a handler there hands the signal to the watcher
// below (one that comes before the watcher waits is kept for it).
void BlockTerminationSignals();

// A thread that waits for SIGTERM or SIGINT (blocked first, with
// BlockTerminationSignals) and calls `on_signal` with the first one's
// number; later signals are ignored. The destructor stops and joins the
// thread: `on_signal` never runs after it, so it may borrow what its owner
// destroys next. Destroy it on the thread that created it.
class TerminationSignalWatcher {
 public:
  explicit TerminationSignalWatcher(std::function<void(int)> on_signal);
  ~TerminationSignalWatcher();
  TerminationSignalWatcher(const TerminationSignalWatcher&) = delete;
  TerminationSignalWatcher& operator=(const TerminationSignalWatcher&) = delete;

 private:
  void Loop();

  const std::function<void(int)> on_signal_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace plexus
