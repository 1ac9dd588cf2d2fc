// The data path's connections (DataPath): a pool per worker, checked out
// and in by each request, woken when their worker or session is gone; what
// the session tells it (SessionObserver); and the shards of puts kept to
// put again when the server asks after a lost host.
#include "plexus/client/data_path.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "plexus/common/logging.h"
#include "plexus/common/process.h"

namespace plexus {

bool DataPath::InUse::NeedsWorker(int64_t w) const {
  return worker == w ||
         std::find(also_on.begin(), also_on.end(), w) != also_on.end();
}

DataPath::DataPath(const ClientOptions& options, ClientSession& session)
    : options_(options), session_(session), machine_id_(LocalMachineId()) {}

DataPath::~DataPath() {
  if (reputter_.joinable()) reputter_.join();
}

bool DataPath::SameMachine(const proto::SliceDevice& device) const {
  return options_.shared_memory && device.machine_id() == machine_id_;
}

absl::Status DataPath::WorkerStatus(int64_t worker_id) {
  absl::MutexLock lock(&mu_);
  auto it = workers_down_.find(worker_id);
  return it == workers_down_.end() ? absl::OkStatus() : it->second;
}

absl::Status DataPath::SessionGone(uint64_t epoch) const {
  // The session marks itself before it tells the data path: it says why.
  absl::Status s = session_.SessionStatus(epoch, 0);
  if (!s.ok()) return s;
  return absl::UnavailableError(absl::StrCat("the session with the server at ",
                                             session_.address(), " ended"));
}

absl::StatusOr<std::unique_ptr<transport::DataPlaneConnection>>
DataPath::Checkout(const proto::SliceDevice& device, uint64_t epoch,
                   absl::Span<const int64_t> also_on) {
  const int64_t worker = device.worker_id();
  transport::DataPlaneIdentity identity;
  bool usable;
  {
    absl::MutexLock lock(&mu_);
    usable = UsableLocked(epoch);
    if (usable) {
      identity = identity_;
      auto it = pool_.find(worker);
      if (it != pool_.end() && !it->second.empty()) {
        auto conn = std::move(it->second.back());
        it->second.pop_back();
        in_use_[conn.get()] = {worker, {also_on.begin(), also_on.end()}};
        return conn;
      }
    }
  }
  if (!usable) return SessionGone(epoch);
  // A worker declared down (a stopped one accepts but never answers the
  // handshake), the session's end or a close ends the connecting too.
  auto given_up = [this, worker, epoch] {
    absl::MutexLock lock(&mu_);
    return !UsableLocked(epoch) || workers_down_.contains(worker);
  };
  auto conn = transport::DataPlaneConnection::Connect(
      device.data_address(), SameMachine(device) ? device.unix_path() : "",
      &data_counters_, identity, given_up);
  {
    absl::MutexLock lock(&mu_);
    // Checked under the lock that wakes connections: a worker reported
    // down meanwhile, the session's end, or a close, is seen here or
    // wakes this.
    if (UsableLocked(epoch)) {
      if (auto down = workers_down_.find(worker); down != workers_down_.end()) {
        return down->second;
      }
      if (!conn.ok()) return conn;
      in_use_[conn->get()] = {worker, {also_on.begin(), also_on.end()}};
      return conn;
    }
  }
  return SessionGone(epoch);
}

void DataPath::Checkin(int64_t worker_id,
                       std::unique_ptr<transport::DataPlaneConnection> conn,
                       uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  auto use = in_use_.find(conn.get());
  const bool shut = use != in_use_.end() && use->second.shut;
  if (use != in_use_.end()) in_use_.erase(use);
  // A connection of an ended session proves its credential: not pooled;
  // nor one shut down meanwhile (its session ended and was resumed since:
  // the worker has closed its end).
  if (shut || !UsableLocked(epoch) || workers_down_.contains(worker_id)) {
    return;
  }
  auto& list = pool_[worker_id];
  if (list.size() < 8) list.push_back(std::move(conn));
}

void DataPath::Discard(std::unique_ptr<transport::DataPlaneConnection> conn) {
  absl::MutexLock lock(&mu_);
  in_use_.erase(conn.get());
  // Destroyed here, under the lock: no wake-up shuts down a freed one.
  conn.reset();
}

absl::Status DataPath::WithConnection(
    const proto::SliceDevice& device, uint64_t epoch, uint64_t buffer,
    const std::function<absl::Status(transport::DataPlaneConnection&)>& fn) {
  absl::Status down = WorkerStatus(device.worker_id());
  if (!down.ok()) return down;
  auto conn = Checkout(device, epoch);
  absl::Status s = conn.ok() ? fn(**conn) : conn.status();
  if (conn.ok() && (*conn)->healthy()) {
    // Success, or the worker's own answer (its error, code and message
    // intact): the connection is in step and goes back to the pool.
    Checkin(device.worker_id(), std::move(*conn), epoch);
    // A worker whose server went away may answer for a value nobody will
    // compute: the session's end says what happened.
    if (!s.ok()) {
      if (absl::Status ended = session_.SessionStatus(epoch, buffer);
          !ended.ok()) {
        return ended;
      }
    }
    return s;
  }
  if (conn.ok()) Discard(std::move(*conn));
  // Woken because the client closed, its session ended, or its worker went
  // down: say that.
  if (absl::Status ended = session_.SessionStatus(epoch, buffer); !ended.ok()) {
    return ended;
  }
  down = WorkerStatus(device.worker_id());
  if (!down.ok()) return down;
  // The connection itself failed: the worker may be gone.
  return absl::UnavailableError(absl::StrCat("lost worker ", device.worker_id(),
                                             " (", device.host_name(),
                                             "): ", s.message()));
}

void DataPath::Clear() {
  absl::MutexLock lock(&mu_);
  DropLinksLocked();
  pool_.clear();
  kept_puts_.clear();
}

// ---------------------------------------------------------------- events

void DataPath::SessionInstalled(uint64_t epoch,
                                const transport::DataPlaneIdentity& id) {
  SessionResumed(epoch, id);
  // The last session's records name its ids and workers, which the server
  // that answers now may hand out again for other things.
  absl::MutexLock lock(&mu_);
  workers_down_.clear();
  kept_puts_.clear();
  reputs_.clear();
}

void DataPath::SessionResumed(uint64_t epoch,
                              const transport::DataPlaneIdentity& id) {
  absl::MutexLock lock(&mu_);
  epoch_ = epoch;
  usable_ = true;
  identity_ = id;
  // Its connections were broken with the stream; its kept puts stand.
  pool_.clear();
  DropLinksLocked();
  unlinked_.clear();
}

void DataPath::StreamBroke() {
  absl::MutexLock lock(&mu_);
  usable_ = false;
  DropLinksLocked();
}

void DataPath::SessionEnded() {
  absl::MutexLock lock(&mu_);
  usable_ = false;
  pool_.clear();
  DropLinksLocked();
  for (auto& [conn, use] : in_use_) {
    use.shut = true;
    conn->Shutdown();
  }
}

void DataPath::WorkerDown(int64_t worker, const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  workers_down_[worker] = why;
  pool_.erase(worker);
  DropLinksLocked(worker);
  for (auto& [conn, use] : in_use_) {
    if (!use.NeedsWorker(worker)) continue;
    use.shut = true;
    conn->Shutdown();
  }
}

void DataPath::PutsReleased(const absl::flat_hash_set<uint64_t>& ids) {
  absl::MutexLock lock(&mu_);
  for (uint64_t id : ids) kept_puts_.erase(id);
  reputs_.erase(
      std::remove_if(reputs_.begin(), reputs_.end(),
                     [&](const auto& r) { return ids.count(r.first) > 0; }),
      reputs_.end());
}

void DataPath::RePut(uint64_t id, int32_t shard) {
  absl::MutexLock lock(&mu_);
  reputs_.emplace_back(id, shard);
  if (!reputter_.joinable()) {
    reputter_ = std::thread([this, epoch = epoch_] { RePutLoop(epoch); });
  }
}

void DataPath::SessionDone() {
  // The reader, which starts the reputter, has stopped.
  if (reputter_.joinable()) reputter_.join();
}

// ---------------------------------------------------------------- reputs

void DataPath::KeepPut(uint64_t id, uint64_t slice_id,
                       std::vector<std::shared_ptr<Storage>> shards) {
  absl::MutexLock lock(&mu_);
  kept_puts_[id] = {slice_id, std::move(shards)};
}

void DataPath::RePutLoop(uint64_t epoch) {
  while (true) {
    uint64_t id;
    int32_t shard;
    uint64_t slice_id = 0;
    std::shared_ptr<Storage> data;
    {
      absl::MutexLock lock(&mu_);
      auto work = [this, epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !UsableLocked(epoch) || !reputs_.empty();
      };
      mu_.Await(absl::Condition(&work));
      if (!UsableLocked(epoch)) return;
      std::tie(id, shard) = reputs_.front();
      reputs_.pop_front();
      auto kept = kept_puts_.find(id);
      if (kept != kept_puts_.end() && shard >= 0 &&
          shard < static_cast<int>(kept->second.shards.size())) {
        slice_id = kept->second.slice_id;
        data = kept->second.shards[shard];
      }
    }
    // Not under mu_: the session's lock comes first.
    std::optional<proto::SliceDevice> device =
        data == nullptr ? std::nullopt : session_.SliceDevice(slice_id, shard);
    if (!device.has_value()) {
      SPDLOG_ERROR(
          "cannot put buffer {} shard {} again after a loss: its data or "
          "slice is gone here",
          id, shard);
      continue;
    }
    auto conn = Checkout(*device, epoch);
    absl::Status s =
        conn.ok() ? (*conn)->Put({id, shard}, *data) : conn.status();
    if (conn.ok() && (*conn)->healthy()) {
      Checkin(device->worker_id(), std::move(*conn), epoch);
    } else if (conn.ok()) {
      Discard(std::move(*conn));
    }
    // The put itself reached the new device first: nothing to do.
    if (s.code() == absl::StatusCode::kAlreadyExists) s = absl::OkStatus();
    if (!s.ok()) {
      SPDLOG_WARN("putting buffer {} shard {} again on worker {} failed: {}",
                  id, shard, device->worker_id(), s.ToString());
    }
  }
}

}  // namespace plexus
