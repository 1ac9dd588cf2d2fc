// Where ClusterState writes the changes a restart cannot get back from its
// workers and clients (proto/model_journal.proto): workers, clients,
// slices, programs and the server's ids. Calls and buffers are not
// journaled: after a restart, workers give back what they hold
// (RegisterWorker.inventory) and clients what they still hold and what
// they sent that may not have run (LiveBuffers, ClientToServer.resent).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "plexus/journal/journal.h"
#include "plexus/proto/model_journal.pb.h"

namespace plexus {

// The journal's type tag of a ModelRecord.
inline constexpr uint16_t kModelRecordType = 1;

class ModelJournalSink {
 public:
  virtual ~ModelJournalSink() = default;
  // Called under the model's lock, in the order of the changes: queues the
  // record and returns (never waits for the disk).
  virtual void Record(const proto::ModelRecord& change) = 0;
};

// The sink over a crash-safe journal (journal/journal.h): one record per
// change, written and synced by the journal's group-commit thread.
// A failed append is logged once and counted; the journal's error is
// sticky (JournalSink::status).
class JournalSink final : public ModelJournalSink {
 public:
  explicit JournalSink(journal::Journal* journal) : journal_(journal) {}
  void Record(const proto::ModelRecord& change) override;
  // Each record appended is also given to `tee` (serialized), in order,
  // under the same lock: a standby's feed (standby/journal_feed.h). Null:
  // none.
  void set_tee(std::function<void(std::string)> tee) { tee_ = std::move(tee); }
  // OK, or the first append error.
  absl::Status status() const { return status_; }
  int64_t records() const { return records_; }

 private:
  journal::Journal* journal_;  // not owned
  absl::Status status_;
  int64_t records_ = 0;
  std::function<void(std::string)> tee_;
};

// The ModelRecords of a replayed journal, in order: InvalidArgument naming
// the sequence number of a record of another type or one that does not
// parse.
absl::StatusOr<std::vector<proto::ModelRecord>> ModelRecordsOf(
    const journal::Replay& replay);

}  // namespace plexus
