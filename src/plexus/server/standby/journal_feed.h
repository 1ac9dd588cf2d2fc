// JournalFeed: a primary server's journal records on their way to its
// standby (plexus-server --standby-of), and the standby's word of what it
// has synced to its own journal. The primary's journal sink pushes each
// record as it appends it (under the server's lock, in the model's order);
// the Follow stream takes them in batches and sends them; the standby
// answers with the count it has synced; and the server, before a change
// leaves it (ServerImpl::AwaitJournalLocked), waits until the standby has
// it too, so a takeover loses nothing a client or worker was told.
//
// Records are counted as the journal sink counts them (`base`: the count
// the standby's snapshot covers). A standby that stops reading is cut off,
// never waited for without bound: past `max_queued` records the feed
// closes itself, and a wait for its sync has a deadline. Once closed (the
// stream ended, the standby fell behind, the server stops) every wait
// returns at once with the reason. Thread-safe; waits are on the injected
// clock and never spin.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "plexus/common/clock.h"

namespace plexus {

class JournalFeed {
 public:
  JournalFeed(uint64_t base, size_t max_queued, Clock* clock);

  // Queues the next record (serialized). Past max_queued waiting to be
  // taken, the feed closes (RESOURCE_EXHAUSTED: the standby stopped
  // reading) and drops it. Nothing once closed.
  void Push(std::string record);
  // Waits until records are queued, the feed closes, or `deadline`; moves
  // the queued records into *records and sets *last to the count after
  // them. False once closed (and nothing queued is left to send).
  bool Take(std::vector<std::string>* records, uint64_t* last,
            absl::Time deadline);
  // The standby has synced the records up to count `n`.
  void Synced(uint64_t n);
  // Waits until the standby has synced count `n`: OK; DEADLINE_EXCEEDED
  // naming both counts; the close's reason once closed.
  absl::Status AwaitSynced(uint64_t n, absl::Time deadline);
  // Ends the feed: every wait returns, with `why`. The first reason stays.
  void Close(absl::Status why);

  uint64_t pushed() const;
  uint64_t synced() const;
  absl::Status closed() const;  // OK while open

 private:
  const size_t max_queued_;
  Clock* const clock_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t pushed_ ABSL_GUARDED_BY(mu_);  // count after the last pushed
  uint64_t synced_ ABSL_GUARDED_BY(mu_);
  absl::Status closed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace plexus
