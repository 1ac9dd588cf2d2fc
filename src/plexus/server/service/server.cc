// ServerImpl: construction, Init, Wait and Shutdown; Server::Start. The
// sessions and status are in server_workers.cc, server_clients.cc and
// server_status.cc (internal/server_impl.h).
#include "plexus/server/server.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "plexus/common/address.h"
#include "plexus/common/logging.h"
#include "plexus/common/process.h"
#include "plexus/common/tls.h"
#include "plexus/server/service/internal/server_impl.h"

namespace plexus {

ServerImpl::ServerImpl(const ServerOptions& options, ClusterSecret secret)
    : options_(options),
      secret_(std::move(secret)),
      machine_id_(LocalMachineId()),
      timeline_({.capacity = options.timeline_capacity,
                 .clock = options.clock,
                 .skew = options.timeline_skew,
                 .enabled = options.timeline}),
      admission_(options.admission),
      scheduler_({.consistent_order = options.consistent_order}) {}

ServerImpl::~ServerImpl() {
  web_.reset();         // its threads read status through this
  peer_watch_.reset();  // its step-down calls Shutdown
  Shutdown();
  // Sessions were cancelled by Shutdown(); give in-flight unary calls a
  // moment, then cancel whatever is left.
  // Real time whatever options_.clock is: gRPC waits for this deadline on
  // its own clock.
  if (grpc_server_)
    grpc_server_->Shutdown(
        absl::ToChronoTime(Clock::Real()->Now() + absl::Milliseconds(100)));
  client_ops_.reset();  // every client session's handler has returned
  if (liveness_.joinable()) liveness_.join();
}

absl::Status ServerImpl::Init() {
  {
    absl::MutexLock lock(&mu_);
    state_.SetTenants(options_.tenants);
    state_.set_park_dir(options_.park_dir);
  }
  if (absl::Status s = OpenJournal(); !s.ok()) return s;
  // Before the gRPC server starts: a standby's Follow disarms it.
  if (!options_.peer_address.empty()) {
    PeerWatchOptions watch;
    watch.peer = options_.peer_address;
    watch.period =
        std::min(absl::Milliseconds(250), options_.standby_lease / 4);
    peer_watch_ = std::make_unique<PeerWatch>(watch, [this] {
      stepped_down_ = true;
      SPDLOG_ERROR(
          "the other server of the pair, at {}, serves: it took over while "
          "this one was stalled or cut off from it, and has the workers and "
          "clients. Stepping down (this server shuts down; start it again "
          "to follow the other as its standby)",
          options_.peer_address);
      Shutdown();
    });
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      ServerCredentialsFor(options_.tls_cert_file, options_.tls_key_file);
  if (!credentials.ok()) return credentials.status();
  anonymous_clients_ = options_.anonymous_clients &&
                       IsLoopbackHost(HostOfAddress(options_.listen_address));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options_.listen_address, *credentials, &port);
  // One server per address: gRPC sets SO_REUSEPORT by default, so a second
  // server on a port in use bound it too and took half of its new
  // connections (workers and clients of one cluster refused by the other's
  // secret). It fails to listen instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.SetMaxSendMessageSize(256 << 20);
  // Workers and clients given a server list (a primary and its standby)
  // ping every second to find a primary that stopped answering
  // (common/tls.h, SessionChannel): allowed, without strikes.
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 500);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  if (absl::Status wire = UseWireWriterForWorkers(); !wire.ok()) return wire;
  absl::StatusOr<std::unique_ptr<transport::FramePoller>> poller =
      transport::FramePoller::Start(transport::PolledFrames::kReports,
                                    "plexus-reports", "the worker");
  if (!poller.ok()) return poller.status();
  reports_poller_ = *std::move(poller);
  builder.RegisterService(this);
  grpc_server_ = builder.BuildAndStart();
  if (!grpc_server_ || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options_.listen_address));
  }
  std::string host =
      options_.listen_address.substr(0, options_.listen_address.rfind(':'));
  address_ = absl::StrCat(host, ":", port);
  advertised_ = AdvertisedAddress(options_.advertise_address, address_);
  if (absl::Status s = StartWeb(); !s.ok()) return s;
  StartClientOpsListener();
  liveness_ = std::thread([this] { LivenessLoop(); });
  SPDLOG_INFO(
      "listening on {}{} ({}; client sessions without a tenant "
      "credential {})",
      address_,
      advertised_ == address_ ? ""
                              : absl::StrCat(", advertised as ", advertised_),
      options_.tls_cert_file.empty() ? "plain text" : "TLS",
      anonymous_clients_ ? "open as tenant \"default\"" : "are refused");
  return absl::OkStatus();
}

void ServerImpl::StartClientOpsListener() {
  if (!options_.client_ops_on_frames) return;
  if (!options_.tls_cert_file.empty()) {
    SPDLOG_INFO(
        "client sessions' ops stay on their TLS streams (the ops listener "
        "does not encrypt)");
    return;
  }
  absl::StatusOr<std::unique_ptr<ClientOpsListener>> listener =
      ClientOpsListener::Start(options_.client_ops_listen.empty()
                                   ? HostOfAddress(address_)
                                   : options_.client_ops_listen,
                               secret_, options_.clock);
  if (!listener.ok()) {
    SPDLOG_WARN(
        "no ops listener ({}): client sessions' ops stay on their gRPC "
        "streams",
        listener.status().ToString());
    return;
  }
  client_ops_ = *std::move(listener);
  SPDLOG_INFO("client sessions' ops as frames: TCP port {}, unix @{}",
              client_ops_->tcp_port(), client_ops_->unix_name());
}

absl::Status ServerImpl::StartWeb() {
  if (options_.web_listen.empty()) return absl::OkStatus();
  web::WebOptions web;
  web.clock = options_.clock;
  // HOST:PORT, an IPv6 host in brackets.
  auto with_port = [](const std::string& host, absl::string_view port) {
    return host.find(':') != std::string::npos
               ? absl::StrCat("[", host, "]:", port)
               : absl::StrCat(host, ":", port);
  };
  web.listen = options_.web_listen == "auto"
                   ? with_port(HostOfAddress(address_), "0")
                   : options_.web_listen;
  absl::StatusOr<std::unique_ptr<web::WebServer>> started =
      web::WebServer::Start(web, secret_, [this](bool why) {
        proto::StatusRequest request;
        if (!why) request.set_why_after_ms(-1);
        proto::ClusterStatus status;
        FillStatus(request, &status);
        return status;
      });
  if (!started.ok()) return started.status();
  web_ = std::move(*started);
  // The page is reached at the host clients are told, on its own port.
  const std::string bound = web_->address();
  web_advertised_ =
      with_port(HostOfAddress(advertised_), bound.substr(bound.rfind(':') + 1));
  return absl::OkStatus();
}

void ServerImpl::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&shutdown_));
}

void ServerImpl::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (shutdown_) return;
  shutdown_ = true;
  {
    absl::MutexLock admission(&admission_mu_);
    stopping_ = true;
    admission_room_.SignalAll();
  }
  for (auto& [id, ctx] : worker_contexts_) ctx->TryCancel();
  for (auto& [id, ctx] : client_contexts_) ctx->TryCancel();
  // The standby's stream ends (Follow), saying so if an operator asked.
  if (standby_feed_ != nullptr) {
    standby_feed_->Close(absl::CancelledError("the server shut down"));
  }
}

std::string AdvertisedAddress(const std::string& advertise,
                              const std::string& bound) {
  if (advertise.empty()) return bound;
  const bool bracketed = advertise.front() == '[';
  const size_t colons = std::count(advertise.begin(), advertise.end(), ':');
  const bool has_port =
      bracketed ? advertise.find("]:") != std::string::npos : colons == 1;
  if (has_port) return advertise;
  const std::string port = bound.substr(bound.rfind(':') + 1);
  // A bare IPv6 address needs its brackets before a port.
  if (!bracketed && colons > 1) return absl::StrCat("[", advertise, "]:", port);
  return absl::StrCat(advertise, ":", port);
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(
    const ServerOptions& options) {
  absl::StatusOr<ClusterSecret> given_or_drawn =
      ClusterSecret::GivenOrGenerate(options.secret);
  if (!given_or_drawn.ok()) return given_or_drawn.status();
  auto server = std::make_unique<ServerImpl>(options, *given_or_drawn);
  absl::Status s = server->Init();
  if (!s.ok()) return s;
  return std::unique_ptr<Server>(std::move(server));
}

}  // namespace plexus
