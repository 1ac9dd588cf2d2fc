// The pure pieces of a client's reconnect to its server: what the client
// records of a session that ended, the errors that say what was lost with
// it, and how a program's XLA islands follow a slice granted again. No
// threads, no I/O; ClientCore (client_session.cc) drives them.
//
// A client's life, one session after another (ClientCore::SessionLoop):
//
//   Init ──▶ kOpen ──stream breaks──▶ kReconnecting ──new session──▶ kOpen
//              │                        │   (back-off; slices asked for
//              │                        │    again, programs registered
//              │                        │    again, then kOpen)
//              │                        └─ reconnect_timeout passed, or
//              │                           refused ──▶ kGaveUp
//              └─ Close() (from any state) ──▶ kClosed
//
// Every session has an epoch (1, 2, ...). A future belongs to the session
// that made it: the server's records and the workers' buffers of a session
// go when it ends (ClientGone), so a future of an ended session reads as
// lost (LostWithSession), never as a wait for a value nobody will make.
// Slices and programs are the client's own descriptions and outlive a
// session: they are asked for and registered again in the next one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "plexus/common/backoff.h"
#include "plexus/proto/plexus.pb.h"

namespace plexus {

// The payload that marks a status as "lost with an ended session"
// (DATA_LOSS): the Python binding raises plexus.ServerRestartedError for it.
inline constexpr char kSessionLostPayload[] = "plexus.dev/session-lost";

enum class SessionState { kOpen, kReconnecting, kGaveUp, kClosed };

// The states above as plain data: what each event does, what a use that
// waits for a session finds, and when the reconnect tries again or gives
// up. The caller passes the time. Not thread-safe: ClientCore holds one
// under its lock.
class SessionMachine {
 public:
  // What a use waiting for a session finds now.
  enum class Use { kOpen, kWait, kClosed, kGaveUp };

  // Reconnect attempts: the first at once, then 0.1 s doubling to 2 s
  // apart, none once `reconnect_timeout` has passed since the end (zero:
  // the client never reconnects).
  explicit SessionMachine(absl::Duration reconnect_timeout);
  // The longest wait between attempts (2 s; common/address.h RetryCapFor
  // for a server list).
  void SetRetryCap(absl::Duration cap);

  SessionState state() const { return state_; }
  // The current session's stream broke (a write failed, or its reader saw
  // it end); until the next Installed().
  bool broken() const { return broken_; }
  // kOpen with a stream that is not broken.
  bool usable() const;
  Use use() const;
  absl::Time give_up_at() const { return give_up_at_; }

  // A session's stream is up: the first one is open; a reconnect's stays
  // kReconnecting until Restored().
  void Installed();
  void StreamBroke();
  // The session ended at `now` (its reader saw the stream end), not by
  // Close(): kReconnecting until now + reconnect_timeout, or kGaveUp when
  // that is zero. Returns the new state.
  SessionState Ended(absl::Time now);
  // The reconnect's restore finished: kOpen, if still reconnecting on a
  // stream that is not broken.
  void Restored();
  // An attempt failed at `now`: the delay before the next one (never past
  // the give-up time), or nullopt when the reconnect must give up.
  std::optional<absl::Duration> AttemptFailed(absl::Time now);
  // When an attempt that starts at `now` must end: 2 s at most, and never
  // past the give-up time.
  absl::Time AttemptDeadline(absl::Time now) const;
  void GiveUp();  // kGaveUp, unless closed
  void Close();   // kClosed, from any state, for good

 private:
  const absl::Duration reconnect_timeout_;
  SessionState state_ = SessionState::kOpen;
  bool broken_ = false;
  absl::Time give_up_at_ = absl::InfiniteFuture();
  std::optional<Backoff> backoff_;  // always set (SetRetryCap replaces it)
};

// One session that ended, as the client records it.
struct SessionEnd {
  uint64_t epoch = 0;
  uint64_t client_id = 0;
  std::string address;
  absl::Time ended;
  std::string reason;        // why the stream ended, as gRPC said
  int64_t lost_futures = 0;  // futures of the session alive when it ended
  // Set once the next session opened (and its restore finished).
  bool reconnected = false;
  // The next server resumed this session (it keeps a journal): its ids,
  // slices, programs and the futures whose values the workers kept stand.
  bool resumed = false;
  uint64_t new_client_id = 0;
  absl::Time reconnected_at;
  int attempts = 0;  // connection attempts it took
  int slices_restored = 0;
  int slices_lost = 0;
  int programs_restored = 0;
  int programs_lost = 0;
  // Set when the client stopped trying (reconnect_timeout, or a refusal),
  // or kNoReconnect when it never tries.
  std::string gave_up;
};

// SessionEnd::gave_up of a client whose reconnect_timeout is zero.
inline constexpr char kNoReconnect[] = "reconnect_timeout is 0";

// The error a use of buffer `buffer_id` (0: none named) of ended session
// `end` gets: DATA_LOSS carrying kSessionLostPayload, naming the server,
// the buffer, how many futures went with the session, and what the client
// did next.
absl::Status LostWithSession(const SessionEnd& end, uint64_t buffer_id);

// Where a use of session `epoch`'s values stands on the client's records:
// `current` is the open (or last) session's epoch, `broken` whether its
// stream broke, `ends` the ends recorded, oldest first. A resumed session
// keeps its epoch, so several ends may name one epoch: the last one speaks.
struct EpochStanding {
  enum Kind {
    kUsable,  // the open session's, its stream whole
    // The open session's stream broke (a write failed) and its reader has
    // not yet recorded the end (ClientSession::EndedLocked): wait for it.
    // An end recorded before, of a break the next server resumed, says
    // nothing about this one.
    kEndDue,
    kEnded,  // `end` is the last end recorded for the epoch (null: none)
  };
  Kind kind = kUsable;
  const SessionEnd* end = nullptr;
};
EpochStanding StandingOf(uint64_t epoch, uint64_t current, bool broken,
                         const std::vector<SessionEnd>& ends);

// The log line (and the gist of the Python record) for `end`: what was
// lost and what the reconnect restored.
std::string DescribeSessionEnd(const SessionEnd& end);

// The error of an operation that waited `waited` for a session while the
// client was reconnecting to `address` (UNAVAILABLE), naming the server,
// how long it waited and when the client gives up.
absl::Status WaitedForServer(const std::string& address, absl::Time ended,
                             absl::Duration waited, absl::Time give_up,
                             absl::Time now);

// Whether a failed attempt to open a session means the server will refuse
// every next one too (another protocol version, a tenant it does not
// admit, options it rejects): the client gives up at once instead of
// retrying. Not for a server that is not there or not answering yet.
bool RefusedForGood(const absl::Status& attempt);

// An XLA program's islands name the workers that run them (and their
// device indices, baked into its compile options). Rewrites `xla`'s
// workers from slice map `before` to `after` (the same slice granted in
// the next session): each island's worker becomes the worker that holds,
// in `after`, the virtual devices it held in `before`. Fails
// (FAILED_PRECONDITION, saying what differs) when those devices are not
// on one worker with the same device indices, as the compile options
// need: the program must be compiled again.
absl::Status RebindIslands(const proto::SliceInfo& before,
                           const proto::SliceInfo& after,
                           proto::XlaProgram* xla);

}  // namespace plexus
