// LocalWorkers: the embedded cluster's worker processes, started by the
// server on this machine. Each child dies with the server (PR_SET_PDEATHSIG)
// and is stopped and reaped by Stop() or the destructor, so an embedded
// cluster never leaves a process behind. Stop() says which workers did not
// exit cleanly (a crash at shutdown must not pass unnoticed). Each child
// gets the cluster secret in its environment ($PLEXUS_CLUSTER_SECRET), never
// on its command line (which `ps` shows to everyone).
//
// Spares (`spares`): workers started with --spare, which the server keeps
// for remapping a lost host's devices. In a cluster with spares, a worker
// that exits while the cluster runs (killed, crashed) is replaced by a new
// spare, so a killed host's slot comes back as capacity for the next loss;
// its exit is logged, as an event the cluster recovered from, not reported
// by Stop() (nor is one killed by SIGKILL from outside just before Stop(),
// which the supervisor had no time to reap). Restarts are rate limited
// (RestartRateLimit: at most `restarts_per_window` in any `restart_window`),
// which guards against a crash loop without capping a long run: a restart over
// the limit is deferred, logged as such, and made as soon as the window allows.
// Start and Stop from one thread; the supervisor thread restarts workers in
// between.
#pragma once

#include <sys/types.h>

#include <deque>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "plexus/common/clock.h"
#include "plexus/common/credentials.h"

namespace plexus {

// At most `max` events in any sliding `window`: the crash-loop guard of
// LocalWorkers' restarts. Plain data driven by the caller's clock (tested
// with absl::Time values, no waiting). Not thread-safe.
class RestartRateLimit {
 public:
  RestartRateLimit(int max, absl::Duration window)
      : max_(max), window_(window) {}
  // True, and the event counted, when fewer than `max` were admitted in
  // (now - window, now]; false, and nothing counted, otherwise.
  bool Admit(absl::Time now);
  // The first time at or after `now` at which Admit would be true.
  absl::Time NextAdmission(absl::Time now) const;
  // Events admitted in (now - window, now].
  int InWindow(absl::Time now) const;
  int max() const { return max_; }
  absl::Duration window() const { return window_; }

 private:
  void Expire(absl::Time now) const;
  const int max_;
  const absl::Duration window_;
  mutable std::deque<absl::Time> admitted_;  // oldest first, within window
};

struct LocalWorkersOptions {
  std::string worker_binary;  // path to plexus-worker
  std::string server_address;
  int hosts = 0;
  int spares = 0;  // more workers, started with --spare
  int devices_per_host = 1;
  double device_memory_mib = 1024;
  bool shared_memory = true;
  std::string log_level = "info";
  // The crash-loop guard: at most this many workers replaced in any
  // sliding window; one more waits until the window allows it.
  int restarts_per_window = 30;
  absl::Duration restart_window = absl::Minutes(1);
  // Handed to every worker; Start() refuses to start workers without it.
  std::optional<ClusterSecret> secret;
  // What the rate limit and Stop()'s grace period read the time from (not
  // owned). The waits themselves are on descriptors (poll on pidfds), so a
  // FakeClock decides what the limit admits, not how long a poll sleeps.
  Clock* clock = Clock::Real();
};

class LocalWorkers {
 public:
  // How long Stop() waits for the workers after SIGTERM (below the 20 s
  // the Python LocalCluster waits for the server).
  static constexpr absl::Duration kStopGrace = absl::Seconds(12);

  explicit LocalWorkers(LocalWorkersOptions options)
      : options_(std::move(options)),
        restart_limit_(options_.restarts_per_window, options_.restart_window) {}
  ~LocalWorkers() { Stop().IgnoreError(); }
  // Starts hosts + spares workers and the supervisor.
  absl::Status Start();
  // SIGTERM, then SIGKILL for any still alive after a grace period; reaps.
  // An error names every worker that did not exit with code 0 (a crash, a
  // signal, or one killed for outliving the grace period), one per line.
  absl::Status Stop();
  // The workers' pids now (hosts, then spares, then restarted spares in
  // the place of the ones they replace). A worker whose replacement the
  // rate limit defers has no pid here until it is made.
  std::vector<pid_t> pids() const;
  // Workers replaced so far, and replacements waiting for the rate limit.
  int restarts() const;
  int deferred_restarts() const;
  // Waits until the supervisor has handled `exits` exits of workers (each
  // replaced or deferred) and made `restarts` replacements. False if
  // `timeout` passed first.
  bool AwaitSupervisor(int exits, int restarts, absl::Duration timeout) const;

 private:
  // Forks one worker; its host name and whether it is a spare.
  absl::StatusOr<pid_t> Spawn(const std::string& host_name, bool spare);
  void Supervise();
  // The worker in pids_[slot] exited: a new spare takes the slot if the
  // rate limit allows, else the slot is removed and its replacement
  // deferred.
  void ReplaceLocked(size_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes the deferred replacements the rate limit allows now (appended
  // to pids_).
  void StartDeferredLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forks the next restarted spare, appended to pids_; logs and returns 0
  // if it cannot.
  pid_t SpawnReplacementLocked(const std::string& replaces)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status StopWorkers();

  LocalWorkersOptions options_;
  std::vector<std::string> env_;  // with the secret, for execve
  mutable absl::Mutex mu_;
  std::vector<pid_t> pids_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> names_ ABSL_GUARDED_BY(mu_);  // per pid
  int restarts_ ABSL_GUARDED_BY(mu_) = 0;
  // The workers whose replacement is deferred, oldest first.
  std::deque<std::string> deferred_ ABSL_GUARDED_BY(mu_);
  int exits_ ABSL_GUARDED_BY(mu_) = 0;  // exits the supervisor handled
  RestartRateLimit restart_limit_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // Stop() began
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;   // every worker reaped
  int stop_fd_ = -1;  // eventfd: wakes the supervisor to stop
  std::thread supervisor_;
};

}  // namespace plexus
