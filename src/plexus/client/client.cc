#include "plexus/client/client.h"

#include <unistd.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
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

// ---------------------------------------------------------------- Slice

proto::SliceRequest ToProto(const SliceOptions& options) {
  proto::SliceRequest req;
  req.set_num_devices(options.num_devices);
  for (int32_t m : options.mesh_shape) req.add_mesh_shape(m);
  for (const auto& a : options.axis_names) req.add_axis_names(a);
  req.set_placement(
      options.placement == Placement::kOneHost  ? proto::PLACEMENT_ONE_HOST
      : options.placement == Placement::kSpread ? proto::PLACEMENT_SPREAD
                                                : proto::PLACEMENT_ANY);
  for (const auto& h : options.hosts) req.add_hosts(h);
  for (uint64_t s : options.avoid_slices) req.add_avoid_slices(s);
  req.set_timeout_ms(absl::ToInt64Milliseconds(options.timeout));
  req.set_on_loss(options.on_loss);
  req.set_min_devices(options.min_devices);
  req.set_grow(options.grow);
  req.set_elastic_axis(options.elastic_axis);
  req.set_on_preempt(options.on_preempt);
  return req;
}

Slice::Slice(std::shared_ptr<ClientCore> core, proto::SliceInfo info,
             SliceOptions options, uint64_t epoch)
    : core_(std::move(core)),
      first_id_(info.slice_id()),
      options_(std::move(options)),
      id_(info.slice_id()),
      epoch_(epoch) {
  {
    absl::MutexLock lock(&maps_mu_);
    maps_.push_back(std::move(info));
    current_.store(&maps_.back(), std::memory_order_release);
  }
  // Not under maps_mu_: the core's reader remaps under its own lock, so
  // its lock comes first (lock order: ClientCore::mu_, then maps_mu_).
  core_->session().AddSlice(this);
}

void Slice::Remap(proto::SliceInfo info) {
  absl::MutexLock lock(&maps_mu_);
  // A newer map; or the same one suspended or resumed (SliceInfo.suspended
  // changes without a remap: notes come in order on the session's stream).
  const proto::SliceInfo& last = maps_.back();
  if (info.generation() < last.generation() ||
      (info.generation() == last.generation() &&
       info.suspended() == last.suspended())) {
    return;
  }
  maps_.push_back(std::move(info));
  current_.store(&maps_.back(), std::memory_order_release);
}

void Slice::Rebind(proto::SliceInfo info, uint64_t epoch) {
  absl::MutexLock lock(&maps_mu_);
  id_.store(info.slice_id(), std::memory_order_release);
  maps_.push_back(std::move(info));
  current_.store(&maps_.back(), std::memory_order_release);
  epoch_.store(epoch, std::memory_order_release);
}

void Slice::MarkLost(absl::Status lost) {
  absl::MutexLock lock(&mu_);
  lost_ = std::move(lost);
}

absl::Status Slice::lost() const {
  absl::MutexLock lock(&mu_);
  return lost_;
}

void Slice::SetAvoided(std::vector<std::weak_ptr<Slice>> slices) {
  absl::MutexLock lock(&mu_);
  avoided_ = std::move(slices);
}

std::vector<std::weak_ptr<Slice>> Slice::avoided() const {
  absl::MutexLock lock(&mu_);
  return avoided_;
}

int Slice::num_hosts() const {
  std::set<int64_t> hosts;
  for (const auto& d : info().devices()) hosts.insert(d.worker_id());
  return static_cast<int>(hosts.size());
}

Slice::~Slice() {
  core_->session().RemoveSlice(this);
  Close();
}

absl::StatusOr<Slice::Resized> Slice::Resize(int num_devices, int axis) {
  if (!Hold()) {
    return absl::FailedPreconditionError(
        absl::StrCat("resize: slice ", id(), " is closed"));
  }
  proto::SliceResize req;
  req.set_slice_id(id());
  req.set_num_devices(num_devices);
  req.set_axis(axis);
  absl::StatusOr<proto::SliceReply> reply =
      core_->session().ResizeSlice(std::move(req), epoch());
  Unhold();
  if (!reply.ok()) return reply.status();
  Remap(reply->slice());  // the note in the same message did already
  return Resized{reply->values_moved(), reply->bytes_moved()};
}

absl::StatusOr<Slice::Resized> Slice::Suspend(bool to_files) {
  proto::SliceResize req;
  req.set_suspend(true);
  req.set_to_files(to_files);
  std::vector<uint64_t> tokens, parked_ids;
  absl::StatusOr<Resized> parked =
      SendSuspendOrResume(std::move(req), "suspend", &tokens, &parked_ids);
  if (!parked.ok()) return parked.status();
  // Each park's token, ready once its files are written and synced; each
  // is released as its future goes.
  if (tokens.empty()) return parked;
  absl::StatusOr<std::shared_ptr<SessionTag>> tag =
      core_->session().AwaitSessionForUse();
  if (!tag.ok()) return tag.status();
  const ArgSpec token_spec{{DType::kU8, {1}}, Sharding::Replicated()};
  std::vector<Future> written;
  for (uint64_t token : tokens) {
    written.emplace_back(std::make_shared<BufferHandle>(
        core_, token, token_spec, shared_from_this(), *tag));
  }
  for (const Future& f : written) {
    if (absl::Status s = core_->data().Wait(f); !s.ok()) {
      return absl::Status(
          s.code(), absl::StrCat("suspend: slice ", id(),
                                 ": a value was not parked: ", s.message()));
    }
  }
  // Every file is written; each value reads as parked once the server
  // recorded it (its note), which a restart of the server keeps.
  ClientSession& session = core_->session();
  const absl::Time until = session.Now() + kParkedNoteWait;
  for (uint64_t value : parked_ids) {
    while (session.LostStatus(value).ok()) {
      const int64_t notes = session.notes_heard();
      if (!session.LostStatus(value).ok()) break;
      if (!session.AwaitNote(notes, until - session.Now()) &&
          session.Now() >= until) {
        return absl::DeadlineExceededError(absl::StrCat(
            "suspend: slice ", id(),
            ": its values' files are written, but "
            "the server did not record buffer ",
            value, " as parked within ", absl::FormatDuration(kParkedNoteWait),
            " (was the slice resumed meanwhile?)"));
      }
    }
  }
  return parked;
}

absl::StatusOr<Slice::Resized> Slice::Resume() {
  proto::SliceResize req;
  req.set_resume(true);
  return SendSuspendOrResume(std::move(req), "resume");
}

absl::StatusOr<Slice::Resized> Slice::SendSuspendOrResume(
    proto::SliceResize req, const char* what, std::vector<uint64_t>* tokens,
    std::vector<uint64_t>* parked_ids) {
  if (!Hold()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": slice ", id(), " is closed"));
  }
  req.set_slice_id(id());
  absl::StatusOr<proto::SliceReply> reply =
      core_->session().ResizeSlice(std::move(req), epoch());
  Unhold();
  if (!reply.ok()) return reply.status();
  Remap(reply->slice());
  if (tokens != nullptr) {
    tokens->assign(reply->wait_ids().begin(), reply->wait_ids().end());
  }
  if (parked_ids != nullptr) {
    parked_ids->assign(reply->parked_ids().begin(), reply->parked_ids().end());
  }
  return Resized{reply->values_moved(), reply->bytes_moved()};
}

void Slice::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    if (holds_ > 0) return;  // the last Unhold() releases it
  }
  core_->session().ReleaseSlice(id(), epoch());
}

bool Slice::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

bool Slice::Hold() {
  absl::MutexLock lock(&mu_);
  if (closed_) return false;
  holds_++;
  return true;
}

void Slice::Unhold() {
  {
    absl::MutexLock lock(&mu_);
    if (--holds_ > 0 || !closed_) return;
  }
  core_->session().ReleaseSlice(id(), epoch());  // closed during the hold
}

// ---------------------------------------------------------------- Program

void Program::Rebind(uint64_t id, uint64_t epoch) {
  id_.store(id, std::memory_order_release);
  epoch_.store(epoch, std::memory_order_release);
}

void Program::MarkLost(absl::Status lost) {
  absl::MutexLock lock(&mu_);
  lost_ = std::move(lost);
}

absl::Status Program::lost() const {
  absl::MutexLock lock(&mu_);
  return lost_;
}

// ---------------------------------------------------------------- Future

uint64_t Future::buffer_id() const { return handle_->current_id(); }
std::pair<uint64_t, const proto::SliceInfo*> Future::placed() const {
  return handle_->placed();
}
const ArgSpec& Future::arg() const { return handle_->arg(); }
const std::shared_ptr<Slice>& Future::slice() const { return handle_->slice(); }
uint64_t Future::epoch() const { return handle_->epoch(); }

// ---------------------------------------------------------------- Client

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const std::string& address, const ClientOptions& options) {
  auto core = std::make_shared<ClientCore>(options);
  absl::Status s = core->Init(address);
  if (!s.ok()) return s;
  return std::unique_ptr<Client>(new Client(std::move(core)));
}

Client::~Client() { Close(); }

void Client::Close() { core_->Close(); }

uint64_t Client::client_id() const { return core_->client_id(); }

absl::StatusOr<std::shared_ptr<Slice>> Client::CreateSlice(
    const SliceOptions& options) {
  proto::SliceRequest req = ToProto(options);
  // While the client reconnects, the request waits for the new session
  // (at most its own timeout); one cut short by the session's end is made
  // again in the next.
  Clock& clock = *core_->options().clock;
  const absl::Time deadline = clock.Now() + options.timeout;
  for (;;) {
    auto session = core_->session().AwaitSession(deadline);
    if (!session.ok()) {
      return absl::Status(session.status().code(),
                          absl::StrCat("slice: ", session.status().message()));
    }
    const uint64_t epoch = (*session)->epoch;
    auto info = core_->session().RequestSlice(req, epoch);
    if (!info.ok() && core_->session().SessionStatus(epoch).ok())
      return info.status();
    if (!info.ok() && !core_->session().CheckOpen().ok()) return info.status();
    if (!info.ok() && clock.Now() < deadline) continue;
    if (!info.ok()) return info.status();
    auto slice = std::make_shared<Slice>(core_, *info, options, epoch);
    slice->SetAvoided(
        core_->session().TrackedSlices(options.avoid_slices, epoch));
    core_->session().Track(slice);
    return slice;
  }
}

absl::StatusOr<std::shared_ptr<Program>> Client::Compile(
    const std::shared_ptr<Slice>& slice, const std::string& name,
    const std::string& kernel_name, const Attrs& attrs,
    const std::vector<ArgSpec>& inputs) {
  // The server refuses a longer one too; here it fails where it was made.
  if (absl::Status s = CheckName("program name", name); !s.ok()) return s;
  const std::string what = absl::StrCat("program '", name, "'");
  if (slice == nullptr || slice->closed()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": the slice is closed"));
  }
  const builtin::KernelSignature* kernel =
      builtin::KernelCatalogue::Global().Find(kernel_name);
  if (kernel == nullptr) {
    std::string known;
    for (const auto& n : builtin::KernelCatalogue::Global().Names()) {
      absl::StrAppend(&known, known.empty() ? "" : ", ", n);
    }
    return absl::NotFoundError(absl::StrCat(
        what, ": unknown kernel '", kernel_name, "' (known: ", known, ")"));
  }
  if (absl::Status s = CheckArgs(*slice, what, "argument", inputs); !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].sharding.is_mesh() && !kernel->TakesMeshShardings()) {
      std::string takers;
      for (const auto& n : builtin::KernelCatalogue::Global().Names()) {
        if (!builtin::KernelCatalogue::Global().Find(n)->TakesMeshShardings()) {
          continue;
        }
        absl::StrAppend(&takers, takers.empty() ? "" : ", ", n);
      }
      return absl::InvalidArgumentError(absl::StrCat(
          what, " argument ", i, ": kernel '", kernel_name,
          "' takes replicated, split or partial inputs, not ",
          inputs[i].sharding.ToString(),
          " (built-in programs that take PartitionSpecs over meshes of "
          "several axes: ",
          takers, "; plexus.jit programs take them all)"));
    }
    if (!kernel->AcceptsDType(inputs[i].global.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " argument ", i, ": kernel '", kernel_name,
                       "' computes in float32, float64, int32 and int64, not ",
                       DTypeName(inputs[i].global.dtype),
                       " (plexus.jit programs take "
                       "every dtype)"));
    }
  }
  auto outputs = kernel->InferOutputs(inputs, slice->num_devices(), attrs);
  if (!outputs.ok()) {
    return absl::Status(outputs.status().code(),
                        absl::StrCat(what, ": ", outputs.status().message()));
  }
  proto::ProgramDef def;
  def.set_name(name);
  def.set_kernel(kernel_name);
  AttrsToProto(attrs, def.mutable_attrs());
  return Register(slice, std::move(def), inputs, std::move(*outputs));
}

absl::StatusOr<std::shared_ptr<Program>> Client::CompileXla(
    const std::shared_ptr<Slice>& slice, const std::string& name,
    proto::XlaProgram xla, const std::vector<ArgSpec>& inputs,
    std::vector<ArgSpec> outputs) {
  // The server refuses a longer one too; here it fails where it was made.
  if (absl::Status s = CheckName("program name", name); !s.ok()) return s;
  const std::string what = absl::StrCat("program '", name, "'");
  if (slice == nullptr || slice->closed()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": the slice is closed"));
  }
  if (xla.module().empty() || xla.islands_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": an XLA program needs a module and islands"));
  }
  if (absl::Status s = CheckArgs(*slice, what, "argument", inputs); !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].sharding.is_partial()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " argument ", i,
          ": XLA programs take replicated or split inputs, not partial ones; "
          "all_reduce it first"));
    }
  }
  for (size_t o = 0; o < outputs.size(); ++o) {
    if (outputs[o].sharding.is_partial() &&
        !CanAccumulate(outputs[o].global.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " output ", o, ": a partial ", outputs[o].global.ToString(),
          " cannot be summed (Plexus adds no 8-bit floats); make it "
          "replicated or split, or cast it to a wider float in the program"));
    }
  }
  proto::ProgramDef def;
  def.set_name(name);
  def.set_kernel("xla");
  *def.mutable_xla() = std::move(xla);
  if (absl::Status s = DonatedInputs(def, inputs, outputs).status(); !s.ok()) {
    return s;
  }
  return Register(slice, std::move(def), inputs, std::move(outputs));
}

absl::Status Client::CheckArgs(const Slice& slice, const std::string& what,
                               const char* kind,
                               const std::vector<ArgSpec>& args) {
  const int n = slice.num_devices();
  for (size_t i = 0; i < args.size(); ++i) {
    if (absl::Status s = ValidateSpec(args[i].global); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", kind, " ", i, ": ", s.message()));
    }
    auto local = args[i].Local(n);
    if (!local.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " ", kind, " ", i, ": ", local.status().message()));
    }
    for (const auto& d : slice.info().devices()) {
      if (local->byte_size() > d.memory_bytes()) {
        return absl::ResourceExhaustedError(absl::StrCat(
            what, " ", kind, " ", i, " needs ", local->byte_size(),
            " bytes per device, more than the ", d.memory_bytes(),
            "-byte budget of device ", d.device(), " on ", d.host_name()));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Program>> Client::Register(
    const std::shared_ptr<Slice>& slice, proto::ProgramDef def,
    const std::vector<ArgSpec>& inputs, std::vector<ArgSpec> outputs) {
  const std::string what = absl::StrCat("program '", def.name(), "'");
  if (absl::Status s = CheckArgs(*slice, what, "output", outputs); !s.ok()) {
    return s;
  }
  for (const auto& a : inputs) *def.add_inputs() = ToProto(a);
  for (const auto& a : outputs) *def.add_outputs() = ToProto(a);
  // The server refuses these too; here it fails where it was made.
  if (absl::Status s = CheckProgramStrings(def); !s.ok()) return s;
  // While the client reconnects, registering waits for the new session.
  auto session = core_->session().AwaitSessionForUse();
  if (!session.ok()) {
    return absl::Status(session.status().code(),
                        absl::StrCat(what, ": ", session.status().message()));
  }
  const uint64_t epoch = (*session)->epoch;
  if (slice->epoch() != epoch) {
    absl::Status lost = slice->lost();
    if (lost.ok()) lost = core_->session().SessionStatus(slice->epoch());
    return absl::Status(lost.code(), absl::StrCat(what, ": ", lost.message()));
  }
  absl::StatusOr<uint64_t> id = core_->session().NextIds();
  if (!id.ok()) {
    return absl::Status(id.status().code(),
                        absl::StrCat(what, ": ", id.status().message()));
  }
  proto::ClientOp op;
  op.mutable_program()->set_program_id(*id);
  *op.mutable_program()->mutable_program() = def;
  std::vector<proto::ClientOp> ops;
  ops.push_back(std::move(op));
  core_->session().Enqueue(std::move(ops), epoch);
  auto program = std::make_shared<Program>(*id, std::move(def), inputs,
                                           std::move(outputs), slice, epoch);
  core_->session().Track(program);
  return program;
}

Graph Client::NewGraph() { return Graph(core_); }

void Client::Flush() { core_->session().Flush(); }

std::vector<SessionEnd> Client::SessionEnds() const {
  return core_->session().SessionEnds();
}

SessionState Client::state() const { return core_->session().state(); }

ClientCounters Client::counters() const {
  ClientCounters c;
  c.bytes_put = core_->data().bytes_put.load();
  c.bytes_fetched = core_->data().bytes_fetched.load();
  c.calls = core_->calls.load();
  c.live_futures = core_->live_futures.load();
  c.wait_round_trips = core_->data().wait_round_trips.load();
  c.messages_sent = core_->session().messages_sent();
  c.messages_sent_inline = core_->session().messages_sent_inline();
  c.messages_sent_as_frames = core_->session().messages_sent_as_frames();
  c.relay_links_opened = core_->data().relay_links_opened.load();
  c.answers_relayed = core_->data().answers_relayed.load();
  return c;
}

// ---------------------------------------------------------------- status

absl::StatusOr<proto::ClusterStatus> GetClusterStatus(
    const std::string& address, bool fresh) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      ServerChannel(address, /*ca_file=*/"");  // $PLEXUS_TLS_CA
  if (!channel.ok()) return channel.status();
  auto stub = proto::Controller::NewStub(*channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(GrpcTimeout(absl::Seconds(5)));
  proto::StatusRequest req;
  if (fresh) req.set_fresh_timeout_ms(3000);
  proto::ClusterStatus status;
  grpc::Status s = stub->GetStatus(&ctx, req, &status);
  if (!s.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "no Plexus server answers at ", address, ": ", s.error_message()));
  }
  return status;
}

uint32_t Client::CallSite(const std::string& text) {
  return core_->call_sites().Id(text);
}

namespace {

absl::StatusOr<std::unique_ptr<proto::Controller::Stub>> TraceStub(
    const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);  // every process's ring, in one reply
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = ServerChannel(
      address, /*ca_file=*/"", std::move(args));  // $PLEXUS_TLS_CA
  if (!channel.ok()) return channel.status();
  return proto::Controller::NewStub(*channel);
}

absl::StatusOr<proto::TraceReply> CallTrace(proto::Controller::Stub& stub,
                                            const std::string& address,
                                            int64_t since_ns, bool events,
                                            absl::Duration timeout,
                                            const TraceAuth& auth) {
  grpc::ClientContext ctx;
  ctx.set_deadline(GrpcTimeout(timeout + timeout));
  proto::TraceRequest req;
  req.set_since_ns(since_ns);
  req.set_events(events);
  req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  req.set_client_id(auth.client_id);
  if (auth.credential.has_value()) {
    req.set_credential(auth.credential->data(), auth.credential->size());
  }
  proto::TraceReply reply;
  grpc::Status s = stub.Trace(&ctx, req, &reply);
  if (s.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
    return absl::PermissionDeniedError(s.error_message());
  }
  if (!s.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "no Plexus server answers at ", address, ": ", s.error_message()));
  }
  return reply;
}

// Round trips that ask for the server's time only, for the client's clock
// offset: the quickest gives the estimate.
constexpr int kClockProbes = 8;

}  // namespace

absl::StatusOr<proto::TraceReply> Client::Trace(int64_t since_ns,
                                                absl::Duration timeout) {
  const transport::DataPlaneIdentity identity = core_->session().identity();
  auto stub = TraceStub(core_->session().address());
  if (!stub.ok()) return stub.status();
  // The client's clock against the server's, as the server estimates a
  // worker's (timeline/clock_offset.h), from the Trace RPC's own round
  // trips on one channel (the first one connects it): the server stamps
  // its time once (t2 = t3), the client sends at t1 and reads at t4.
  Timeline& timeline = core_->timeline();
  ClockOffsetEstimator clock(kClockProbes);
  for (int i = 0; i < kClockProbes; ++i) {
    const int64_t t1 = timeline.NowNs();
    auto now = CallTrace(**stub, core_->session().address(), 0,
                         /*events=*/false, timeout, {});
    const int64_t t4 = timeline.NowNs();
    if (!now.ok()) return now.status();
    clock.Add({t1, now->server_now_ns(), now->server_now_ns(), t4});
  }
  auto reply =
      CallTrace(**stub, core_->session().address(), since_ns, /*events=*/true,
                timeout, {identity.peer.id, identity.credential});
  if (!reply.ok()) return reply;
  // This client's own ring, on the server's clock like the rest.
  proto::TimelineRing* mine = reply->add_rings();
  const int64_t offset = clock.offset_ns();
  std::vector<proto::TimelineRing> chunks = RingChunks(
      timeline, since_ns == 0 ? 0 : since_ns - offset, /*per_chunk=*/1 << 30);
  mine->Swap(&chunks.front());
  mine->set_client_id(identity.peer.id);
  mine->set_process(absl::StrCat("client ", core_->options().name, " (",
                                 identity.peer.id, ")"));
  mine->set_pid(getpid());
  mine->set_offset_ns(offset);
  mine->set_offset_error_ns(clock.error_ns());
  return reply;
}

absl::StatusOr<proto::TraceReply> CollectTrace(const std::string& address,
                                               int64_t since_ns, bool events,
                                               absl::Duration timeout,
                                               const TraceAuth& auth) {
  auto stub = TraceStub(address);
  if (!stub.ok()) return stub.status();
  return CallTrace(**stub, address, since_ns, events, timeout, auth);
}

absl::Status ShutdownServer(const std::string& address,
                            const ClusterSecret& secret) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      ServerChannel(address, /*ca_file=*/"");  // $PLEXUS_TLS_CA
  if (!channel.ok()) return channel.status();
  auto stub = proto::Controller::NewStub(*channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(GrpcTimeout(absl::Seconds(5)));
  proto::ShutdownRequest req;
  const Credential admin = secret.Derive(CredentialRole::kAdmin);
  req.set_credential(admin.data(), admin.size());
  proto::ShutdownReply reply;
  grpc::Status s = stub->Shutdown(&ctx, req, &reply);
  if (s.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
    return absl::PermissionDeniedError(
        absl::StrCat("the Plexus server at ", address,
                     " refused to shut down: ", s.error_message()));
  }
  if (!s.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "no Plexus server answers at ", address, ": ", s.error_message()));
  }
  return absl::OkStatus();
}

}  // namespace plexus
