#include "plexus/server/scheduling/gang_scheduler.h"

namespace plexus {

GangScheduler::GangScheduler(Options options) : options_(options) {}

void GangScheduler::AddWorker(int64_t worker_id,
                              std::shared_ptr<WorkerQueue> queue) {
  absl::MutexLock lock(&mu_);
  if (worker_id >= 0) {
    const size_t at = static_cast<size_t>(worker_id);
    if (at >= slots_.size()) slots_.resize(at + 1);
    slots_[at].queue = queue;
  }
  queues_[worker_id] = std::move(queue);
}

std::shared_ptr<WorkerQueue> GangScheduler::RemoveWorker(int64_t worker_id) {
  absl::MutexLock lock(&mu_);
  auto it = queues_.find(worker_id);
  if (it == queues_.end()) return nullptr;
  std::shared_ptr<WorkerQueue> queue = std::move(it->second);
  queues_.erase(it);
  if (worker_id >= 0 && static_cast<size_t>(worker_id) < slots_.size()) {
    slots_[static_cast<size_t>(worker_id)].queue.reset();
  }
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
  std::vector<GangUnit> gang(units.size());
  for (size_t u = 0; u < units.size(); ++u) gang[u].ops = std::move(units[u]);
  return Submit(std::move(gang));
}

uint64_t GangScheduler::Submit(std::vector<GangUnit> units) {
  absl::MutexLock lock(&mu_);
  const uint64_t epoch = ++epoch_;
  if (!options_.consistent_order) {
    SubmitInconsistentLocked(units);
    return epoch;
  }
  // Each worker's ops of the batch, in unit order (a unit's ops for a
  // worker, then its Execute there), gathered by worker, then into its
  // queue at once (one lock of the queue, one wake-up of its writer).
  // A worker with no queue (removed meanwhile) has its ops dropped.
  auto stage = [this](int64_t worker)
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> std::vector<OutOp>* {
    if (worker < 0 || static_cast<size_t>(worker) >= slots_.size()) {
      return nullptr;
    }
    Slot& slot = slots_[static_cast<size_t>(worker)];
    if (slot.queue == nullptr) return nullptr;
    if (slot.staged.empty()) touched_.push_back(static_cast<size_t>(worker));
    return &slot.staged;
  };
  for (GangUnit& unit : units) {
    for (auto& [worker, list] : unit.ops) {
      if (list.empty()) continue;
      std::vector<OutOp>* out = stage(worker);
      if (out == nullptr) continue;
      for (proto::WorkerOp& op : list) out->emplace_back(std::move(op));
    }
    for (const std::shared_ptr<const EncodedOp>& op : unit.shared) {
      for (int64_t worker : op->workers) {
        if (std::vector<OutOp>* out = stage(worker)) out->emplace_back(op);
      }
    }
    if (unit.executes == nullptr) continue;
    for (int h = 0; h < unit.executes->hosts(); ++h) {
      if (std::vector<OutOp>* out = stage(unit.executes->worker(h))) {
        out->emplace_back(unit.executes.get(), h);
      }
    }
  }
  // The batch's calls' wire Executes, kept alive by one reference per
  // worker's push, not one per host of each call (OutOp::keep).
  const std::shared_ptr<const void> keep = KeepExecutes(units);
  for (size_t at : touched_) {
    Slot& slot = slots_[at];
    HoldIn(slot.staged, keep);
    slot.queue->PushAll(slot.staged);
    slot.staged.clear();
  }
  touched_.clear();
  return epoch;
}

std::shared_ptr<const void> GangScheduler::KeepExecutes(
    std::vector<GangUnit>& units) {
  auto keep = std::make_shared<std::vector<std::shared_ptr<const void>>>();
  for (GangUnit& unit : units) {
    if (unit.executes != nullptr) keep->push_back(std::move(unit.executes));
  }
  if (keep->empty()) return nullptr;
  return keep;
}

void GangScheduler::HoldIn(std::vector<OutOp>& ops,
                           const std::shared_ptr<const void>& keep) {
  if (keep == nullptr) return;
  // (An op of its own, a shared encoded one, keeps its own reference.)
  for (OutOp& op : ops) {
    if (op.keep == nullptr) {
      op.keep = keep;
      return;
    }
  }
}

void GangScheduler::SubmitInconsistentLocked(std::vector<GangUnit>& units) {
  std::vector<OutOp> ops;
  for (auto& [worker, queue] : queues_) {
    const bool reverse = worker % 2 == 1;
    for (size_t i = 0; i < units.size(); ++i) {
      GangUnit& unit = units[reverse ? units.size() - 1 - i : i];
      auto it = unit.ops.find(worker);
      if (it != unit.ops.end()) {
        for (proto::WorkerOp& op : it->second) ops.emplace_back(std::move(op));
      }
      for (const std::shared_ptr<const EncodedOp>& op : unit.shared) {
        for (int64_t w : op->workers) {
          if (w == worker) ops.emplace_back(op);
        }
      }
      if (unit.executes == nullptr) continue;
      for (int h = 0; h < unit.executes->hosts(); ++h) {
        if (unit.executes->worker(h) == worker)
          ops.emplace_back(unit.executes, h);  // (its own reference)
      }
    }
    if (!ops.empty()) queue->PushAll(ops);
  }
}

uint64_t GangScheduler::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

}  // namespace plexus
