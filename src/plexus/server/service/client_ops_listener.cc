// ClientOpsListener: client sessions' ops as OPS frames (see the header).
#include "plexus/server/service/internal/client_ops_listener.h"

#include <sys/socket.h>
#include <unistd.h>

#include <random>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/arena.h"
#include "plexus/common/logging.h"
#include "plexus/server/service/internal/batch_arena.h"

namespace plexus {
namespace {

absl::Status RefuseShards() {
  return absl::PermissionDeniedError(
      "the server's ops listener takes a client session's ops only");
}

}  // namespace

absl::StatusOr<std::unique_ptr<ClientOpsListener>> ClientOpsListener::Start(
    const std::string& tcp_host, const ClusterSecret& secret, Clock* clock) {
  std::unique_ptr<ClientOpsListener> listener(new ClientOpsListener(secret));
  transport::DataPlaneServerOptions options;
  options.tcp_host = tcp_host.empty() ? "0.0.0.0" : tcp_host;
  std::random_device rd;
  options.unix_name =
      absl::StrCat("plexus-server-ops-", getpid(), "-", rd(), rd());
  options.clock = clock;
  absl::StatusOr<std::unique_ptr<transport::DataPlaneServer>> server =
      transport::DataPlaneServer::Start(options, listener.get(),
                                        &listener->counters_);
  if (!server.ok()) return server.status();
  listener->server_ = *std::move(server);
  const std::string tcp = listener->server_->tcp_address();
  if (!absl::SimpleAtoi(tcp.substr(tcp.rfind(':') + 1), &listener->tcp_port_)) {
    return absl::InternalError(
        absl::StrCat("the ops listener's address has no port: ", tcp));
  }
  return listener;
}

ClientOpsListener::~ClientOpsListener() {
  server_.reset();  // joins the connection threads
  absl::MutexLock lock(&mu_);
  for (auto& [generation, session] : sessions_) {
    if (session.fd >= 0) ::close(session.fd);
  }
}

void ClientOpsListener::Open(uint64_t generation, uint64_t client_id,
                             Apply apply) {
  absl::MutexLock lock(&mu_);
  Session& session = sessions_[generation];
  session.client_id = client_id;
  session.apply = std::move(apply);
  ++open_[client_id];
}

bool ClientOpsListener::MarkerRead(uint64_t generation) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(generation);
  if (it == sessions_.end()) return false;
  it->second.marker_read = true;
  return true;
}

void ClientOpsListener::Close(uint64_t generation, absl::Duration drain,
                              const std::function<void()>& cancel) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(generation);
  if (it == sessions_.end()) return;
  Session& session = it->second;
  // The frames written before the stream's end are applied first: the
  // client closes its connection before it half-closes the stream, and it
  // connected (and sent its first frame) before the stream's last message.
  // (Real time: a bound on what sockets deliver, not a job's deadline.)
  if (session.marker_read && !session.ended) {
    auto ended = [&session]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return session.ended;
    };
    mu_.AwaitWithTimeout(absl::Condition(&ended), drain);
  }
  session.closing = true;
  if (session.fd >= 0 && !session.ended) {
    SPDLOG_INFO(
        "client {}: its ops connection still open {} after its stream "
        "ended; shutting it down",
        session.client_id, absl::FormatDuration(drain));
    ::shutdown(session.fd, SHUT_RDWR);
  }
  if (session.inside > 0) {
    // An apply may wait (for room in the client's queue, for a suspended
    // slice): the session's end ends those waits.
    mu_.Unlock();
    cancel();
    mu_.Lock();
    auto left = [&session]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return session.inside == 0;
    };
    mu_.Await(absl::Condition(&left));
  }
  if (session.fd >= 0) ::close(session.fd);
  if (--open_[session.client_id] <= 0) open_.erase(session.client_id);
  sessions_.erase(generation);
}

int64_t ClientOpsListener::frames(uint64_t generation) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(generation);
  return it == sessions_.end() ? 0 : it->second.frames;
}

absl::StatusOr<Credential> ClientOpsListener::CredentialFor(
    const transport::DataPlanePeer& peer) {
  if (peer.role != CredentialRole::kClient) return RefuseShards();
  {
    absl::MutexLock lock(&mu_);
    if (!open_.contains(peer.id)) {
      return absl::PermissionDeniedError(
          absl::StrCat("client ", peer.id, " has no session open here"));
    }
  }
  return secret_.Derive(CredentialRole::kClient, peer.id);
}

absl::Status ClientOpsListener::Authorize(
    transport::DataPlaneRequest request, const ShardKey&,
    const transport::DataPlanePeer& peer) {
  if (request != transport::DataPlaneRequest::kOps ||
      peer.role != CredentialRole::kClient) {
    return RefuseShards();
  }
  return absl::OkStatus();
}

absl::Status ClientOpsListener::OpsConnectionOpened(
    const transport::DataPlanePeer& peer, uint64_t generation, int fd) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(generation);
  if (it == sessions_.end() || it->second.client_id != peer.id ||
      it->second.closing) {
    return absl::PermissionDeniedError(
        absl::StrCat("client ", peer.id,
                     " has no open session of ops generation ", generation));
  }
  Session& session = it->second;
  if (session.connected) {
    return absl::FailedPreconditionError(absl::StrCat(
        "client ", peer.id, "'s session has its ops connection already"));
  }
  session.connected = true;
  session.fd = ::dup(fd);
  return absl::OkStatus();
}

absl::Status ClientOpsListener::ApplyOps(const transport::DataPlanePeer& peer,
                                         uint64_t generation,
                                         std::string& message) {
  // As the stream's reader parses a batch (internal/batch_arena.h), in a
  // block of this connection thread's.
  thread_local std::vector<char> block(kBatchArenaBlock);
  google::protobuf::Arena arena(BatchArenaOptions(block));
  auto* msg =
      google::protobuf::Arena::CreateMessage<proto::ClientToServer>(&arena);
  if (!msg->ParseFromString(message)) {
    return absl::InvalidArgumentError(
        absl::StrCat("client ", peer.id, ": an OPS frame of ", message.size(),
                     " bytes that is not a ClientToServer"));
  }
  if (msg->ops_on_frames() || !msg->client_name().empty() ||
      msg->resume_client_id() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "client ", peer.id,
        ": an OPS frame with a session's opening fields (they go on its "
        "stream)"));
  }
  // The connection's first frame, sent before the stream's last message,
  // is empty: it opened the connection (OpsConnectionOpened), so that the
  // session's end waits for the connection's (Close).
  if (msg->ops_size() == 0) return absl::OkStatus();
  Apply* apply = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(generation);
    if (it == sessions_.end() || it->second.client_id != peer.id) {
      return absl::PermissionDeniedError(
          absl::StrCat("client ", peer.id,
                       " has no open session of ops generation ", generation));
    }
    Session& session = it->second;
    // The stream's last message first: it was written before any frame.
    ++session.inside;  // Close waits for this thread to leave
    auto ready = [&session]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return session.marker_read || session.closing;
    };
    mu_.Await(absl::Condition(&ready));
    if (session.closing) {
      --session.inside;
      return absl::CancelledError(
          absl::StrCat("client ", peer.id, "'s session ended"));
    }
    ++session.frames;
    apply = &session.apply;  // the node stays until Close, which waits
  }
  const absl::Status applied = (*apply)(*msg);
  absl::MutexLock lock(&mu_);
  --sessions_.find(generation)->second.inside;  // Close waits for this
  return applied;
}

void ClientOpsListener::OpsEnded(const transport::DataPlanePeer& peer,
                                 uint64_t generation, const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(generation);
  if (it == sessions_.end() || it->second.client_id != peer.id) return;
  Session& session = it->second;
  session.ended = true;
  if (session.fd >= 0) {
    ::close(session.fd);
    session.fd = -1;
  }
  if (!session.closing) {
    SPDLOG_INFO("client {}: its ops connection ended: {}", peer.id,
                why.ToString());
  }
}

absl::Status ClientOpsListener::AdmitIncoming(const ShardKey&, size_t, bool) {
  return RefuseShards();
}

absl::StatusOr<std::shared_ptr<Storage>> ClientOpsListener::AllocateIncoming(
    const ShardKey&, size_t, bool) {
  return RefuseShards();
}

absl::Status ClientOpsListener::Deliver(const ShardKey&,
                                        std::shared_ptr<Storage>, bool) {
  return RefuseShards();
}

absl::StatusOr<std::shared_ptr<const Storage>> ClientOpsListener::AwaitReady(
    const ShardKey&) {
  return RefuseShards();
}

}  // namespace plexus
