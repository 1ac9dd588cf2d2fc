// Journal: the controller's crash-safe log of typed records, with group
// commit. A record is a small type tag and opaque bytes (the server's model
// encodes protobufs); each gets a sequence number (1, 2, 3, ...) when it is
// appended, and is durable once the batch holding it has been written and
// synced. Thread-safe: every method may be called from any thread.
//
//   Append ──▶ pending ──(group-commit thread: one write + one sync per
//                         batch)──▶ durable ──(Compact)──▶ in the snapshot
//
// Guarantees:
// - Append never blocks on the disk: it queues the record and returns its
//   sequence number. The group-commit thread ("journal-write") writes every
//   record queued since its last sync as one batch, and syncs once.
// - Durability is in sequence order: durable_seq() is n only once records
//   1..n are all on disk. After a crash (SIGKILL, power loss), Open replays
//   every record that was reported durable, in order, and perhaps some that
//   were appended but not yet reported.
// - Nothing untrusted is replayed: each record carries a CRC-32 over its
//   sequence number, type and bytes, and the sequence numbers must run
//   without a gap. Replay stops at the first record that fails either check
//   and says where and why (Replay::tail); that record and every one after it
//   are moved out of the journal (kept aside in the store, never replayed),
//   so appending resumes right after the last good record.
// - A durable callback (OnDurable) runs exactly once, on the journal's
//   notification thread ("journal-notify", never the group-commit thread
//   nor the caller's), with OK or the error that stopped the journal;
//   callbacks registered in sequence order run in that order.
// - Errors are sticky: once a write or sync fails, the journal accepts no
//   more records (Append returns the error), nothing after the last durable
//   record is ever reported durable, and every waiter gets the error, which
//   names the journal's path and what failed.
// - One process at a time: Open takes the store's exclusive lock, and a
//   second Open of the same path fails with FailedPrecondition.
//
// Storage: SQLite in WAL mode with synchronous=FULL, one file (the WAL
// beside it while open); src/plexus/journal/CMakeLists.txt says why SQLite.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "plexus/common/clock.h"
#include "plexus/common/serial_executor.h"

namespace plexus::journal {

namespace internal {
class JournalStore;
}

// The type tag of a snapshot record, written by Compact. Callers' records
// use tags 1..65535.
inline constexpr uint16_t kSnapshotType = 0;

struct JournalRecord {
  uint64_t seq = 0;
  uint16_t type = 0;
  std::string payload;
};

// What Open read back.
struct Replay {
  // In sequence order, contiguous. If the journal was compacted, the first
  // is the snapshot (type kSnapshotType), whose seq is the last record it
  // replaces.
  std::vector<JournalRecord> records;
  // OK if every stored record was good. Otherwise DataLoss naming the path,
  // the first bad record's sequence number, why it was not trusted
  // (checksum, truncated, gap, ...) and how many records were moved aside.
  absl::Status tail;
  // Records moved out of the journal because they came at or after the bad
  // one.
  uint64_t discarded = 0;
};

struct JournalOptions {
  // The journal's file, created if absent (its directory must exist).
  std::string path;
  // Deadlines of AwaitDurable are on this clock. Not owned.
  Clock* clock = Clock::Real();
};

struct JournalStats {
  uint64_t appended = 0;        // records appended since Open
  uint64_t synced_batches = 0;  // write + sync commits (one per batch)
  uint64_t bytes_written = 0;   // encoded record bytes written
  uint64_t compactions = 0;
};

class Journal {
 public:
  // Opens (or creates) the journal at options.path, replays what it holds
  // into *replay and starts the group-commit thread. Errors name the path:
  // InvalidArgument (empty path, null replay), FailedPrecondition (another
  // process has it open), DataLoss (the store itself is unreadable: not a
  // journal, or its file is corrupt beyond a record), Internal otherwise. A
  // bad record is not an error of Open: see Replay::tail.
  static absl::StatusOr<std::unique_ptr<Journal>> Open(
      const JournalOptions& options, Replay* replay);
  // The same over a given store (tests inject faults; the benchmark compares
  // backends). options.path is used in messages only.
  static absl::StatusOr<std::unique_ptr<Journal>> OpenWithStore(
      const JournalOptions& options,
      std::unique_ptr<internal::JournalStore> store, Replay* replay);

  // Writes and syncs everything appended, runs every callback, then closes.
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // Queues a record and returns its sequence number (one more than the
  // last). InvalidArgument for type kSnapshotType; the sticky error once the
  // journal has failed.
  absl::StatusOr<uint64_t> Append(uint16_t type, std::string payload);

  // The highest n such that records 1..n are durable (0: none yet, or the
  // seq of the snapshot a compacted journal opened with).
  uint64_t durable_seq() const;
  // The sequence number of the last record appended.
  uint64_t last_seq() const;
  // The sequence number of the snapshot the records start from (Compact;
  // 0: none). last_seq() == snapshot_seq(): nothing since the snapshot.
  uint64_t snapshot_seq() const;

  // Waits, on the options' clock, until record `seq` is durable: OK,
  // DeadlineExceeded (naming seq and the durable seq reached), the sticky
  // error, or InvalidArgument for a seq never appended.
  absl::Status AwaitDurable(uint64_t seq, absl::Time deadline);
  // Runs `done` on the notification thread once record `seq` is durable
  // (OK) or the journal has failed first (its error). A seq already durable
  // runs `done` soon, still on that thread. InvalidArgument (to `done`) for
  // a seq never appended.
  void OnDurable(uint64_t seq, std::function<void(absl::Status)> done);

  // Replaces records 1..upto (or the previous snapshot and the records up
  // to `upto`) by one snapshot record with sequence number `upto`, whose
  // payload is `snapshot` (the caller's state after applying record upto).
  // Returns once that is synced. Appends go on meanwhile; records after
  // `upto` are kept. InvalidArgument if upto is not after the current
  // snapshot or is past last_seq(); the sticky error otherwise.
  absl::Status Compact(uint64_t upto, std::string snapshot);

  JournalStats stats() const;
  const std::string& path() const { return options_.path; }

 private:
  struct Compaction {
    uint64_t upto = 0;
    std::string snapshot;
    bool done = false;
    absl::Status status;
  };
  struct Waiter {
    uint64_t seq;
    std::function<void(absl::Status)> done;
  };

  Journal(const JournalOptions& options,
          std::unique_ptr<internal::JournalStore> store, uint64_t last_seq);
  void WriterLoop();
  bool HasWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a batch: records the new durable seq (or the error) and hands the
  // callbacks that are now due to the notification thread.
  void FinishBatchLocked(uint64_t last, const absl::Status& status,
                         uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunCompaction(Compaction* compaction);

  const JournalOptions options_;
  const std::unique_ptr<internal::JournalStore> store_;  // writer thread's

  // State shared between callers and the group-commit thread.
  mutable absl::Mutex mu_;
  std::vector<JournalRecord> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<Compaction*> compactions_ ABSL_GUARDED_BY(mu_);
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);  // seq ascending
  uint64_t last_seq_ ABSL_GUARDED_BY(mu_);
  uint64_t durable_seq_ ABSL_GUARDED_BY(mu_);
  uint64_t snapshot_seq_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);  // sticky
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  JournalStats stats_ ABSL_GUARDED_BY(mu_);

  // Declared after the state they use: destroyed first (the destructor
  // joins the writer; the executor then runs what was posted).
  SerialExecutor notify_{"journal-notify"};
  std::thread writer_;
};

}  // namespace plexus::journal
