// TaskRunner::RunTask: one shard task of a call, on its device's thread.
#include "plexus/worker/task_runner.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "plexus/common/logging.h"
#include "plexus/worker/input_binding.h"

namespace plexus {

void TaskRunner::RunTask(const std::shared_ptr<CallContext>& call,
                         int task_index, absl::Time queued,
                         int64_t reserved_ahead) {
  const proto::Execute& exec = call->exec();
  const proto::ShardTask& task = exec.tasks(task_index);
  TaskState state;
  state.reserved_ahead = reserved_ahead;
  // A call of a client that left after the call was queued here is
  // dropped, not run: nobody can read its outputs, and other clients' calls
  // wait behind it on this device. (The worker cannot stop one that runs.)
  const bool dropped = store_.HasLeft(ClientOfBuffer(exec.program_id()));
  const absl::Time started = clock_->Now();
  call->queued_micros += absl::ToInt64Microseconds(started - queued);
  absl::Status status = ExecuteTask(call, task_index, dropped, state);
  const absl::Time ran = clock_->Now();
  if (state.reserved_ahead > 0) {
    store_.Unreserve(task.device(), state.reserved_ahead);
    state.reserved_ahead = 0;
  }
  // Whether the program's next call on this device may run on the reader:
  // an XLA run's own time counts too, once it has ended.
  const bool quick = status.ok() && ran - started <= kInlineTask;
  if (call->program != nullptr && !state.joined_island) {
    call->program->quick_device.store(quick ? task.device() : -1,
                                      std::memory_order_relaxed);
  }
  if (call->island && !state.joined_island) {
    call->island->Fail(task_index, status);
  }
  if (call->collective && !state.contributed_stored &&
      (state.shard_collectives == nullptr ||
       !state.shard_collectives->contributed())) {
    call->collective->Abort(
        task.shard(), status.ok() ? absl::InternalError("collective kernel did "
                                                        "not all-reduce")
                                  : status);
  }
  PublishOutputs(*call, task_index, status, dropped, state);
  if (!state.joined_island) {
    if (status.ok()) calls_executed_++;
    RecordTask(*call, task_index, started, ran, !status.ok());
    FinishTask(call, task_index, std::move(state.keep), state.scratch_bytes,
               absl::ToInt64Microseconds(ran - started));
    return;
  }
  FinishWhenIslandEnds(call, task_index, std::move(state), started,
                       !status.ok(), quick);
}

absl::Status TaskRunner::CheckRunnable(const CallContext& call, int task_index,
                                       bool dropped) const {
  const proto::Execute& exec = call.exec();
  const LoadedProgram* program = call.program;
  const absl::Status& input_error = call.input_errors[task_index];
  if (!input_error.ok()) return input_error;
  if (dropped) {
    return absl::CancelledError(
        absl::StrCat("call ", exec.call_id(), " dropped: client ",
                     ClientOfBuffer(exec.program_id()), " has left"));
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
  return absl::OkStatus();
}

absl::Status TaskRunner::ExecuteTask(const std::shared_ptr<CallContext>& call,
                                     int task_index, bool dropped,
                                     TaskState& state) {
  if (absl::Status s = CheckRunnable(*call, task_index, dropped); !s.ok()) {
    return s;
  }
  const proto::Execute& exec = call->exec();
  const proto::ShardTask& task = exec.tasks(task_index);
  const LoadedProgram* program = call->program;
  const bool stored_collective =
      call->collective != nullptr && call->collective->nccl_enabled();
  builtin::KernelContext ctx;
  ctx.attrs = &program->attrs;
  ctx.shard = task.shard();
  ctx.num_shards = exec.num_shards();
  ctx.clock = clock_;
  if (program->kernel != nullptr) {  // a built-in kernel may read them
    ctx.input_shardings.reserve(program->inputs.size());
    for (const ArgSpec& in : program->inputs) {
      ctx.input_shardings.push_back(in.sharding);
    }
  }
  const size_t num_inputs = task.inputs_size();
  ctx.inputs.reserve(num_inputs);
  state.keep.reserve(state.keep.size() + num_inputs);
  InputStorage input_storage;
  input_storage.reserve(num_inputs);
  // XLA reads inputs where they are (device memory as it is).
  InputDevices input_devices;
  input_devices.reserve(num_inputs);
  for (int i = 0; i < task.inputs_size(); ++i) {
    input_devices.push_back(nullptr);
    auto input = BindInput(
        store_, task.inputs(i), task.device(), &state.keep,
        &state.scratch_bytes,
        program->xla || stored_collective ? &input_devices.back() : nullptr,
        &state.reserved_ahead);
    if (!input.ok()) return input.status();  // upstream error, intact
    ctx.inputs.push_back(*input);
    input_storage.push_back(state.keep.back());
  }
  if (stored_collective) {
    return AllReduceStored(*call, task_index, ctx, input_storage, state);
  }
  Donations donate(ctx.inputs.size(), false);
  WrittenOver written_over(program->outputs.size(), -1);
  if (program->xla) {
    xla_.TakeDonations(*call, task_index, ctx, input_devices, state.keep,
                       input_storage, &donate, &written_over);
    // Their charges are reservations now: the outputs' (also if the
    // task fails before it makes them).
    for (int i : written_over) {
      if (i >= 0) state.output_bytes += ctx.inputs[i].spec.byte_size();
    }
  }
  bool all_aliased = false;
  if (absl::Status s = MakeOutputs(*call, task_index, written_over,
                                   input_storage, &ctx, state, &all_aliased);
      !s.ok()) {
    return s;
  }
  if (call->collective) {
    state.shard_collectives = std::make_unique<ShardCollectives>(
        call->collective.get(), task.shard());
    ctx.collectives = state.shard_collectives.get();
  }
  if (all_aliased) return absl::OkStatus();
  if (program->xla) {
    state.joined_island = true;
    return xla_.RunPartition(call, task_index, ctx, input_devices,
                             input_storage, donate, &state.outputs,
                             &state.reserved_ahead);
  }
  absl::Status s = program->kernel->Run(ctx);
  if (!s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat("program '", program->name, "' failed on shard ",
                               task.shard(), " (worker ", me_.worker_id.load(),
                               "): ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status TaskRunner::AllReduceStored(CallContext& call, int task_index,
                                         const builtin::KernelContext& ctx,
                                         const InputStorage& input_storage,
                                         TaskState& state) {
  const proto::Execute& exec = call.exec();
  const proto::ShardTask& task = exec.tasks(task_index);
  const LoadedProgram& program = *call.program;
  if (program.outputs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("program '", program.name, "': all_reduce of no output"));
  }
  absl::StatusOr<const TensorSpec*> of = call.outputs->Of(0);
  if (!of.ok()) return of.status();
  const TensorSpec* local = *of;
  if (ctx.inputs.size() != 1 || ctx.inputs[0].spec != *local) {
    return absl::InvalidArgumentError(absl::StrCat(
        "program '", program.name, "': all_reduce of ",
        ctx.inputs.empty() ? "nothing" : ctx.inputs[0].spec.ToString(),
        " into ", local->ToString()));
  }
  if (absl::Status s = store_.Reserve(task.device(), local->byte_size());
      !s.ok()) {
    return s;
  }
  state.output_bytes += local->byte_size();
  state.contributed_stored = true;
  auto out =
      call.collective->AllReduceStored(task.shard(), input_storage[0], *local);
  if (!out.ok()) {
    return absl::Status(
        out.status().code(),
        absl::StrCat("program '", program.name, "' failed on shard ",
                     task.shard(), " (worker ", me_.worker_id.load(),
                     "): ", out.status().message()));
  }
  state.outputs.push_back(*std::move(out));
  state.aliased.push_back(false);
  return absl::OkStatus();
}

absl::Status TaskRunner::MakeOutputs(const CallContext& call, int task_index,
                                     const WrittenOver& written_over,
                                     const InputStorage& input_storage,
                                     builtin::KernelContext* ctx,
                                     TaskState& state, bool* all_aliased) {
  const proto::Execute& exec = call.exec();
  const LoadedProgram& program = *call.program;
  const int device = exec.tasks(task_index).device();
  *all_aliased = !program.outputs.empty();
  // XLA's outputs are charged together, after the loop (one wait for room
  // for them all, one take of the store's lock).
  int64_t xla_bytes = 0;
  for (size_t o = 0; o < program.outputs.size(); ++o) {
    absl::StatusOr<const TensorSpec*> of = call.outputs->Of(o);
    if (!of.ok()) return of.status();
    const TensorSpec* local = *of;
    if (program.xla &&
        !(task_index > 0 && program.outputs[o].sharding.is_partial())) {
      // XLA's output stays in device memory, charged to the device now;
      // RunPartition fills it in. (Of a `partial` output, partition 0
      // holds the island's value and the others zeros, made here.) One
      // written over a donated input takes over the input's charge.
      if (written_over[o] < 0) xla_bytes += local->byte_size();
      state.aliased.push_back(false);
      *all_aliased = false;
      state.outputs.push_back(nullptr);
      continue;
    }
    const int alias =
        program.kernel
            ? program.kernel->signature().AliasedInput(static_cast<int>(o))
            : -1;
    if (alias >= 0 && alias < static_cast<int>(ctx->inputs.size()) &&
        ctx->inputs[alias].spec == *local) {
      // Immutable buffers: the output is the input's buffer, no copy.
      auto shared = std::const_pointer_cast<Storage>(input_storage[alias]);
      ctx->outputs.push_back({*local, shared->data()});
      state.outputs.push_back(std::move(shared));
      state.aliased.push_back(true);
      continue;
    }
    *all_aliased = false;
    state.aliased.push_back(false);
    auto storage =
        store_.Allocate(device, local->byte_size(), &state.reserved_ahead);
    if (!storage.ok()) return storage.status();
    state.output_bytes += local->byte_size();
    ctx->outputs.push_back({*local, (*storage)->data()});
    state.outputs.push_back(std::move(*storage));
  }
  if (xla_bytes > 0) {
    if (absl::Status s =
            store_.Reserve(device, xla_bytes, &state.reserved_ahead);
        !s.ok()) {
      return s;
    }
    state.output_bytes += xla_bytes;
  }
  return absl::OkStatus();
}

void TaskRunner::PublishOutputs(CallContext& call, int task_index,
                                const absl::Status& status, bool dropped,
                                TaskState& state) {
  const proto::Execute& exec = call.exec();
  const proto::ShardTask& task = exec.tasks(task_index);
  const int device = task.device();
  if (status.ok()) {
    // An XLA output goes in now, before its run has ended: the device's
    // next program reads it as it is, host readers await it.
    // An aliased output is charged again: a conservative budget.
    std::vector<ObjectStore::Output> outputs(exec.output_ids_size());
    for (int o = 0; o < exec.output_ids_size(); ++o) {
      outputs[o] = {{exec.output_ids(o), task.shard()},
                    std::move(state.outputs[o]),
                    /*reserved=*/!state.aliased[o]};
    }
    store_.Fulfil(absl::MakeSpan(outputs), device);
    return;
  }
  if (state.output_bytes > 0) store_.Unreserve(device, state.output_bytes);
  for (int o = 0; o < exec.output_ids_size(); ++o) {
    store_.Fail({exec.output_ids(o), task.shard()}, status);
  }
  if (!dropped) calls_failed_++;
  call.failed = true;
  SPDLOG_DEBUG("call {} shard {} failed: {}", exec.call_id(), task.shard(),
               status.ToString());
}

void TaskRunner::FinishWhenIslandEnds(const std::shared_ptr<CallContext>& call,
                                      int task_index, TaskState state,
                                      absl::Time started, bool failed,
                                      bool launched_quickly) {
  // At once where no run was queued, also where this task failed after it
  // was queued.
  const int device = call->exec().tasks(task_index).device();
  xla_runs_started_.fetch_add(1);
  call->island->WhenEnded([this, call, task_index, keep = std::move(state.keep),
                           scratch_bytes = state.scratch_bytes, device, started,
                           failed,
                           launched_quickly](const absl::Status& end) mutable {
    // Device time: from when it was queued or the device's previous run
    // ended, whichever is later, to its end.
    const int64_t now = absl::ToUnixMicros(clock_->Now());
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
                   call->exec().call_id(),
                   call->exec().tasks(task_index).shard(), end.ToString());
    }
    const int64_t busy = std::max<int64_t>(0, now - from);
    // A run that held its device long would hold the reader that launched
    // the next (the plugin may wait for room for another run in flight).
    const bool quick = launched_quickly && !failed && end.ok() &&
                       busy <= absl::ToInt64Microseconds(kInlineTask);
    call->program->quick_device.store(quick ? device : -1,
                                      std::memory_order_relaxed);
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

void TaskRunner::RecordTask(const CallContext& call, int task_index,
                            absl::Time started, absl::Time ended, bool failed) {
  if (!timeline_.enabled()) return;
  const proto::Execute& exec = call.exec();
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

void TaskRunner::FinishTask(const std::shared_ptr<CallContext>& call,
                            int task_index,
                            std::vector<std::shared_ptr<const Storage>> keep,
                            int64_t scratch_bytes, int64_t busy_micros) {
  const proto::Execute& exec = call->exec();
  const proto::ShardTask& task = exec.tasks(task_index);
  call->busy_micros += busy_micros;
  if (scratch_bytes > 0) store_.Unreserve(task.device(), scratch_bytes);
  keep.clear();
  if (call->input_errors[task_index].ok()) {
    // Else its pins were dropped when it was queued.
    std::vector<BufferKey> pinned;
    for (const auto& binding : task.inputs()) {
      for (const auto& piece : binding.pieces()) {
        pinned.push_back({piece.buffer_id(), piece.shard()});
      }
    }
    store_.RemoveReaders(pinned);
  }
  if (--call->tasks_left == 0) {
    if (call->collective) call->collective->ReleasePartials();
    reports_.CallFinished(exec, call->failed.load(), call->busy_micros.load(),
                          call->queued_micros.load());
  }
}

void TaskRunner::AwaitXlaRuns() {
  const int64_t started = xla_runs_started_.load();
  absl::MutexLock lock(&xla_runs_mu_);
  auto ended = [this, started]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(xla_runs_mu_) {
    return xla_runs_ended_ >= started;
  };
  xla_runs_mu_.Await(absl::Condition(&ended));
}

}  // namespace plexus
