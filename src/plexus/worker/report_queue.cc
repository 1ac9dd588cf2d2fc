#include "plexus/worker/report_queue.h"

#include <utility>

#include "plexus/common/status_proto.h"

namespace plexus {

bool ReportQueue::PendingLocked() const {
  return !calls_done_.tickets().empty() || !calls_done_.copies_done().empty();
}

bool ReportQueue::DueLocked() const {
  return calls_done_.tickets_size() >= kReportBatch ||
         (PendingLocked() && clock_->Now() >= first_done_ + kReportDelay);
}

void ReportQueue::NoteFirstLocked() {
  if (!PendingLocked()) first_done_ = clock_->Now();
}

void ReportQueue::CallFinished(const proto::Execute& exec, bool failed,
                               int64_t busy_micros, int64_t queued_micros) {
  absl::MutexLock lock(&mu_);
  Usage& usage = usage_[exec.client_id()];
  usage.busy_micros += busy_micros;
  usage.calls++;
  usage.tasks += exec.tasks_size();
  usage.queued_micros += queued_micros;
  if (exec.ticket() == 0) return;  // not admitted by a server (harnesses)
  NoteFirstLocked();
  // (Not its client: the server knows each ticket's, CallsDone.client_ids
  // is left empty.)
  calls_done_.add_tickets(exec.ticket());
  calls_done_.add_busy_micros(busy_micros);
  if (failed) calls_done_.add_failed_tickets(exec.ticket());
  // The writer wakes for the first of a batch (to time it) and when the
  // batch is full; not for each call.
  if (calls_done_.tickets_size() == 1 ||
      calls_done_.tickets_size() == kReportBatch) {
    wake_writer_.SignalAll();
  }
}

void ReportQueue::CopyArrived(uint64_t buffer_id) {
  absl::MutexLock lock(&mu_);
  NoteFirstLocked();
  calls_done_.add_copies_done(buffer_id);
  wake_writer_.SignalAll();
}

void ReportQueue::TransferFailed(int64_t dst_worker,
                                 const transport::ShardKey& key,
                                 const absl::Status& reason) {
  proto::TransferFailed f;
  f.set_dst_worker_id(dst_worker);
  f.set_buffer_id(key.buffer_id);
  f.set_shard(key.shard);
  *f.mutable_status() = StatusToProto(reason);
  absl::MutexLock lock(&mu_);
  failed_transfers_.push_back(std::move(f));
  wake_writer_.SignalAll();
}

void ReportQueue::ClientGone(uint64_t client) {
  absl::MutexLock lock(&mu_);
  usage_.erase(client);
}

std::optional<std::vector<proto::ClientUsage>> ReportQueue::TryUsage() {
  if (!mu_.TryLock()) return std::nullopt;
  std::vector<proto::ClientUsage> all;
  for (const auto& [client, usage] : usage_) {
    proto::ClientUsage& u = all.emplace_back();
    u.set_client_id(client);
    u.set_busy_micros(usage.busy_micros);
    u.set_calls(usage.calls);
    u.set_tasks(usage.tasks);
    u.set_queued_micros(usage.queued_micros);
  }
  mu_.Unlock();
  return all;
}

bool ReportQueue::AwaitReports(std::vector<proto::WorkerToServer>* out) {
  absl::MutexLock lock(&mu_);
  while (!closed_ && failed_transfers_.empty() && !DueLocked()) {
    if (PendingLocked()) {
      clock_->AwaitWithDeadline(&mu_, &wake_writer_,
                                first_done_ + kReportDelay);
    } else {
      wake_writer_.Wait(&mu_);
    }
  }
  if (closed_) return false;
  for (proto::TransferFailed& f : failed_transfers_) {
    *out->emplace_back().mutable_transfer_failed() = std::move(f);
  }
  failed_transfers_.clear();
  // Everything that finished while the last write was going out.
  if (PendingLocked()) {
    out->emplace_back().mutable_calls_done()->Swap(&calls_done_);
  }
  return true;
}

void ReportQueue::Reopen() {
  absl::MutexLock lock(&mu_);
  closed_ = false;
  failed_transfers_.clear();
  calls_done_.Clear();
}

void ReportQueue::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  wake_writer_.SignalAll();
}

}  // namespace plexus
