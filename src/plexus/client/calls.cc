// Calls: each checked against its program and turned into ops (BuildCall),
// issued one at a time (Client::Call) or as one graph (Graph).
#include <unistd.h>

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "plexus/client/client.h"
#include "plexus/client/client_core.h"
#include "plexus/client/grpc_timeout.h"
#include "plexus/common/argument_count.h"
#include "plexus/common/donation.h"
#include "plexus/common/names.h"
#include "plexus/common/tls.h"
#include "plexus/executors/builtin/catalogue.h"
#include "plexus/timeline/clock_offset.h"
#include "plexus/timeline/timeline_proto.h"

namespace plexus {
namespace {

// The slices a call uses, held open (Slice::Hold) until its op is queued,
// so that a slice closed meanwhile is released after the call, not before.
class SliceHolds {
 public:
  SliceHolds() = default;
  SliceHolds(const SliceHolds&) = delete;
  SliceHolds& operator=(const SliceHolds&) = delete;
  ~SliceHolds() {
    for (Slice* slice : held_) slice->Unhold();
  }
  // False if `slice` is closed.
  bool Hold(Slice* slice) {
    for (Slice* held : held_) {
      if (held == slice) return true;
    }
    if (!slice->Hold()) return false;
    held_.push_back(slice);
    return true;
  }

 private:
  std::vector<Slice*> held_;  // borrowed: the program and inputs own them
};

// The session a call is made in (`*session`; null: the open one, waited
// for while the client reconnects) and its program's registration in it:
// the session's epoch, or why the call cannot be made.
absl::StatusOr<uint64_t> CallSession(ClientSession& sessions,
                                     const Program& program,
                                     std::shared_ptr<SessionTag>* session) {
  // Error context, built only when an error needs it (every call runs this).
  auto what = [&] { return absl::StrCat("program '", program.name(), "'"); };
  if (*session == nullptr) {
    auto open = sessions.AwaitSessionForUse();
    if (!open.ok()) {
      return absl::Status(open.status().code(),
                          absl::StrCat(what(), ": ", open.status().message()));
    }
    *session = std::move(*open);
  } else if (absl::Status s = sessions.SessionStatus((*session)->epoch);
             !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(what(), ": ", s.message()));
  }
  const uint64_t epoch = (*session)->epoch;
  if (program.epoch() != epoch) {
    // Not registered again after a reconnect: its own reason, or its
    // session's end.
    absl::Status lost = program.lost();
    if (lost.ok()) lost = sessions.SessionStatus(program.epoch());
    if (lost.ok()) {
      lost = absl::FailedPreconditionError(
          "it is not registered in the client's session");
    }
    return absl::Status(lost.code(),
                        absl::StrCat(what(), ": ", lost.message()));
  }
  return epoch;
}

// Checks input `i` of a call of `program` in session `epoch` and holds its
// slice. OK with `*upstream` set when the input already failed (the
// outputs fail with it).
absl::Status CheckInput(ClientSession& session, const Program& program,
                        const std::vector<Future>& inputs, size_t i,
                        uint64_t epoch, SliceHolds* holds,
                        absl::Status* upstream) {
  auto what = [&] { return absl::StrCat("program '", program.name(), "'"); };
  if (!inputs[i].valid()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what(), " argument ", i, " is an empty future"));
  }
  if (inputs[i].handle()->donated()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what(), " argument ", i, ": ",
                     session.BufferStatus(inputs[i].buffer_id()).message()));
  }
  const ArgSpec& want = program.inputs()[i];
  const ArgSpec& got = inputs[i].arg();
  if (!CanRelayout(got, want)) {  // another layout moves to `want`'s
    return absl::InvalidArgumentError(
        absl::StrCat(what(), " argument ", i, " has ", got.ToString(),
                     " but the program was compiled for ", want.ToString()));
  }
  if (!holds->Hold(inputs[i].slice().get())) {
    return absl::FailedPreconditionError(absl::StrCat(
        what(), " argument ", i, " lives on a slice that was closed"));
  }
  // A future of an ended session is lost: so are the outputs.
  absl::Status s =
      inputs[i].epoch() != epoch
          ? session.SessionStatus(inputs[i].epoch(), inputs[i].buffer_id())
          : session.BufferStatus(inputs[i].buffer_id());
  if (!s.ok() && upstream->ok()) *upstream = s;
  return absl::OkStatus();
}

// The releases of the inputs `program` consumes (donated), appended to
// `ops` after its call. A donated input is consumed, as jax.jit deletes a
// donated array: the buffer is released right after the call (the server
// holds it back until the call has read it), and every later use is
// refused.
void AppendDonations(ClientSession& session, const Program& program,
                     const std::vector<Future>& inputs,
                     std::vector<proto::ClientOp>* ops) {
  for (int i : program.donated_inputs()) {
    if (i < 0 || i >= static_cast<int>(inputs.size()) ||
        !inputs[i].handle()->Donate()) {
      continue;
    }
    const uint64_t id = inputs[i].buffer_id();
    proto::ClientOp release;
    release.mutable_release()->set_buffer_id(id);
    release.mutable_release()->set_slice_id(inputs[i].slice()->id());
    ops->push_back(std::move(release));
    session.MarkFailed(
        id, absl::FailedPreconditionError(absl::StrCat(
                "buffer ", id, " was donated to program '", program.name(),
                "' (donate_argnums): a donated value is gone once the call "
                "that takes it is made, as a donated jax.Array is deleted")));
  }
}

// Validates a call and fills `op`; the futures it returns are valid even
// when `op` is not sent (an input already failed: the outputs fail too).
// `holds` keeps the slices open; the caller queues `op` (in session
// `*session`) before dropping it. A null `*session` is the open one, waited
// for while the client reconnects; a graph passes the one its first call
// was made in.
absl::StatusOr<std::vector<Future>> BuildCall(
    const std::shared_ptr<ClientCore>& core, const Program& program,
    const std::vector<Future>& inputs, SliceHolds* holds,
    std::vector<proto::ClientOp>* ops, std::shared_ptr<SessionTag>* session,
    uint32_t site, uint64_t graph_id) {
  ClientSession& sessions = core->session();
  // Error context, built only when an error needs it (every call runs this).
  auto what = [&] { return absl::StrCat("program '", program.name(), "'"); };
  absl::StatusOr<uint64_t> in_session = CallSession(sessions, program, session);
  if (!in_session.ok()) return in_session.status();
  const uint64_t epoch = *in_session;
  if (!holds->Hold(program.slice().get())) {
    return absl::FailedPreconditionError(
        absl::StrCat(what(), ": its slice was closed"));
  }
  // The server's rule (it checks every call); here only to fail fast.
  if (absl::Status s = CheckArgumentCount(
          program.name(), program.inputs().size(), inputs.size());
      !s.ok()) {
    return s;
  }
  absl::Status upstream;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (absl::Status s =
            CheckInput(sessions, program, inputs, i, epoch, holds, &upstream);
        !s.ok()) {
      return s;
    }
  }
  // The call's id, then its outputs'.
  absl::StatusOr<uint64_t> ids = sessions.NextIds(1 + program.outputs().size());
  if (!ids.ok()) {
    return absl::Status(ids.status().code(),
                        absl::StrCat(what(), ": ", ids.status().message()));
  }
  proto::ClientOp op;
  // Its call site goes first, once per session.
  if (site != 0 && core->call_sites().Op(site, epoch, &op)) {
    ops->push_back(std::move(op));
    op.Clear();
  }
  proto::Call* call = op.mutable_call();
  call->set_call_id(*ids);
  if (site != 0) call->set_site(site);
  if (graph_id != 0) call->set_graph_id(graph_id);
  call->set_slice_id(program.slice()->id());
  call->set_program_id(program.id());
  std::vector<Future> outputs;
  uint64_t id = *ids;
  for (const ArgSpec& out : program.outputs()) {
    ++id;
    call->add_output_ids(id);
    // Queued only once built (Client::Call), or at the graph's end.
    outputs.emplace_back(std::make_shared<BufferHandle>(
        core, id, out, program.slice(), *session, /*issued=*/false));
    if (!upstream.ok()) sessions.MarkFailed(id, upstream);
  }
  if (!upstream.ok()) return outputs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Future& in = inputs[i];
    proto::InputRef* ref = call->add_inputs();
    ref->set_buffer_id(in.buffer_id());
    ref->set_slice_id(in.slice()->id());
    // Its layout only when it is not the program's (the server reads an
    // absent one as the program's: proto InputRef.arg).
    if (!(in.arg() == program.inputs()[i])) {
      *ref->mutable_arg() = ToProto(in.arg());
    }
  }
  core->calls++;
  // A round trip's call (made alone right after a wait, not a graph's,
  // whose calls made after a wait are many, their outputs mostly read by
  // the next call only): its small outputs are answered on the relay
  // links, no FETCH sent (DataPath::RelayCall).
  if (graph_id == 0 && sessions.waited()) {
    const DataPath::Relay relay = core->data().RelayCall(
        program.slice()->info(), program.outputs(), call->output_ids());
    call->set_relay(relay != DataPath::Relay::kNone);
    call->set_relay_first_shard(relay == DataPath::Relay::kFirstShard);
  }
  ops->push_back(std::move(op));
  AppendDonations(sessions, program, inputs, ops);
  return outputs;
}

// The client's timeline events for the calls among `ops`, issued from
// `start_ns`; their end is stamped by RecordIssued once they are queued.
std::vector<TimelineEvent> IssuedCalls(ClientCore& core,
                                       const std::vector<proto::ClientOp>& ops,
                                       int64_t start_ns) {
  std::vector<TimelineEvent> events;
  if (!core.timeline().enabled()) return events;
  const uint64_t client = core.client_id();
  for (const proto::ClientOp& op : ops) {
    if (!op.has_call()) continue;
    const proto::Call& call = op.call();
    TimelineEvent& e = events.emplace_back();
    e.kind = EventKind::kCall;
    e.start_ns = start_ns;
    e.client_id = client;
    e.call_id = call.call_id();
    e.program_id = call.program_id();
    e.buffer_id = call.output_ids_size() > 0 ? call.output_ids(0) : 0;
    e.graph_id = call.graph_id();
    e.label = call.site();
  }
  return events;
}

void RecordIssued(ClientCore& core, std::vector<TimelineEvent>& events) {
  if (events.empty()) return;
  const int64_t now = core.timeline().NowNs();
  for (TimelineEvent& e : events) {
    e.end_ns = now;
    core.timeline().Record(e);
  }
}

}  // namespace

absl::StatusOr<std::vector<Future>> Graph::Call(
    const Program& program, const std::vector<Future>& inputs, uint32_t site) {
  const size_t before = ops_.size();
  SliceHolds holds;  // recorded only: Submit may still find a slice closed
  if (graph_id_ == 0) graph_id_ = core_->session().NextGraphId();
  auto outputs = BuildCall(core_, program, inputs, &holds, &ops_, &session_,
                           site, graph_id_);
  // Sequential dispatch sends each op once its inputs are computed: one
  // list per op, the call's inputs, none for the releases after it.
  if (core_->options().sequential_dispatch) {
    for (size_t k = before; k < ops_.size(); ++k) {
      op_inputs_.push_back(k == before ? inputs : std::vector<Future>{});
    }
  }
  if (!outputs.ok()) return outputs;
  keep_.insert(keep_.end(), inputs.begin(), inputs.end());
  keep_.insert(keep_.end(), outputs->begin(), outputs->end());
  if (batch_ops_ == 0) {
    batch_ops_ = core_->session().waited() ? kFirstOpsAfterWait : kStreamedOps;
  }
  if (ops_.size() >= batch_ops_) {
    if (absl::Status sent = Send(); !sent.ok()) return sent;
    batch_ops_ = std::min(2 * batch_ops_, kStreamedOps);
  }
  return outputs;
}

absl::Status Graph::Send() {
  if (core_->closed()) return absl::FailedPreconditionError("client closed");
  if (ops_.empty()) return absl::OkStatus();  // all sent as recorded
  std::vector<TimelineEvent> issued =
      IssuedCalls(*core_, ops_, core_->timeline().NowNs());
  if (core_->options().sequential_dispatch) {
    for (size_t i = 0; i < ops_.size(); ++i) {
      core_->data().AwaitInputs(op_inputs_[i]);
      std::vector<proto::ClientOp> one;
      one.push_back(std::move(ops_[i]));
      core_->session().Enqueue(std::move(one), session_->epoch);
    }
  } else if (session_ != nullptr) {
    core_->session().Enqueue(std::move(ops_), session_->epoch);
  }
  RecordIssued(*core_, issued);
  ClearRecorded();  // releases now queue after the calls
  return absl::OkStatus();
}

absl::Status Graph::Submit() {
  absl::Status sent = Send();
  if (!sent.ok()) Abandon();
  session_ = nullptr;
  graph_id_ = 0;  // the next call recorded starts another graph
  batch_ops_ = 0;
  return sent;
}

void Graph::Abandon() {
  for (const proto::ClientOp& op : ops_) {
    if (!op.has_call()) continue;
    for (uint64_t id : op.call().output_ids()) {
      core_->session().MarkFailed(
          id,
          absl::FailedPreconditionError(absl::StrCat(
              "buffer ", id, " is an output of call ", op.call().call_id(),
              ", recorded in a graph dropped before it was submitted (Graph::"
              "Submit): the call was never made")));
    }
  }
  ClearRecorded();
}

void Graph::ClearRecorded() {
  ops_.clear();
  op_inputs_.clear();
  keep_.clear();
}

Graph::Graph(Graph&& other) noexcept
    : core_(std::move(other.core_)),
      ops_(std::move(other.ops_)),
      op_inputs_(std::move(other.op_inputs_)),
      keep_(std::move(other.keep_)),
      session_(std::move(other.session_)),
      graph_id_(other.graph_id_),
      batch_ops_(other.batch_ops_) {
  other.ClearRecorded();
}

Graph& Graph::operator=(Graph&& other) noexcept {
  if (this != &other) {
    if (core_ != nullptr) Abandon();
    core_ = std::move(other.core_);
    ops_ = std::move(other.ops_);
    op_inputs_ = std::move(other.op_inputs_);
    keep_ = std::move(other.keep_);
    session_ = std::move(other.session_);
    graph_id_ = other.graph_id_;
    batch_ops_ = other.batch_ops_;
    other.ClearRecorded();
  }
  return *this;
}

Graph::~Graph() {
  if (core_ != nullptr) Abandon();
}

absl::StatusOr<std::vector<Future>> Client::Call(
    const Program& program, const std::vector<Future>& inputs, uint32_t site) {
  SliceHolds holds;  // declared first: dropped after the op is queued
  std::vector<proto::ClientOp> ops;
  std::shared_ptr<SessionTag> session;
  const int64_t start_ns = core_->timeline().NowNs();
  auto outputs = BuildCall(core_, program, inputs, &holds, &ops, &session, site,
                           /*graph_id=*/0);
  if (outputs.ok() && !ops.empty()) {
    std::vector<TimelineEvent> issued = IssuedCalls(*core_, ops, start_ns);
    if (core_->options().sequential_dispatch) core_->data().AwaitInputs(inputs);
    core_->session().Enqueue(std::move(ops), session->epoch);
    RecordIssued(*core_, issued);
  }
  return outputs;
}

}  // namespace plexus
