// ServerImpl: the journal (ServerOptions::journal_path) — opened and
// replayed at Init, compacted as it grows — and the resume of the workers
// and client sessions of the run before a restart
// (server/model/model_journal.h, ClusterState's restart part).
#include "absl/strings/str_cat.h"
#include "plexus/common/logging.h"
#include "plexus/server/service/internal/server_impl.h"

namespace plexus {

absl::Status ServerImpl::OpenJournal() {
  if (options_.journal_path.empty()) return absl::OkStatus();
  journal::Replay replay;
  absl::StatusOr<std::unique_ptr<journal::Journal>> opened =
      journal::Journal::Open(
          {.path = options_.journal_path, .clock = options_.clock}, &replay);
  if (!opened.ok()) return opened.status();
  journal_ = *std::move(opened);
  if (!replay.tail.ok()) {
    // What was durable is there; what came after a torn write is not
    // trusted, and was set aside in the store.
    SPDLOG_WARN("journal {}: {}", options_.journal_path,
                replay.tail.ToString());
  }
  absl::StatusOr<std::vector<proto::ModelRecord>> records =
      ModelRecordsOf(replay);
  if (!records.ok()) {
    return absl::DataLossError(absl::StrCat("journal ", options_.journal_path,
                                            ": ", records.status().message()));
  }
  absl::MutexLock lock(&mu_);
  for (const proto::ModelRecord& r : *records) {
    if (absl::Status s = state_.Restore(r); !s.ok()) {
      return absl::DataLossError(
          absl::StrCat("journal ", options_.journal_path, ": ", s.message()));
    }
  }
  state_.FinishRestore();
  if (!records->empty()) {
    resume_until_ = options_.clock->Now() + options_.resume_wait;
    int sessions = 0;
    for (const auto& [id, c] : state_.clients()) sessions += c.away ? 1 : 0;
    SPDLOG_INFO(
        "restarted on journal {} ({} records): {} worker(s) and {} client "
        "session(s) of the last run have {} to come back",
        options_.journal_path, records->size(), state_.AwayWorkers().size(),
        sessions, absl::FormatDuration(options_.resume_wait));
  } else {
    SPDLOG_INFO("journal {}: empty, a fresh start", options_.journal_path);
  }
  journal_sink_ = std::make_unique<JournalSink>(journal_.get());
  state_.set_journal(journal_sink_.get());
  // The journal starts every run as one snapshot: it holds what the model
  // holds, not its history. One that is a snapshot and nothing after (a
  // server killed again before it appended anything) is one already.
  if (journal_->last_seq() > journal_->snapshot_seq()) {
    const proto::ModelSnapshot snapshot = state_.SnapshotRecords();
    if (absl::Status s = journal_->Compact(journal_->last_seq(),
                                           snapshot.SerializeAsString());
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

void ServerImpl::AwaitJournalLocked() {
  if (journal_ == nullptr) return;
  const uint64_t last = journal_->last_seq();
  if (journal_->durable_seq() < last) {
    absl::Status s =
        journal_->AwaitDurable(last, options_.clock->Now() + absl::Seconds(30));
    if (!s.ok()) {
      SPDLOG_ERROR(
          "journal {}: a change is not durable ({}); a restart will not get "
          "it back",
          options_.journal_path, s.ToString());
    }
  }
  AwaitStandbyLocked();
}

void ServerImpl::MaybeCompactJournal() {
  if (journal_ == nullptr) return;
  uint64_t upto;
  std::string snapshot;
  {
    absl::MutexLock lock(&mu_);
    if (journal_sink_->records() - compacted_at_ <
        options_.journal_compact_every) {
      return;
    }
    compacted_at_ = journal_sink_->records();
    // Every record is appended under mu_: the snapshot is the model after
    // the last of them.
    upto = journal_->last_seq();
    snapshot = state_.SnapshotRecords().SerializeAsString();
  }
  if (absl::Status s = journal_->Compact(upto, std::move(snapshot)); !s.ok()) {
    SPDLOG_ERROR("journal {}: compaction failed: {}", options_.journal_path,
                 s.ToString());
    return;
  }
  SPDLOG_INFO("journal {}: compacted up to record {}", options_.journal_path,
              upto);
}

void ServerImpl::EndResumeWait() {
  std::vector<int64_t> away;
  std::vector<uint64_t> sessions;
  {
    absl::MutexLock lock(&mu_);
    if (resume_until_ == absl::InfinitePast() ||
        options_.clock->Now() < resume_until_) {
      return;
    }
    resume_until_ = absl::InfinitePast();
    away = state_.AwayWorkers();
    // Sessions that resume meanwhile wait until these are lost and their
    // slices remapped (ResumeSessionLocked): routed onto a host about to
    // be lost, their work would be routed again at each loss.
    ending_resume_wait_ = !away.empty();
    for (int64_t id : away) state_.EndAway(id);
    for (const auto& [id, c] : state_.clients()) {
      if (c.away) sessions.push_back(id);
    }
  }
  const std::string why = absl::StrCat(
      "did not come back within ", absl::FormatDuration(options_.resume_wait),
      " (--resume-wait-s) after the server restarted");
  for (int64_t id : away) {
    WorkerDown(id, absl::StrCat("worker ", id, " ", why));
  }
  absl::MutexLock lock(&mu_);
  ending_resume_wait_ = false;
  for (uint64_t id : sessions) {
    SPDLOG_WARN("client {}'s session {}: it ends, its slices are freed", id,
                why);
    state_.RemoveClient(id);
    proto::WorkerOp gone;
    gone.mutable_client_gone()->set_client_id(id);
    for (const auto& [wid, w] : state_.workers()) {
      if (w.alive) scheduler_.Send(wid, gone);
    }
  }
  if (!sessions.empty()) AnswerSlicesLocked();
}

absl::Status ServerImpl::ResumeSessionLocked(const proto::ClientToServer& msg,
                                             const std::string& tenant,
                                             uint64_t id) {
  const std::string& proof = msg.resume_credential();
  if (!secret_.Verify(CredentialRole::kClient, absl::StrCat(id),
                      reinterpret_cast<const uint8_t*>(proof.data()),
                      proof.size())) {
    return absl::PermissionDeniedError(absl::StrCat(
        "resume of client ", id, ": the credential does not match"));
  }
  const ClientRecord* c = state_.FindClient(id);
  if (c != nullptr && c->tenant != tenant) {
    return absl::PermissionDeniedError(
        absl::StrCat("resume of client ", id, ": it was tenant '", c->tenant,
                     "', not '", tenant, "'"));
  }
  if (absl::Status s = state_.ResumeClient(id); !s.ok()) return s;
  // Its work needs its slices' hosts: wait for them, or for the end of the
  // resume wait (EndResumeWait), which loses those that did not come back
  // and remaps their slices onto spares. Until that is done: a session
  // that went on when the wait's time was up, before the liveness check
  // had lost them, routed its first calls onto those hosts, and each loss
  // then routed them again (a slice's unpark read its files twice: the
  // second read failed). The deadline only guards a liveness check that
  // never comes.
  auto ready = [this, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return shutdown_ || (!state_.WaitsForWorkers(id) && !ending_resume_wait_);
  };
  const absl::Time until = std::max(resume_until_, options_.clock->Now()) +
                           LivenessCheckPeriod(options_) * 2 +
                           absl::Seconds(30);
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready), until)) {
    SPDLOG_WARN(
        "client {} resumes while worker(s) of its slices are still away", id);
  }
  return absl::OkStatus();
}

}  // namespace plexus
