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
// spare (at most kMaxRestarts times), so a killed host's slot comes back
// as capacity for the next loss; its exit is logged, as an event the
// cluster recovered from, not reported by Stop(). Start and Stop from one
// thread; the supervisor thread restarts workers in between.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "plexus/common/credentials.h"

namespace plexus {

struct LocalWorkersOptions {
  std::string worker_binary;  // path to plexus-worker
  std::string server_address;
  int hosts = 0;
  int spares = 0;  // more workers, started with --spare
  int devices_per_host = 1;
  double device_memory_mib = 1024;
  bool shared_memory = true;
  std::string log_level = "info";
  // Handed to every worker; Start() refuses to start workers without it.
  std::optional<ClusterSecret> secret;
};

class LocalWorkers {
 public:
  static constexpr int kMaxRestarts = 64;
  // How long Stop() waits for the workers after SIGTERM (below the 20 s
  // the Python LocalCluster waits for the server).
  static constexpr absl::Duration kStopGrace = absl::Seconds(12);

  explicit LocalWorkers(LocalWorkersOptions options)
      : options_(std::move(options)) {}
  ~LocalWorkers() { Stop().IgnoreError(); }
  // Starts hosts + spares workers and the supervisor.
  absl::Status Start();
  // SIGTERM, then SIGKILL for any still alive after a grace period; reaps.
  // An error names every worker that did not exit with code 0 (a crash, a
  // signal, or one killed for outliving the grace period), one per line.
  absl::Status Stop();
  // The workers' pids now (hosts, then spares, then restarted spares in
  // the place of the ones they replace).
  std::vector<pid_t> pids() const;

 private:
  // Forks one worker; its host name and whether it is a spare.
  absl::StatusOr<pid_t> Spawn(const std::string& host_name, bool spare);
  void Supervise();
  absl::Status StopWorkers();

  LocalWorkersOptions options_;
  std::vector<std::string> env_;  // with the secret, for execve
  mutable absl::Mutex mu_;
  std::vector<pid_t> pids_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> names_ ABSL_GUARDED_BY(mu_);  // per pid
  int restarts_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // Stop() began
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;   // every worker reaped
  int stop_fd_ = -1;  // eventfd: wakes the supervisor to stop
  std::thread supervisor_;
};

}  // namespace plexus
