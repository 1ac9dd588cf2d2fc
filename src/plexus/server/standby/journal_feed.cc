#include "plexus/server/standby/journal_feed.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace plexus {

JournalFeed::JournalFeed(uint64_t base, size_t max_queued, Clock* clock)
    : max_queued_(max_queued), clock_(clock), pushed_(base), synced_(base) {}

void JournalFeed::Push(std::string record) {
  absl::MutexLock lock(&mu_);
  if (!closed_.ok()) return;
  if (queue_.size() >= max_queued_) {
    closed_ = absl::ResourceExhaustedError(absl::StrCat(
        "the standby took no journal record while ", max_queued_,
        " waited: it is cut off (it follows again from a snapshot when it "
        "reconnects)"));
    queue_.clear();
    changed_.SignalAll();
    return;
  }
  queue_.push_back(std::move(record));
  ++pushed_;
  changed_.SignalAll();
}

bool JournalFeed::Take(std::vector<std::string>* records, uint64_t* last,
                       absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (closed_.ok() && queue_.empty()) {
    if (clock_->AwaitWithDeadline(&mu_, &changed_, deadline)) break;
  }
  if (!closed_.ok()) return false;
  for (std::string& r : queue_) records->push_back(std::move(r));
  queue_.clear();
  *last = pushed_;
  return true;
}

void JournalFeed::Synced(uint64_t n) {
  absl::MutexLock lock(&mu_);
  if (n > synced_ && n <= pushed_) {
    synced_ = n;
    changed_.SignalAll();
  }
}

absl::Status JournalFeed::AwaitSynced(uint64_t n, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (closed_.ok() && synced_ < n) {
    if (clock_->AwaitWithDeadline(&mu_, &changed_, deadline)) break;
  }
  if (synced_ >= n) return absl::OkStatus();
  if (!closed_.ok()) return closed_;
  return absl::DeadlineExceededError(
      absl::StrCat("the standby had synced ", synced_, " of the journal's ", n,
                   " record(s) at the deadline"));
}

void JournalFeed::Close(absl::Status why) {
  absl::MutexLock lock(&mu_);
  if (!closed_.ok()) return;
  closed_ = why.ok() ? absl::CancelledError("the feed was closed") : why;
  queue_.clear();
  changed_.SignalAll();
}

uint64_t JournalFeed::pushed() const {
  absl::MutexLock lock(&mu_);
  return pushed_;
}

uint64_t JournalFeed::synced() const {
  absl::MutexLock lock(&mu_);
  return synced_;
}

absl::Status JournalFeed::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

}  // namespace plexus
