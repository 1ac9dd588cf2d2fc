#include "plexus/worker/peer_sender.h"

#include "absl/strings/str_cat.h"
#include "plexus/common/logging.h"

namespace plexus {

PeerSender::PeerSender(int64_t peer_id, std::string tcp_address,
                       std::string unix_path,
                       transport::DataPlaneCounters* counters,
                       transport::DataPlaneIdentity identity,
                       FailureCallback on_failure)
    : peer_id_(peer_id),
      tcp_address_(std::move(tcp_address)),
      unix_path_(std::move(unix_path)),
      counters_(counters),
      identity_(identity),
      on_failure_(std::move(on_failure)),
      thread_([this] { Loop(); }) {}

PeerSender::~PeerSender() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void PeerSender::Send(const transport::ShardKey& key,
                      absl::StatusOr<std::shared_ptr<const Storage>> data) {
  // A value in device memory is never sent on the caller's thread (a
  // device thread, as its producer is queued): it may not be computed yet.
  const bool small = !data.ok() || ((*data)->kind() == MemoryKind::kHost &&
                                    (*data)->size() <= kInlineBytes);
  {
    absl::MutexLock lock(&mu_);
    if (down_) return;
    if (!small || busy_ || !queue_.empty() || stop_) {
      queue_.push_back({key, std::move(data)});
      return;
    }
    busy_ = true;
  }
  Deliver({key, std::move(data)});
  absl::MutexLock lock(&mu_);
  busy_ = false;
}

void PeerSender::MarkDown() {
  absl::MutexLock lock(&mu_);
  down_ = true;
  queue_.clear();
}

absl::Status PeerSender::SendOne(const Item& item) {
  if (!conn_) {
    // A peer declared down (a stopped one accepts but never answers the
    // handshake), or this sender stopping, ends the connecting too.
    auto given_up = [this] {
      absl::MutexLock lock(&mu_);
      return down_ || stop_;
    };
    auto conn = transport::DataPlaneConnection::Connect(
        tcp_address_, unix_path_, counters_, identity_, given_up);
    if (!conn.ok()) return conn.status();
    conn_ = std::move(*conn);
  }
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

void PeerSender::Deliver(Item item) {
  if (item.data.ok() && (*item.data)->kind() == MemoryKind::kDevice) {
    // No device path between workers yet: staged through host memory, on
    // this thread, once the value is computed (or its error goes instead).
    item.data =
        Storage::InHostMemory(*std::move(item.data), /*shareable=*/true);
    TransferPaths::host_staged()++;
  }
  absl::Status s = SendOne(item);
  if (s.ok()) return;
  // One reconnect: the connection may have been closed under us.
  conn_.reset();
  s = SendOne(item);
  if (s.ok()) return;
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
