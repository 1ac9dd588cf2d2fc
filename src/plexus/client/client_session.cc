// The client's sessions with the server (ClientSession): opening one
// (hello, protocol, tenant credential), the session thread that runs one
// after another and reconnects with back-off when one ends without Close,
// what is tracked to restore in the next (session_restore.cc restores it),
// and the waits that end when a session opens again (AwaitSession,
// SessionStatus). reconnect.h has the states as plain data.
#include "plexus/client/client_session.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "plexus/client/grpc_timeout.h"
#include "plexus/common/address.h"
#include "plexus/common/logging.h"
#include "plexus/common/process.h"
#include "plexus/common/protocol.h"
#include "plexus/common/thread_name.h"
#include "plexus/common/tls.h"

namespace plexus {
namespace {

// How long a use of a session whose stream broke waits for its reader to
// record the end (it sees a broken stream at once; the bound is for a
// reader that does not).
constexpr absl::Duration kEndRecordWait = absl::Seconds(10);

template <typename T>
void DropExpired(std::vector<std::weak_ptr<T>>& v) {
  v.erase(std::remove_if(v.begin(), v.end(),
                         [](const std::weak_ptr<T>& w) { return w.expired(); }),
          v.end());
}

// The tenant and tenant credential a session opens with, as ClientOptions
// says; nothing for an anonymous session.
absl::Status SetTenant(const ClientOptions& options,
                       proto::ClientToServer* hello) {
  auto env = [](const char* name) {
    const char* value = std::getenv(name);
    return std::string(value != nullptr ? value : "");
  };
  std::string tenant =
      options.tenant.empty() ? env(kTenantEnv) : options.tenant;
  std::string token = options.tenant_token;
  if (token.empty() && options.tenant.empty()) token = env(kTenantTokenEnv);
  if (!token.empty()) {
    absl::StatusOr<Credential> credential = TenantTokenFromHex(token);
    if (!credential.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tenant token",
                       options.tenant_token.empty()
                           ? absl::StrCat(" ($", kTenantTokenEnv, ")")
                           : "",
                       ": ", credential.status().message()));
    }
    hello->set_tenant(tenant.empty() ? kDefaultTenantName : tenant);
    hello->set_tenant_credential(credential->data(), credential->size());
    return absl::OkStatus();
  }
  std::optional<ClusterSecret> secret = options.secret;
  if (!secret.has_value() && !env(kClusterSecretEnv).empty()) {
    absl::StatusOr<ClusterSecret> loaded = ClusterSecret::Load("");
    if (!loaded.ok()) return loaded.status();
    secret = *loaded;
  }
  if (!secret.has_value()) {
    if (!tenant.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tenant '", tenant, "' needs its token: set $", kTenantTokenEnv,
          " (the operator prints it with `plexus token --tenant ", tenant,
          "`)"));
    }
    return absl::OkStatus();  // anonymous
  }
  if (tenant.empty()) tenant = kDefaultTenantName;
  if (absl::Status s = CheckTenantName(tenant); !s.ok()) return s;
  const Credential credential = secret->Derive(CredentialRole::kTenant, tenant);
  hello->set_tenant(tenant);
  hello->set_tenant_credential(credential.data(), credential.size());
  return absl::OkStatus();
}

}  // namespace

ClientSession::ClientSession(const ClientOptions& options,
                             SessionObserver* observer, StatsFn stats)
    : options_(options),
      observer_(observer),
      stats_(std::move(stats)),
      machine_(options.reconnect_timeout) {}

ClientSession::~ClientSession() { Close(); }

bool ClientSession::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

absl::Status ClientSession::CheckOpen() const {
  if (closing_.load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError(
        absl::StrCat("client ", client_id(), " is closed"));
  }
  return absl::OkStatus();
}

void ClientSession::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    machine_.Close();
    UpdateOpenTagLocked();
    closing_.store(true, std::memory_order_release);
    // Fetches and waits in other threads end now, with "closed".
    observer_->SessionEnded();
    if (opening_ != nullptr) opening_->TryCancel();
  }
  // The sender flushes what is queued, then half-closes the stream; the
  // server frees the client's slices and buffers when the stream ends.
  if (session_thread_.joinable()) session_thread_.join();
}

absl::Status ClientSession::Open(const std::string& address) {
  address_ = address;
  {
    absl::MutexLock lock(&mu_);
    machine_.SetRetryCap(RetryCapFor(address, absl::Seconds(2)));
  }
  RaiseOpenFileLimit();
  UseLockOrderChecksOfThisBuild();
  auto session = OpenSession(options_.clock->Now() + absl::Seconds(10));
  if (!session.ok()) return session.status();
  Install(**session);
  session_thread_ = std::thread([this, s = std::move(*session)]() mutable {
    SetThreadName("plexus-session");
    SessionLoop(std::move(s));
  });
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ClientSession::Session>>
ClientSession::OpenSession(absl::Time deadline) {
  auto session = std::make_unique<Session>();
  // A fresh channel each time: a channel that failed to connect waits out
  // gRPC's own back-off before it tries again.
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      SessionChannel(address_, options_.tls_ca);
  if (!channel.ok()) return channel.status();
  session->channel = *std::move(channel);
  // In steps, so that Close() does not wait out an attempt. gRPC measures
  // each step itself (a relative timeout: 10 to 100 ms, so that a clock
  // that stands still, a test's, is not polled); the deadline is on the
  // client's clock.
  Clock& clock = *options_.clock;
  while (!session->channel->WaitForConnected(
      GrpcTimeout(std::clamp(deadline - clock.Now(), absl::Milliseconds(10),
                             absl::Milliseconds(100))))) {
    if (closing_.load(std::memory_order_acquire)) {
      return absl::CancelledError("the client was closed");
    }
    if (clock.Now() >= deadline) {
      return absl::UnavailableError(
          absl::StrCat("cannot reach a Plexus server at ", address_));
    }
  }
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return absl::CancelledError("the client was closed");
    opening_ = &session->context;
  }
  const absl::Status opened = Handshake(*session);
  absl::MutexLock lock(&mu_);
  opening_ = nullptr;
  if (!opened.ok()) return opened;
  return session;
}

absl::Status ClientSession::Handshake(Session& session) {
  session.stub = proto::Controller::NewStub(session.channel);
  session.stream = session.stub->ClientSession(&session.context);
  proto::ClientToServer hello;
  hello.set_client_name(options_.name);
  hello.set_protocol_version(kProtocolVersion);
  if (absl::Status s = SetTenant(options_, &hello); !s.ok()) return s;
  uint64_t resume_id = 0;
  {
    // The session that ended with its server, if the next may resume it.
    absl::MutexLock lock(&mu_);
    if (resume_epoch_ != 0) {
      resume_id = resume_client_id_;
      hello.set_resume_client_id(resume_id);
      hello.set_resume_credential(resume_credential_);
    }
  }
  if (!session.stream->Write(hello)) {
    return absl::UnavailableError("the server closed the client session");
  }
  proto::ServerToClient first;
  if (!session.stream->Read(&first)) {
    // Finish says why: a protocol version mismatch names both versions.
    const grpc::Status why = session.stream->Finish();
    return absl::Status(
        why.ok() ? absl::StatusCode::kUnavailable
                 : static_cast<absl::StatusCode>(why.error_code()),
        absl::StrCat("the server refused the client session: ",
                     why.error_message().empty() ? "no reason given"
                                                 : why.error_message()));
  }
  if (absl::Status v =
          CheckProtocolVersion("client", "server", first.protocol_version());
      !v.ok()) {
    session.context.TryCancel();
    proto::ServerToClient rest;
    while (session.stream->Read(&rest)) {
    }
    session.stream->Finish().IgnoreError();
    return v;
  }
  session.client_id = first.client_id();
  session.resumed =
      first.resumed() && resume_id != 0 && first.client_id() == resume_id;
  journaled_.store(first.journaled(), std::memory_order_release);
  spare_wait_ms_.store(first.spare_wait_ms(), std::memory_order_relaxed);
  if (first.credential().size() != session.identity.credential.size()) {
    return absl::UnavailableError(
        "the server sent no data-plane credential (an older server?)");
  }
  session.identity.peer = {CredentialRole::kClient, session.client_id};
  std::copy(first.credential().begin(), first.credential().end(),
            session.identity.credential.begin());
  if (first.ops_generation() == 0) return absl::OkStatus();
  return MoveOpsToFrames(session, first);
}

absl::Status ClientSession::MoveOpsToFrames(
    Session& session, const proto::ServerToClient& first) {
  // The server's TCP port on the host this stream reached (gRPC's peer:
  // "ipv4:10.0.0.1:7070", "ipv6:[::1]:7070"; the one server of a list
  // that answered); its unix socket first, which a server sharing this
  // machine's network namespace answers.
  const std::string peer = session.context.peer();
  std::string tcp;
  if (absl::StartsWith(peer, "ipv4:") || absl::StartsWith(peer, "ipv6:")) {
    const std::string host = HostOfAddress(peer.substr(5));
    tcp = host.find(':') != std::string::npos
              ? absl::StrCat("[", host, "]:", first.ops_tcp_port())
              : absl::StrCat(host, ":", first.ops_tcp_port());
  }
  transport::DataPlaneIdentity me = session.identity;
  me.generation = first.ops_generation();
  Clock& clock = *options_.clock;
  const absl::Time give_up = clock.Now() + kOpsConnectTimeout;
  auto give_up_now = [this, &clock, give_up] {
    return clock.Now() >= give_up || closing_.load(std::memory_order_acquire);
  };
  // The unix socket alone first: on another machine (or network
  // namespace) it is not there, which is no news worth a log line.
  absl::StatusOr<std::unique_ptr<transport::DataPlaneConnection>> ops =
      absl::UnavailableError("no unix socket tried");
  if (options_.shared_memory && !first.ops_unix_name().empty()) {
    ops = transport::DataPlaneConnection::Connect(
        "", first.ops_unix_name(), &session.ops_counters, me, give_up_now,
        &clock, kOpsConnectTimeout);
  }
  if (!ops.ok() && !absl::IsPermissionDenied(ops.status()) && !tcp.empty()) {
    ops = transport::DataPlaneConnection::Connect(
        tcp, "", &session.ops_counters, me, give_up_now, &clock,
        kOpsConnectTimeout);
  }
  if (!ops.ok()) {
    SPDLOG_WARN(
        "client {}: cannot reach the server's ops listener (unix @{}, TCP "
        "{}): {}; its ops stay on the gRPC stream",
        session.client_id, first.ops_unix_name(), tcp.empty() ? "none" : tcp,
        ops.status().ToString());
    return absl::OkStatus();
  }
  // Its first frame, empty, before the stream's last message: the server
  // takes the connection for the session's from it, and waits for its end
  // when the stream ends.
  if (absl::Status opened = (*ops)->SendOps(""); !opened.ok()) {
    SPDLOG_WARN(
        "client {}: the server's ops listener closed the connection ({}); "
        "its ops stay on the gRPC stream",
        session.client_id, opened.ToString());
    return absl::OkStatus();
  }
  proto::ClientToServer moved;
  moved.set_ops_on_frames(true);
  if (!session.stream->Write(moved)) {
    return absl::UnavailableError("the server closed the client session");
  }
  SPDLOG_DEBUG("client {}: its ops now go as frames ({})", session.client_id,
               (*ops)->uses_shared_memory() ? "unix socket" : "TCP");
  session.ops = *std::move(ops);
  return absl::OkStatus();
}

void ClientSession::Install(Session& session) {
  absl::MutexLock lock(&mu_);
  const uint64_t resumed_epoch = std::exchange(resume_epoch_, 0);
  last_resumed_ = session.resumed && resumed_epoch == epoch_.load();
  restoring_ = false;
  if (last_resumed_) {
    // The same session, resumed: its epoch, ids, slices, programs and
    // records stand; the restore tells the server what it holds. New ops
    // wait for its snapshot (ResumeRestore).
    restoring_ = true;
    identity_ = session.identity;
    machine_.Installed();
    UpdateOpenTagLocked();
    observer_->SessionResumed(resumed_epoch, session.identity);
    // Reads that failed as the server went away go again now.
    resumes_.fetch_add(1, std::memory_order_acq_rel);
    const absl::Time now = options_.clock->Now();
    for (auto it = ends_.rbegin(); it != ends_.rend(); ++it) {
      SessionEnd& end = *it;
      if (end.reconnected || !end.gave_up.empty()) break;
      end.reconnected = true;
      end.resumed = true;
      end.new_client_id = session.client_id;
      end.reconnected_at = now;
      SPDLOG_WARN("{}", DescribeSessionEnd(end));
    }
    return;
  }
  {
    absl::MutexLock kept(&kept_mu_);
    kept_calls_.Clear();
    kept_programs_.clear();
  }
  const uint64_t epoch = epoch_.load() + 1;
  session_tag_ = std::make_shared<SessionTag>(epoch);
  tags_.push_back(session_tag_);
  epoch_.store(epoch, std::memory_order_release);
  client_id_.store(session.client_id, std::memory_order_release);
  identity_ = session.identity;
  machine_.Installed();
  UpdateOpenTagLocked();
  observer_->SessionInstalled(epoch, session.identity);
  // The last session's records name its ids, workers and slices, which
  // the server that answers now may hand out again for other things.
  queue_.clear();
  slice_replies_.clear();
  aliases_.clear();
  has_aliases_.store(false, std::memory_order_release);
  lost_.clear();
  broken_slices_.clear();
  slices_.clear();
}

void ClientSession::SessionLoop(std::unique_ptr<Session> session) {
  while (session != nullptr) {
    std::shared_ptr<SessionTag> tag;
    {
      absl::MutexLock lock(&mu_);
      tag = session_tag_;
    }
    sender_ = std::thread([this, &session] {
      SetThreadName("plexus-send");
      SenderLoop(*session);
    });
    reader_ = std::thread([this, &session] {
      SetThreadName("plexus-recv");
      ReaderLoop(*session);
    });
    bool resumed;
    {
      absl::MutexLock lock(&mu_);
      resumed = std::exchange(last_resumed_, false);
    }
    if (resumed) {
      ResumeRestore(tag);
    } else if (tag->epoch > 1) {
      Restore(tag);
    }
    {
      absl::MutexLock lock(&mu_);
      auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return machine_.broken() || closed_;
      };
      mu_.Await(absl::Condition(&ended));
    }
    sender_.join();
    reader_.join();
    observer_->SessionDone();
    // Both directions are done: Finish says why the stream ended.
    const grpc::Status why = session->stream->Finish();
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      if (!ends_.empty() && ends_.back().epoch == tag->epoch &&
          !why.error_message().empty()) {
        ends_.back().reason = why.error_message();
      }
      if (machine_.state() != SessionState::kReconnecting) return;
    }
    session.reset();
    session = Reconnect();
  }
}

std::unique_ptr<ClientSession::Session> ClientSession::Reconnect() {
  for (int attempts = 1;; ++attempts) {
    // An attempt ends by the give-up time, and soon enough that one on a
    // server that accepts but does not answer is not the only one.
    absl::Time deadline;
    {
      absl::MutexLock lock(&mu_);
      deadline = machine_.AttemptDeadline(options_.clock->Now());
    }
    auto session = OpenSession(deadline);
    if (session.ok()) {
      {
        absl::MutexLock lock(&mu_);
        if (!ends_.empty()) ends_.back().attempts = attempts;
      }
      Install(**session);
      return std::move(*session);
    }
    absl::MutexLock lock(&mu_);
    if (closed_) return nullptr;
    if (RefusedForGood(session.status())) {
      GiveUpLocked(absl::StrCat(
          "the server at ", address_,
          " refused the new session: ", session.status().message()));
      return nullptr;
    }
    std::optional<absl::Duration> delay =
        machine_.AttemptFailed(options_.clock->Now());
    if (!delay.has_value()) {
      GiveUpLocked(absl::StrCat(
          "no server answered at ", address_, " within the reconnect timeout (",
          absl::FormatDuration(options_.reconnect_timeout), ", ", attempts,
          attempts == 1 ? " attempt)" : " attempts)"));
      return nullptr;
    }
    auto closed = [this]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_; };
    options_.clock->AwaitCondition(&mu_, absl::Condition(&closed),
                                   options_.clock->Now() + *delay);
    if (closed_) return nullptr;
  }
}

void ClientSession::GiveUpLocked(std::string why) {
  if (machine_.state() == SessionState::kClosed) return;
  machine_.GiveUp();
  resume_epoch_ = 0;
  UpdateOpenTagLocked();
  if (!ends_.empty()) ends_.back().gave_up = why;
  SPDLOG_ERROR("client {}: {}; its slices and programs are gone too",
               client_id(), why);
}

absl::Status ClientSession::GaveUpStatusLocked() const {
  const SessionEnd* end = ends_.empty() ? nullptr : &ends_.back();
  return absl::UnavailableError(absl::StrCat(
      "client ", end != nullptr ? end->client_id : client_id(),
      "'s session with the server at ", address_,
      " ended (the server restarted or went away",
      end != nullptr && !end->reason.empty() ? absl::StrCat(": ", end->reason)
                                             : std::string(),
      "); its slices, programs and futures are lost, and ",
      end == nullptr || end->gave_up.empty() || end->gave_up == kNoReconnect
          ? absl::StrCat("the client does not reconnect (", kNoReconnect, ")")
          : absl::StrCat("the client gave up reconnecting: ", end->gave_up),
      "; connect again"));
}

void ClientSession::Track(const std::shared_ptr<Slice>& slice) {
  absl::MutexLock lock(&made_mu_);
  if (slices_made_.size() >= 64 && (slices_made_.size() & 63) == 0) {
    DropExpired(slices_made_);
  }
  slices_made_.push_back(slice);
}

void ClientSession::Track(const std::shared_ptr<Program>& program) {
  absl::MutexLock lock(&made_mu_);
  if (programs_made_.size() >= 64 && (programs_made_.size() & 63) == 0) {
    DropExpired(programs_made_);
  }
  programs_made_.push_back(program);
}

std::vector<std::weak_ptr<Slice>> ClientSession::TrackedSlices(
    const std::vector<uint64_t>& ids, uint64_t epoch) {
  std::vector<std::weak_ptr<Slice>> found;
  if (ids.empty()) return found;
  absl::MutexLock lock(&made_mu_);
  for (const auto& w : slices_made_) {
    std::shared_ptr<Slice> s = w.lock();
    if (s == nullptr || s->epoch() != epoch) continue;
    if (std::find(ids.begin(), ids.end(), s->id()) != ids.end()) {
      found.push_back(w);
    }
  }
  return found;
}

void ClientSession::LiveTracked(
    std::vector<std::shared_ptr<Slice>>* slices,
    std::vector<std::shared_ptr<Program>>* programs) {
  absl::MutexLock lock(&made_mu_);
  DropExpired(slices_made_);
  DropExpired(programs_made_);
  for (const auto& w : slices_made_) {
    if (auto s = w.lock()) slices->push_back(std::move(s));
  }
  for (const auto& w : programs_made_) {
    if (auto p = w.lock()) programs->push_back(std::move(p));
  }
}

std::vector<SessionEnd> ClientSession::SessionEnds() const {
  absl::MutexLock lock(&mu_);
  return ends_;
}

SessionState ClientSession::state() const {
  absl::MutexLock lock(&mu_);
  return machine_.state();
}

void ClientSession::UpdateOpenTagLocked() {
  open_tag_.store(machine_.usable() ? session_tag_.get() : nullptr,
                  std::memory_order_release);
}

absl::StatusOr<std::shared_ptr<SessionTag>> ClientSession::AwaitSession(
    absl::Time deadline) {
  if (absl::Status open = CheckOpen(); !open.ok()) return open;
  if (SessionTag* open = open_tag_.load(std::memory_order_acquire)) {
    return open->shared_from_this();  // kept in tags_: alive
  }
  absl::MutexLock lock(&mu_);
  if (machine_.usable()) return session_tag_;
  Clock& clock = *options_.clock;
  const absl::Time start = clock.Now();
  auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return machine_.use() != SessionMachine::Use::kWait;
  };
  clock.AwaitCondition(&mu_, absl::Condition(&settled), deadline);
  switch (machine_.use()) {
    case SessionMachine::Use::kOpen:
      return session_tag_;
    case SessionMachine::Use::kClosed:
      return absl::FailedPreconditionError(
          absl::StrCat("client ", client_id(), " is closed"));
    case SessionMachine::Use::kGaveUp:
      return GaveUpStatusLocked();
    case SessionMachine::Use::kWait:
      break;
  }
  const absl::Time now = clock.Now();
  return WaitedForServer(address_, ends_.empty() ? start : ends_.back().ended,
                         now - start, machine_.give_up_at(), now);
}

absl::Status ClientSession::SessionStatus(uint64_t epoch,
                                          uint64_t buffer_id) const {
  if (absl::Status open = CheckOpen(); !open.ok()) return open;
  absl::MutexLock lock(&mu_);
  // The stream broke a moment ago (a write failed first): its reader
  // records the end as it sees the stream end, at once; until then the
  // end a resume settled before would speak for this one.
  auto end_recorded = [this, epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ ||
           StandingOf(epoch, epoch_.load(), machine_.broken(), ends_).kind !=
               EpochStanding::kEndDue;
  };
  if (!end_recorded()) {  // (every call asks: no clock read when it is)
    options_.clock->AwaitCondition(&mu_, absl::Condition(&end_recorded),
                                   options_.clock->Now() + kEndRecordWait);
  }
  // Ended with its server, and the next may resume it: wait for the
  // reconnect's outcome (it ends by the reconnect timeout).
  auto decided = [this, epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || resume_epoch_ != epoch ||
           machine_.state() != SessionState::kReconnecting;
  };
  if (epoch != 0 && resume_epoch_ == epoch) {
    mu_.Await(absl::Condition(&decided));
  }
  return SessionStatusLocked(epoch, buffer_id);
}

void ClientSession::NoteLive(uint64_t buffer_id, uint64_t slice_id,
                             const ArgSpec& arg, bool issued) {
  if (!journaled_.load(std::memory_order_acquire)) return;
  absl::MutexLock kept(&kept_mu_);
  live_[buffer_id] = {slice_id, arg, issued};
}

void ClientSession::MarkIssuedLocked(const std::vector<proto::ClientOp>& ops) {
  if (!journaled_.load(std::memory_order_acquire)) return;
  absl::MutexLock kept(&kept_mu_);
  for (const proto::ClientOp& op : ops) {
    if (!op.has_call()) continue;
    for (uint64_t id : op.call().output_ids()) {
      if (auto it = live_.find(id); it != live_.end()) it->second.issued = true;
    }
  }
}

absl::Status ClientSession::SessionStatusLocked(uint64_t epoch,
                                                uint64_t buffer_id) const {
  if (closed_) {
    return absl::FailedPreconditionError(
        absl::StrCat("client ", client_id(), " is closed"));
  }
  const EpochStanding standing =
      StandingOf(epoch, epoch_.load(), machine_.broken(), ends_);
  if (standing.kind == EpochStanding::kUsable) return absl::OkStatus();
  if (standing.end != nullptr) return LostWithSession(*standing.end, buffer_id);
  // Ended a moment ago, and its reader has not recorded it yet.
  return absl::UnavailableError(
      absl::StrCat("the session with the server at ", address_, " ended"));
}

}  // namespace plexus
