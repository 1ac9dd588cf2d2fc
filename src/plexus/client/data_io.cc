// Put, Fetch and Wait: the client's use of the data plane. The Client
// methods check the request against its session and slice; the DataPath
// moves the bytes and the waits, one worker connection at a time.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "plexus/client/client.h"
#include "plexus/client/client_core.h"
#include "plexus/client/data_path.h"
#include "plexus/client/fetch_plan.h"

namespace plexus {
namespace {

// A put's arguments against its slice and session `epoch`: the spec of
// one shard, or why the put cannot be made.
absl::StatusOr<TensorSpec> CheckPut(ClientSession& session,
                                    const std::shared_ptr<Slice>& slice,
                                    const proto::SliceInfo& map,
                                    const ArgSpec& arg, uint64_t epoch) {
  if (slice == nullptr || slice->closed()) {
    return absl::FailedPreconditionError("put: the slice is closed");
  }
  if (slice->epoch() != epoch) {
    absl::Status lost = slice->lost();
    if (lost.ok()) lost = session.SessionStatus(slice->epoch());
    return absl::Status(lost.code(), absl::StrCat("put: ", lost.message()));
  }
  if (arg.sharding.is_partial()) {
    return absl::InvalidArgumentError("put: an array cannot be put as partial");
  }
  auto local = arg.Local(map.devices_size());
  if (!local.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("put: ", local.status().message()));
  }
  const int64_t bytes = local->byte_size();
  for (const auto& d : map.devices()) {
    if (bytes > d.memory_bytes()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "put: a shard of ", arg.global.ToString(), " needs ", bytes,
          " bytes, more than the ", d.memory_bytes(), "-byte budget of device ",
          d.device(), " on ", d.host_name()));
    }
  }
  return *local;
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
  ClientSession& session = core_->session();
  // While the client reconnects, a put waits for the new session.
  auto tag = session.AwaitSessionForUse();
  if (!tag.ok()) {
    return absl::Status(tag.status().code(),
                        absl::StrCat("put: ", tag.status().message()));
  }
  const uint64_t epoch = (*tag)->epoch;
  if (slice == nullptr) {
    return absl::FailedPreconditionError("put: the slice is closed");
  }
  // One map for the whole put: a resize meanwhile (a loss's shrink, a
  // growth) must not change the shards under it (the server refuses a put
  // cut for a map of another size, and the client says so).
  const proto::SliceInfo& map = slice->info();
  absl::StatusOr<TensorSpec> local = CheckPut(session, slice, map, arg, epoch);
  if (!local.ok()) return local.status();
  absl::StatusOr<uint64_t> next = session.NextIds();
  if (!next.ok()) {
    return absl::Status(next.status().code(),
                        absl::StrCat("put: ", next.status().message()));
  }
  const uint64_t id = *next;
  proto::ClientOp op;
  op.mutable_put()->set_buffer_id(id);
  op.mutable_put()->set_slice_id(slice->id());
  // The map the shards go by (the server asks for them again if it is old).
  op.mutable_put()->set_slice_generation(map.generation());
  op.mutable_put()->set_slice_resizes(map.resizes());
  *op.mutable_put()->mutable_arg() = ToProto(arg);
  // Every shard's data, kept to put it again after a loss.
  auto shards = core_->data().CutShards(map, data, arg, *local);
  if (!shards.ok()) return shards.status();
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
  core_->data().KeepPut(id, slice->id(), *shards);
  session.Enqueue(std::move(ops), epoch);
  slice->Unhold();
  Future future(
      std::make_shared<BufferHandle>(core_, id, arg, slice, *std::move(tag)));
  absl::Status sent = core_->data().SendShards(*slice, id, arg, *local, *shards,
                                               map.resizes(), epoch, progress);
  if (!sent.ok()) return sent;
  return future;
}

absl::Status Client::FetchOnce(const Future& future, void* dst,
                               TransferProgress* progress) {
  return core_->data().Fetch(future, dst, progress);
}

absl::Status Client::WaitOnce(const Future& future) {
  return core_->data().Wait(future);
}

absl::Status Client::WaitManyOnce(const std::vector<Future>& futures,
                                  absl::Time deadline) {
  return core_->data().WaitMany(futures, deadline);
}

// ---------------------------------------------------------------- puts

absl::StatusOr<std::vector<std::shared_ptr<Storage>>> DataPath::CutShards(
    const proto::SliceInfo& map, const void* data, const ArgSpec& arg,
    const TensorSpec& local) const {
  const int n = map.devices_size();
  const int64_t bytes = local.byte_size();
  std::shared_ptr<Storage> replicated;
  std::map<Shape, std::shared_ptr<Storage>> blocks;  // mesh: by block start
  std::vector<std::shared_ptr<Storage>> shards(n);
  for (int j = 0; j < n; ++j) {
    const proto::SliceDevice& device = map.devices(j);
    std::shared_ptr<Storage>& shard = shards[j];
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
                    block->data(), block->size(), local.shape,
                    Shape(local.shape.size(), 0), local.shape,
                    DTypeSize(arg.global.dtype));
        if (!copied.ok()) return copied;
      }
      shard = block;
    } else if (arg.sharding.is_split()) {
      auto s =
          Storage::Allocate(bytes, SameMachine(device) && bytes >= 64 * 1024);
      if (!s.ok()) return s.status();
      shard = *s;
      const int64_t len = local.shape[arg.sharding.axis];
      absl::Status copied =
          CopyRows(data, arg.global.byte_size(), arg.global.shape,
                   shard->data(), shard->size(), local.shape, arg.sharding.axis,
                   j * len, 0, len, DTypeSize(arg.global.dtype));
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
  return shards;
}

absl::Status DataPath::SendShards(
    const Slice& slice, uint64_t id, const ArgSpec& arg,
    const TensorSpec& local,
    const std::vector<std::shared_ptr<Storage>>& shards, uint64_t resizes,
    uint64_t epoch, TransferProgress* progress) {
  const int n = static_cast<int>(shards.size());
  const int64_t bytes = local.byte_size();
  if (progress != nullptr) {
    progress->total_bytes = bytes * n;
    progress->done_bytes = 0;
  }
  for (int j = 0; j < n; ++j) {
    absl::Status s =
        SendShard(slice, id, j, *shards[j], bytes, resizes, epoch, progress);
    if (!s.ok()) {
      // A host lost that no spare replaced: the value cannot be held.
      const absl::StatusCode code = session_.SliceBroken(slice.id())
                                        ? absl::StatusCode::kDataLoss
                                        : s.code();
      return absl::Status(code, absl::StrCat("put of ", arg.global.ToString(),
                                             " shard ", j, ": ", s.message()));
    }
    bytes_put += bytes;
  }
  return absl::OkStatus();
}

absl::Status DataPath::SendShard(const Slice& slice, uint64_t id, int j,
                                 const Storage& shard, int64_t bytes,
                                 uint64_t resizes, uint64_t epoch,
                                 TransferProgress* progress) {
  std::atomic<int64_t>* sent =
      progress != nullptr ? &progress->done_bytes : nullptr;
  absl::Status s;
  int resumed = 0;
  for (int attempt = 0;; ++attempt) {
    const int64_t heard = session_.losses_heard();
    const int64_t resumes = session_.resumes();
    const proto::SliceInfo& map = slice.info();
    const uint64_t generation = map.generation();
    if (map.resizes() != resizes || j >= map.devices_size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "put: slice ", slice.id(), " was resized (to ", map.devices_size(),
          " devices) while the put was sent; put it again"));
    }
    const proto::SliceDevice device = map.devices(j);
    // A shard sent again after a loss counts from where it began.
    if (progress != nullptr) progress->done_bytes = bytes * j;
    s = WithConnection(device, epoch, id,
                       [&](transport::DataPlaneConnection& conn) {
                         return conn.Put({id, j}, shard, sent);
                       });
    // Put again by the recovery already.
    if (s.code() == absl::StatusCode::kAlreadyExists) s = absl::OkStatus();
    // Its server went away and the next resumed the session meanwhile
    // (WithConnection waited for that): the session's end shut the
    // connection, and the worker dropped what part of the shard it had.
    // The shard goes again, a few times at most (once per resume).
    if (s.code() == absl::StatusCode::kUnavailable &&
        session_.resumes() != resumes && ++resumed <= 4) {
      --attempt;
      continue;
    }
    // A host lost under the put: once the server remapped the slice, the
    // shard goes to the device that took its place.
    if (s.code() != absl::StatusCode::kUnavailable || attempt >= 2 ||
        (session_.losses_heard() == heard &&
         !session_.AwaitLoss(heard, absl::Seconds(5))) ||
        slice.generation() == generation) {
      return s;
    }
  }
}

// ---------------------------------------------------------------- reads

namespace {

// Writes shard `j` (`data`, of spec `local`; `box`: its block, for a mesh
// sharding) into its place in the global array `dst`.
absl::Status PlaceShard(const ArgSpec& arg, const TensorSpec& local, int j,
                        const Box* box, const Storage& data, void* dst) {
  if (arg.sharding.is_mesh()) {
    return CopyBox(data.data(), data.size(), local.shape,
                   Shape(local.shape.size(), 0), dst, arg.global.byte_size(),
                   arg.global.shape, box->start, local.shape,
                   DTypeSize(arg.global.dtype));
  }
  if (arg.sharding.is_split()) {
    const int64_t len = local.shape[arg.sharding.axis];
    return CopyRows(data.data(), data.size(), local.shape, dst,
                    arg.global.byte_size(), arg.global.shape, arg.sharding.axis,
                    0, j * len, len, DTypeSize(arg.global.dtype));
  }
  if (arg.sharding.is_partial()) {
    AccumulateInto(arg.global.dtype, dst, data.data(),
                   arg.global.num_elements());
  } else if (local.byte_size() > 0) {
    std::memcpy(dst, data.data(), local.byte_size());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DataPath::Readable(const Future& future) const {
  if (!future.valid()) return absl::InvalidArgumentError("empty future");
  if (absl::Status s =
          session_.SessionStatus(future.epoch(), future.buffer_id());
      !s.ok()) {
    return s;
  }
  return session_.BufferStatus(future.buffer_id());
}

absl::Status DataPath::Fetch(const Future& future, void* dst,
                             TransferProgress* progress) {
  if (absl::Status s = Readable(future); !s.ok()) return s;
  const uint64_t epoch = future.epoch();
  const ArgSpec& arg = future.arg();
  // Not a structured binding: C++17 lambdas cannot capture one (clang).
  const std::pair<uint64_t, const proto::SliceInfo*> where = future.placed();
  const uint64_t id = where.first;
  const proto::SliceInfo& info = *where.second;
  const int n = info.devices_size();
  auto local = arg.Local(n);
  if (!local.ok()) return local.status();
  const int64_t bytes = local->byte_size();
  absl::StatusOr<FetchPlan> plan = PlanFetch(arg, n);
  if (!plan.ok()) return plan.status();
  if (arg.sharding.is_partial() && arg.global.byte_size() > 0) {
    std::memset(dst, 0, arg.global.byte_size());
  }
  std::atomic<int64_t>* received = nullptr;
  if (progress != nullptr) {
    progress->total_bytes = bytes * static_cast<int64_t>(plan->reads.size());
    progress->done_bytes = 0;
    received = &progress->done_bytes;
  }
  // However it ends, a later read of it does not wait for relayed answers.
  absl::Cleanup forget = [this, id] { ForgetRelayed(id); };
  for (size_t r = 0; r < plan->reads.size(); ++r) {
    const int j = plan->reads[r];
    std::shared_ptr<Storage> data;
    if (auto relayed = AwaitRelayed(info.devices(j).worker_id(), {id, j},
                                    /*keep=*/false)) {
      if (!relayed->ok()) return relayed->status();
      data = **std::move(relayed);
      if (received != nullptr) received->fetch_add(bytes);
    } else {
      absl::Status s =
          WithConnection(info.devices(j), epoch, id,
                         [&](transport::DataPlaneConnection& conn) {
                           auto got = conn.Fetch({id, j}, received);
                           if (!got.ok()) return got.status();
                           data = std::move(*got);
                           return absl::OkStatus();
                         });
      if (!s.ok()) return s;
      MaybeLink(info.devices(j), epoch);
    }
    if (static_cast<int64_t>(data->size()) < bytes) {
      return absl::InternalError(
          absl::StrCat("shard ", j, " of ", arg.global.ToString(), " has ",
                       data->size(), " bytes, expected ", bytes));
    }
    bytes_fetched += bytes;
    const Box* box = arg.sharding.is_mesh() ? &plan->boxes[r] : nullptr;
    if (absl::Status placed = PlaceShard(arg, *local, j, box, *data, dst);
        !placed.ok()) {
      return placed;
    }
  }
  return absl::OkStatus();
}

void DataPath::AwaitInputs(const std::vector<Future>& inputs) {
  for (const Future& in : inputs) {
    const std::pair<uint64_t, const proto::SliceInfo*> where = in.placed();
    const uint64_t id = where.first;
    const proto::SliceInfo* map = where.second;
    for (int j = 0; j < map->devices_size(); ++j) {
      // A failed input is not waited on again: the call will fail with it.
      (void)WithConnection(map->devices(j), in.epoch(), id,
                           [&](transport::DataPlaneConnection& conn) {
                             return conn.Wait({id, j});
                           });
    }
  }
}

absl::Status DataPath::Wait(const Future& future) {
  if (absl::Status s = Readable(future); !s.ok()) return s;
  const uint64_t epoch = future.epoch();
  const std::pair<uint64_t, const proto::SliceInfo*> where = future.placed();
  const uint64_t id = where.first;
  const proto::SliceInfo* map = where.second;
  for (int j = 0; j < map->devices_size(); ++j) {
    // A relayed value stays with its link for the fetch that may follow.
    if (auto relayed = AwaitRelayed(map->devices(j).worker_id(), {id, j},
                                    /*keep=*/true)) {
      if (!relayed->ok()) return relayed->status();
      continue;
    }
    absl::Status s = WithConnection(map->devices(j), epoch, id,
                                    [&](transport::DataPlaneConnection& conn) {
                                      return conn.Wait({id, j});
                                    });
    wait_round_trips++;
    if (!s.ok()) return s;
    MaybeLink(map->devices(j), epoch);
  }
  return absl::OkStatus();
}

}  // namespace plexus
