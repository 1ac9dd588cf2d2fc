// DataPath::WaitMany: every shard of many futures confirmed ready in one
// round trip per worker (all its shards' waits are sent at once, to every
// worker, before any answer is read). A relayed call's shard is confirmed
// by its answer on the relay link instead (AwaitRelayed, as Wait does),
// its value left there for the fetch that may follow.
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
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

// A relayed call's output shard, its answer due on `worker`'s relay link.
struct RelayedShard {
  const proto::SliceDevice* device = nullptr;
  transport::ShardKey key;
  size_t owner = 0;  // index into the futures
};

// The futures' shards by worker (those answered on a relay link apart, in
// `relayed`); or the error of a future already failed.
absl::StatusOr<WaitBatches> BatchByWorker(
    ClientSession& session, const std::vector<Future>& futures,
    absl::FunctionRef<bool(const transport::ShardKey&)> is_relayed,
    std::vector<RelayedShard>* relayed) {
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
      if (is_relayed({id, j})) {
        relayed->push_back({&map->devices(j), {id, j}, f});
        continue;
      }
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
  std::vector<RelayedShard> relayed;
  absl::StatusOr<WaitBatches> batches = BatchByWorker(
      session_, futures, [this](const ShardKey& key) { return IsRelayed(key); },
      &relayed);
  if (!batches.ok()) return batches.status();
  // The wait ends when any of its workers is lost, saying which.
  std::vector<int64_t> workers;
  for (const auto& [worker, batch] : *batches) workers.push_back(worker);
  for (const RelayedShard& r : relayed) {
    if (std::find(workers.begin(), workers.end(), r.device->worker_id()) ==
        workers.end()) {
      workers.push_back(r.device->worker_id());
    }
  }
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
  // Every worker's waits go out before any answer is read (the relayed
  // shards' answers are on their way already).
  absl::Status result;
  auto send = [&](WaitBatches& list) {
    for (auto& [worker, batch] : list) {
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
  };
  std::vector<bool> not_ready(futures.size(), false);
  // Per host whose answers did not all come by the deadline: how many of
  // its shards went unconfirmed (a worker answers a wait once the shard
  // is ready there, so a shard not ready and a host that does not answer
  // look alike from here; the server's `why` tells them apart).
  std::map<std::string, int64_t> unconfirmed;
  auto late_on = [&](const proto::SliceDevice& device) -> int64_t& {
    return unconfirmed[absl::StrCat("host ", device.host_name(), " (worker ",
                                    device.worker_id(), ")")];
  };
  // Workers that answered: the next round trip's call may be relayed
  // (Wait's rule), once each has a link.
  std::vector<const proto::SliceDevice*> linkable;
  auto read = [&](WaitBatches& list) {
    for (auto& [worker, batch] : list) {
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
          late_on(*batch.device) +=
              static_cast<int64_t>(batch.keys.size() - *answered);
        }
      }
      if (batch.conn->healthy()) {
        Checkin(worker, std::move(batch.conn), epoch);
        if (answered.ok()) linkable.push_back(batch.device);
      } else {
        Discard(std::move(batch.conn));
      }
    }
  };
  send(*batches);
  // The relayed shards' answers (read as Wait reads them, each left for
  // the fetch that may follow); one that cannot come so is asked of its
  // worker after the others.
  WaitBatches again;
  for (const RelayedShard& r : relayed) {
    if (!result.ok()) break;
    bool timed_out = false;
    auto answer = AwaitRelayed(r.device->worker_id(), r.key, /*keep=*/true,
                               deadline, &timed_out);
    if (answer.has_value()) {
      if (!answer->ok()) result = answer->status();
      continue;
    }
    if (timed_out) {
      not_ready[r.owner] = true;
      late_on(*r.device)++;
      continue;
    }
    WaitBatch& batch = again[r.device->worker_id()];
    batch.device = r.device;
    batch.keys.push_back(r.key);
    batch.owners.push_back(r.owner);
  }
  read(*batches);
  if (!again.empty() && result.ok()) {
    send(again);
    read(again);
  }
  for (const proto::SliceDevice* device : linkable) MaybeLink(*device, epoch);
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
