#include "plexus/worker/peer_table.h"

#include <utility>

namespace plexus {

PeerTable::PeerTable(const WorkerIdentity& me,
                     transport::DataPlaneCounters* counters,
                     const CudaIpc* cuda_ipc, Timeline* timeline,
                     ReportQueue* reports)
    : me_(me),
      counters_(counters),
      cuda_ipc_(cuda_ipc),
      timeline_(timeline),
      reports_(reports) {}

PeerTable::~PeerTable() {
  StopSenders();
  DestroySenders();
}

void PeerTable::Add(const proto::PeerInfo& peer) {
  absl::MutexLock lock(&mu_);
  peers_[peer.worker_id()] = peer;
}

PeerSender* PeerTable::SenderTo(int64_t worker_id) {
  absl::MutexLock lock(&mu_);
  if (senders_stopped_) return nullptr;  // the worker is being destroyed
  auto it = senders_.find(worker_id);
  if (it != senders_.end()) return it->second.get();
  auto pit = peers_.find(worker_id);
  if (pit == peers_.end()) return nullptr;
  const proto::PeerInfo& p = pit->second;
  const bool same_machine = p.machine_id() == me_.machine_id;
  auto sender = std::make_unique<PeerSender>(
      worker_id, p.data_address(), same_machine ? p.unix_path() : "", counters_,
      me_.AsPeer(),
      [reports = reports_, worker_id](const transport::ShardKey& key,
                                      const absl::Status& reason) {
        reports->TransferFailed(worker_id, key, reason);
      },
      cuda_ipc_, timeline_);
  PeerSender* raw = sender.get();
  senders_[worker_id] = std::move(sender);
  return raw;
}

void PeerTable::MarkDown(int64_t worker_id, uint64_t generation,
                         const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  auto it = senders_.find(worker_id);
  if (it != senders_.end()) it->second->MarkDown();
  if (generation != 0) fenced_[generation] = worker_id;
  down_[worker_id] = why;
}

std::optional<absl::Status> PeerTable::DownStatus(int64_t worker_id) const {
  absl::MutexLock lock(&mu_);
  auto it = down_.find(worker_id);
  if (it == down_.end()) return std::nullopt;
  return it->second;
}

bool PeerTable::IsDown(int64_t worker_id) const {
  absl::MutexLock lock(&mu_);
  return down_.contains(worker_id);
}

std::optional<int64_t> PeerTable::FencedWorker(uint64_t generation) const {
  absl::MutexLock lock(&mu_);
  auto it = fenced_.find(generation);
  if (it == fenced_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<std::unique_ptr<transport::DataPlaneConnection>>
PeerTable::Connect(int64_t peer, const std::function<bool()>& cancelled) {
  proto::PeerInfo info;
  {
    absl::MutexLock lock(&mu_);
    if (down_.contains(peer)) {
      return absl::UnavailableError("it was declared down");
    }
    auto it = peers_.find(peer);
    if (it == peers_.end()) {
      // Not NOT_FOUND: a peer asked for an executable answers that while
      // it compiles (XlaPrograms::AskPeer waits for it).
      return absl::FailedPreconditionError(
          "a worker this one was never told of");
    }
    info = it->second;
  }
  const bool same_machine = info.machine_id() == me_.machine_id;
  return transport::DataPlaneConnection::Connect(
      info.data_address(), same_machine ? info.unix_path() : "", counters_,
      me_.AsPeer(), cancelled);
}

void PeerTable::StopSenders() {
  absl::MutexLock lock(&mu_);
  senders_stopped_ = true;
  for (auto& [id, sender] : senders_) sender->MarkDown();
}

void PeerTable::DestroySenders() {
  absl::flat_hash_map<int64_t, std::unique_ptr<PeerSender>> senders;
  {
    absl::MutexLock lock(&mu_);
    senders.swap(senders_);
  }
  senders.clear();  // joins their threads, outside the lock
}

}  // namespace plexus
