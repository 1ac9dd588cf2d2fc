// LocalWorkers: the embedded cluster's worker processes, started by the
// server on this machine. Each child dies with the server (PR_SET_PDEATHSIG)
// and is stopped and reaped by Stop() or the destructor, so an embedded
// cluster never leaves a process behind. Stop() says which workers did not
// exit cleanly (a crash at shutdown must not pass unnoticed). Each child
// gets the cluster secret in its environment ($PLEXUS_CLUSTER_SECRET), never
// on its command line (which `ps` shows to everyone). Not thread-safe.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "plexus/common/credentials.h"

namespace plexus {

struct LocalWorkersOptions {
  std::string worker_binary;  // path to plexus-worker
  std::string server_address;
  int hosts = 0;
  int devices_per_host = 1;
  double device_memory_mib = 1024;
  bool shared_memory = true;
  std::string log_level = "info";
  // Handed to every worker; Start() refuses to start workers without it.
  std::optional<ClusterSecret> secret;
};

class LocalWorkers {
 public:
  explicit LocalWorkers(LocalWorkersOptions options)
      : options_(std::move(options)) {}
  ~LocalWorkers() { Stop().IgnoreError(); }
  absl::Status Start();
  // SIGTERM, then SIGKILL for any still alive after a grace period; reaps.
  // An error names every worker that did not exit with code 0 (a crash, a
  // signal, or one killed for outliving the grace period), one per line.
  absl::Status Stop();
  const std::vector<pid_t>& pids() const { return pids_; }

 private:
  LocalWorkersOptions options_;
  std::vector<pid_t> pids_;  // pids_[h] runs host h
};

}  // namespace plexus
