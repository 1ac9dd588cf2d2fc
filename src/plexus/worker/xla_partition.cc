// Running one partition of an XLA call: the tasks of one call on this
// worker form an island that runs the program's SPMD executable once over
// its devices (xla_island.h); its donated inputs.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "plexus/worker/xla_programs.h"

namespace plexus {

namespace {

void RecordLocalReads(Timeline& timeline, int64_t worker_id,
                      const proto::Execute& exec,
                      const std::vector<std::vector<xla::XlaArgument>>& inputs,
                      const xla::PjrtRuntime::ArgumentReads& reads,
                      int64_t queued_ns) {
  // A transfer event per argument a partition read on this worker's
  // devices without a transfer between workers: as it is (its own device)
  // or by the plugin's copy from another one; from the run's queueing to
  // now (the copy is queued on the device with the run).
  const int64_t now_ns = reads.empty() ? 0 : timeline.NowNs();
  for (size_t p = 0; p < reads.size() && p < inputs.size(); ++p) {
    if (static_cast<int>(p) >= exec.tasks_size()) break;
    const proto::ShardTask& task = exec.tasks(static_cast<int>(p));
    for (size_t i = 0; i < reads[p].size() && i < inputs[p].size(); ++i) {
      if (reads[p][i] == xla::ArgumentRead::kHost) continue;
      TimelineEvent e;
      e.kind = EventKind::kTransfer;
      e.path = reads[p][i] == xla::ArgumentRead::kAlias
                   ? TransferPath::kAlias
                   : TransferPath::kDeviceToDevice;
      e.start_ns = queued_ns;
      e.end_ns = now_ns;
      e.client_id = exec.client_id();
      e.call_id = exec.call_id();
      e.program_id = exec.program_id();
      const proto::InputBinding* binding =
          static_cast<int>(i) < task.inputs_size()
              ? &task.inputs(static_cast<int>(i))
              : nullptr;
      if (binding != nullptr && binding->pieces_size() > 0) {
        e.buffer_id = binding->pieces(0).buffer_id();
      }
      e.peer = worker_id;
      e.device = task.device();
      e.shard = task.shard();
      e.bytes = static_cast<int64_t>(inputs[p][i].spec.byte_size());
      timeline.Record(e);
    }
  }
}

}  // namespace

absl::Status XlaPrograms::RunPartition(
    const std::shared_ptr<CallContext>& call_ref, int task_index,
    const builtin::KernelContext& ctx, const InputDevices& input_devices,
    const InputStorage& input_storage, const Donations& donate,
    std::vector<std::shared_ptr<Storage>>* outputs, int64_t* reserved_ahead) {
  CallContext& call = *call_ref;
  const proto::Execute& exec = call.exec();
  LoadedProgram& program = *call.program;
  const int device = exec.tasks(task_index).device();
  auto named = [&](const absl::Status& s) {
    return absl::Status(
        s.code(), absl::StrCat("program '", program.name, "' failed on worker ",
                               me_.worker_id.load(), ": ", s.message()));
  };
  // Every partition resolves the executable (compiled once, cached), then
  // charges XLA's scratch memory to its own device's budget while the
  // island runs. A partition that cannot still arrives, failing the island.
  absl::StatusOr<std::shared_ptr<const xla::PjrtExecutable>> exe =
      call.executable;
  if (call.executable == nullptr) {
    std::vector<int> devices;
    for (const auto& task : exec.tasks()) devices.push_back(task.device());
    exe = ExecutableFor(program, devices);
  }
  absl::Status ready = exe.status();
  const int64_t scratch = exe.ok() ? (*exe)->temp_bytes() : 0;
  if (ready.ok() && scratch > 0) {
    ready = store_.Reserve(device, scratch, reserved_ahead);
    if (!ready.ok()) {
      ready = absl::Status(ready.code(),
                           absl::StrCat("XLA scratch memory of ", scratch,
                                        " bytes: ", ready.message()));
    }
  }
  if (!ready.ok()) {
    call.island->Fail(task_index, ready);
    return named(ready);
  }
  std::vector<xla::XlaArgument> inputs;
  inputs.reserve(ctx.inputs.size());
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    // The views of the block the input is (one assembled for this task
    // goes with it, its views too).
    const Storage* block =
        i < input_storage.size() ? input_storage[i].get() : nullptr;
    inputs.push_back({ctx.inputs[i].spec, ctx.inputs[i].data,
                      i < input_devices.size() ? input_devices[i] : nullptr,
                      i < donate.size() && donate[i],
                      block != nullptr && block->data() == ctx.inputs[i].data
                          ? &block->views()
                          : nullptr});
  }
  // The run's arguments through one pointer: with `this`, two words, which
  // the std::function holds in place (no allocation per call).
  struct Queued {
    const std::shared_ptr<CallContext>& call;
    const std::shared_ptr<const xla::PjrtExecutable>& exe;
  } queued{call_ref, *exe};
  auto mine = call.island->Arrive(
      task_index, std::move(inputs),
      [this, &queued](const IslandExecution::Inputs& in,
                      IslandExecution::DoneFn done) {
        return QueueRun(queued.call, queued.exe, in, std::move(done));
      });
  if (scratch > 0) {
    // XLA's scratch is in use until the run has ended.
    call.island->WhenEnded([this, device, scratch](const absl::Status&) {
      store_.Unreserve(device, scratch);
    });
  }
  if (!mine.ok()) return named(mine.status());
  CountDonations(input_devices, donate);
  for (size_t o = 0; o < outputs->size(); ++o) {
    if ((*outputs)[o] != nullptr) {
      // A `partial` output off partition 0: zeros, so the sum over all
      // devices of the slice is the sum over islands. XLA's is dropped.
      std::memset((*outputs)[o]->data(), 0, (*outputs)[o]->size());
      continue;
    }
    if (o >= mine->size() || (*mine)[o] == nullptr) {
      return named(absl::InternalError(
          absl::StrCat("XLA made no output ", o, " on this partition")));
    }
    (*outputs)[o] = Storage::OnDevice((*mine)[o]);
  }
  return absl::OkStatus();
}

absl::StatusOr<IslandExecution::Outputs> XlaPrograms::QueueRun(
    const std::shared_ptr<CallContext>& call_ref,
    const std::shared_ptr<const xla::PjrtExecutable>& executable,
    const IslandExecution::Inputs& in, IslandExecution::DoneFn done) {
  const xla::PjrtExecutable& exe = *executable;
  const proto::Execute& exec = call_ref->exec();
  LoadedProgram& program = *call_ref->program;
  const int64_t worker = me_.worker_id.load();
  std::shared_ptr<const std::string> name;
  bool checked;
  {
    absl::MutexLock lock(&program.first_use_mu);
    if (program.run_name == nullptr || program.run_name_worker != worker) {
      program.run_name = std::make_shared<const std::string>(
          absl::StrCat("program '", program.name, "' on worker ", worker));
      program.run_name_worker = worker;
    }
    name = program.run_name;
    checked = program.outputs_checked_for == executable &&
              program.outputs_checked_shards == exec.num_shards();
  }
  if (!checked) {
    const LocalOutputs& outputs = *call_ref->outputs;
    for (size_t o = 0; o < program.outputs.size(); ++o) {
      const TensorSpec& got = exe.outputs()[o];
      absl::StatusOr<const TensorSpec*> of = outputs.Of(o);
      if (!of.ok()) return of.status();
      const TensorSpec* local = *of;
      if (got != *local) {
        return absl::InternalError(absl::StrCat(
            "XLA compiled output ", o, " as ", got.ToString(),
            " per device, the program declared ", local->ToString()));
      }
    }
    absl::MutexLock lock(&program.first_use_mu);
    program.outputs_checked_for = executable;
    program.outputs_checked_shards = exec.num_shards();
  }
  // Queued behind what the device runs already; its inputs need not be
  // ready. The call stays alive until the run's end is handled.
  const int64_t queued_ns = timeline_.enabled() ? timeline_.NowNs() : 0;
  xla::PjrtRuntime::ArgumentReads reads;
  auto out = exe.runtime().Execute(
      exe, in, std::move(name),
      [call_ref, done = std::move(done)](absl::Status end) { done(end); },
      timeline_.enabled() ? &reads : nullptr);
  if (!out.ok()) return out.status();
  RecordLocalReads(timeline_, me_.worker_id.load(), exec, in, reads, queued_ns);
  IslandExecution::Outputs result(out->size());
  for (size_t p = 0; p < out->size(); ++p) {
    result[p].assign(std::make_move_iterator((*out)[p].begin()),
                     std::make_move_iterator((*out)[p].end()));
  }
  return result;
}

void XlaPrograms::CountDonations(const InputDevices& input_devices,
                                 const Donations& donate) {
  // A donated input the plugin did not take (its module does not alias it,
  // or another partition's could not be given): its memory is freed when
  // the run ends, and its output was charged in its place meanwhile.
  for (size_t i = 0; i < donate.size(); ++i) {
    if (!donate[i]) continue;
    if (input_devices[i] != nullptr && input_devices[i]->donated()) {
      donations_++;
    } else {
      donations_declined_++;
    }
  }
}

void XlaPrograms::TakeDonations(
    const CallContext& call, int task_index, const builtin::KernelContext& ctx,
    const InputDevices& input_devices,
    const std::vector<std::shared_ptr<const Storage>>& keep,
    const InputStorage& bound, Donations* donate, WrittenOver* written_over) {
  const proto::Execute& exec = call.exec();
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
    absl::StatusOr<const TensorSpec*> local = call.outputs->Of(o);
    const DeviceBuffer* buffer =
        i < static_cast<int>(input_devices.size()) ? input_devices[i] : nullptr;
    // The entry's Storage, as the task holds it: TakeForDonation checks
    // that nothing else does.
    const Storage* storage = nullptr;
    long refs = 0;
    auto count = [&](absl::Span<const std::shared_ptr<const Storage>> list) {
      for (const auto& held : list) {
        if (buffer != nullptr && held->device_buffer() == buffer) {
          storage = held.get();
          refs++;
        }
      }
    };
    count(keep);
    count(bound);
    const BufferKey key{binding.pieces(0).buffer_id(),
                        binding.pieces(0).shard()};
    if (storage == nullptr || binding.pieces_size() != 1 || !local.ok() ||
        !(ctx.inputs[i].spec == **local) ||
        !store_.TakeForDonation(
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

}  // namespace plexus
