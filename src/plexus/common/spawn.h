// SpawnChild: the one process launcher. fork, the child's set-up
// (process group, parent-death signal, standard streams, inherited
// descriptors) and exec, written once for every launcher in Plexus
// (plexus-server's local workers, the embedded cluster's server).
//
// Between fork and exec the child calls only async-signal-safe functions
// (setpgid, prctl, getppid, dup2, execve, write, _exit): a multi-threaded
// parent's child may not allocate or take a lock. Everything it needs
// (argv, envp, descriptors) is built before the fork.
//
// The child reports a failure of its set-up or of execve over a
// close-on-exec pipe, so SpawnChild returns only once the child has exec'd
// (the pipe closes) or failed (its pid is reaped and the Status names the
// step and errno). Thread-safe: no shared state; each call forks once.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace plexus {

struct SpawnOptions {
  // argv[0] is the path executed (no $PATH search). Must not be empty.
  std::vector<std::string> argv;
  // "NAME=value" strings for execve (EnvironmentWith in common/process.h
  // builds one); none: this process's environment.
  std::optional<std::vector<std::string>> env;
  // PR_SET_PDEATHSIG(SIGKILL): the child dies when the thread that spawned
  // it exits (the whole process, or only that thread: spawn from a thread
  // that outlives the child). A parent already gone when the child starts
  // is reported as a failure.
  bool die_with_parent = true;
  // When set: stdout and stderr to this file (created or truncated, 0644),
  // stdin from /dev/null. Empty: all three inherited.
  std::string log_file;
  // The child leads a new process group (its pid), set by both the child
  // and the parent so neither can see it unset; kill(-pid) then reaches
  // whatever it starts.
  bool new_process_group = false;
  // {parent's descriptor, number in the child}: dup2'd in the child (dup2
  // clears close-on-exec on the copy), e.g. the write end of a ready pipe.
  std::vector<std::pair<int, int>> pass_fds;
};

// Forks and execs `options.argv`. Returns the child's pid once it has
// exec'd; the caller reaps it. Errors: InvalidArgument (empty argv),
// NotFound (execve: no such file), Internal otherwise, each naming the
// step that failed ("fork", "execve /path", "open log file ...").
absl::StatusOr<pid_t> SpawnChild(const SpawnOptions& options);

}  // namespace plexus
