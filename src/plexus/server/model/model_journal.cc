#include "plexus/server/model/model_journal.h"

#include "absl/strings/str_cat.h"
#include "plexus/common/logging.h"

namespace plexus {

void JournalSink::Record(const proto::ModelRecord& change) {
  if (!status_.ok()) return;
  std::string bytes = change.SerializeAsString();
  absl::StatusOr<uint64_t> seq = journal_->Append(kModelRecordType, bytes);
  if (!seq.ok()) {
    status_ = seq.status();
    SPDLOG_ERROR(
        "the journal takes no more records ({}): a restart of this server "
        "will not get back what changed from here on",
        status_.ToString());
    return;
  }
  ++records_;
  if (tee_) tee_(std::move(bytes));
}

absl::StatusOr<std::vector<proto::ModelRecord>> ModelRecordsOf(
    const journal::Replay& replay) {
  std::vector<proto::ModelRecord> out;
  for (const journal::JournalRecord& r : replay.records) {
    if (r.type == journal::kSnapshotType) {
      proto::ModelSnapshot snapshot;
      if (!snapshot.ParseFromString(r.payload)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "journal record ", r.seq, ": a snapshot that does not parse"));
      }
      for (proto::ModelRecord& m : *snapshot.mutable_records()) {
        out.push_back(std::move(m));
      }
      continue;
    }
    if (r.type != kModelRecordType) {
      return absl::InvalidArgumentError(
          absl::StrCat("journal record ", r.seq, ": type ", r.type,
                       " is not a model record (", kModelRecordType, ")"));
    }
    if (!out.emplace_back().ParseFromString(r.payload)) {
      return absl::InvalidArgumentError(
          absl::StrCat("journal record ", r.seq, ": does not parse"));
    }
  }
  return out;
}

}  // namespace plexus
