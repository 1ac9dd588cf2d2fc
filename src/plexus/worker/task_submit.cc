// TaskRunner::Submit: a call's Execute op becomes its tasks on this
// worker's devices, in the order of the server's op stream.
#include <string>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "plexus/common/logging.h"
#include "plexus/worker/frame_arena.h"
#include "plexus/worker/task_runner.h"

namespace plexus {
namespace {

// Collective exchange buffers are keyed by Execute.exchange_id, a server
// temporary; from an older server, which sends none, by the call id with the
// top bit set.
constexpr uint64_t kCollectiveBit = uint64_t{1} << 63;
// The longest an NCCL all_reduce waits for its peers (one that dies fails
// it at once: CallCollective's watch entries).
constexpr absl::Duration kNcclTimeout = absl::Minutes(5);

}  // namespace

TaskRunner::TaskRunner(ObjectStore& store,
                       const std::vector<std::unique_ptr<Device>>& devices,
                       XlaPrograms& xla, PeerTable& peers, ReportQueue& reports,
                       Timeline& timeline, const WorkerIdentity& me,
                       CollectiveGpus* nccl, Clock* clock)
    : store_(store),
      devices_(devices),
      xla_(xla),
      peers_(peers),
      reports_(reports),
      timeline_(timeline),
      me_(me),
      nccl_(nccl),
      clock_(clock),
      device_run_ends_(
          std::make_unique<std::atomic<int64_t>[]>(devices.size())),
      device_run_busy_(
          std::make_unique<std::atomic<int64_t>[]>(devices.size())) {}

void TaskRunner::Submit(proto::Execute& incoming,
                        std::shared_ptr<LoadedProgram> program) {
  auto call = std::make_shared<CallContext>();
  call->op = KeepOp(incoming);  // no copy: the op is consumed
  const proto::Execute& exec = call->exec();
  if (program != nullptr) {
    call->program = program.get();
    call->outputs = program->OutputsOn(exec.num_shards());
    call->program_ref = std::move(program);  // alive while the call runs
  }
  call->tasks_left = exec.tasks_size();
  if (call->program && call->program->xla) {
    call->island = std::make_unique<IslandExecution>(exec.tasks_size());
  }
  const absl::Status collective_error = SetUpCollective(*call);
  DeclareAndPin(*call, collective_error);
  Enqueue(call);
}

absl::Status TaskRunner::SetUpCollective(CallContext& call) {
  const proto::Execute& exec = call.exec();
  if (!(call.program && call.program->kernel &&
        call.program->kernel->signature().is_collective() &&
        exec.peers_size() > 0)) {
    return absl::OkStatus();
  }
  std::vector<CallCollective::Peer> peers;
  int my_rank = -1;
  for (int r = 0; r < exec.peers_size(); ++r) {
    peers.push_back({exec.peers(r).worker_id(), exec.peers(r).local_shards()});
    if (exec.peers(r).worker_id() == me_.worker_id.load()) my_rank = r;
  }
  absl::Status error = CheckCollective(call, peers, my_rank);
  if (error.ok()) MakeCollective(call, std::move(peers), my_rank);
  return error;
}

absl::Status TaskRunner::CheckCollective(
    const CallContext& call, const std::vector<CallCollective::Peer>& peers,
    int my_rank) const {
  const proto::Execute& exec = call.exec();
  const std::string& name = call.program->name;
  if (my_rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("program '", name, "': call ", exec.call_id(),
                     " does not list this worker among its peers"));
  }
  if (exec.tasks_size() == 0 ||
      peers[my_rank].local_shards != exec.tasks_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("program '", name, "': call ", exec.call_id(), " counts ",
                     peers[my_rank].local_shards,
                     " shards on this worker but sends ", exec.tasks_size()));
  }
  for (const CallCollective::Peer& peer : peers) {
    std::optional<absl::Status> down = peers_.DownStatus(peer.worker_id);
    if (!down.has_value()) continue;
    // Its partial will never come.
    return absl::Status(
        down->code(),
        absl::StrCat("program '", name, "': call ", exec.call_id(),
                     " takes part with worker ", peer.worker_id,
                     ", which is down: ", down->message()));
  }
  return absl::OkStatus();
}

void TaskRunner::MakeCollective(CallContext& call,
                                std::vector<CallCollective::Peer> peers,
                                int my_rank) {
  const proto::Execute& exec = call.exec();
  const LoadedProgram& program = *call.program;
  // On the timeline, each partial, offer or ring step sent to a peer is
  // a transfer of this call (the peer's task of it reads it).
  TimelineEvent step;
  if (timeline_.enabled()) {
    step.kind = EventKind::kTransfer;
    step.client_id = exec.client_id();
    step.call_id = exec.call_id();
    step.program_id = exec.program_id();
  }
  call.collective = std::make_unique<CallCollective>(
      exec.exchange_id() != 0 ? exec.exchange_id()
                              : exec.call_id() | kCollectiveBit,
      std::move(peers), my_rank, &store_,
      [this, step](int64_t worker, const BufferKey& key,
                   absl::StatusOr<std::shared_ptr<const Storage>> data) {
        if (PeerSender* s = peers_.SenderTo(worker)) {
          TimelineEvent e = step;
          e.buffer_id = key.buffer_id;
          e.shard = key.shard;
          e.peer = worker;
          s->Send({key.buffer_id, key.shard}, std::move(data), e);
        }
      });
  // Every rank's partial has the shape of one shard's input.
  TensorSpec partial_spec;
  if (!program.inputs.empty()) {
    auto local = program.inputs[0].Local(exec.num_shards());
    if (local.ok()) partial_spec = *local;
  }
  // On the GPUs where every worker runs NCCL and holds one shard of the
  // call (several local shards on distinct GPUs would take one NCCL
  // group call: not built, so they take the host path).
  // (all_reduce only: its tasks then skip the kernel, RunTask.)
  bool nccl =
      nccl_ != nullptr && exec.peers_size() > 1 &&
      program.kernel == builtin::KernelRegistry::Global().Find("all_reduce") &&
      program.inputs.size() == 1 && program.outputs.size() == 1;
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
    summed.peer = me_.worker_id.load();
    summed.device = exec.tasks(0).device();
    summed.shard = exec.tasks(0).shard();
    call.collective->EnableNccl(nccl_, kNcclTimeout,
                                timeline_.enabled() ? &timeline_ : nullptr,
                                summed, clock_);
  }
  call.collective->ExpectPartials(exec.tasks(0).device(), partial_spec);
}

void TaskRunner::DeclareAndPin(CallContext& call,
                               const absl::Status& collective_error) {
  const proto::Execute& exec = call.exec();
  // An input that is not here (released before this call reached the
  // worker) fails its task now: nothing would ever fulfil it.
  call.input_errors.assign(exec.tasks_size(), collective_error);
  const int num_devices = static_cast<int>(devices_.size());
  std::vector<TensorSpec> made;  // specs when the op's outputs are not the
                                 // program's
  absl::Span<const TensorSpec> specs;
  absl::InlinedVector<BufferKey, 8> keys;
  absl::InlinedVector<int, 8> argument_of;  // of each of the inputs' keys
  keys.reserve(exec.output_ids_size());
  for (int t = 0; t < exec.tasks_size(); ++t) {
    const proto::ShardTask& task = exec.tasks(t);
    // A task for a device this worker lacks fails where it stands: its
    // outputs are declared on no device and fail, nothing waits for it.
    const bool on_device = task.device() >= 0 && task.device() < num_devices;
    if (!on_device && call.input_errors[t].ok()) {
      call.input_errors[t] = absl::InvalidArgumentError(
          absl::StrCat("call ", exec.call_id(), " names device ", task.device(),
                       " but this worker has ", num_devices));
    }
    // The store is taken once for the task's outputs and once for its
    // inputs (a call of a 100-leaf pytree declares 100 and pins 100).
    if (t == 0) specs = DeclaredSpecs(call, made);
    keys.clear();
    for (int o = 0; o < exec.output_ids_size(); ++o) {
      keys.push_back({exec.output_ids(o), task.shard()});
    }
    store_.DeclareOutputs(keys, on_device ? task.device() : -1, specs);
    if (!call.input_errors[t].ok()) continue;
    keys.clear();
    argument_of.clear();
    int pieces = 0;
    for (const auto& input : task.inputs()) pieces += input.pieces_size();
    keys.reserve(pieces);
    argument_of.reserve(pieces);
    for (int i = 0; i < task.inputs_size(); ++i) {
      for (const auto& piece : task.inputs(i).pieces()) {
        keys.push_back({piece.buffer_id(), piece.shard()});
        argument_of.push_back(i);
      }
    }
    bool elsewhere = false;
    int pinned = 0;
    absl::Status known =
        store_.AddReaders(keys, task.device(), &elsewhere, &pinned);
    call.awaits_another_device |= on_device && elsewhere;
    if (!known.ok()) {
      call.input_errors[t] = absl::Status(
          known.code(),
          absl::StrCat(call.program ? "program '" + call.program->name + "'"
                                    : "a program",
                       " argument ", argument_of[pinned], ": ",
                       known.message()));
      store_.RemoveReaders(absl::MakeConstSpan(keys).first(pinned));
    }
  }
}

absl::Span<const TensorSpec> TaskRunner::DeclaredSpecs(
    const CallContext& call, std::vector<TensorSpec>& made) {
  const proto::Execute& exec = call.exec();
  if (call.outputs != nullptr &&
      static_cast<int>(call.outputs->spec.size()) == exec.output_ids_size()) {
    return call.outputs->spec;  // the usual call: the program's own
  }
  made.assign(exec.output_ids_size(), TensorSpec());
  for (int o = 0; o < exec.output_ids_size(); ++o) {
    if (call.outputs && o < static_cast<int>(call.outputs->spec.size())) {
      made[o] = call.outputs->spec[o];
    }
  }
  return made;
}

void TaskRunner::Enqueue(const std::shared_ptr<CallContext>& call) {
  if (TryRunInline(call)) return;
  const proto::Execute& exec = call->exec();
  const LoadedProgram* program = call->program;
  // A built-in kernel that is not a collective runs on this device alone:
  // others may run before it, and it before other clients' queued tasks by
  // its start tag, unless it waits for another device's work
  // (worker/task_queue.h).
  const bool alone = program != nullptr && program->kernel != nullptr &&
                     !program->kernel->signature().is_collective() &&
                     !program->xla;
  const TaskOrder order{.client = exec.client_id(),
                        .start_tag = exec.start_tag(),
                        .may_pass = alone && !call->awaits_another_device,
                        .passable = alone};
  const bool collective_kernel =
      program != nullptr && program->kernel != nullptr &&
      program->kernel->signature().is_collective() && !program->xla;
  const int num_devices = static_cast<int>(devices_.size());
  for (int i = 0; i < exec.tasks_size(); ++i) {
    int device = exec.tasks(i).device();
    if (device < 0 || device >= num_devices) {
      SPDLOG_ERROR("call {} names device {} but this worker has {}",
                   exec.call_id(), device, num_devices);
      RunTask(call, i, clock_->Now());  // fails at once with input_errors[i]
      continue;
    }
    Device::Task run = [this, call, i, queued = clock_->Now()] {
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

}  // namespace plexus
