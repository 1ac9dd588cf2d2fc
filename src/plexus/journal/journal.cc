#include "plexus/journal/journal.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "plexus/journal/internal/record.h"
#include "plexus/journal/internal/sqlite_store.h"
#include "plexus/journal/internal/store.h"

namespace plexus::journal {

using internal::JournalStore;
using internal::StoredRecord;

absl::StatusOr<std::unique_ptr<Journal>> Journal::Open(
    const JournalOptions& options, Replay* replay) {
  if (options.path.empty()) {
    return absl::InvalidArgumentError("journal: empty path");
  }
  absl::StatusOr<std::unique_ptr<JournalStore>> store =
      internal::OpenSqliteStore(options.path);
  if (!store.ok()) return store.status();
  return OpenWithStore(options, *std::move(store), replay);
}

absl::StatusOr<std::unique_ptr<Journal>> Journal::OpenWithStore(
    const JournalOptions& options, std::unique_ptr<JournalStore> store,
    Replay* replay) {
  if (replay == nullptr || store == nullptr || options.clock == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("journal ", options.path,
                     ": Open needs a replay, a store and a clock"));
  }
  internal::ReplayReader reader(options.path);
  if (absl::Status s =
          store->Scan([&reader](uint64_t key, absl::string_view v) {
            return reader.Add(key, v);
          });
      !s.ok()) {
    return s;
  }
  uint64_t discarded = 0;
  if (reader.stopped()) {
    absl::StatusOr<uint64_t> moved = store->DiscardFrom(reader.first_bad_key());
    if (!moved.ok()) return moved.status();
    discarded = *moved;
  }
  *replay = reader.Finish(discarded);
  auto journal = absl::WrapUnique(
      new Journal(options, std::move(store), reader.last_seq()));
  if (!replay->records.empty() &&
      replay->records.front().type == kSnapshotType) {
    absl::MutexLock lock(&journal->mu_);
    journal->snapshot_seq_ = replay->records.front().seq;
  }
  return journal;
}

Journal::Journal(const JournalOptions& options,
                 std::unique_ptr<JournalStore> store, uint64_t last_seq)
    : options_(options),
      store_(std::move(store)),
      last_seq_(last_seq),
      durable_seq_(last_seq),
      snapshot_seq_(0) {
  writer_ = std::thread([this] { WriterLoop(); });
}

Journal::~Journal() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
  }
  writer_.join();
  // notify_ (destroyed next) runs every callback posted.
}

absl::StatusOr<uint64_t> Journal::Append(uint16_t type, std::string payload) {
  if (type == kSnapshotType) {
    return absl::InvalidArgumentError(
        absl::StrCat("journal ", options_.path,
                     ": type 0 is the snapshot's; records use 1..65535"));
  }
  if (payload.size() > internal::kMaxPayloadBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "journal ", options_.path, ": a record of ", payload.size(),
        " bytes (at most ", internal::kMaxPayloadBytes, ")"));
  }
  absl::MutexLock lock(&mu_);
  if (!error_.ok()) return error_;
  if (last_seq_ >= internal::kMaxSeq) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "journal ", options_.path, ": no sequence number after ", last_seq_));
  }
  const uint64_t seq = ++last_seq_;
  pending_.push_back(JournalRecord{seq, type, std::move(payload)});
  ++stats_.appended;
  return seq;
}

uint64_t Journal::durable_seq() const {
  absl::MutexLock lock(&mu_);
  return durable_seq_;
}

uint64_t Journal::last_seq() const {
  absl::MutexLock lock(&mu_);
  return last_seq_;
}

uint64_t Journal::snapshot_seq() const {
  absl::MutexLock lock(&mu_);
  return snapshot_seq_;
}

JournalStats Journal::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::Status Journal::AwaitDurable(uint64_t seq, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (seq > last_seq_) {
    return absl::InvalidArgumentError(
        absl::StrCat("journal ", options_.path, ": record ", seq,
                     " was never appended (last is ", last_seq_, ")"));
  }
  auto settled = [this, seq]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return durable_seq_ >= seq || !error_.ok();
  };
  options_.clock->AwaitCondition(&mu_, absl::Condition(&settled), deadline);
  if (durable_seq_ >= seq) return absl::OkStatus();
  if (!error_.ok()) return error_;
  return absl::DeadlineExceededError(absl::StrCat(
      "journal ", options_.path, ": record ", seq,
      " not durable by the deadline (durable up to ", durable_seq_, ")"));
}

void Journal::OnDurable(uint64_t seq, std::function<void(absl::Status)> done) {
  absl::Status now;
  {
    absl::MutexLock lock(&mu_);
    if (seq > last_seq_) {
      now = absl::InvalidArgumentError(
          absl::StrCat("journal ", options_.path, ": record ", seq,
                       " was never appended (last is ", last_seq_, ")"));
    } else if (seq > durable_seq_ && error_.ok()) {
      // Appends are in seq order, so waiters almost always go at the end.
      auto at = std::upper_bound(
          waiters_.begin(), waiters_.end(), seq,
          [](uint64_t s, const Waiter& w) { return s < w.seq; });
      waiters_.insert(at, Waiter{seq, std::move(done)});
      return;
    } else {
      now = seq <= durable_seq_ ? absl::OkStatus() : error_;
    }
  }
  notify_.Post([done = std::move(done), now] { done(now); });
}

bool Journal::HasWorkLocked() const {
  return !pending_.empty() || !compactions_.empty() || closing_;
}

void Journal::WriterLoop() {
  while (true) {
    std::vector<JournalRecord> batch;
    std::vector<Compaction*> compactions;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &Journal::HasWorkLocked));
      if (pending_.empty() && compactions_.empty()) return;  // closing
      batch.swap(pending_);
      compactions.swap(compactions_);
      if (!error_.ok()) {
        // Nothing more is written after a failure; compactions get the error.
        for (Compaction* c : compactions) {
          c->status = error_;
          c->done = true;
        }
        continue;
      }
    }
    if (!batch.empty()) {
      std::vector<StoredRecord> stored;
      stored.reserve(batch.size());
      uint64_t bytes = 0;
      for (const JournalRecord& r : batch) {
        stored.push_back(StoredRecord{
            r.seq, internal::EncodeRecord(r.seq, r.type, r.payload)});
        bytes += stored.back().value.size();
      }
      absl::Status s = store_->Write(stored);
      absl::MutexLock lock(&mu_);
      FinishBatchLocked(batch.back().seq, s, bytes);
    }
    for (Compaction* c : compactions) RunCompaction(c);
  }
}

void Journal::FinishBatchLocked(uint64_t last, const absl::Status& status,
                                uint64_t bytes) {
  if (status.ok()) {
    durable_seq_ = last;
    ++stats_.synced_batches;
    stats_.bytes_written += bytes;
  } else {
    error_ = absl::Status(
        status.code(),
        absl::StrCat(status.message(), " (the journal stopped: records after ",
                     durable_seq_, " are not durable)"));
  }
  auto due = waiters_.begin();
  if (error_.ok()) {
    due =
        std::upper_bound(waiters_.begin(), waiters_.end(), durable_seq_,
                         [](uint64_t s, const Waiter& w) { return s < w.seq; });
  } else {
    due = waiters_.end();
  }
  std::vector<Waiter> ready(std::make_move_iterator(waiters_.begin()),
                            std::make_move_iterator(due));
  waiters_.erase(waiters_.begin(), due);
  absl::Status result = error_;
  if (!ready.empty()) {
    notify_.Post([ready = std::move(ready), result]() mutable {
      for (Waiter& w : ready) w.done(result);
    });
  }
}

void Journal::RunCompaction(Compaction* c) {
  {
    // Checked again here, in the order compactions run: a later snapshot
    // may have been written since Compact checked.
    absl::MutexLock lock(&mu_);
    if (!error_.ok() || c->upto <= snapshot_seq_) {
      c->status =
          !error_.ok()
              ? error_
              : absl::InvalidArgumentError(absl::StrCat(
                    "journal ", options_.path, ": cannot compact up to record ",
                    c->upto, ": the snapshot is already at ", snapshot_seq_));
      c->done = true;
      return;
    }
  }
  absl::Status s = store_->ReplacePrefix(StoredRecord{
      c->upto, internal::EncodeRecord(c->upto, kSnapshotType, c->snapshot)});
  absl::MutexLock lock(&mu_);
  if (s.ok()) {
    snapshot_seq_ = c->upto;
    ++stats_.compactions;
  }
  c->status = s;
  c->done = true;
}

absl::Status Journal::Compact(uint64_t upto, std::string snapshot) {
  Compaction c;
  c.upto = upto;
  c.snapshot = std::move(snapshot);
  absl::MutexLock lock(&mu_);
  if (!error_.ok()) return error_;
  if (upto <= snapshot_seq_ || upto > last_seq_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "journal ", options_.path, ": cannot compact up to record ", upto,
        ": it must be after the snapshot (", snapshot_seq_,
        ") and at most the last record (", last_seq_, ")"));
  }
  compactions_.push_back(&c);
  mu_.Await(absl::Condition(&c.done));
  return c.status;
}

}  // namespace plexus::journal
