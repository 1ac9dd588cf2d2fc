#include "plexus/client/client_core.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "plexus/common/logging.h"
#include "plexus/common/process.h"
#include "plexus/common/protocol.h"
#include "plexus/common/status_proto.h"
#include "plexus/common/tls.h"

namespace plexus {
namespace {

constexpr size_t kMaxQueuedOps = 1 << 16;

}  // namespace

namespace {

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

ClientCore::~ClientCore() { Close(); }

absl::Status ClientCore::Init(const std::string& address) {
  address_ = address;
  machine_id_ = LocalMachineId();
  RaiseOpenFileLimit();
  UseLockOrderChecksOfThisBuild();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> tls =
      ChannelCredentialsFor(options_.tls_ca);
  if (!tls.ok()) return tls.status();
  channel_ = grpc::CreateCustomChannel(address, *tls, args);
  if (!channel_->WaitForConnected(
          absl::ToChronoTime(absl::Now() + absl::Seconds(10)))) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach a Plexus server at ", address));
  }
  stub_ = proto::Controller::NewStub(channel_);
  stream_ = stub_->ClientSession(&context_);
  proto::ClientToServer hello;
  hello.set_client_name(options_.name);
  hello.set_protocol_version(kProtocolVersion);
  if (absl::Status s = SetTenant(options_, &hello); !s.ok()) return s;
  if (!stream_->Write(hello)) {
    return absl::UnavailableError("the server closed the client session");
  }
  proto::ServerToClient first;
  if (!stream_->Read(&first)) {
    // Finish says why: a protocol version mismatch names both versions.
    const grpc::Status why = stream_->Finish();
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
    context_.TryCancel();
    proto::ServerToClient rest;
    while (stream_->Read(&rest)) {
    }
    stream_->Finish().IgnoreError();
    return v;
  }
  client_id_ = first.client_id();
  if (first.credential().size() != identity_.credential.size()) {
    return absl::UnavailableError(
        "the server sent no data-plane credential (an older server?)");
  }
  identity_.peer = {CredentialRole::kClient, client_id_};
  std::copy(first.credential().begin(), first.credential().end(),
            identity_.credential.begin());
  sender_ = std::thread([this] { SenderLoop(); });
  reader_ = std::thread([this] { ReaderLoop(); });
  return absl::OkStatus();
}

bool ClientCore::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

absl::Status ClientCore::CheckOpen() const {
  if (closing_.load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError(
        absl::StrCat("client ", client_id_, " is closed"));
  }
  if (session_lost_.load(std::memory_order_acquire)) return SessionLost();
  return absl::OkStatus();
}

absl::Status ClientCore::SessionLost() const {
  return absl::UnavailableError(absl::StrCat(
      "client ", client_id_, "'s session with the server at ", address_,
      " ended (the server restarted or went away): its slices, programs and "
      "futures are lost; connect again"));
}

void ClientCore::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    closing_.store(true, std::memory_order_release);
    // Fetches and waits in other threads end now, with "closed".
    for (auto& [conn, use] : in_use_) conn->Shutdown();
  }
  // The sender flushes what is queued, then half-closes the stream; the
  // server frees the client's slices and buffers when the stream ends.
  if (sender_.joinable()) sender_.join();
  if (reader_.joinable()) reader_.join();
  if (reputter_.joinable()) reputter_.join();
  absl::MutexLock lock(&mu_);
  pool_.clear();
  kept_puts_.clear();
}

void ClientCore::Enqueue(std::vector<proto::ClientOp> ops) {
  absl::MutexLock lock(&mu_);
  auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || stream_broken_ || queue_.size() < kMaxQueuedOps;
  };
  mu_.Await(absl::Condition(&room));
  if (closed_ || stream_broken_) return;
  for (auto& op : ops) queue_.push_back(std::move(op));
}

void ClientCore::Flush() {
  absl::MutexLock lock(&mu_);
  auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stream_broken_ || (queue_.empty() && !sending_);
  };
  mu_.Await(absl::Condition(&drained));
}

void ClientCore::SenderLoop() {
  absl::Time next_stats = absl::Now();
  while (true) {
    proto::ClientToServer msg;
    bool last = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return closed_ || !queue_.empty();
      };
      mu_.AwaitWithDeadline(absl::Condition(&ready), next_stats);
      for (auto& op : queue_) *msg.add_ops() = std::move(op);
      queue_.clear();
      sending_ = msg.ops_size() > 0;
      last = closed_;
    }
    if (absl::Now() >= next_stats || last) {
      proto::ClientStats* s = msg.add_ops()->mutable_stats();
      s->set_bytes_put(bytes_put.load());
      s->set_bytes_fetched(bytes_fetched.load());
      s->set_calls(calls.load());
      s->set_live_futures(live_futures.load());
      next_stats = absl::Now() + absl::Seconds(1);
    }
    bool ok = msg.ops_size() == 0 || stream_->Write(msg);
    absl::MutexLock lock(&mu_);
    sending_ = false;
    if (!ok) {
      stream_broken_ = true;
      queue_.clear();
    }
    if (last || !ok) break;
  }
  stream_->WritesDone();
}

void ClientCore::ReaderLoop() {
  proto::ServerToClient msg;
  while (stream_->Read(&msg)) {
    absl::MutexLock lock(&mu_);
    for (const auto& r : msg.slices()) slice_replies_[r.request_id()] = r;
    for (const auto& e : msg.errors()) {
      absl::Status s = StatusFromProto(e.status());
      for (uint64_t id : e.output_ids()) failed_[id] = s;
      if (e.output_ids_size() == 0) {
        SPDLOG_WARN("server: {}", s.ToString());
      }
    }
    for (uint64_t id : msg.released_puts()) kept_puts_.erase(id);
    for (const auto& r : msg.recoveries()) ApplyRecoveryLocked(r);
    for (const auto& d : msg.workers_down()) {
      // Slices still on it were not remapped: they broke.
      for (const auto& [sid, slice] : slices_) {
        for (const auto& dev : slice->info().devices()) {
          if (dev.worker_id() != d.worker_id()) continue;
          broken_slices_.try_emplace(
              sid, absl::StrCat("worker ", d.worker_id(), " was lost"));
          break;
        }
      }
      losses_heard_++;
      workers_down_[d.worker_id()] = StatusFromProto(d.status());
      // A worker that is down (or stopped) will not answer: wake whoever
      // waits on it; they find it in workers_down_ and say so.
      pool_.erase(d.worker_id());
      for (auto& [conn, use] : in_use_) {
        if (use.NeedsWorker(d.worker_id())) conn->Shutdown();
      }
    }
  }
  absl::MutexLock lock(&mu_);
  stream_broken_ = true;
  if (closed_) return;
  // Everything of this session lived in the server's records and on
  // workers it ordered: nothing of it can be used again. Each use says so
  // (CheckOpen), and whoever waits on a worker now stops.
  session_lost_.store(true, std::memory_order_release);
  SPDLOG_WARN("{} ({} live future(s))", std::string(SessionLost().message()),
              live_futures.load());
  pool_.clear();
  for (auto& [conn, use] : in_use_) conn->Shutdown();
}

absl::StatusOr<proto::SliceInfo> ClientCore::RequestSlice(
    proto::SliceRequest req) {
  uint64_t rid;
  {
    absl::MutexLock lock(&mu_);
    rid = next_request_++;
  }
  req.set_request_id(rid);
  proto::ClientOp op;
  *op.mutable_slice_request() = req;
  std::vector<proto::ClientOp> ops;
  ops.push_back(std::move(op));
  Enqueue(std::move(ops));
  absl::MutexLock lock(&mu_);
  auto answered = [this, rid]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stream_broken_ || closed_ || slice_replies_.count(rid) > 0;
  };
  mu_.Await(absl::Condition(&answered));
  auto it = slice_replies_.find(rid);
  if (it == slice_replies_.end() && closed_) {
    // Close() from another thread while this request waited at the server.
    return absl::FailedPreconditionError(
        "the client was closed before the server granted the slice");
  }
  if (it == slice_replies_.end()) {
    return absl::UnavailableError(
        absl::StrCat("no slice: ", SessionLost().message()));
  }
  proto::SliceReply reply = std::move(it->second);
  slice_replies_.erase(it);
  if (reply.has_error()) {
    absl::Status refused = StatusFromProto(reply.error());
    if (!refused.ok()) return refused;
  }
  return reply.slice();
}

void ClientCore::ReleaseBuffer(uint64_t buffer_id, uint64_t slice_id) {
  proto::ClientOp op;
  op.mutable_release()->set_buffer_id(buffer_id);
  op.mutable_release()->set_slice_id(slice_id);
  absl::MutexLock lock(&mu_);
  if (closed_ || stream_broken_) return;
  queue_.push_back(std::move(op));  // never blocks: destructors call this
}

void ClientCore::ReleaseSlice(uint64_t slice_id) {
  proto::ClientOp op;
  op.set_slice_release(slice_id);
  absl::MutexLock lock(&mu_);
  if (closed_ || stream_broken_) return;
  queue_.push_back(std::move(op));
}

void ClientCore::MarkFailed(uint64_t buffer_id, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  failed_[buffer_id] = status;
}

absl::Status ClientCore::BufferStatus(uint64_t buffer_id) {
  absl::MutexLock lock(&mu_);
  auto it = failed_.find(buffer_id);
  return it == failed_.end() ? absl::OkStatus() : it->second;
}

void ClientCore::ForgetBuffer(uint64_t buffer_id) {
  absl::MutexLock lock(&mu_);
  failed_.erase(buffer_id);
}

absl::Status ClientCore::WorkerStatus(int64_t worker_id) {
  absl::MutexLock lock(&mu_);
  auto it = workers_down_.find(worker_id);
  return it == workers_down_.end() ? absl::OkStatus() : it->second;
}

bool ClientCore::SameMachine(const proto::SliceDevice& device) const {
  return options_.shared_memory && device.machine_id() == machine_id_;
}

absl::StatusOr<std::unique_ptr<transport::DataPlaneConnection>>
ClientCore::Checkout(const proto::SliceDevice& device,
                     absl::Span<const int64_t> also_on) {
  const int64_t worker = device.worker_id();
  {
    absl::MutexLock lock(&mu_);
    auto it = pool_.find(worker);
    if (it != pool_.end() && !it->second.empty()) {
      auto conn = std::move(it->second.back());
      it->second.pop_back();
      in_use_[conn.get()] = {worker, {also_on.begin(), also_on.end()}};
      return conn;
    }
  }
  // A worker declared down (a stopped one accepts but never answers the
  // handshake) or a close ends the connecting too.
  auto given_up = [this, worker] {
    absl::MutexLock lock(&mu_);
    return closed_ || workers_down_.contains(worker);
  };
  auto conn = transport::DataPlaneConnection::Connect(
      device.data_address(), SameMachine(device) ? device.unix_path() : "",
      &data_counters_, identity_, given_up);
  absl::MutexLock lock(&mu_);
  // Checked under the lock that the reader takes to wake connections: a
  // worker reported down meanwhile, or a close, is seen here or wakes this.
  if (absl::Status open = CheckOpen(); !open.ok()) return open;
  if (auto down = workers_down_.find(worker); down != workers_down_.end()) {
    return down->second;
  }
  if (!conn.ok()) return conn;
  in_use_[conn->get()] = {worker, {also_on.begin(), also_on.end()}};
  return conn;
}

void ClientCore::Checkin(int64_t worker_id,
                         std::unique_ptr<transport::DataPlaneConnection> conn) {
  absl::MutexLock lock(&mu_);
  in_use_.erase(conn.get());
  if (closed_ || workers_down_.contains(worker_id)) return;
  auto& list = pool_[worker_id];
  if (list.size() < 8) list.push_back(std::move(conn));
}

void ClientCore::Discard(std::unique_ptr<transport::DataPlaneConnection> conn) {
  absl::MutexLock lock(&mu_);
  in_use_.erase(conn.get());
  // Destroyed here, under the lock: the reader never shuts down a freed one.
  conn.reset();
}

}  // namespace plexus
