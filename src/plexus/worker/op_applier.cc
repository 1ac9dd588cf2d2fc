#include "plexus/worker/op_applier.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/common/logging.h"
#include "plexus/common/status_proto.h"

namespace plexus {
namespace {

// The error an op that fails something carries. Such an op without a code
// (a status that reads as OK) is still a failure, never a success: the
// store cannot hold an OK failure.
absl::Status FailureFromProto(const proto::Status& proto,
                              absl::string_view what) {
  absl::Status status = StatusFromProto(proto);
  if (!status.ok()) return status;
  return absl::UnknownError(absl::StrCat(what, " (no reason given)"));
}

}  // namespace

OpApplier::OpApplier(ObjectStore& store, PeerTable& peers, TaskRunner& tasks,
                     XlaPrograms& xla, ReportQueue& reports,
                     ServerSession& session, Timeline& timeline,
                     CollectiveGpus* nccl, int num_devices,
                     transport::RelayLinks& relays)
    : store_(store),
      peers_(peers),
      tasks_(tasks),
      xla_(xla),
      reports_(reports),
      session_(session),
      timeline_(timeline),
      nccl_(nccl),
      num_devices_(num_devices),
      relays_(relays) {}

void OpApplier::Apply(proto::WorkerOp& op) {
  switch (op.op_case()) {
    case proto::WorkerOp::kLoad:
      ApplyLoad(*op.mutable_load());
      break;
    case proto::WorkerOp::kExecute:
      ApplyExecute(*op.mutable_execute());
      break;
    case proto::WorkerOp::kTransfer:
      ApplyTransfer(op.transfer());
      break;
    case proto::WorkerOp::kExpect:
      ApplyExpect(op.expect());
      break;
    case proto::WorkerOp::kDeclare:
      ApplyDeclare(op.declare());
      break;
    case proto::WorkerOp::kRelease:
      store_.Release(absl::MakeConstSpan(op.release().buffer_ids()));
      break;
    case proto::WorkerOp::kFail:
      ApplyFail(op.fail());
      break;
    case proto::WorkerOp::kPeerDown:
      ApplyPeerDown(op.peer_down());
      break;
    case proto::WorkerOp::kClockEcho:
      session_.ApplyClockEcho(op.clock_echo());
      break;
    case proto::WorkerOp::kCollectTimeline:
      session_.SendTimeline(op.collect_timeline());
      break;
    case proto::WorkerOp::kSendStats:
      session_.SendStats(op.send_stats());
      break;
    case proto::WorkerOp::kTransferFailed:
      // The sender could not reach this worker's data plane; the server
      // relays what it would have said in a PUSH_ERROR.
      store_.Fail(
          {op.transfer_failed().buffer_id(), op.transfer_failed().shard()},
          FailureFromProto(op.transfer_failed().status(), "transfer failed"));
      break;
    case proto::WorkerOp::kPeer:
      peers_.Add(op.peer());
      break;
    case proto::WorkerOp::kShardLayout:
      layouts_.Add(op.shard_layout());
      break;
    case proto::WorkerOp::kClientGone:
      ApplyClientGone(op.client_gone().client_id());
      break;
    default:
      SPDLOG_WARN("ignoring unknown op {}", static_cast<int>(op.op_case()));
  }
}

void OpApplier::ApplyLoad(proto::LoadProgram& load) {
  auto prog = std::make_unique<LoadedProgram>();
  const proto::ProgramDef& def = load.program();
  prog->id = load.program_id();
  prog->name = def.name();
  prog->kernel = builtin::KernelRegistry::Global().Find(def.kernel());
  if (def.kernel() == "xla") {
    prog->xla = std::make_unique<proto::XlaProgram>();
    prog->xla->Swap(load.mutable_program()->mutable_xla());
  }
  prog->attrs = AttrsFromProto(def.attrs());
  // The server checked these specs when the program was registered; a
  // load that still carries one that does not parse is refused, never
  // trusted: its calls fail, saying the program is not loaded.
  absl::Status specs;
  auto add_specs = [&](const auto& defs, std::vector<ArgSpec>* out,
                       const char* what) {
    for (int i = 0; i < defs.size() && specs.ok(); ++i) {
      auto a = FromProto(defs[i]);
      if (a.ok()) {
        out->push_back(*a);
      } else {
        specs = absl::InvalidArgumentError(
            absl::StrCat(what, " ", i, ": ", a.status().message()));
      }
    }
  };
  add_specs(def.inputs(), &prog->inputs, "argument");
  add_specs(def.outputs(), &prog->outputs, "output");
  if (!specs.ok()) {
    SPDLOG_ERROR("program {} ('{}') not loaded: {}", load.program_id(),
                 def.name(), std::string(specs.message()));
    programs_.erase(load.program_id());
    programs_loaded_ = static_cast<int64_t>(programs_.size());
    return;
  }
  std::shared_ptr<LoadedProgram> loaded = std::move(prog);
  programs_[load.program_id()] = loaded;
  programs_loaded_ = static_cast<int64_t>(programs_.size());
  // Complete now, and never modified again: the compiler thread may
  // read it from here on.
  if (loaded->xla) xla_.CompileAhead(std::move(loaded), load.stand_by());
}

void OpApplier::ApplyExecute(proto::Execute& exec) {
  const bool relay = exec.relay() && relays_.Has(exec.client_id());
  if (absl::Status s = layouts_.Expand(&exec); !s.ok()) {
    // It cannot run here: whoever reads its outputs hears why, and the
    // server hears it done (failed), rather than wait for it.
    SPDLOG_ERROR("{}", std::string(s.message()));
    for (uint64_t id : exec.output_ids()) {
      store_.FailBuffer(id, s);
      if (relay) relays_.Answer(exec.client_id(), {id, -1}, s);
    }
    reports_.CallFinished(exec, /*failed=*/true, 0, 0);
    return;
  }
  std::vector<BufferKey> relayed;
  if (relay) {
    for (const proto::ShardTask& task : exec.tasks()) {
      // Only what the client's fetch reads (Call.relay_first_shard).
      if (exec.relay_first_shard() && task.shard() != 0) continue;
      for (uint64_t id : exec.output_ids()) {
        relayed.push_back(BufferKey{id, task.shard()});
      }
    }
  }
  auto it = programs_.find(exec.program_id());
  tasks_.Submit(exec, it != programs_.end() ? it->second : nullptr);
  // After the outputs are declared (a task run inline has readied them:
  // answered now, from this thread).
  if (relay) RelayOutputs(exec.client_id(), relayed);
}

void OpApplier::RelayOutputs(uint64_t client,
                             const std::vector<BufferKey>& keys) {
  const int64_t since = timeline_.enabled() ? timeline_.NowNs() : 0;
  for (const BufferKey& key : keys) {
    store_.OnReady(key, [relays = &relays_, client, key, since](auto result) {
      relays->Answer(client, {key.buffer_id, key.shard}, result, since);
    });
  }
}

void OpApplier::ApplyFail(const proto::FailBuffers& fail) {
  const absl::Status why = FailureFromProto(fail.status(), "call rejected");
  for (uint64_t id : fail.buffer_ids()) {
    store_.FailBuffer(id, why);
    // Every shard of it here: the client's relayed wait hears it once.
    if (fail.relay()) relays_.Answer(ClientOfBuffer(id), {id, -1}, why);
  }
}

void OpApplier::ApplyExpect(const proto::Expect& e) {
  // A temporary, or a client's shard restored from a surviving copy
  // (recovery), which the client owns as it owns a call's output.
  const BufferKey key{e.buffer_id(), e.shard()};
  auto spec = HeldSpec(key, e.spec(), e.device());
  store_.Declare(key, spec.ok() ? e.device() : -1,
                 spec.ok() ? *spec : TensorSpec{}, /*owned=*/e.owned(),
                 ObjectStore::Arrival::kFromPeer, e.src_worker_id());
  if (!spec.ok()) store_.Fail(key, spec.status());
  if (e.report()) {
    store_.OnReady(key, [reports = &reports_, id = key.buffer_id](auto result) {
      if (result.ok()) reports->CopyArrived(id);
    });
  }
}

void OpApplier::ApplyDeclare(const proto::Declare& d) {
  const BufferKey key{d.buffer_id(), d.shard()};
  auto spec = HeldSpec(key, d.spec(), d.device());
  store_.Declare(key, spec.ok() ? d.device() : -1,
                 spec.ok() ? *spec : TensorSpec{}, /*owned=*/true,
                 ObjectStore::Arrival::kFromClient);
  if (!spec.ok()) store_.Fail(key, spec.status());
}

void OpApplier::ApplyTransfer(const proto::Transfer& t) {
  BufferKey src{t.buffer_id(), t.shard()};
  transport::ShardKey dst{t.dst_buffer_id(), t.dst_shard()};
  PeerSender* sender = peers_.SenderTo(t.dst_worker_id());
  if (sender == nullptr) {
    // Never told where it is (the server tells a worker of a peer ahead of
    // the first op that needs it: ClusterState::TellPeer), or the worker
    // is stopping. The destination hears it through the server rather
    // than wait for a shard that will never come.
    const absl::Status why = absl::FailedPreconditionError(
        absl::StrCat("transfer of buffer ", t.buffer_id(), " shard ", t.shard(),
                     " to worker ", t.dst_worker_id(),
                     ": the source worker was never told where it is"));
    SPDLOG_WARN("{}", std::string(why.message()));
    reports_.TransferFailed(t.dst_worker_id(), dst, why);
    return;
  }
  if (absl::Status known = store_.AddReader(src); !known.ok()) {
    // The source is gone (released): the destination's consumers hear why
    // rather than wait for a shard that will never come.
    sender->Send(dst, absl::NotFoundError(
                          absl::StrCat("transfer to worker ", t.dst_worker_id(),
                                       " failed: ", known.message())));
    return;
  }
  // The timeline's event: from when the shard is ready to its delivery.
  TimelineEvent event;
  if (timeline_.enabled()) {
    event.kind = EventKind::kTransfer;
    event.client_id = ClientOfBuffer(t.buffer_id());
    event.call_id = t.call_id();
    event.buffer_id = t.buffer_id();
    event.shard = t.shard();
    event.peer = t.dst_worker_id();
    event.device = t.dst_device();
  }
  store_.OnReady(
      src, [store = &store_, src, dst, sender, event](auto result) mutable {
        // No device path between workers yet: the sender stages a value in
        // device memory through host memory, on its own thread.
        sender->Send(dst, std::move(result), event);
        store->RemoveReader(src);
      });
}

void OpApplier::ApplyPeerDown(const proto::PeerDown& down) {
  const absl::Status lost = FailureFromProto(
      down.status(), absl::StrCat("worker ", down.worker_id(), " is down"));
  SPDLOG_WARN("worker {} is down: {}", down.worker_id(),
              std::string(lost.message()));
  // Ops can come after the PeerDown, since admission holds calls at the
  // server until there is room: a collective with it that arrives later
  // fails at once (TaskRunner), an Expect from it fails in the store.
  peers_.MarkDown(down.worker_id(), down.generation(), lost);
  store_.FailFromSource(down.worker_id(), lost);
  if (nccl_ != nullptr) nccl_->DropWorker(down.worker_id());
}

void OpApplier::UnloadAll() {
  programs_.clear();
  layouts_ = ShardLayouts();
  programs_loaded_ = 0;
}

void OpApplier::ApplyClientGone(uint64_t client) {
  relays_.Drop(client);
  store_.ReleaseClient(client);
  layouts_.ForgetClient(client);
  reports_.ClientGone(client);
  // Its programs go too (their ids carry the client's, as buffer ids
  // do); calls and compiles still running hold their own reference.
  int64_t unloaded = 0;
  for (auto it = programs_.begin(); it != programs_.end();) {
    if (ClientOfBuffer(it->first) == client) {
      programs_.erase(it++);
      unloaded++;
    } else {
      ++it;
    }
  }
  programs_loaded_ = static_cast<int64_t>(programs_.size());
  if (unloaded > 0) {
    SPDLOG_INFO("client {} gone: unloaded {} program(s)", client, unloaded);
  }
}

absl::StatusOr<TensorSpec> OpApplier::HeldSpec(const BufferKey& key,
                                               const proto::TensorSpec& spec,
                                               int device) const {
  if (device < 0 || device >= num_devices_) {
    return absl::InvalidArgumentError(
        absl::StrCat(KeyString(key), " is declared on device ", device,
                     " but this worker has ", num_devices_));
  }
  auto parsed = FromProto(spec);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        KeyString(key), " is declared as ", parsed.status().message()));
  }
  return parsed;
}

}  // namespace plexus
