// EmbeddedCluster: a whole Plexus cluster on this machine, for C++ programs,
// tests and benchmarks (plexus.local() is the Python equivalent).
// It runs `plexus-server --local-workers H` (found next to the running
// binary) as a child process in a process group of its own; the server
// starts the worker processes. The server dies with this process
// (PR_SET_PDEATHSIG), and the destructor stops it and reaps it, so a
// benchmark never leaves a process behind, even when it fails half-way.
// It draws the cluster's secret and hands it to the server in its
// environment ($PLEXUS_CLUSTER_SECRET; the server passes it on to its
// workers); secret() is for tests that act as the operator.
// Not thread-safe.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/common/credentials.h"
#include "plexus/proto/plexus.pb.h"

namespace plexus {

struct EmbeddedClusterOptions {
  int hosts = 1;
  int devices_per_host = 1;
  int64_t device_memory_mib = 1024;
  // False: workers move buffers over TCP, as between hosts (--no-shm).
  bool shared_memory = true;
  std::string log_level = "warn";
  // The server's journal (plexus-server --journal); empty: none.
  std::string journal_path;
  // How long the server and all of its workers may take to come up.
  absl::Duration start_timeout = absl::Seconds(30);
};

class EmbeddedCluster {
 public:
  // Returns once the server listens and `hosts` workers are alive. Errors
  // name what did not happen and include the end of the server's log.
  static absl::StatusOr<std::unique_ptr<EmbeddedCluster>> Start(
      const EmbeddedClusterOptions& options);
  // Stop(); an error is printed to stderr (call Stop() to check it).
  ~EmbeddedCluster();

  EmbeddedCluster(const EmbeddedCluster&) = delete;
  EmbeddedCluster& operator=(const EmbeddedCluster&) = delete;

  const std::string& address() const { return address_; }
  const EmbeddedClusterOptions& options() const { return options_; }
  // The cluster secret (common/credentials.h). Never log it.
  const ClusterSecret& secret() const { return secret_; }
  // The server process (its workers are its children).
  pid_t server_pid() const { return pid_; }
  absl::StatusOr<proto::ClusterStatus> Status() const;

  // SIGTERM to the server (it stops its workers), SIGKILL to the whole
  // process group if it is not gone within a grace period; reaps. An error
  // when any process did not exit cleanly: the server (its exit code or
  // signal) and each worker that crashed, was killed or exited non-zero,
  // as the server reported them. Later calls return OK and do nothing.
  absl::Status Stop();

 private:
  EmbeddedCluster(EmbeddedClusterOptions options, std::string dir,
                  ClusterSecret secret)
      : options_(std::move(options)),
        dir_(std::move(dir)),
        secret_(std::move(secret)) {}
  std::string LogTail() const;

  EmbeddedClusterOptions options_;
  std::string dir_;  // temporary: the server's log
  ClusterSecret secret_;
  pid_t pid_ = -1;  // the server; also its process group id
  // The read end of the server's --ready-fd pipe: its address, then at
  // exit a line for each worker that did not exit cleanly.
  int ready_fd_ = -1;
  std::string address_;
};

}  // namespace plexus
