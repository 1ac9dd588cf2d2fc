// The Plexus worker: one per host. Registers its devices with the server,
// executes the shard tasks it is sent on its devices in the order the
// server decided, owns the object store of its devices' buffers and moves
// shards directly to and from peer workers over the data plane.
//
// Threads: the control-stream reader (applies server ops in order), the
// control-stream writer (registration, heartbeats), one thread per device,
// one sender thread per peer, and the data-plane server's threads.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/common/credentials.h"

namespace plexus {

struct WorkerOptions {
  std::string server_address;  // host:port of plexus-server
  std::string host_name;       // defaults to gethostname()
  int num_devices = 1;
  int64_t device_memory = int64_t{1} << 30;  // budget per device, bytes
  // Use the shared-memory data plane with peers on this machine. Off: every
  // transfer goes over TCP, as between hosts.
  bool shared_memory = true;
  std::string data_host = "127.0.0.1";  // the TCP data plane binds here
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  // The PJRT C API plugin that runs XLA programs, loaded on the first XLA
  // call (e.g. the xla_cpu_pjrt.so of the xla-cpu-pjrt wheel).
  std::string pjrt_plugin;
  // The cluster secret (common/credentials.h): the worker proves itself to
  // the server and its peers with it, and checks every data-plane request
  // against it. Start() refuses to run without one.
  std::optional<ClusterSecret> secret;
};

class Worker {
 public:
  // Starts the data plane, connects to the server and registers.
  static absl::StatusOr<std::unique_ptr<Worker>> Start(
      const WorkerOptions& options);
  virtual ~Worker() = default;
  // Blocks until the server closes the session or Shutdown() is called.
  // Returns why the session ended.
  virtual absl::Status Wait() = 0;
  virtual void Shutdown() = 0;
  virtual int64_t worker_id() const = 0;
};

}  // namespace plexus
