#include "plexus/worker/peer_sender.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "plexus/common/logging.h"

namespace plexus {

PeerSender::PeerSender(int64_t peer_id, std::string tcp_address,
                       std::string unix_path,
                       transport::DataPlaneCounters* counters,
                       transport::DataPlaneIdentity identity,
                       FailureCallback on_failure, const CudaIpc* ipc,
                       Timeline* timeline)
    : peer_id_(peer_id),
      tcp_address_(std::move(tcp_address)),
      unix_path_(std::move(unix_path)),
      counters_(counters),
      identity_(identity),
      on_failure_(std::move(on_failure)),
      ipc_(ipc),
      timeline_(timeline),
      thread_([this] { Loop(); }) {}

PeerSender::~PeerSender() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    if (awaiting_ != nullptr) awaiting_->Shutdown();
  }
  thread_.join();
}

void PeerSender::Send(const transport::ShardKey& key,
                      absl::StatusOr<std::shared_ptr<const Storage>> data,
                      const TimelineEvent& event) {
  // A value in device memory is never sent on the caller's thread (a
  // device thread, as its producer is queued): it may not be computed yet.
  const bool small = !data.ok() || ((*data)->kind() == MemoryKind::kHost &&
                                    (*data)->size() <= kInlineBytes);
  {
    absl::MutexLock lock(&mu_);
    if (down_) return;
    if (!small || busy_ || !queue_.empty() || stop_) {
      queue_.push_back({key, std::move(data), event});
      return;
    }
    busy_ = true;
  }
  Deliver({key, std::move(data), event});
  absl::MutexLock lock(&mu_);
  busy_ = false;
}

void PeerSender::MarkDown() {
  absl::MutexLock lock(&mu_);
  down_ = true;
  queue_.clear();
  // A peer that will not answer a PUSH_IPC: the sender thread lets go of
  // the value now.
  if (awaiting_ != nullptr) awaiting_->Shutdown();
}

absl::Status PeerSender::Connect() {
  if (conn_) return absl::OkStatus();
  // A peer declared down (a stopped one accepts but never answers the
  // handshake), or this sender stopping, ends the connecting too.
  auto conn = transport::DataPlaneConnection::Connect(
      tcp_address_, unix_path_, counters_, identity_,
      [this] { return given_up(); });
  if (!conn.ok()) return conn.status();
  conn_ = std::move(*conn);
  return absl::OkStatus();
}

absl::Status PeerSender::SendOne(const Item& item) {
  if (absl::Status s = Connect(); !s.ok()) return s;
  if (item.data.ok()) return conn_->Push(item.key, **item.data);
  return conn_->PushError(item.key, item.data.status());
}

void PeerSender::Loop() {
  while (true) {
    Item item;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || (!queue_.empty() && !busy_);
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    Deliver(std::move(item));
    absl::MutexLock lock(&mu_);
    busy_ = false;
  }
}

bool PeerSender::SendByIpc(const Item& item) {
  // Connecting says whether the peer is on this host's unix socket and
  // opens CUDA IPC; a peer that cannot be reached is the host-staged
  // path's to retry and report.
  if (!Connect().ok()) {
    conn_.reset();
    return false;
  }
  absl::Status possible = IpcPossible(
      **item.data, conn_->uses_shared_memory(), conn_->peer_opens_cuda_ipc(),
      ipc_ != nullptr
          ? ipc_->available()
          : absl::FailedPreconditionError("this worker has no CUDA IPC"));
  if (!possible.ok()) {
    if (!std::exchange(logged_not_possible_, true)) {
      SPDLOG_INFO("transfers to worker {}: host-staged ({})", peer_id_,
                  std::string(possible.message()));
    }
    return false;
  }
  auto failed = [&](const absl::Status& why) {
    if (!std::exchange(logged_failure_, true)) {
      SPDLOG_WARN(
          "transfer of buffer {} shard {} to worker {}: CUDA IPC failed, "
          "staged through host memory instead (said once): {}",
          item.key.buffer_id, item.key.shard, peer_id_, why.ToString());
    } else {
      SPDLOG_DEBUG("CUDA IPC to worker {} failed: {}", peer_id_,
                   why.ToString());
    }
    return false;
  };
  // A value that failed upstream goes as its error (the host-staged
  // path's PUSH_ERROR), not as a failure of CUDA IPC.
  const DeviceBuffer& buffer = *(*item.data)->device_buffer();
  if (!buffer.Await().ok()) return false;
  absl::StatusOr<transport::IpcShard> shard = ipc_->Export(buffer);
  if (!shard.ok()) return failed(shard.status());
  {
    absl::MutexLock lock(&mu_);
    if (down_ || stop_) return false;
    awaiting_ = conn_.get();
  }
  // `item` holds the value, so its memory stays exported until the answer.
  absl::Status s = conn_->PushIpc(item.key, *shard);
  {
    absl::MutexLock lock(&mu_);
    awaiting_ = nullptr;
  }
  if (s.ok()) {
    TransferPaths::ipc()++;
    TransferBytes::Add(TransferBytes::kIpc,
                       static_cast<int64_t>(buffer.size()));
    return true;
  }
  if (!conn_->healthy()) {
    // Broken (or cut by MarkDown): the host-staged path reconnects, once.
    conn_.reset();
    return false;
  }
  return failed(s);  // the peer took nothing: send the bytes
}

void PeerSender::Record(Item& item, TransferPath path) {
  if (timeline_ == nullptr || item.event.kind == EventKind::kNone) return;
  item.event.end_ns = timeline_->NowNs();
  item.event.path = path;
  item.event.bytes =
      item.data.ok() ? static_cast<int64_t>((*item.data)->size()) : 0;
  item.event.failed = !item.data.ok();
  timeline_->Record(item.event);
}

void PeerSender::Deliver(Item item) {
  // One transfer at a time per peer: its slice on the timeline runs from
  // here (the sender took it) to its delivery.
  if (timeline_ != nullptr && item.event.kind != EventKind::kNone) {
    item.event.start_ns = timeline_->NowNs();
  }
  if (item.data.ok() && (*item.data)->kind() == MemoryKind::kDevice) {
    if (SendByIpc(item)) {
      Record(item, TransferPath::kIpc);
      return;
    }
    if (given_up()) return;  // the server fails what was sent to it
    // Staged through host memory, on this thread, once the value is
    // computed (or its error goes instead).
    item.data =
        Storage::InHostMemory(*std::move(item.data), /*shareable=*/true);
    TransferPaths::host_staged()++;
  }
  auto delivered = [&] {
    const bool shm = conn_ != nullptr && conn_->uses_shared_memory();
    if (item.data.ok()) {
      TransferBytes::Add(
          shm ? TransferBytes::kSharedMemory : TransferBytes::kTcp,
          static_cast<int64_t>((*item.data)->size()));
    }
    Record(item, shm ? TransferPath::kSharedMemory : TransferPath::kTcp);
  };
  absl::Status s = SendOne(item);
  if (s.ok()) return delivered();
  // One reconnect: the connection may have been closed under us.
  conn_.reset();
  s = SendOne(item);
  if (s.ok()) return delivered();
  conn_.reset();
  {
    // A dead peer fails here too; the server reports it (PeerDown) and
    // fails what it was sent, so there is nobody to tell.
    absl::MutexLock lock(&mu_);
    if (down_) return;
  }
  const std::string reason = absl::StrCat(
      "transfer of buffer ", item.key.buffer_id, " shard ", item.key.shard,
      " to worker ", peer_id_, " could not be delivered: ", s.message());
  SPDLOG_WARN("{}", reason);
  if (!on_failure_) return;
  // A shard that had failed upstream: the destination learns that error,
  // exactly as the PUSH_ERROR would have told it.
  on_failure_(item.key, item.data.ok() ? absl::UnavailableError(reason)
                                       : item.data.status());
}

}  // namespace plexus
