#include "plexus/client/client_core.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "plexus/common/logging.h"
#include "plexus/common/status_proto.h"

namespace plexus {

uint32_t ClientCore::CallSiteId(const std::string& text) {
  absl::MutexLock lock(&sites_mu_);
  auto it = site_ids_.find(text);
  if (it != site_ids_.end()) return it->second;
  if (sites_.size() >= kMaxCallSites) return 0;
  sites_.push_back(text);
  const uint32_t id = static_cast<uint32_t>(sites_.size());
  site_ids_.emplace(text, id);
  return id;
}

bool ClientCore::CallSiteOp(uint32_t site, uint64_t epoch,
                            proto::ClientOp* op) {
  absl::MutexLock lock(&sites_mu_);
  if (site == 0 || site > sites_.size()) return false;
  if (epoch != sites_epoch_) {
    sites_epoch_ = epoch;
    sites_sent_.assign(sites_.size(), false);
  }
  if (sites_sent_.size() < sites_.size()) sites_sent_.resize(sites_.size());
  if (sites_sent_[site - 1]) return false;
  sites_sent_[site - 1] = true;
  op->mutable_site()->set_id(site);
  op->mutable_site()->set_text(sites_[site - 1]);
  return true;
}
namespace {

constexpr size_t kMaxQueuedOps = 1 << 16;

}  // namespace

namespace {

Timeline::Options ClientTimelineOptions() {
  Timeline::Options options;
  options.capacity = TimelineEventsFromEnv();
  options.enabled = options.capacity > 0;
  options.skew = TestSkewFromEnv("client");
  return options;
}

}  // namespace

ClientCore::ClientCore(ClientOptions options)
    : options_(std::move(options)),
      timeline_(ClientTimelineOptions()),
      machine_(options_.reconnect_timeout) {}

ClientCore::~ClientCore() { Close(); }

bool ClientCore::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

absl::Status ClientCore::CheckOpen() const {
  if (closing_.load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError(
        absl::StrCat("client ", client_id(), " is closed"));
  }
  return absl::OkStatus();
}

void ClientCore::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    machine_.Close();
    UpdateOpenTagLocked();
    closing_.store(true, std::memory_order_release);
    // Fetches and waits in other threads end now, with "closed".
    for (auto& [conn, use] : in_use_) conn->Shutdown();
    if (opening_ != nullptr) opening_->TryCancel();
  }
  // The sender flushes what is queued, then half-closes the stream; the
  // server frees the client's slices and buffers when the stream ends.
  if (session_thread_.joinable()) session_thread_.join();
  absl::MutexLock lock(&mu_);
  pool_.clear();
  kept_puts_.clear();
}

void ClientCore::Enqueue(std::vector<proto::ClientOp> ops, uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  auto room = [this, epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || machine_.broken() || epoch_.load() != epoch ||
           queue_.size() < kMaxQueuedOps;
  };
  mu_.Await(absl::Condition(&room));
  if (closed_ || machine_.broken() || epoch_.load() != epoch) return;
  for (auto& op : ops) queue_.push_back(std::move(op));
}

void ClientCore::Flush() {
  absl::MutexLock lock(&mu_);
  auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return machine_.broken() || closed_ || (queue_.empty() && !sending_);
  };
  mu_.Await(absl::Condition(&drained));
}

void ClientCore::SenderLoop(Session& session) {
  absl::Time next_stats = absl::Now();
  while (true) {
    proto::ClientToServer msg;
    bool last = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return closed_ || machine_.broken() || !queue_.empty();
      };
      mu_.AwaitWithDeadline(absl::Condition(&ready), next_stats);
      if (machine_.broken() && !closed_) break;  // the reader saw it end
      for (auto& op : queue_) *msg.add_ops() = std::move(op);
      queue_.clear();
      sending_ = msg.ops_size() > 0;
      last = closed_;
    }
    if (absl::Now() >= next_stats || last) {
      proto::ClientStats* s = msg.add_ops()->mutable_stats();
      s->set_bytes_put(bytes_put.load());
      s->set_bytes_fetched(bytes_fetched.load());
      s->set_calls(calls.load());
      s->set_live_futures(live_futures.load());
      next_stats = absl::Now() + absl::Seconds(1);
    }
    bool ok = msg.ops_size() == 0 || session.stream->Write(msg);
    absl::MutexLock lock(&mu_);
    sending_ = false;
    if (!ok) {
      machine_.StreamBroke();
      UpdateOpenTagLocked();
      queue_.clear();
    }
    if (last || !ok) break;
  }
  session.stream->WritesDone();
}

void ClientCore::ReaderLoop(Session& session) {
  proto::ServerToClient msg;
  while (session.stream->Read(&msg)) {
    absl::MutexLock lock(&mu_);
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
      for (uint64_t id : released) kept_puts_.erase(id);
      reputs_.erase(std::remove_if(reputs_.begin(), reputs_.end(),
                                   [&](const auto& r) {
                                     return released.count(r.first) > 0;
                                   }),
                    reputs_.end());
    }
    for (const auto& r : msg.recoveries()) ApplyRecoveryLocked(r);
    for (const auto& d : msg.workers_down()) {
      // Slices still on it were not remapped: they broke.
      for (const auto& [sid, slice] : slices_) {
        for (const auto& dev : slice->info().devices()) {
          if (dev.worker_id() != d.worker_id()) continue;
          broken_slices_.try_emplace(
              sid, absl::StrCat("worker ", d.worker_id(), " was lost"));
          break;
        }
      }
      losses_heard_++;
      workers_down_[d.worker_id()] = StatusFromProto(d.status());
      // A worker that is down (or stopped) will not answer: wake whoever
      // waits on it; they find it in workers_down_ and say so.
      pool_.erase(d.worker_id());
      for (auto& [conn, use] : in_use_) {
        if (use.NeedsWorker(d.worker_id())) conn->Shutdown();
      }
    }
  }
  absl::MutexLock lock(&mu_);
  machine_.StreamBroke();
  UpdateOpenTagLocked();
  queue_.clear();
  if (closed_) return;
  // Everything of this session lived in the server's records and on
  // workers it ordered: nothing of it can be used again. Each use of it
  // says so (SessionStatus), and whoever waits on a worker now stops.
  SessionEnd& end = ends_.emplace_back();
  end.epoch = epoch_.load();
  end.client_id = session.client_id;
  end.address = address_;
  end.ended = absl::Now();
  end.lost_futures = session_tag_->live_futures.load();
  if (machine_.Ended(end.ended) == SessionState::kReconnecting) {
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
  pool_.clear();
  for (auto& [conn, use] : in_use_) conn->Shutdown();
}

absl::StatusOr<proto::SliceInfo> ClientCore::RequestSlice(
    proto::SliceRequest req, uint64_t epoch) {
  uint64_t rid;
  {
    absl::MutexLock lock(&mu_);
    rid = next_request_++;
  }
  req.set_request_id(rid);
  proto::ClientOp op;
  *op.mutable_slice_request() = req;
  std::vector<proto::ClientOp> ops;
  ops.push_back(std::move(op));
  Enqueue(std::move(ops), epoch);
  absl::MutexLock lock(&mu_);
  auto answered = [this, rid, epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return machine_.broken() || closed_ || epoch_.load() != epoch ||
           slice_replies_.count(rid) > 0;
  };
  mu_.Await(absl::Condition(&answered));
  auto it = slice_replies_.find(rid);
  if (it == slice_replies_.end() && closed_) {
    // Close() from another thread while this request waited at the server.
    return absl::FailedPreconditionError(
        "the client was closed before the server granted the slice");
  }
  if (it == slice_replies_.end()) {
    return absl::UnavailableError(
        absl::StrCat("the session with the server at ", address_,
                     " ended before the server granted the slice"));
  }
  proto::SliceReply reply = std::move(it->second);
  slice_replies_.erase(it);
  if (reply.has_error()) {
    absl::Status refused = StatusFromProto(reply.error());
    if (!refused.ok()) return refused;
  }
  return reply.slice();
}

void ClientCore::ReleaseBuffer(uint64_t buffer_id, uint64_t slice_id,
                               uint64_t epoch) {
  proto::ClientOp op;
  op.mutable_release()->set_buffer_id(buffer_id);
  op.mutable_release()->set_slice_id(slice_id);
  absl::MutexLock lock(&mu_);
  if (closed_ || machine_.broken() || epoch_.load() != epoch) return;
  queue_.push_back(std::move(op));  // never blocks: destructors call this
}

void ClientCore::ReleaseSlice(uint64_t slice_id, uint64_t epoch) {
  proto::ClientOp op;
  op.set_slice_release(slice_id);
  absl::MutexLock lock(&mu_);
  if (closed_ || machine_.broken() || epoch_.load() != epoch) return;
  queue_.push_back(std::move(op));
}

void ClientCore::MarkFailed(uint64_t buffer_id, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  failed_[buffer_id] = status;
}

absl::Status ClientCore::BufferStatus(uint64_t buffer_id) {
  absl::MutexLock lock(&mu_);
  auto it = failed_.find(buffer_id);
  return it == failed_.end() ? absl::OkStatus() : it->second;
}

void ClientCore::ForgetBuffer(uint64_t buffer_id) {
  absl::MutexLock lock(&mu_);
  failed_.erase(buffer_id);
}

absl::Status ClientCore::WorkerStatus(int64_t worker_id) {
  absl::MutexLock lock(&mu_);
  auto it = workers_down_.find(worker_id);
  return it == workers_down_.end() ? absl::OkStatus() : it->second;
}

bool ClientCore::SameMachine(const proto::SliceDevice& device) const {
  return options_.shared_memory && device.machine_id() == machine_id_;
}

absl::StatusOr<std::unique_ptr<transport::DataPlaneConnection>>
ClientCore::Checkout(const proto::SliceDevice& device, uint64_t epoch,
                     absl::Span<const int64_t> also_on) {
  const int64_t worker = device.worker_id();
  transport::DataPlaneIdentity identity;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = SessionStatusLocked(epoch, 0); !s.ok()) return s;
    identity = identity_;
    auto it = pool_.find(worker);
    if (it != pool_.end() && !it->second.empty()) {
      auto conn = std::move(it->second.back());
      it->second.pop_back();
      in_use_[conn.get()] = {worker, {also_on.begin(), also_on.end()}};
      return conn;
    }
  }
  // A worker declared down (a stopped one accepts but never answers the
  // handshake), the session's end or a close ends the connecting too.
  auto given_up = [this, worker, epoch] {
    absl::MutexLock lock(&mu_);
    return closed_ || machine_.broken() || epoch_.load() != epoch ||
           workers_down_.contains(worker);
  };
  auto conn = transport::DataPlaneConnection::Connect(
      device.data_address(), SameMachine(device) ? device.unix_path() : "",
      &data_counters_, identity, given_up);
  absl::MutexLock lock(&mu_);
  // Checked under the lock that the reader takes to wake connections: a
  // worker reported down meanwhile, the session's end, or a close, is seen
  // here or wakes this.
  if (absl::Status s = SessionStatusLocked(epoch, 0); !s.ok()) return s;
  if (auto down = workers_down_.find(worker); down != workers_down_.end()) {
    return down->second;
  }
  if (!conn.ok()) return conn;
  in_use_[conn->get()] = {worker, {also_on.begin(), also_on.end()}};
  return conn;
}

void ClientCore::Checkin(int64_t worker_id,
                         std::unique_ptr<transport::DataPlaneConnection> conn,
                         uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  in_use_.erase(conn.get());
  // A connection of an ended session proves its credential: not pooled.
  if (closed_ || machine_.broken() || epoch_.load() != epoch ||
      workers_down_.contains(worker_id)) {
    return;
  }
  auto& list = pool_[worker_id];
  if (list.size() < 8) list.push_back(std::move(conn));
}

void ClientCore::Discard(std::unique_ptr<transport::DataPlaneConnection> conn) {
  absl::MutexLock lock(&mu_);
  in_use_.erase(conn.get());
  // Destroyed here, under the lock: the reader never shuts down a freed one.
  conn.reset();
}

}  // namespace plexus
