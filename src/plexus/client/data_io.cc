// Client::Put, Fetch and Wait: the client's use of the data plane.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/client/client.h"
#include "plexus/client/client_core.h"

namespace plexus {
namespace {

// Runs `fn` with a pooled connection (of session `epoch`) to the worker of
// `device`; a failure against a worker the server reported down says so,
// and one of a session that ended says what was lost with it (`buffer`).
template <typename Fn>
absl::Status WithConnection(ClientCore& core, const proto::SliceDevice& device,
                            uint64_t epoch, uint64_t buffer, Fn fn) {
  absl::Status down = core.WorkerStatus(device.worker_id());
  if (!down.ok()) return down;
  auto conn = core.Checkout(device, epoch);
  absl::Status s = conn.ok() ? fn(**conn) : conn.status();
  if (conn.ok() && (*conn)->healthy()) {
    // Success, or the worker's own answer (its error, code and message
    // intact): the connection is in step and goes back to the pool.
    core.Checkin(device.worker_id(), std::move(*conn), epoch);
    // A worker whose server went away may answer for a value nobody will
    // compute: the session's end says what happened.
    if (!s.ok()) {
      if (absl::Status ended = core.SessionStatus(epoch, buffer); !ended.ok()) {
        return ended;
      }
    }
    return s;
  }
  if (conn.ok()) core.Discard(std::move(*conn));
  // Woken because the client closed, its session ended, or its worker went
  // down: say that.
  if (absl::Status ended = core.SessionStatus(epoch, buffer); !ended.ok()) {
    return ended;
  }
  down = core.WorkerStatus(device.worker_id());
  if (!down.ok()) return down;
  // The connection itself failed: the worker may be gone.
  return absl::UnavailableError(absl::StrCat("lost worker ", device.worker_id(),
                                             " (", device.host_name(),
                                             "): ", s.message()));
}

}  // namespace

absl::StatusOr<Future> Client::Put(const std::shared_ptr<Slice>& slice,
                                   const void* data, const ArgSpec& arg,
                                   TransferProgress* progress) {
  ScopedEvent put(&core_->timeline(), EventKind::kPut);
  absl::StatusOr<Future> f = PutOnce(slice, data, arg, progress);
  put.event.client_id = core_->client_id();
  put.event.bytes = static_cast<int64_t>(arg.global.byte_size());
  if (f.ok()) put.event.buffer_id = f->buffer_id();
  put.event.failed = !f.ok();
  return f;
}

absl::StatusOr<Future> Client::PutOnce(const std::shared_ptr<Slice>& slice,
                                       const void* data, const ArgSpec& arg,
                                       TransferProgress* progress) {
  // While the client reconnects, a put waits for the new session.
  auto session =
      core_->AwaitSession(absl::Now() + core_->options().reconnect_timeout);
  if (!session.ok()) {
    return absl::Status(session.status().code(),
                        absl::StrCat("put: ", session.status().message()));
  }
  const uint64_t epoch = (*session)->epoch;
  if (slice == nullptr || slice->closed()) {
    return absl::FailedPreconditionError("put: the slice is closed");
  }
  if (slice->epoch() != epoch) {
    absl::Status lost = slice->lost();
    if (lost.ok()) lost = core_->SessionStatus(slice->epoch());
    return absl::Status(lost.code(), absl::StrCat("put: ", lost.message()));
  }
  if (arg.sharding.is_partial()) {
    return absl::InvalidArgumentError("put: an array cannot be put as partial");
  }
  const int n = slice->num_devices();
  auto local = arg.Local(n);
  if (!local.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("put: ", local.status().message()));
  }
  const int64_t bytes = local->byte_size();
  for (const auto& d : slice->info().devices()) {
    if (bytes > d.memory_bytes()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "put: a shard of ", arg.global.ToString(), " needs ", bytes,
          " bytes, more than the ", d.memory_bytes(), "-byte budget of device ",
          d.device(), " on ", d.host_name()));
    }
  }
  const uint64_t id = core_->NextId();
  proto::ClientOp op;
  op.mutable_put()->set_buffer_id(id);
  op.mutable_put()->set_slice_id(slice->id());
  // The map the shards go by (the server asks for them again if it is old).
  op.mutable_put()->set_slice_generation(slice->generation());
  *op.mutable_put()->mutable_arg() = ToProto(arg);

  std::shared_ptr<Storage> replicated;
  std::map<Shape, std::shared_ptr<Storage>> blocks;  // mesh: by block start
  // Every shard's data, kept to put it again after a loss.
  std::vector<std::shared_ptr<Storage>> kept(n);
  for (int j = 0; j < n; ++j) {
    const proto::SliceDevice& device = slice->info().devices(j);
    std::shared_ptr<Storage>& shard = kept[j];
    if (arg.sharding.is_mesh()) {
      auto box = arg.BlockOf(n, j);
      if (!box.ok()) return box.status();
      std::shared_ptr<Storage>& block = blocks[box->start];
      if (!block) {  // replicas of a block share one memfd
        auto s = Storage::Allocate(bytes, bytes >= 64 * 1024);
        if (!s.ok()) return s.status();
        block = *s;
        absl::Status copied =
            CopyBox(data, arg.global.byte_size(), arg.global.shape, box->start,
                    block->data(), block->size(), local->shape,
                    Shape(local->shape.size(), 0), local->shape,
                    DTypeSize(arg.global.dtype));
        if (!copied.ok()) return copied;
      }
      shard = block;
    } else if (arg.sharding.is_split()) {
      auto s = Storage::Allocate(
          bytes, core_->SameMachine(device) && bytes >= 64 * 1024);
      if (!s.ok()) return s.status();
      shard = *s;
      const int64_t len = local->shape[arg.sharding.axis];
      absl::Status copied = CopyRows(
          data, arg.global.byte_size(), arg.global.shape, shard->data(),
          shard->size(), local->shape, arg.sharding.axis, j * len, 0, len,
          DTypeSize(arg.global.dtype));
      if (!copied.ok()) return copied;
    } else {
      if (!replicated) {
        auto s = Storage::Allocate(bytes, bytes >= 64 * 1024);
        if (!s.ok()) return s.status();
        replicated = *s;
        if (bytes) std::memcpy(replicated->data(), data, bytes);
      }
      shard = replicated;  // one memfd, mapped by every local worker
    }
  }
  // Kept before the put is declared or any shard sent: a host lost
  // meanwhile gets its shards again from here (the server asks,
  // Recovery.reput_ids).
  std::vector<proto::ClientOp> ops;
  ops.push_back(std::move(op));
  // Held while the put is queued: a Close() racing it releases the slice
  // after the put, never before (see Slice).
  if (!slice->Hold()) {
    return absl::FailedPreconditionError("put: the slice is closed");
  }
  core_->KeepPut(id, slice->id(), kept);
  core_->Enqueue(std::move(ops), epoch);
  slice->Unhold();
  Future future(std::make_shared<BufferHandle>(core_, id, arg, slice,
                                               std::move(*session)));
  std::atomic<int64_t>* sent = nullptr;
  if (progress != nullptr) {
    progress->total_bytes = bytes * n;
    progress->done_bytes = 0;
    sent = &progress->done_bytes;
  }
  for (int j = 0; j < n; ++j) {
    absl::Status s;
    for (int attempt = 0;; ++attempt) {
      const int64_t heard = core_->losses_heard();
      const uint64_t generation = slice->generation();
      const proto::SliceDevice device = slice->info().devices(j);
      // A shard sent again after a loss counts from where it began.
      if (progress != nullptr) progress->done_bytes = bytes * j;
      s = WithConnection(*core_, device, epoch, id,
                         [&](transport::DataPlaneConnection& conn) {
                           return conn.Put({id, j}, *kept[j], sent);
                         });
      // Put again by the recovery already.
      if (s.code() == absl::StatusCode::kAlreadyExists) s = absl::OkStatus();
      // A host lost under the put: once the server remapped the slice, the
      // shard goes to the device that took its place.
      if (s.code() != absl::StatusCode::kUnavailable || attempt >= 2 ||
          (core_->losses_heard() == heard &&
           !core_->AwaitLoss(heard, absl::Seconds(5))) ||
          slice->generation() == generation) {
        break;
      }
    }
    if (!s.ok()) {
      // A host lost that no spare replaced: the value cannot be held.
      const absl::StatusCode code = core_->SliceBroken(slice->id())
                                        ? absl::StatusCode::kDataLoss
                                        : s.code();
      return absl::Status(code, absl::StrCat("put of ", arg.global.ToString(),
                                             " shard ", j, ": ", s.message()));
    }
    core_->bytes_put += bytes;
  }
  return future;
}

absl::Status Client::FetchOnce(const Future& future, void* dst,
                               TransferProgress* progress) {
  if (!future.valid()) return absl::InvalidArgumentError("empty future");
  const uint64_t epoch = future.epoch();
  if (absl::Status s = core_->SessionStatus(epoch, future.buffer_id());
      !s.ok()) {
    return s;
  }
  absl::Status failed = core_->BufferStatus(future.buffer_id());
  if (!failed.ok()) return failed;
  const ArgSpec& arg = future.arg();
  const proto::SliceInfo& info = future.slice()->info();
  const int n = info.devices_size();
  auto local = arg.Local(n);
  if (!local.ok()) return local.status();
  const int64_t bytes = local->byte_size();
  // The devices to read: one per distinct block.
  std::vector<int> reads;
  std::vector<Box> boxes;
  if (arg.sharding.is_mesh()) {
    std::map<Shape, bool> seen;
    for (int j = 0; j < n; ++j) {
      auto box = arg.BlockOf(n, j);
      if (!box.ok()) return box.status();
      if (!seen.emplace(box->start, true).second) continue;
      reads.push_back(j);
      boxes.push_back(*box);
    }
  } else {
    for (int j = 0; j < (arg.sharding.is_replicated() ? 1 : n); ++j) {
      reads.push_back(j);
    }
  }
  if (arg.sharding.is_partial() && arg.global.byte_size() > 0) {
    std::memset(dst, 0, arg.global.byte_size());
  }
  std::atomic<int64_t>* received = nullptr;
  if (progress != nullptr) {
    progress->total_bytes = bytes * static_cast<int64_t>(reads.size());
    progress->done_bytes = 0;
    received = &progress->done_bytes;
  }
  for (size_t r = 0; r < reads.size(); ++r) {
    const int j = reads[r];
    const proto::SliceDevice& device = info.devices(j);
    std::shared_ptr<Storage> data;
    absl::Status s = WithConnection(
        *core_, device, epoch, future.buffer_id(),
        [&](transport::DataPlaneConnection& conn) {
          auto got = conn.Fetch({future.buffer_id(), j}, received);
          if (!got.ok()) return got.status();
          data = std::move(*got);
          return absl::OkStatus();
        });
    if (!s.ok()) return s;
    if (static_cast<int64_t>(data->size()) < bytes) {
      return absl::InternalError(
          absl::StrCat("shard ", j, " of ", arg.global.ToString(), " has ",
                       data->size(), " bytes, expected ", bytes));
    }
    core_->bytes_fetched += bytes;
    if (arg.sharding.is_mesh()) {
      absl::Status copied =
          CopyBox(data->data(), data->size(), local->shape,
                  Shape(local->shape.size(), 0), dst, arg.global.byte_size(),
                  arg.global.shape, boxes[r].start, local->shape,
                  DTypeSize(arg.global.dtype));
      if (!copied.ok()) return copied;
    } else if (arg.sharding.is_split()) {
      const int64_t len = local->shape[arg.sharding.axis];
      absl::Status copied =
          CopyRows(data->data(), data->size(), local->shape, dst,
                   arg.global.byte_size(), arg.global.shape, arg.sharding.axis,
                   0, j * len, len, DTypeSize(arg.global.dtype));
      if (!copied.ok()) return copied;
    } else if (arg.sharding.is_partial()) {
      AccumulateInto(arg.global.dtype, dst, data->data(),
                     arg.global.num_elements());
    } else if (bytes > 0) {
      std::memcpy(dst, data->data(), bytes);
    }
  }
  return absl::OkStatus();
}

void ClientCore::AwaitInputs(const std::vector<Future>& inputs) {
  for (const Future& in : inputs) {
    const proto::SliceInfo& info = in.slice()->info();
    for (int j = 0; j < info.devices_size(); ++j) {
      // A failed input is not waited on again: the call will fail with it.
      (void)WithConnection(*this, info.devices(j), in.epoch(), in.buffer_id(),
                           [&](transport::DataPlaneConnection& conn) {
                             return conn.Wait({in.buffer_id(), j});
                           });
    }
  }
}

absl::Status Client::WaitOnce(const Future& future) {
  if (!future.valid()) return absl::InvalidArgumentError("empty future");
  const uint64_t epoch = future.epoch();
  if (absl::Status s = core_->SessionStatus(epoch, future.buffer_id());
      !s.ok()) {
    return s;
  }
  absl::Status failed = core_->BufferStatus(future.buffer_id());
  if (!failed.ok()) return failed;
  const proto::SliceInfo& info = future.slice()->info();
  for (int j = 0; j < info.devices_size(); ++j) {
    absl::Status s =
        WithConnection(*core_, info.devices(j), epoch, future.buffer_id(),
                       [&](transport::DataPlaneConnection& conn) {
                         return conn.Wait({future.buffer_id(), j});
                       });
    core_->wait_round_trips++;
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Client::WaitManyOnce(const std::vector<Future>& futures,
                                  absl::Time deadline) {
  if (absl::Status open = core_->CheckOpen(); !open.ok()) return open;
  // Every future must be of the open session (`epoch`): one of a session
  // that ended is lost, and says so.
  const uint64_t epoch = core_->epoch();
  for (const Future& future : futures) {
    if (!future.valid()) return absl::InvalidArgumentError("empty future");
    if (absl::Status s =
            core_->SessionStatus(future.epoch(), future.buffer_id());
        !s.ok()) {
      return s;
    }
  }
  // Each worker's shards, and which future each belongs to.
  struct Batch {
    const proto::SliceDevice* device = nullptr;
    std::vector<transport::ShardKey> keys;
    std::vector<size_t> owners;  // index into `futures`, per key
    std::unique_ptr<transport::DataPlaneConnection> conn;
  };
  std::map<int64_t, Batch> batches;
  for (size_t f = 0; f < futures.size(); ++f) {
    const Future& future = futures[f];
    if (!future.valid()) return absl::InvalidArgumentError("empty future");
    absl::Status failed = core_->BufferStatus(future.buffer_id());
    if (!failed.ok()) return failed;
    const proto::SliceInfo& info = future.slice()->info();
    for (int j = 0; j < info.devices_size(); ++j) {
      Batch& batch = batches[info.devices(j).worker_id()];
      batch.device = &info.devices(j);
      batch.keys.push_back({future.buffer_id(), j});
      batch.owners.push_back(f);
    }
  }
  // The wait ends when any of its workers is lost, saying which.
  std::vector<int64_t> workers;
  for (const auto& [worker, batch] : batches) workers.push_back(worker);
  auto explain = [&](const Batch& batch, const absl::Status& s) {
    if (absl::Status ended = core_->SessionStatus(
            epoch, futures[batch.owners.front()].buffer_id());
        !ended.ok()) {
      return ended;
    }
    for (int64_t w : workers) {
      absl::Status down = core_->WorkerStatus(w);
      if (!down.ok()) return down;
    }
    return absl::UnavailableError(
        absl::StrCat("lost worker ", batch.device->worker_id(), " (",
                     batch.device->host_name(), "): ", s.message()));
  };
  // Every worker's waits go out before any answer is read.
  absl::Status result;
  for (auto& [worker, batch] : batches) {
    absl::Status down = core_->WorkerStatus(worker);
    if (!down.ok()) {
      result = down;
      break;
    }
    auto conn = core_->Checkout(*batch.device, epoch, workers);
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
  for (auto& [worker, batch] : batches) {
    if (batch.conn == nullptr) continue;
    if (!result.ok()) {
      // Its answers are still due: pooled, the next request would read
      // them as its own.
      core_->Discard(std::move(batch.conn));
      continue;
    }
    absl::StatusOr<size_t> answered =
        batch.conn->AwaitWaits(batch.keys, deadline);
    core_->wait_round_trips++;
    if (!answered.ok()) {
      result = batch.conn->healthy() ? answered.status()
                                     : explain(batch, answered.status());
    } else {
      for (size_t k = *answered; k < batch.keys.size(); ++k) {
        not_ready[batch.owners[k]] = true;
      }
    }
    if (batch.conn->healthy()) {
      core_->Checkin(worker, std::move(batch.conn), epoch);
    } else {
      core_->Discard(std::move(batch.conn));
    }
  }
  if (!result.ok()) {
    // Failed as the session ended: say what was lost with it.
    if (absl::Status ended = core_->SessionStatus(
            epoch, futures.empty() ? 0 : futures.front().buffer_id());
        !ended.ok()) {
      return ended;
    }
    return result;
  }
  const int64_t late = std::count(not_ready.begin(), not_ready.end(), true);
  if (late > 0) {
    return absl::DeadlineExceededError(
        absl::StrCat("wait: ", late, " of ", futures.size(),
                     " futures not ready by the deadline"));
  }
  return absl::OkStatus();
}

}  // namespace plexus
