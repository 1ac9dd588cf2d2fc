// A worker without a server, for the targets that drive one
// (worker_ops_fuzz.cc, data_plane_fuzz.cc): WorkerImpl::StartLocal, then
// ops fed to ApplyOps as the control-stream reader would.
#pragma once

#include <memory>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "plexus/common/credentials.h"
#include "plexus/proto/plexus.pb.h"
#include "plexus/worker/worker_impl.h"

namespace plexus::fuzz {

// Two devices of 1 MiB each; no PJRT plugin (XLA programs fail to load).
// With `secret`, the worker checks data-plane credentials against it (else
// against one of its own that no input can know).
inline std::unique_ptr<WorkerImpl> StartWorker(
    const ClusterSecret* secret = nullptr) {
  WorkerOptions options;
  if (secret != nullptr) options.secret = *secret;
  options.num_devices = 2;
  options.device_memory = 1 << 20;
  options.data_host = "127.0.0.1";
  auto worker = std::make_unique<WorkerImpl>(options);
  if (absl::Status s = worker->StartLocal(); !s.ok()) {
    std::fprintf(stderr, "worker did not start: %s\n", s.ToString().c_str());
    std::abort();
  }
  return worker;
}

// Peers the ops name are made unreachable (a refused port, no unix
// socket): a transfer to them fails, and no input makes the harness
// connect to whatever listens on this machine.
inline void DisarmPeers(proto::ServerToWorker& msg) {
  for (proto::WorkerOp& op : *msg.mutable_ops()) {
    if (!op.has_peer()) continue;
    op.mutable_peer()->set_data_address("127.0.0.1:1");
    op.mutable_peer()->set_unix_path("");
  }
}

// Lets the devices run what the ops queued, up to `limit` (a task may wait
// for a shard nothing will produce; tearing the worker down ends it).
inline void WaitForDevices(const WorkerImpl& worker, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  while (worker.pending_tasks() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Microseconds(20));
  }
}

}  // namespace plexus::fuzz
