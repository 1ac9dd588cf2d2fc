#include "plexus/server/scheduling/gang_scheduler.h"

namespace plexus {

GangScheduler::GangScheduler(Options options) : options_(options) {}

void GangScheduler::AddWorker(int64_t worker_id,
                              std::shared_ptr<WorkerQueue> queue) {
  absl::MutexLock lock(&mu_);
  queues_[worker_id] = std::move(queue);
}

std::shared_ptr<WorkerQueue> GangScheduler::RemoveWorker(int64_t worker_id) {
  absl::MutexLock lock(&mu_);
  auto it = queues_.find(worker_id);
  if (it == queues_.end()) return nullptr;
  std::shared_ptr<WorkerQueue> queue = std::move(it->second);
  queues_.erase(it);
  return queue;
}

std::vector<std::shared_ptr<WorkerQueue>> GangScheduler::Queues() {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<WorkerQueue>> out;
  for (auto& [id, q] : queues_) out.push_back(q);
  return out;
}

void GangScheduler::Send(int64_t worker_id, proto::WorkerOp op) {
  absl::MutexLock lock(&mu_);
  auto it = queues_.find(worker_id);
  if (it != queues_.end()) it->second->Push(std::move(op));
}

void GangScheduler::Broadcast(const proto::WorkerOp& op, int64_t except) {
  absl::MutexLock lock(&mu_);
  for (auto& [id, q] : queues_) {
    if (id != except) q->Push(op);
  }
}

uint64_t GangScheduler::Submit(std::vector<WorkerOps> units) {
  absl::MutexLock lock(&mu_);
  const uint64_t epoch = ++epoch_;
  // Each worker's ops of the batch enter its queue at once (one lock of
  // the queue, one wake-up of its writer, not one per op).
  std::vector<proto::WorkerOp> ops;
  for (auto& entry : queues_) {
    // Not a structured binding: C++17 lambdas cannot capture one (clang).
    const auto& worker = entry.first;
    auto& queue = entry.second;
    const bool reverse = !options_.consistent_order && worker % 2 == 1;
    auto deliver = [&](WorkerOps& unit) {
      auto it = unit.find(worker);
      if (it == unit.end()) return;
      for (auto& op : it->second) ops.push_back(std::move(op));
    };
    if (reverse) {
      for (auto u = units.rbegin(); u != units.rend(); ++u) deliver(*u);
    } else {
      for (auto& u : units) deliver(u);
    }
    if (!ops.empty()) queue->PushAll(ops);
  }
  return epoch;
}

uint64_t GangScheduler::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

}  // namespace plexus
