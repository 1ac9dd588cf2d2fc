// DataPath::WaitMany: every shard of many futures confirmed ready in one
// round trip per worker (all its shards' waits are sent at once, to every
// worker, before any answer is read).
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "plexus/client/data_path.h"

namespace plexus {
namespace {

// One worker's shards, and which future each belongs to.
struct WaitBatch {
  const proto::SliceDevice* device = nullptr;
  std::vector<transport::ShardKey> keys;
  std::vector<size_t> owners;  // index into the futures, per key
  std::unique_ptr<transport::DataPlaneConnection> conn;
};
using WaitBatches = std::map<int64_t, WaitBatch>;

// The futures' shards by worker; or the error of a future already failed.
absl::StatusOr<WaitBatches> BatchByWorker(ClientSession& session,
                                          const std::vector<Future>& futures) {
  WaitBatches batches;
  for (size_t f = 0; f < futures.size(); ++f) {
    const Future& future = futures[f];
    if (!future.valid()) return absl::InvalidArgumentError("empty future");
    absl::Status failed = session.BufferStatus(future.buffer_id());
    if (!failed.ok()) return failed;
    const std::pair<uint64_t, const proto::SliceInfo*> where = future.placed();
    const uint64_t id = where.first;
    const proto::SliceInfo* map = where.second;
    for (int j = 0; j < map->devices_size(); ++j) {
      WaitBatch& batch = batches[map->devices(j).worker_id()];
      batch.device = &map->devices(j);
      batch.keys.push_back({id, j});
      batch.owners.push_back(f);
    }
  }
  return batches;
}

}  // namespace

absl::Status DataPath::WaitMany(const std::vector<Future>& futures,
                                absl::Time deadline) {
  if (absl::Status open = session_.CheckOpen(); !open.ok()) return open;
  // Every future must be of the open session (`epoch`): one of a session
  // that ended is lost, and says so.
  const uint64_t epoch = session_.epoch();
  for (const Future& future : futures) {
    if (!future.valid()) return absl::InvalidArgumentError("empty future");
    if (absl::Status s =
            session_.SessionStatus(future.epoch(), future.buffer_id());
        !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<WaitBatches> batches = BatchByWorker(session_, futures);
  if (!batches.ok()) return batches.status();
  // The wait ends when any of its workers is lost, saying which.
  std::vector<int64_t> workers;
  for (const auto& [worker, batch] : *batches) workers.push_back(worker);
  auto explain = [&](const WaitBatch& batch, const absl::Status& s) {
    if (absl::Status ended = session_.SessionStatus(
            epoch, futures[batch.owners.front()].buffer_id());
        !ended.ok()) {
      return ended;
    }
    for (int64_t w : workers) {
      absl::Status down = WorkerStatus(w);
      if (!down.ok()) return down;
    }
    return absl::UnavailableError(
        absl::StrCat("lost worker ", batch.device->worker_id(), " (",
                     batch.device->host_name(), "): ", s.message()));
  };
  // Every worker's waits go out before any answer is read.
  absl::Status result;
  for (auto& [worker, batch] : *batches) {
    absl::Status down = WorkerStatus(worker);
    if (!down.ok()) {
      result = down;
      break;
    }
    auto conn = Checkout(*batch.device, epoch, workers);
    if (!conn.ok()) {
      result = conn.status();
      break;
    }
    batch.conn = *std::move(conn);
    if (absl::Status sent = batch.conn->SendWaits(batch.keys); !sent.ok()) {
      result = explain(batch, sent);
      break;
    }
  }
  std::vector<bool> not_ready(futures.size(), false);
  // Per host whose answers did not all come by the deadline: how many of
  // its shards went unconfirmed (a worker answers a wait once the shard
  // is ready there, so a shard not ready and a host that does not answer
  // look alike from here; the server's `why` tells them apart).
  std::map<std::string, int64_t> unconfirmed;
  for (auto& [worker, batch] : *batches) {
    if (batch.conn == nullptr) continue;
    if (!result.ok()) {
      // Its answers are still due: pooled, the next request would read
      // them as its own.
      Discard(std::move(batch.conn));
      continue;
    }
    absl::StatusOr<size_t> answered =
        batch.conn->AwaitWaits(batch.keys, deadline);
    wait_round_trips++;
    if (!answered.ok()) {
      result = batch.conn->healthy() ? answered.status()
                                     : explain(batch, answered.status());
    } else {
      for (size_t k = *answered; k < batch.keys.size(); ++k) {
        not_ready[batch.owners[k]] = true;
      }
      if (*answered < batch.keys.size()) {
        unconfirmed[absl::StrCat("host ", batch.device->host_name(),
                                 " (worker ", worker, ")")] +=
            static_cast<int64_t>(batch.keys.size() - *answered);
      }
    }
    if (batch.conn->healthy()) {
      Checkin(worker, std::move(batch.conn), epoch);
    } else {
      Discard(std::move(batch.conn));
    }
  }
  if (!result.ok()) {
    // Failed as the session ended: say what was lost with it.
    if (absl::Status ended = session_.SessionStatus(
            epoch, futures.empty() ? 0 : futures.front().buffer_id());
        !ended.ok()) {
      return ended;
    }
    return result;
  }
  const int64_t late = std::count(not_ready.begin(), not_ready.end(), true);
  if (late > 0) {
    std::vector<std::string> hosts;
    for (const auto& [host, shards] : unconfirmed) {
      hosts.push_back(
          absl::StrCat(host, ": ", shards, shards == 1 ? " shard" : " shards"));
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "wait: ", late, " of ", futures.size(),
        " futures not ready by the deadline (not confirmed ready by ",
        absl::StrJoin(hosts, "; "), ")"));
  }
  return absl::OkStatus();
}

}  // namespace plexus
