// A session's traffic (ClientSession): the ops queued for the server and
// the sender that writes them in batches, and the reader that applies what
// the server says (slice grants, call errors, puts released, recoveries,
// workers down) until the stream ends.
#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "plexus/client/client_session.h"
#include "plexus/common/logging.h"
#include "plexus/common/status_proto.h"

namespace plexus {
namespace {

constexpr size_t kMaxQueuedOps = 1 << 16;

}  // namespace

void ClientSession::Enqueue(std::vector<proto::ClientOp> ops, uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  auto room = [this, epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return GoneLocked(epoch) || (!restoring_ && queue_.size() < kMaxQueuedOps);
  };
  mu_.Await(absl::Condition(&room));
  // Queued or kept from here on (a resume's snapshot, taken while
  // restoring_ holds this, sees both or neither).
  MarkIssuedLocked(ops);
  if (GoneLocked(epoch)) {
    // The stream broke under this session, which the next server may
    // resume: its calls, puts and programs are kept to send then.
    if (!closed_ && epoch == epoch_.load() &&
        journaled_.load(std::memory_order_acquire)) {
      proto::ClientToServer unsent;
      for (auto& op : ops) *unsent.add_ops() = std::move(op);
      KeepCalls(std::move(unsent), NextKeepSeqLocked());
    }
    return;
  }
  for (auto& op : ops) queue_.push_back(std::move(op));
  urgent_ = true;
  // A round trip's next op (the client waited on a result since its last
  // ops; not a loop's that issues without waiting), with nothing being
  // written: this thread writes, the sender sleeps on. (While a resume is
  // restored, or its messages wait, the sender goes.)
  const bool after_wait = waited_.exchange(false, std::memory_order_relaxed);
  if (!after_wait || !options_.send_inline_after_wait || writable_ == nullptr ||
      sending_ || closed_ || restoring_ || !pre_messages_.empty() ||
      machine_.broken()) {
    return;
  }
  Session& session = *writable_;
  proto::ClientToServer msg;
  uint64_t keep_seq = 0;
  TakeQueuedLocked(msg, keep_seq);
  mu_.Unlock();
  const bool ok = WriteTaken(session, msg, keep_seq, /*write=*/true);
  if (ok) messages_sent_inline_.fetch_add(1, std::memory_order_relaxed);
  mu_.Lock();
  WroteLocked(ok);
}

void ClientSession::TakeQueuedLocked(proto::ClientToServer& msg,
                                     uint64_t& keep_seq) {
  for (auto& op : queue_) *msg.add_ops() = std::move(op);
  queue_.clear();
  urgent_ = false;
  keep_seq = msg.ops_size() > 0 ? NextKeepSeqLocked() : 0;
  sending_ = msg.ops_size() > 0;
}

bool ClientSession::WriteTaken(Session& session, proto::ClientToServer& msg,
                               uint64_t keep_seq, bool write) {
  const bool ok = write && (msg.ops_size() == 0 || WriteToServer(session, msg));
  if (ok && msg.ops_size() > 0) {
    messages_sent_.fetch_add(1, std::memory_order_relaxed);
  }
  // Kept to send again after a resume: what was written, and what a
  // failed write may not have delivered.
  if (msg.ops_size() > 0 && journaled_.load(std::memory_order_acquire)) {
    KeepCalls(std::move(msg), keep_seq);
  }
  return ok;
}

void ClientSession::WroteLocked(bool ok) {
  sending_ = false;
  if (!ok) {
    machine_.StreamBroke();
    UpdateOpenTagLocked();
    observer_->StreamBroke();
    KeepUnsentLocked();
  }
}

void ClientSession::Flush() {
  absl::MutexLock lock(&mu_);
  auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return machine_.broken() || closed_ || (queue_.empty() && !sending_);
  };
  ++flushing_;  // lingering releases go now
  mu_.Await(absl::Condition(&drained));
  --flushing_;
}

void ClientSession::SenderLoop(Session& session) {
  Clock& clock = *options_.clock;
  absl::Time next_stats = clock.Now();
  {
    absl::MutexLock lock(&mu_);
    writable_ = &session;
  }
  while (true) {
    proto::ClientToServer msg;
    std::vector<proto::ClientToServer> pre;
    bool last = false;
    bool stats_due = false;
    uint64_t keep_seq = 0;  // its place among the kept batches
    {
      absl::MutexLock lock(&mu_);
      // While a resumed session waits for its snapshot (restoring_), what
      // is queued (a release: destructors queue them without waiting)
      // waits too, and goes after the resume's messages. Sent before the
      // LiveBuffers, a release reached the workers while the server still
      // listed the value as given back, and a call sent again read it
      // there: "released before this call could read it".
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return closed_ || machine_.broken() ||
               (!queue_.empty() && !restoring_ && (urgent_ || flushing_ > 0)) ||
               !pre_messages_.empty();
      };
      // Only releases queued: they linger for an op to go with.
      auto lingering = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() && !restoring_;
      };
      auto wake = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return ready() || lingering();
      };
      while (!ready()) {
        if (lingering()) {
          // Real time: nothing else moves them; then they go alone.
          mu_.AwaitWithTimeout(absl::Condition(&ready),
                               options_.release_linger);
          break;
        }
        if (!clock.AwaitCondition(&mu_, absl::Condition(&wake), next_stats)) {
          break;  // the stats are due
        }
      }
      // A caller's inline write (Enqueue) ends before this one starts.
      auto idle = [this]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !sending_; };
      mu_.Await(absl::Condition(&idle));
      if (machine_.broken() && !closed_) {
        // The reader saw it end. What is queued goes with the resume's
        // calls sent again, ahead of its LiveBuffers' end: sent after it,
        // as new ops, the server would have taken their outputs (live
        // futures no worker held) for lost.
        KeepUnsentLocked();
        writable_ = nullptr;
        break;
      }
      pre.swap(pre_messages_);
      if (!restoring_) TakeQueuedLocked(msg, keep_seq);
      last = closed_;
      stats_due = clock.Now() >= next_stats || last;
      // Held for every write of this thread's, the stats' alone too.
      sending_ = msg.ops_size() > 0 || !pre.empty() || stats_due;
      if (last) writable_ = nullptr;  // what follows is this thread's
    }
    // A resume's messages go first, each as one write (ResumeRestore).
    bool pre_ok = true;
    for (const proto::ClientToServer& m : pre) {
      if (!(pre_ok = WriteToServer(session, m))) break;
      messages_sent_.fetch_add(1, std::memory_order_relaxed);
    }
    if (stats_due) {
      stats_(msg.add_ops()->mutable_stats());
      next_stats = clock.Now() + absl::Seconds(1);
    }
    // (After a failed resume message, the batch is kept, not written.)
    const bool ok = WriteTaken(session, msg, keep_seq, /*write=*/pre_ok);
    absl::MutexLock lock(&mu_);
    WroteLocked(ok);
    if (!ok) writable_ = nullptr;
    if (last || !ok) break;
  }
  // The frames' connection first: the server takes the stream's end for
  // the session's, once the frames before it are read.
  session.ops.reset();
  session.stream->WritesDone();
}

bool ClientSession::WriteToServer(Session& session,
                                  const proto::ClientToServer& msg) {
  if (session.ops == nullptr) return session.stream->Write(msg);
  const absl::Status sent = session.ops->SendOps(msg.SerializeAsString());
  if (sent.ok()) {
    messages_sent_as_frames_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  // The stream's reader sees the session end, as after a broken stream.
  SPDLOG_WARN(
      "client {}: an ops frame could not be sent ({}); ending the "
      "session",
      session.client_id, sent.ToString());
  session.context.TryCancel();
  return false;
}

void ClientSession::KeepCalls(proto::ClientToServer&& msg, uint64_t seq) {
  // The batch itself is kept, moved (no copy per call on the sender's
  // path), in the order its ops left the queue (KeptBatches);
  // ResumeRestore picks its calls and puts. Programs are kept apart, each
  // for good.
  absl::MutexLock kept(&kept_mu_);
  for (const proto::ClientOp& op : msg.ops()) {
    if (op.has_program()) kept_programs_[op.program().program_id()] = op;
  }
  kept_calls_.Keep(std::move(msg), seq);
}

void ClientSession::KeepUnsentLocked() {
  if (!queue_.empty() && journaled_.load(std::memory_order_acquire)) {
    // Ops queued and never written: a resume sends their calls, puts and
    // programs with the rest (the others go: a buffer released is
    // released at the resume's end, a slice request times out).
    proto::ClientToServer unsent;
    for (proto::ClientOp& op : queue_) *unsent.add_ops() = std::move(op);
    KeepCalls(std::move(unsent), NextKeepSeqLocked());
  }
  queue_.clear();
}

void ClientSession::ReaderLoop(Session& session) {
  proto::ServerToClient msg;
  while (session.stream->Read(&msg)) {
    absl::MutexLock lock(&mu_);
    ApplyLocked(msg);
  }
  absl::MutexLock lock(&mu_);
  machine_.StreamBroke();
  UpdateOpenTagLocked();
  KeepUnsentLocked();
  if (closed_) return;
  EndedLocked(session);
}

void ClientSession::ApplyLocked(const proto::ServerToClient& msg) {
  for (const auto& r : msg.slices()) slice_replies_[r.request_id()] = r;
  for (const auto& e : msg.errors()) {
    absl::Status s = StatusFromProto(e.status());
    for (uint64_t id : e.output_ids()) failed_[id] = s;
    if (e.output_ids_size() == 0) {
      SPDLOG_WARN("server: {}", s.ToString());
    }
  }
  if (msg.released_puts_size() > 0) {
    // Released for good: nothing will read them, so a request to put
    // them again still queued (the put itself got there first) is
    // dropped, not refused for want of the data.
    absl::flat_hash_set<uint64_t> released(msg.released_puts().begin(),
                                           msg.released_puts().end());
    observer_->PutsReleased(released);
  }
  for (const auto& r : msg.recoveries()) ApplyRecoveryLocked(r);
  for (const auto& d : msg.workers_down()) WorkerDownLocked(d);
}

void ClientSession::EndedLocked(const Session& session) {
  // Everything of this session lived in the server's records and on
  // workers it ordered: nothing of it can be used again. Each use of it
  // says so (SessionStatus), and whoever waits on a worker now stops.
  SessionEnd& end = ends_.emplace_back();
  end.epoch = epoch_.load();
  end.client_id = session.client_id;
  end.address = address_;
  end.ended = options_.clock->Now();
  end.lost_futures = session_tag_->live_futures.load();
  if (machine_.Ended(end.ended) == SessionState::kReconnecting &&
      journaled_.load(std::memory_order_acquire)) {
    // A server with a journal may come back (or a standby take over) and
    // resume this session: its futures wait for that (SessionStatus).
    resume_epoch_ = end.epoch;
    resume_client_id_ = session.client_id;
    resume_credential_.assign(identity_.credential.begin(),
                              identity_.credential.end());
    SPDLOG_WARN(
        "client {}'s session with the server at {} ended (the server went "
        "away); asking the next to resume it, with its {} live future(s), "
        "for up to {}",
        end.client_id, address_, end.lost_futures,
        absl::FormatDuration(options_.reconnect_timeout));
  } else if (machine_.state() == SessionState::kReconnecting) {
    SPDLOG_WARN(
        "client {}'s session with the server at {} ended (the server "
        "restarted or went away): its {} live future(s) are lost; "
        "reconnecting for up to {}",
        end.client_id, address_, end.lost_futures,
        absl::FormatDuration(options_.reconnect_timeout));
  } else {
    end.gave_up = kNoReconnect;
    SPDLOG_WARN("{}", std::string(GaveUpStatusLocked().message()));
  }
  observer_->SessionEnded();
}

absl::StatusOr<proto::SliceInfo> ClientSession::RequestSlice(
    proto::SliceRequest req, uint64_t epoch) {
  proto::ClientOp op;
  *op.mutable_slice_request() = std::move(req);
  absl::StatusOr<proto::SliceReply> reply =
      AskForSlice(std::move(op), epoch, "granted the slice",
                  [](proto::ClientOp& o, uint64_t rid) {
                    o.mutable_slice_request()->set_request_id(rid);
                  });
  if (!reply.ok()) return reply.status();
  return std::move(*reply->mutable_slice());
}

absl::StatusOr<proto::SliceReply> ClientSession::ResizeSlice(
    proto::SliceResize req, uint64_t epoch) {
  proto::ClientOp op;
  *op.mutable_slice_resize() = std::move(req);
  return AskForSlice(std::move(op), epoch, "answered the resize",
                     [](proto::ClientOp& o, uint64_t rid) {
                       o.mutable_slice_resize()->set_request_id(rid);
                     });
}

absl::StatusOr<proto::SliceReply> ClientSession::AskForSlice(
    proto::ClientOp op, uint64_t epoch, absl::string_view answer,
    absl::FunctionRef<void(proto::ClientOp&, uint64_t)> set_request_id) {
  uint64_t rid;
  {
    absl::MutexLock lock(&mu_);
    rid = next_request_++;
  }
  set_request_id(op, rid);
  std::vector<proto::ClientOp> ops;
  ops.push_back(std::move(op));
  Enqueue(std::move(ops), epoch);
  absl::MutexLock lock(&mu_);
  auto answered = [this, rid, epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return GoneLocked(epoch) || slice_replies_.count(rid) > 0;
  };
  mu_.Await(absl::Condition(&answered));
  auto it = slice_replies_.find(rid);
  if (it == slice_replies_.end() && closed_) {
    // Close() from another thread while this request waited at the server.
    return absl::FailedPreconditionError(
        absl::StrCat("the client was closed before the server ", answer));
  }
  if (it == slice_replies_.end()) {
    return absl::UnavailableError(
        absl::StrCat("the session with the server at ", address_,
                     " ended before the server ", answer));
  }
  proto::SliceReply reply = std::move(it->second);
  slice_replies_.erase(it);
  if (reply.has_error()) {
    absl::Status refused = StatusFromProto(reply.error());
    if (!refused.ok()) return refused;
  }
  return reply;
}

void ClientSession::ReleaseBuffer(uint64_t buffer_id, uint64_t slice_id,
                                  uint64_t epoch) {
  proto::ClientOp op;
  op.mutable_release()->set_buffer_id(buffer_id);
  op.mutable_release()->set_slice_id(slice_id);
  absl::MutexLock lock(&mu_);
  if (GoneLocked(epoch)) return;
  queue_.push_back(std::move(op));  // never blocks: destructors call this
}

void ClientSession::ReleaseSlice(uint64_t slice_id, uint64_t epoch) {
  proto::ClientOp op;
  op.set_slice_release(slice_id);
  absl::MutexLock lock(&mu_);
  if (GoneLocked(epoch)) return;
  queue_.push_back(std::move(op));
  urgent_ = true;
}

void ClientSession::MarkFailed(uint64_t buffer_id, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  failed_[buffer_id] = status;
}

absl::Status ClientSession::BufferStatus(uint64_t buffer_id) {
  absl::MutexLock lock(&mu_);
  auto it = failed_.find(buffer_id);
  return it == failed_.end() ? absl::OkStatus() : it->second;
}

void ClientSession::ForgetBuffer(uint64_t buffer_id) {
  {
    absl::MutexLock lock(&mu_);
    failed_.erase(buffer_id);
  }
  if (journaled_.load(std::memory_order_acquire)) {
    absl::MutexLock kept(&kept_mu_);
    live_.erase(buffer_id);
  }
}

}  // namespace plexus
