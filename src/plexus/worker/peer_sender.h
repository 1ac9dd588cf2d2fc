// PeerSender: pushes ready shards to one peer worker over the data plane,
// in the order they became ready. A small shard sent while nothing is queued
// goes out at once on the caller's thread (saving a thread hand-off per
// hop); everything else goes through one sender thread per peer, which
// sleeps on its queue when idle. A shard that cannot be delivered at all
// (the connection fails, again after one reconnect) is reported through
// `on_failure`, so the destination can fail it instead of waiting.
//
// A shard in GPU memory goes to a peer on this host by CUDA IPC where
// both ends can (cuda_ipc.h): the peer copies it from this process's
// memory, which the sender thread holds until the peer answers (or the
// connection breaks, or the peer is marked down: the wait is then cut).
// Anywhere else, or where CUDA IPC fails, it is staged through host memory.
// Thread-safe.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "plexus/timeline/timeline.h"
#include "plexus/transport/data_plane.h"
#include "plexus/worker/cuda_ipc.h"

namespace plexus {

class PeerSender {
 public:
  // Called on the sending thread, once per shard that could not be
  // delivered, with the reason (or, for a shard that had failed upstream,
  // its own error), never after MarkDown: the peer is gone, and the server
  // fails what was expected from or by it.
  using FailureCallback = std::function<void(const transport::ShardKey& key,
                                             const absl::Status& reason)>;
  // `unix_path`: the peer's unix socket when it may share memory with this
  // process (tried first; TCP when it cannot be reached), else empty.
  // Its connections prove `identity` (the worker's). `ipc`: this worker's
  // CUDA IPC (not owned; outlives the sender), or null for none.
  // `timeline`: where delivered transfers are recorded (not owned; outlives
  // the sender), or null.
  PeerSender(int64_t peer_id, std::string tcp_address, std::string unix_path,
             transport::DataPlaneCounters* counters,
             transport::DataPlaneIdentity identity, FailureCallback on_failure,
             const CudaIpc* ipc = nullptr, Timeline* timeline = nullptr);
  ~PeerSender();  // drops what is queued and joins

  // Queues `data` (or its error) for `key` on the peer.
  // `event` (kind kTransfer, its ids and start filled in) is recorded once
  // the shard is delivered, with its path, size and end; kNone: not.
  void Send(const transport::ShardKey& key,
            absl::StatusOr<std::shared_ptr<const Storage>> data,
            const TimelineEvent& event = {});
  // The peer is gone: drop everything queued and everything sent later.
  void MarkDown();

 private:
  struct Item {
    transport::ShardKey key;
    absl::StatusOr<std::shared_ptr<const Storage>> data;
    TimelineEvent event;
  };
  // Item's event, delivered by `path`.
  void Record(Item& item, TransferPath path);
  void Loop();
  // conn_, connected if it was not (the sender thread only).
  absl::Status Connect();
  absl::Status SendOne(const Item& item);
  // A device value by CUDA IPC: true once the peer stored it; false where
  // it was not possible or failed (logged once per reason kind; the caller
  // stages it through host memory).
  bool SendByIpc(const Item& item);
  bool given_up() {
    absl::MutexLock lock(&mu_);
    return down_ || stop_;
  }
  // SendOne with one reconnect; reports a failure. A shard in device memory
  // is copied to host memory first.
  void Deliver(Item item);
  static constexpr size_t kInlineBytes = 64 * 1024;

  const int64_t peer_id_;
  const std::string tcp_address_;
  const std::string unix_path_;
  transport::DataPlaneCounters* const counters_;
  const transport::DataPlaneIdentity identity_;
  const FailureCallback on_failure_;
  const CudaIpc* const ipc_;
  Timeline* const timeline_;
  std::unique_ptr<transport::DataPlaneConnection> conn_;  // sender thread only
  // Sender thread only: whether a fallback from CUDA IPC was logged, for a
  // reason of the decision (INFO) and for a failure once it was tried (WARN).
  bool logged_not_possible_ = false;
  bool logged_failure_ = false;

  absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool down_ ABSL_GUARDED_BY(mu_) = false;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // someone is using conn_
  // conn_ while a PUSH_IPC waits for its answer: MarkDown and the
  // destructor shut it down, so the wait ends.
  transport::DataPlaneConnection* awaiting_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;
};

}  // namespace plexus
