// The worker's peers, as the server names them: where each one's data
// plane is, the sender that pushes shards to it (made on first use), and
// the peers the server declared down, with why, and their generations,
// whose pushes are refused (fenced).
//
// A host that comes back rejoins under a new id, so an id once down stays
// down. Senders live until DestroySenders(), so the raw pointers SenderTo
// gives stay valid in every callback that holds one (see ~WorkerImpl).
//
// Thread-safe. One lock (mu_), never held across a call out of this
// class, except PeerSender::MarkDown (which takes only the sender's own).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "plexus/proto/plexus.pb.h"
#include "plexus/timeline/timeline.h"
#include "plexus/transport/data_plane.h"
#include "plexus/worker/cuda_ipc.h"
#include "plexus/worker/peer_sender.h"
#include "plexus/worker/report_queue.h"
#include "plexus/worker/worker_identity.h"

namespace plexus {

class PeerTable {
 public:
  // All borrowed, and they outlive the table. A sender that cannot deliver
  // a shard tells `reports`.
  PeerTable(const WorkerIdentity& me, transport::DataPlaneCounters* counters,
            const CudaIpc* cuda_ipc, Timeline* timeline, ReportQueue* reports);
  ~PeerTable();  // DestroySenders()

  // A peer the server told of (WorkerOp.peer).
  void Add(const proto::PeerInfo& peer);
  // The sender to a peer, made on first use: valid until DestroySenders();
  // null for an unknown peer, and once StopSenders() was called.
  PeerSender* SenderTo(int64_t worker_id);
  // The server declared `worker_id` down because of `why`: its sender
  // drops what it holds, and, `generation` not 0, what that registration
  // still pushes is refused (should the process come back: a SIGSTOP
  // ends, a network heals).
  void MarkDown(int64_t worker_id, uint64_t generation,
                const absl::Status& why);
  // Why the peer is down, or nothing while it is not.
  std::optional<absl::Status> DownStatus(int64_t worker_id) const;
  bool IsDown(int64_t worker_id) const;
  // The worker whose fenced generation `generation` is, if it is one.
  std::optional<int64_t> FencedWorker(uint64_t generation) const;
  // A connection to `peer`'s data plane (its unix socket where it shares
  // this machine), as this worker; `cancelled` ends the attempts.
  // UNAVAILABLE for a peer declared down, FAILED_PRECONDITION for one never
  // told of (the server tells a worker of a peer as its ops need it).
  absl::StatusOr<std::unique_ptr<transport::DataPlaneConnection>> Connect(
      int64_t peer, const std::function<bool()>& cancelled);

  // The worker is being destroyed: every sender drops what it is given
  // from now on, and no new one is made.
  void StopSenders();
  // Joins the senders' threads (after the devices have drained: their
  // tasks' callbacks may still hold a sender).
  void DestroySenders();

 private:
  const WorkerIdentity& me_;
  transport::DataPlaneCounters* const counters_;
  const CudaIpc* const cuda_ipc_;
  Timeline* const timeline_;
  ReportQueue* const reports_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<int64_t, proto::PeerInfo> peers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int64_t, std::unique_ptr<PeerSender>> senders_
      ABSL_GUARDED_BY(mu_);
  bool senders_stopped_ ABSL_GUARDED_BY(mu_) = false;
  // Generations the server declared down, and whose they were.
  absl::flat_hash_map<uint64_t, int64_t> fenced_ ABSL_GUARDED_BY(mu_);
  // Peers the server declared down, and why.
  absl::flat_hash_map<int64_t, absl::Status> down_ ABSL_GUARDED_BY(mu_);
};

}  // namespace plexus
