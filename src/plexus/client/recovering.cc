// What a client's reads do when the server recovers from a lost host
// (proto::Recovery; ClientSession records it, session_recovery.cc): values
// recomputed under new ids are read under those, lost values say so, and
// reads that failed because of the loss run again.
#include <algorithm>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "plexus/client/client.h"
#include "plexus/client/client_core.h"
#include "plexus/common/status_proto.h"

namespace plexus {
namespace {

// Reads go again at most this many times (each after a loss was heard).
constexpr int kMaxRetries = 4;
// How long a read that failed as a host was lost waits for the server's
// word on it beyond the server's spare wait (the server sends it as it
// declares the host down, or once a slice that waited for a host to take
// its place is remapped or breaks).
constexpr absl::Duration kLossNoteWait = absl::Seconds(5);
// How long a read a worker answered "released" (the value moved by a
// resize the server decided, whose note the client may not have applied
// yet) waits for a note before it reads again.
constexpr absl::Duration kMoveNoteWait = absl::Seconds(2);

}  // namespace

// ---------------------------------------------------------------- reads

namespace {

// Whether `s` is how a read fails when a host it needed is lost.
bool LostHost(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable;
}

}  // namespace

// Runs `attempt` until it succeeds, fails for another reason than a lost
// host, or the loss is settled: the server's note says what became of the
// futures (recovered: read again; lost: DATA_LOSS; broken slice: DATA_LOSS
// naming the host).
// Why none of `futures` can be read any more after a loss: lost, or on a
// slice that no spare replaced; OK if they may be read again.
static absl::Status Settled(ClientSession& session,
                            const std::vector<const Future*>& futures,
                            const absl::Status& failure) {
  for (const Future* f : futures) {
    // Made in a session that ended: the server freed it with the session.
    if (absl::Status s = session.SessionStatus(f->epoch(), f->buffer_id());
        !s.ok()) {
      return s;
    }
    absl::Status lost = session.LostStatus(f->buffer_id());
    if (!lost.ok()) return lost;
    if (!failure.ok() && session.SliceBroken(f->slice()->id())) {
      return absl::DataLossError(
          absl::StrCat(failure.message(), " (slice ", f->slice()->id(),
                       " lost that host and no spare took its place)"));
    }
  }
  return absl::OkStatus();
}

// Runs `attempt` until it succeeds, fails for another reason than a lost
// host, or the loss is settled: the server's note says what became of the
// futures (recovered: read again, under their new ids and places; lost or
// on a broken slice: DATA_LOSS). The wait for the note ends at `deadline`
// too (a wait's timeout, on the client's clock): DEADLINE_EXCEEDED then.
template <typename Attempt>
static absl::Status Recovering(ClientSession& session,
                               const std::vector<const Future*>& futures,
                               Attempt attempt,
                               absl::Time deadline = absl::InfiniteFuture()) {
  if (absl::Status lost = Settled(session, futures, absl::OkStatus());
      !lost.ok()) {
    return lost;
  }
  for (int tries = 1;; ++tries) {
    const int64_t heard = session.losses_heard();
    const int64_t resumes = session.resumes();
    const int64_t notes = session.notes_heard();
    absl::Status s = attempt();
    if (IsReleasedOnWorker(s) && tries < kMaxRetries) {
      // Read where the value was: it moved (the note says where to, and
      // the read resolves it again), or is made again under its id (a
      // server restart's calls sent again): read again either way.
      session.AwaitNote(notes, kMoveNoteWait, deadline);
      // The note may say where it went: lost, or parked in files.
      if (absl::Status settled = Settled(session, futures, s); !settled.ok()) {
        return settled;
      }
      if (session.Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "the wait's timeout passed while the client waited for the "
            "server's word on a value that moved (",
            s.message(), ")"));
      }
      continue;
    }
    if (s.ok() || !LostHost(s)) return s;
    if (IsServerWentAway(s) && tries < kMaxRetries) {
      // A worker saw the server go before this client did (its stream
      // broke first) and failed what it had pending. The next server
      // resumes the session and routes again what the value needs: wait
      // for this session to see the end (Settled waits for the resume),
      // then read again.
      const bool gone = session.AwaitServerGone(
          resumes, session.reconnect_timeout(), deadline);
      if (absl::Status settled = Settled(session, futures, s); !settled.ok()) {
        return settled;
      }
      if (session.resumes() != resumes) continue;
      if (session.Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "the wait's timeout passed while the client waited for its "
            "session to see the server go (",
            s.message(), ")"));
      }
      if (!gone) {
        return absl::UnavailableError(
            absl::StrCat(s.message(),
                         "; this client's session with the server stayed "
                         "whole for ",
                         absl::FormatDuration(session.reconnect_timeout()),
                         " after (only the worker's stream to it broke?)"));
      }
      continue;
    }
    if (absl::Status settled = Settled(session, futures, s); !settled.ok()) {
      return settled;
    }
    // Its server went away and the next resumed the session meanwhile
    // (Settled waited for that): read again.
    if (session.resumes() != resumes && tries < kMaxRetries) continue;
    // The read may have raced the server's note on the loss.
    if (tries >= kMaxRetries) return s;
    if (session.losses_heard() == heard &&
        !session.AwaitLoss(heard, kLossNoteWait + session.spare_wait(),
                           deadline)) {
      if (session.Now() < deadline) return s;
      return absl::DeadlineExceededError(absl::StrCat(
          "the wait's timeout passed while the client waited for the "
          "server's word on a lost host (",
          s.message(), ")"));
    }
    if (absl::Status settled = Settled(session, futures, s); !settled.ok()) {
      return settled;
    }
  }
}

absl::Status Client::Snapshot(const std::vector<Future>& futures) {
  if (absl::Status open = core_->session().CheckOpen(); !open.ok()) return open;
  std::vector<proto::ClientOp> ops;
  const uint64_t epoch = core_->session().epoch();
  for (const Future& f : futures) {
    if (!f.valid()) return absl::InvalidArgumentError("empty future");
    // OK only for the open session's futures (`epoch`, unless it has just
    // ended, when Enqueue drops the ops).
    if (absl::Status s =
            core_->session().SessionStatus(f.epoch(), f.buffer_id());
        !s.ok()) {
      return s;
    }
    ops.emplace_back().set_snapshot(f.buffer_id());
  }
  core_->session().Enqueue(std::move(ops), epoch);
  return absl::OkStatus();
}

namespace {

// The client's timeline event of a fetch or wait of `future` (its first,
// for a wait on many), made to returned.
class ClientRequestEvent {
 public:
  ClientRequestEvent(ClientCore& core, EventKind kind, const Future& future)
      : scoped_(&core.timeline(), kind) {
    scoped_.event.client_id = core.client_id();
    scoped_.event.buffer_id = future.buffer_id();
    if (kind == EventKind::kFetch) {
      scoped_.event.bytes = static_cast<int64_t>(future.spec().byte_size());
    }
  }
  absl::Status Done(absl::Status status) {
    scoped_.event.failed = !status.ok();
    scoped_.Done();
    return status;
  }

 private:
  ScopedEvent scoped_;
};

}  // namespace

std::optional<RecoverySummary> Client::LastRecovery() const {
  return core_->session().LastRecovery();
}

absl::Status Client::Fetch(const Future& future, void* dst,
                           TransferProgress* progress) {
  if (!future.valid()) return absl::InvalidArgumentError("empty future");
  ClientRequestEvent fetch(*core_, EventKind::kFetch, future);
  core_->session().NoteWaited();
  return fetch.Done(Recovering(core_->session(), {&future}, [&] {
    return FetchOnce(future, dst, progress);
  }));
}

absl::Status Client::Wait(const Future& future) {
  if (!future.valid()) return absl::InvalidArgumentError("empty future");
  ClientRequestEvent wait(*core_, EventKind::kWait, future);
  core_->session().NoteWaited();
  return wait.Done(Recovering(core_->session(), {&future},
                              [&] { return WaitOnce(future); }));
}

absl::Status Client::WaitMany(const std::vector<Future>& futures,
                              absl::Time deadline) {
  std::vector<const Future*> all;
  for (const Future& f : futures) {
    if (!f.valid()) return absl::InvalidArgumentError("empty future");
    all.push_back(&f);
  }
  if (futures.empty()) {
    return Recovering(
        core_->session(), all, [&] { return WaitManyOnce(futures, deadline); },
        deadline);
  }
  ClientRequestEvent wait(*core_, EventKind::kWait, futures.front());
  core_->session().NoteWaited();
  return wait.Done(Recovering(
      core_->session(), all, [&] { return WaitManyOnce(futures, deadline); },
      deadline));
}

}  // namespace plexus
