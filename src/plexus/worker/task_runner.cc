// Execution of the shard tasks of a call on this worker's devices.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "plexus/common/logging.h"
#include "plexus/worker/call_context.h"
#include "plexus/worker/worker_impl.h"

namespace plexus {

namespace {

// Collective exchange buffers are keyed by the call id with the top bit set.
constexpr uint64_t kCollectiveBit = uint64_t{1} << 63;
// The longest an NCCL all_reduce waits for its peers (one that dies fails
// it at once: CallCollective's watch entries).
constexpr absl::Duration kNcclTimeout = absl::Minutes(5);

}  // namespace

void WorkerImpl::ApplyExecute(proto::Execute& incoming) {
  auto call = std::make_shared<CallContext>();
  call->exec.Swap(&incoming);  // no copy: the op is consumed
  const proto::Execute& exec = call->exec;
  auto pit = programs_.find(exec.program_id());
  if (pit != programs_.end()) {
    call->program_ref = pit->second;  // alive while the call runs
    call->program = pit->second.get();
  }
  call->tasks_left = exec.tasks_size();
  if (call->program && call->program->xla) {
    call->island = std::make_unique<IslandExecution>(exec.tasks_size());
  }

  // Why the collective of this call cannot take place here: every task
  // fails with it.
  absl::Status collective_error;
  std::vector<CallCollective::Peer> peers;
  int my_rank = -1;
  if (call->program && call->program->kernel &&
      call->program->kernel->signature().is_collective() &&
      exec.peers_size() > 0) {
    for (int r = 0; r < exec.peers_size(); ++r) {
      peers.push_back(
          {exec.peers(r).worker_id(), exec.peers(r).local_shards()});
      if (exec.peers(r).worker_id() == worker_id_) my_rank = r;
    }
    if (my_rank < 0) {
      collective_error = absl::InvalidArgumentError(absl::StrCat(
          "program '", call->program->name, "': call ", exec.call_id(),
          " does not list this worker among its peers"));
    } else if (exec.tasks_size() == 0 ||
               peers[my_rank].local_shards != exec.tasks_size()) {
      collective_error = absl::InvalidArgumentError(
          absl::StrCat("program '", call->program->name, "': call ",
                       exec.call_id(), " counts ", peers[my_rank].local_shards,
                       " shards on this worker but sends ", exec.tasks_size()));
    }
    for (const CallCollective::Peer& peer : peers) {
      auto down = down_peers_.find(peer.worker_id);
      if (down == down_peers_.end() || !collective_error.ok()) continue;
      // Its partial will never come.
      collective_error = absl::Status(
          down->second.code(),
          absl::StrCat("program '", call->program->name, "': call ",
                       exec.call_id(), " takes part with worker ",
                       peer.worker_id,
                       ", which is down: ", down->second.message()));
    }
  }
  if (!peers.empty() && collective_error.ok()) {
    // On the timeline, each partial, offer or ring step sent to a peer is
    // a transfer of this call (the peer's task of it reads it).
    TimelineEvent step;
    if (timeline_.enabled()) {
      step.kind = EventKind::kTransfer;
      step.client_id = exec.client_id();
      step.call_id = exec.call_id();
      step.program_id = exec.program_id();
    }
    call->collective = std::make_unique<CallCollective>(
        exec.call_id() | kCollectiveBit, std::move(peers), my_rank,
        store_.get(),
        [this, step](int64_t worker, const BufferKey& key,
                     absl::StatusOr<std::shared_ptr<const Storage>> data) {
          if (PeerSender* s = SenderTo(worker)) {
            TimelineEvent e = step;
            e.buffer_id = key.buffer_id;
            e.shard = key.shard;
            e.peer = worker;
            s->Send({key.buffer_id, key.shard}, std::move(data), e);
          }
        });
    // Every rank's partial has the shape of one shard's input.
    TensorSpec partial_spec;
    if (!call->program->inputs.empty()) {
      auto local = call->program->inputs[0].Local(exec.num_shards());
      if (local.ok()) partial_spec = *local;
    }
    // On the GPUs where every worker runs NCCL and holds one shard of the
    // call (several local shards on distinct GPUs would take one NCCL
    // group call: not built, so they take the host path).
    // (all_reduce only: its tasks then skip the kernel, RunTask.)
    bool nccl = nccl_ != nullptr && exec.peers_size() > 1 &&
                call->program->kernel ==
                    builtin::KernelRegistry::Global().Find("all_reduce") &&
                call->program->inputs.size() == 1 &&
                call->program->outputs.size() == 1;
    for (const proto::CollectivePeer& peer : exec.peers()) {
      nccl &= peer.nccl() && peer.local_shards() == 1;
    }
    if (nccl) {
      // Its one local shard's sum, on the timeline as a transfer by NCCL.
      TimelineEvent summed;
      summed.client_id = exec.client_id();
      summed.call_id = exec.call_id();
      summed.program_id = exec.program_id();
      summed.buffer_id = exec.output_ids_size() > 0 ? exec.output_ids(0) : 0;
      summed.peer = worker_id_.load();
      summed.device = exec.tasks(0).device();
      summed.shard = exec.tasks(0).shard();
      call->collective->EnableNccl(nccl_.get(), kNcclTimeout,
                                   timeline_.enabled() ? &timeline_ : nullptr,
                                   summed);
    }
    call->collective->ExpectPartials(exec.tasks(0).device(), partial_spec);
  }

  // Declare outputs and pin inputs now, in stream order, so fetches and
  // releases that follow see them. An input that is not here (released
  // before this call reached the worker) fails its task now: nothing would
  // ever fulfil it.
  call->input_errors.assign(exec.tasks_size(), collective_error);
  const int num_devices = static_cast<int>(devices_.size());
  for (int t = 0; t < exec.tasks_size(); ++t) {
    const proto::ShardTask& task = exec.tasks(t);
    // A task for a device this worker lacks fails where it stands: its
    // outputs are declared on no device and fail, nothing waits for it.
    const bool on_device = task.device() >= 0 && task.device() < num_devices;
    if (!on_device && call->input_errors[t].ok()) {
      call->input_errors[t] = absl::InvalidArgumentError(
          absl::StrCat("call ", exec.call_id(), " names device ", task.device(),
                       " but this worker has ", num_devices));
    }
    for (int o = 0; o < exec.output_ids_size(); ++o) {
      TensorSpec spec;
      if (call->program &&
          o < static_cast<int>(call->program->outputs.size())) {
        auto local = call->program->outputs[o].Local(exec.num_shards());
        if (local.ok()) spec = *local;
      }
      store_->Declare({exec.output_ids(o), task.shard()},
                      on_device ? task.device() : -1, spec, /*owned=*/true);
    }
    std::vector<BufferKey> pinned;
    for (int i = 0; i < task.inputs_size() && call->input_errors[t].ok(); ++i) {
      for (const auto& piece : task.inputs(i).pieces()) {
        BufferKey key{piece.buffer_id(), piece.shard()};
        absl::Status known = store_->AddReader(key);
        if (!known.ok()) {
          call->input_errors[t] = absl::Status(
              known.code(),
              absl::StrCat(call->program
                               ? "program '" + call->program->name + "'"
                               : "a program",
                           " argument ", i, ": ", known.message()));
          break;
        }
        pinned.push_back(key);
      }
    }
    if (!call->input_errors[t].ok()) {
      for (const BufferKey& key : pinned) store_->RemoveReader(key);
    }
  }
  // Built-in kernels that are not collectives neither wait for nor are
  // waited on by other calls' tasks: they may pass other clients' queued
  // tasks by their start tag (worker/task_queue.h).
  const TaskOrder order{
      .client = exec.client_id(),
      .start_tag = exec.start_tag(),
      .reorderable = call->program != nullptr &&
                     call->program->kernel != nullptr &&
                     !call->program->kernel->signature().is_collective() &&
                     !call->program->xla};
  const bool collective_kernel =
      call->program != nullptr && call->program->kernel != nullptr &&
      call->program->kernel->signature().is_collective() && !call->program->xla;
  for (int i = 0; i < exec.tasks_size(); ++i) {
    int device = exec.tasks(i).device();
    if (device < 0 || device >= num_devices) {
      SPDLOG_ERROR("call {} names device {} but this worker has {}",
                   exec.call_id(), device, num_devices);
      RunTask(call, i, absl::Now());  // fails at once with input_errors[i]
      continue;
    }
    Device::Task run = [this, call, i, queued = absl::Now()] {
      RunTask(call, i, queued);
    };
    // A built-in collective waits on its peers and the network, not on the
    // device: it runs on the device's communication stream, so the compute
    // queued behind it (the rest of a backward pass) goes on meanwhile.
    if (collective_kernel) {
      devices_[device]->EnqueueCollective(std::move(run), order);
    } else {
      devices_[device]->Enqueue(std::move(run), order);
    }
  }
}

absl::StatusOr<builtin::ConstTensor> WorkerImpl::BindInput(
    const proto::InputBinding& binding, int device,
    std::vector<std::shared_ptr<const Storage>>* keep, int64_t* reserved_bytes,
    const DeviceBuffer** in_device) {
  auto local = FromProto(binding.local());
  if (!local.ok()) return local.status();
  std::vector<std::shared_ptr<const Storage>> sources;
  for (const auto& piece : binding.pieces()) {
    auto data = store_->AwaitReady({piece.buffer_id(), piece.shard()});
    if (!data.ok()) return data.status();
    sources.push_back(*data);
  }
  const size_t bytes = local->byte_size();
  if (binding.pieces_size() == 1 && sources[0]->size() == bytes &&
      binding.pieces(0).dst_offset() == 0) {
    if (in_device != nullptr && sources[0]->kind() == MemoryKind::kDevice) {
      *in_device = sources[0]->device_buffer();
      keep->push_back(sources[0]);
      return builtin::ConstTensor{*local, sources[0]->data()};
    }
    auto host = Storage::InHostMemory(sources[0], /*shareable=*/false);
    if (!host.ok()) return host.status();
    keep->push_back(*host);
    return builtin::ConstTensor{*local, (*host)->data()};
  }
  // Pieces are cut on the host.
  for (auto& source : sources) {
    auto host = Storage::InHostMemory(source, /*shareable=*/false);
    if (!host.ok()) return host.status();
    source = *std::move(host);
  }
  // Assemble the input from pieces of its sources.
  absl::Status reserve = store_->Reserve(device, bytes);
  if (!reserve.ok()) return reserve;
  *reserved_bytes += bytes;
  auto assembled = Storage::AllocateForWrite(bytes);
  if (!assembled.ok()) return assembled.status();
  const int axis = binding.axis();
  const size_t elem = DTypeSize(local->dtype);
  for (int p = 0; p < binding.pieces_size(); ++p) {
    const proto::Piece& piece = binding.pieces(p);
    if (piece.extent_size() > 0) {  // a box of a block (mesh layouts)
      auto shape = [](const auto& field) {
        return Shape(field.begin(), field.end());
      };
      absl::Status copied = CopyBox(
          sources[p]->data(), sources[p]->size(), shape(piece.src_shape()),
          shape(piece.src_start()), (*assembled)->data(), (*assembled)->size(),
          local->shape, shape(piece.dst_start()), shape(piece.extent()), elem);
      if (!copied.ok()) {
        return absl::InternalError(
            absl::StrCat("assembling an input from ",
                         KeyString({piece.buffer_id(), piece.shard()}), ": ",
                         copied.message()));
      }
      continue;
    }
    // The source's rows along `axis`: its size over the other dims.
    Shape src_shape = local->shape;
    int64_t other = elem;
    for (size_t i = 0; i < src_shape.size(); ++i) {
      if (static_cast<int>(i) != axis) other *= src_shape[i];
    }
    if (other == 0) continue;  // an empty array: no rows to copy
    if (!src_shape.empty() && axis >= 0 &&
        axis < static_cast<int>(src_shape.size())) {
      src_shape[axis] = static_cast<int64_t>(sources[p]->size()) / other;
    }
    absl::Status copied =
        CopyRows(sources[p]->data(), sources[p]->size(), src_shape,
                 (*assembled)->data(), (*assembled)->size(), local->shape, axis,
                 piece.src_offset(), piece.dst_offset(), piece.length(), elem);
    if (!copied.ok()) {
      return absl::InternalError(
          absl::StrCat("assembling an input from ",
                       KeyString({piece.buffer_id(), piece.shard()}), ": ",
                       copied.message()));
    }
  }
  std::shared_ptr<const Storage> result = std::move(*assembled);
  keep->push_back(result);
  return builtin::ConstTensor{*local, result->data()};
}

void WorkerImpl::TakeDonations(
    const CallContext& call, int task_index, const builtin::KernelContext& ctx,
    const std::vector<const DeviceBuffer*>& input_devices,
    const std::vector<std::shared_ptr<const Storage>>& keep,
    const std::vector<std::shared_ptr<const Storage>>& bound,
    std::vector<bool>* donate, std::vector<int>* written_over) {
  const proto::Execute& exec = call.exec;
  const proto::ShardTask& task = exec.tasks(task_index);
  const LoadedProgram& program = *call.program;
  const proto::XlaProgram& xla = *program.xla;
  const int pairs =
      std::min(xla.donated_inputs_size(), xla.donated_outputs_size());
  for (int k = 0; k < pairs; ++k) {
    const int i = xla.donated_inputs(k), o = xla.donated_outputs(k);
    if (i < 0 || i >= task.inputs_size() || o < 0 ||
        o >= static_cast<int>(written_over->size()) ||
        !task.inputs(i).donate() || (*donate)[i] || (*written_over)[o] >= 0) {
      continue;  // not allowed by the server (or not well formed)
    }
    const proto::InputBinding& binding = task.inputs(i);
    auto local = program.outputs[o].Local(exec.num_shards());
    const DeviceBuffer* buffer =
        i < static_cast<int>(input_devices.size()) ? input_devices[i] : nullptr;
    // The entry's Storage, as the task holds it: TakeForDonation checks
    // that nothing else does.
    const Storage* storage = nullptr;
    long refs = 0;
    for (const auto* list : {&keep, &bound}) {
      for (const auto& held : *list) {
        if (buffer != nullptr && held->device_buffer() == buffer) {
          storage = held.get();
          refs++;
        }
      }
    }
    const BufferKey key{binding.pieces(0).buffer_id(),
                        binding.pieces(0).shard()};
    if (storage == nullptr || binding.pieces_size() != 1 || !local.ok() ||
        !(ctx.inputs[i].spec == *local) ||
        !store_->TakeForDonation(
            key, storage, refs,
            absl::FailedPreconditionError(
                absl::StrCat(KeyString(key), " was donated to program '",
                             program.name, "' (call ", exec.call_id(),
                             "): its memory holds that ", "call's output")))) {
      donations_declined_++;
      continue;
    }
    (*donate)[i] = true;
    (*written_over)[o] = i;
  }
}

void WorkerImpl::RunTask(const std::shared_ptr<CallContext>& call,
                         int task_index, absl::Time queued) {
  const proto::Execute& exec = call->exec;
  const proto::ShardTask& task = exec.tasks(task_index);
  LoadedProgram* program = call->program;
  const int device = task.device();
  std::vector<std::shared_ptr<const Storage>> keep;
  std::vector<std::shared_ptr<Storage>> outputs;
  int64_t scratch_bytes = 0;
  int64_t output_bytes = 0;
  std::vector<bool> aliased;

  std::unique_ptr<ShardCollectives> shard_collectives;
  // The task handed its input to the collective as stored (EnableNccl).
  const bool stored_collective =
      call->collective != nullptr && call->collective->nccl_enabled();
  bool contributed_stored = false;
  bool joined_island = false;
  const absl::Status& input_error = call->input_errors[task_index];
  // A call of a client that left after the call was queued here is
  // dropped, not run: nobody can read its outputs, and other clients' calls
  // wait behind it on this device. (The worker cannot stop one that runs.)
  const uint64_t client = ClientOfBuffer(exec.program_id());
  const bool dropped = store_->HasLeft(client);
  auto run = [&]() -> absl::Status {
    if (!input_error.ok()) return input_error;
    if (dropped) {
      return absl::CancelledError(absl::StrCat(
          "call ", exec.call_id(), " dropped: client ", client, " has left"));
    }
    if (program == nullptr || (program->kernel == nullptr && !program->xla)) {
      return absl::NotFoundError(absl::StrCat("program ", exec.program_id(),
                                              " is not loaded on this worker"));
    }
    // Each output id is one of the program's outputs (the server routes
    // them so; the worker does not rely on it).
    if (exec.output_ids_size() != static_cast<int>(program->outputs.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("program '", program->name, "' has ",
                       program->outputs.size(), " outputs, but call ",
                       exec.call_id(), " names ", exec.output_ids_size()));
    }
    builtin::KernelContext ctx;
    ctx.attrs = &program->attrs;
    ctx.shard = task.shard();
    ctx.num_shards = exec.num_shards();
    ctx.clock = options_.clock;
    for (const ArgSpec& in : program->inputs) {
      ctx.input_shardings.push_back(in.sharding);
    }
    std::vector<std::shared_ptr<const Storage>> input_storage;
    // XLA reads inputs where they are (device memory as it is).
    std::vector<const DeviceBuffer*> input_devices;
    for (int i = 0; i < task.inputs_size(); ++i) {
      input_devices.push_back(nullptr);
      auto input = BindInput(
          task.inputs(i), device, &keep, &scratch_bytes,
          program->xla || stored_collective ? &input_devices.back() : nullptr);
      if (!input.ok()) return input.status();  // upstream error, intact
      ctx.inputs.push_back(*input);
      input_storage.push_back(keep.back());
    }
    if (stored_collective) {
      // all_reduce on the values as they are stored: the collective sums
      // them on the GPUs or on the host, and gives the output's Storage.
      auto local = program->outputs[0].Local(exec.num_shards());
      if (!local.ok()) return local.status();
      if (ctx.inputs.size() != 1 || ctx.inputs[0].spec != *local) {
        return absl::InvalidArgumentError(absl::StrCat(
            "program '", program->name, "': all_reduce of ",
            ctx.inputs.empty() ? "nothing" : ctx.inputs[0].spec.ToString(),
            " into ", local->ToString()));
      }
      if (absl::Status s = store_->Reserve(device, local->byte_size());
          !s.ok()) {
        return s;
      }
      output_bytes += local->byte_size();
      contributed_stored = true;
      auto out = call->collective->AllReduceStored(task.shard(),
                                                   input_storage[0], *local);
      if (!out.ok()) {
        return absl::Status(
            out.status().code(),
            absl::StrCat("program '", program->name, "' failed on shard ",
                         task.shard(), " (worker ", worker_id_.load(),
                         "): ", out.status().message()));
      }
      outputs.push_back(*std::move(out));
      aliased.push_back(false);
      return absl::OkStatus();
    }
    std::vector<bool> donate(ctx.inputs.size(), false);
    std::vector<int> written_over(program->outputs.size(), -1);
    if (program->xla) {
      TakeDonations(*call, task_index, ctx, input_devices, keep, input_storage,
                    &donate, &written_over);
      // Their charges are reservations now: the outputs' (also if the
      // task fails before it makes them).
      for (int i : written_over) {
        if (i >= 0) output_bytes += ctx.inputs[i].spec.byte_size();
      }
    }
    bool all_aliased = !program->outputs.empty();
    for (size_t o = 0; o < program->outputs.size(); ++o) {
      auto local = program->outputs[o].Local(exec.num_shards());
      if (!local.ok()) return local.status();
      if (program->xla &&
          !(task_index > 0 && program->outputs[o].sharding.is_partial())) {
        // XLA's output stays in device memory, charged to the device now;
        // RunXlaPartition fills it in. (Of a `partial` output, partition
        // 0 holds the island's value and the others zeros, made here.)
        // One written over a donated input takes over the input's charge.
        if (written_over[o] < 0) {
          if (absl::Status s = store_->Reserve(device, local->byte_size());
              !s.ok()) {
            return s;
          }
          output_bytes += local->byte_size();
        }
        aliased.push_back(false);
        all_aliased = false;
        outputs.push_back(nullptr);
        continue;
      }
      const int alias =
          program->kernel
              ? program->kernel->signature().AliasedInput(static_cast<int>(o))
              : -1;
      if (alias >= 0 && alias < static_cast<int>(ctx.inputs.size()) &&
          ctx.inputs[alias].spec == *local) {
        // Immutable buffers: the output is the input's buffer, no copy.
        auto shared = std::const_pointer_cast<Storage>(input_storage[alias]);
        ctx.outputs.push_back({*local, shared->data()});
        outputs.push_back(std::move(shared));
        aliased.push_back(true);
        continue;
      }
      all_aliased = false;
      aliased.push_back(false);
      auto storage = store_->Allocate(device, local->byte_size());
      if (!storage.ok()) return storage.status();
      output_bytes += local->byte_size();
      ctx.outputs.push_back({*local, (*storage)->data()});
      outputs.push_back(std::move(*storage));
    }
    if (call->collective) {
      shard_collectives = std::make_unique<ShardCollectives>(
          call->collective.get(), task.shard());
      ctx.collectives = shard_collectives.get();
    }
    if (all_aliased) return absl::OkStatus();
    if (program->xla) {
      joined_island = true;
      return RunXlaPartition(call, task_index, ctx, input_devices, donate,
                             &outputs);
    }
    absl::Status s = program->kernel->Run(ctx);
    if (!s.ok()) {
      return absl::Status(
          s.code(),
          absl::StrCat("program '", program->name, "' failed on shard ",
                       task.shard(), " (worker ", worker_id_.load(),
                       "): ", s.message()));
    }
    return absl::OkStatus();
  };

  const absl::Time started = absl::Now();
  call->queued_micros += absl::ToInt64Microseconds(started - queued);
  absl::Status status = run();
  const absl::Time ran = absl::Now();
  if (call->island && !joined_island) call->island->Fail(task_index, status);
  if (call->collective && !contributed_stored &&
      (shard_collectives == nullptr || !shard_collectives->contributed())) {
    call->collective->Abort(
        task.shard(), status.ok() ? absl::InternalError("collective kernel did "
                                                        "not all-reduce")
                                  : status);
  }
  if (status.ok()) {
    // An XLA output goes in now, before its run has ended: the device's
    // next program reads it as it is, host readers await it.
    for (int o = 0; o < exec.output_ids_size(); ++o) {
      // An aliased output is charged again: a conservative budget.
      store_->Fulfil({exec.output_ids(o), task.shard()}, std::move(outputs[o]),
                     device, /*reserved=*/!aliased[o]);
    }
  } else {
    if (output_bytes > 0) store_->Unreserve(device, output_bytes);
    for (int o = 0; o < exec.output_ids_size(); ++o) {
      store_->Fail({exec.output_ids(o), task.shard()}, status);
    }
    if (!dropped) calls_failed_++;
    call->failed = true;
    SPDLOG_DEBUG("call {} shard {} failed: {}", exec.call_id(), task.shard(),
                 status.ToString());
  }
  if (!joined_island) {
    if (status.ok()) calls_executed_++;
    RecordTask(*call, task_index, started, ran, !status.ok());
    FinishTask(call, task_index, std::move(keep), scratch_bytes,
               absl::ToInt64Microseconds(ran - started));
    return;
  }
  // A partition of an XLA island: what it reads stays pinned, and the call
  // is reported, once the island's run has ended (at once where none was
  // queued), also where this task failed after it was queued.
  xla_runs_started_.fetch_add(1);
  call->island->WhenEnded(
      [this, call, task_index, keep = std::move(keep), scratch_bytes, device,
       started, failed = !status.ok()](const absl::Status& end) mutable {
        // Device time: from when it was queued or the device's previous run
        // ended, whichever is later, to its end.
        const int64_t now = absl::ToUnixMicros(absl::Now());
        const int64_t last =
            device_run_ends_[device].exchange(now, std::memory_order_relaxed);
        const int64_t from =
            std::max(absl::ToUnixMicros(started), std::min(last, now));
        if (failed) {
          // Counted, and its outputs failed, when it failed.
        } else if (end.ok()) {
          calls_executed_++;
        } else {
          calls_failed_++;
          call->failed = true;
          SPDLOG_DEBUG("call {} shard {} failed on its device: {}",
                       call->exec.call_id(),
                       call->exec.tasks(task_index).shard(), end.ToString());
        }
        const int64_t busy = std::max<int64_t>(0, now - from);
        device_run_busy_[device].fetch_add(busy, std::memory_order_relaxed);
        // On the timeline, the run's time on its device (runs queued
        // behind each other do not overlap there).
        RecordTask(*call, task_index, absl::FromUnixMicros(from),
                   absl::FromUnixMicros(now), failed || !end.ok());
        FinishTask(call, task_index, std::move(keep), scratch_bytes, busy);
        absl::MutexLock lock(&xla_runs_mu_);
        ++xla_runs_ended_;
      });
}

void WorkerImpl::RecordTask(const CallContext& call, int task_index,
                            absl::Time started, absl::Time ended, bool failed) {
  if (!timeline_.enabled()) return;
  const proto::Execute& exec = call.exec;
  const proto::ShardTask& task = exec.tasks(task_index);
  TimelineEvent e;
  e.kind = EventKind::kTask;
  e.start_ns = timeline_.At(started);
  e.end_ns = timeline_.At(ended);
  e.client_id = exec.client_id();
  e.call_id = exec.call_id();
  e.program_id = exec.program_id();
  e.buffer_id = exec.output_ids_size() > 0 ? exec.output_ids(0) : 0;
  e.device = task.device();
  e.shard = task.shard();
  e.failed = failed;
  timeline_.Record(e);
}

void WorkerImpl::FinishTask(const std::shared_ptr<CallContext>& call,
                            int task_index,
                            std::vector<std::shared_ptr<const Storage>> keep,
                            int64_t scratch_bytes, int64_t busy_micros) {
  const proto::Execute& exec = call->exec;
  const proto::ShardTask& task = exec.tasks(task_index);
  call->busy_micros += busy_micros;
  if (scratch_bytes > 0) store_->Unreserve(task.device(), scratch_bytes);
  keep.clear();
  if (call->input_errors[task_index].ok()) {
    // Else its pins were dropped when it was queued.
    for (const auto& binding : task.inputs()) {
      for (const auto& piece : binding.pieces()) {
        store_->RemoveReader({piece.buffer_id(), piece.shard()});
      }
    }
  }
  if (--call->tasks_left == 0) {
    if (call->collective) call->collective->ReleasePartials();
    CallFinished(exec, call->failed.load(), call->busy_micros.load(),
                 call->queued_micros.load());
  }
}

void WorkerImpl::AwaitXlaRuns() {
  const int64_t started = xla_runs_started_.load();
  absl::MutexLock lock(&xla_runs_mu_);
  auto ended = [this, started]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(xla_runs_mu_) {
    return xla_runs_ended_ >= started;
  };
  xla_runs_mu_.Await(absl::Condition(&ended));
}

}  // namespace plexus
