#include "plexus/client/reconnect.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace plexus {
namespace {

std::string Seconds(absl::Duration d) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", absl::ToDoubleSeconds(d));
  return text;
}

std::string Plural(int64_t n, const char* one, const char* many) {
  return absl::StrCat(n, " ", n == 1 ? one : many);
}

// What became of the client after `end`, for messages.
std::string Aftermath(const SessionEnd& end) {
  if (end.reconnected) {
    std::string out =
        absl::StrCat("the client reconnected as client ", end.new_client_id,
                     " after ", Seconds(end.reconnected_at - end.ended));
    const int slices = end.slices_restored + end.slices_lost;
    const int programs = end.programs_restored + end.programs_lost;
    if (slices + programs > 0) {
      absl::StrAppend(&out, " and restored ", end.slices_restored, " of ",
                      Plural(slices, "slice", "slices"), " and ",
                      end.programs_restored, " of ",
                      Plural(programs, "program", "programs"));
    }
    return out;
  }
  if (end.gave_up == kNoReconnect) {
    return absl::StrCat("the client does not reconnect (", kNoReconnect,
                        "); connect again");
  }
  if (!end.gave_up.empty()) {
    return absl::StrCat("the client gave up reconnecting: ", end.gave_up,
                        "; connect again");
  }
  return "the client is reconnecting";
}

BackoffOptions ReconnectBackoff() {
  BackoffOptions options;
  options.initial = absl::Milliseconds(100);
  options.multiplier = 2.0;
  options.cap = absl::Seconds(2);
  options.give_up_after = absl::ZeroDuration();  // the machine's give_up_at
  return options;
}

}  // namespace

SessionMachine::SessionMachine(absl::Duration reconnect_timeout)
    : reconnect_timeout_(reconnect_timeout) {
  backoff_.emplace(ReconnectBackoff());
}

void SessionMachine::SetRetryCap(absl::Duration cap) {
  BackoffOptions options = ReconnectBackoff();
  options.cap = cap;
  backoff_.emplace(options);
}

bool SessionMachine::usable() const {
  return state_ == SessionState::kOpen && !broken_;
}

SessionMachine::Use SessionMachine::use() const {
  switch (state_) {
    case SessionState::kOpen:
      // A write that failed marks the stream before the reader sees it
      // end and the state moves on.
      return broken_ ? Use::kWait : Use::kOpen;
    case SessionState::kReconnecting:
      return Use::kWait;
    case SessionState::kGaveUp:
      return Use::kGaveUp;
    case SessionState::kClosed:
      return Use::kClosed;
  }
  return Use::kClosed;
}

void SessionMachine::Installed() { broken_ = false; }

void SessionMachine::StreamBroke() { broken_ = true; }

SessionState SessionMachine::Ended(absl::Time now) {
  broken_ = true;
  if (state_ == SessionState::kClosed || state_ == SessionState::kGaveUp) {
    return state_;
  }
  if (reconnect_timeout_ <= absl::ZeroDuration()) {
    state_ = SessionState::kGaveUp;
    return state_;
  }
  state_ = SessionState::kReconnecting;
  give_up_at_ = now + reconnect_timeout_;
  backoff_->Reset();
  return state_;
}

void SessionMachine::Restored() {
  if (state_ == SessionState::kReconnecting && !broken_) {
    state_ = SessionState::kOpen;
  }
}

std::optional<absl::Duration> SessionMachine::AttemptFailed(absl::Time now) {
  if (state_ != SessionState::kReconnecting || now >= give_up_at_) {
    return std::nullopt;
  }
  std::optional<absl::Duration> delay = backoff_->NextDelay(now);
  if (!delay.has_value()) return std::nullopt;
  return std::min(*delay, give_up_at_ - now);
}

absl::Time SessionMachine::AttemptDeadline(absl::Time now) const {
  return std::min(now + absl::Seconds(2), give_up_at_);
}

void SessionMachine::GiveUp() {
  if (state_ != SessionState::kClosed) state_ = SessionState::kGaveUp;
}

void SessionMachine::Close() { state_ = SessionState::kClosed; }

EpochStanding StandingOf(uint64_t epoch, uint64_t current, bool broken,
                         const std::vector<SessionEnd>& ends) {
  if (epoch == current && !broken) return {EpochStanding::kUsable};
  const SessionEnd* last = nullptr;
  for (auto it = ends.rbegin(); it != ends.rend(); ++it) {
    if (it->epoch == epoch) {
      last = &*it;
      break;
    }
  }
  if (epoch == current && (last == nullptr || last->resumed)) {
    return {EpochStanding::kEndDue};
  }
  return {EpochStanding::kEnded, last};
}

absl::Status LostWithSession(const SessionEnd& end, uint64_t buffer_id) {
  std::string what = buffer_id == 0
                         ? std::string("a value of the session was lost")
                         : absl::StrCat("buffer ", buffer_id, " was lost");
  absl::Status s = absl::DataLossError(absl::StrCat(
      "the server at ", end.address, " restarted or went away (",
      end.reason.empty() ? "the stream ended" : end.reason, "): ", what,
      " with client ", end.client_id, "'s session (",
      Plural(end.lost_futures, "live future", "live futures"),
      " in all: the server and workers free a session's buffers when it "
      "ends); ",
      Aftermath(end),
      ". Compute it again, or put it again from a copy of your own"));
  s.SetPayload(kSessionLostPayload, absl::Cord(absl::StrCat(end.epoch)));
  return s;
}

std::string DescribeSessionEnd(const SessionEnd& end) {
  if (end.resumed) {
    return absl::StrCat(
        "client ", end.client_id, "'s session with the server at ", end.address,
        " ended (", end.reason.empty() ? "the stream ended" : end.reason,
        ") and was resumed by the next server after ",
        Seconds(end.reconnected_at - end.ended), " (",
        Plural(end.attempts, "attempt", "attempts"), "): its ",
        Plural(end.lost_futures, "live future stands", "live futures stand"),
        " where the workers kept their values");
  }
  std::string out = absl::StrCat(
      "client ", end.client_id, "'s session with the server at ", end.address,
      " ended (", end.reason.empty() ? "the stream ended" : end.reason,
      "): its ",
      Plural(end.lost_futures, "live future was", "live futures were"),
      " lost; ", Aftermath(end));
  if (end.reconnected) {
    absl::StrAppend(&out, " (", Plural(end.attempts, "attempt", "attempts"),
                    ")");
  }
  return out;
}

absl::Status WaitedForServer(const std::string& address, absl::Time ended,
                             absl::Duration waited, absl::Time give_up,
                             absl::Time now) {
  return absl::UnavailableError(absl::StrCat(
      "the server at ", address, " is unreachable: waited ", Seconds(waited),
      " for the client to reconnect (the session ended ", Seconds(now - ended),
      " ago; it keeps trying for ",
      Seconds(std::max(give_up - now, absl::ZeroDuration())), " more)"));
}

bool RefusedForGood(const absl::Status& attempt) {
  switch (attempt.code()) {
    case absl::StatusCode::kFailedPrecondition:  // protocol version
    case absl::StatusCode::kPermissionDenied:    // tenant, credentials
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kInvalidArgument:  // the client's own options
      return true;
    default:
      return false;
  }
}

absl::Status RebindIslands(const proto::SliceInfo& before,
                           const proto::SliceInfo& after,
                           proto::XlaProgram* xla) {
  if (before.devices_size() != after.devices_size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the slice has ", after.devices_size(),
                     " devices now, not ", before.devices_size()));
  }
  // Each old worker's virtual devices, in slice order.
  std::map<int64_t, std::vector<int>> positions;
  for (int j = 0; j < before.devices_size(); ++j) {
    positions[before.devices(j).worker_id()].push_back(j);
  }
  // Old worker -> new worker, each checked once.
  std::map<int64_t, int64_t> to;
  for (const auto& [worker, js] : positions) {
    const int64_t now = after.devices(js[0]).worker_id();
    for (int j : js) {
      const proto::SliceDevice& a = after.devices(j);
      const proto::SliceDevice& b = before.devices(j);
      if (a.worker_id() != now || a.device() != b.device()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "virtual device ", j, " was device ", b.device(), " of ",
            b.host_name(), " beside virtual device ", js[0],
            ", and is now device ", a.device(), " of ", a.host_name(),
            " (the islands and device indices it was compiled for differ)"));
      }
    }
    to[worker] = now;
  }
  for (proto::XlaIsland& island : *xla->mutable_islands()) {
    for (int64_t& w : *island.mutable_workers()) {
      auto it = to.find(w);
      if (it == to.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("an island names worker ", w,
                         ", which held none of the slice's "
                         "devices"));
      }
      w = it->second;
    }
  }
  return absl::OkStatus();
}

}  // namespace plexus
