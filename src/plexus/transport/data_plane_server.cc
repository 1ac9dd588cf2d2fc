// DataPlaneServer: an accept thread per listener (TCP, abstract unix) and a
// thread per connection that serves its frames in order with blocking I/O.
// Connections in their handshake and proven ones are bounded apart
// (DataPlaneServerOptions::max_handshaking, max_connections); the accept
// threads also close handshakes past handshake_timeout.
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "plexus/common/clock.h"
#include "plexus/common/logging.h"
#include "plexus/timeline/timeline.h"
#include "plexus/transport/data_plane.h"
#include "plexus/transport/internal/fetch_answers.h"
#include "plexus/transport/internal/frame_socket.h"
#include "plexus/transport/internal/handshake.h"
#include "plexus/transport/internal/socket_io.h"

namespace plexus::transport {
namespace {

using internal::FetchAnswers;
using internal::FrameHeader;
using internal::FrameSocket;
using internal::FrameType;
using internal::UniqueFd;

// What a frame from a data-plane client asks for; none for the frames only
// a server sends (ACK, DATA, ERROR).
std::optional<DataPlaneRequest> RequestOf(FrameType type) {
  switch (type) {
    case FrameType::kPush:
      return DataPlaneRequest::kPush;
    case FrameType::kPushError:
      return DataPlaneRequest::kPushError;
    case FrameType::kPut:
      return DataPlaneRequest::kPut;
    case FrameType::kFetch:
      return DataPlaneRequest::kFetch;
    case FrameType::kWait:
      return DataPlaneRequest::kWait;
    case FrameType::kFetchExecutable:
      return DataPlaneRequest::kFetchExecutable;
    case FrameType::kPushIpc:
      return DataPlaneRequest::kPushIpc;
    case FrameType::kOps:
      return DataPlaneRequest::kOps;
    case FrameType::kRelay:
      return DataPlaneRequest::kRelay;
    case FrameType::kReports:  // the server reads these, not a worker
    case FrameType::kSkip:
    case FrameType::kAck:
    case FrameType::kData:
    case FrameType::kError:
    case FrameType::kChallenge:
    case FrameType::kHello:
    case FrameType::kWelcome:
      break;
  }
  return std::nullopt;
}

// Thread-safe. Destruction stops accepting, shuts every connection down and
// joins all threads; connection threads blocked in the handler (AwaitReady,
// AllocateIncoming) must be released by the handler's owner first.
class DataPlaneServerImpl : public DataPlaneServer {
 public:
  DataPlaneServerImpl(const DataPlaneServerOptions& options,
                      DataPlaneHandler* handler, DataPlaneCounters* counters)
      : options_(options),
        handler_(handler),
        counters_(counters != nullptr ? counters : &own_counters_) {}
  ~DataPlaneServerImpl() override;

  // Binds both listeners, then starts their accept threads.
  absl::Status Listen(const DataPlaneServerOptions& options);

  std::string tcp_address() const override { return tcp_address_; }
  std::string unix_path() const override { return unix_name_; }

 private:
  struct Connection {
    std::unique_ptr<FrameSocket> socket;
    std::thread thread;
    // In its handshake (counts against max_handshaking) until this time;
    // InfiniteFuture once proven, or once closed for taking too long.
    absl::Time handshake_deadline = absl::InfiniteFuture();
    bool proven = false;  // counts against max_connections
    bool done = false;    // the thread has returned; join it
  };

  // Waits for a connection (and, meanwhile, for the next handshake
  // deadline: it closes the handshakes past theirs).
  void AcceptLoop(int listen_fd, bool is_unix);
  void StartConnection(UniqueFd fd, bool is_unix);
  // Closes the handshakes past their deadline; the earliest deadline left.
  absl::Time CloseLateHandshakes(absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Room for a proven peer on connection `id`, or why not.
  absl::Status AdmitProven(uint64_t id, const DataPlanePeer& peer);
  // Connection thread: serves frames until the peer leaves or errs.
  void Serve(FrameSocket* socket, uint64_t id);
  // What one connection keeps between its frames: the server's ops (the
  // last OPS frame's bytes, its capacity reused; their generation).
  struct ConnectionState {
    std::string ops;
    uint64_t ops_generation = 0;
    bool carried_ops = false;
    bool handed_off = false;  // the handler reads it (TakeOpsConnection)
    // Its client's FETCHes and WAITs (made at the first).
    std::unique_ptr<FetchAnswers> answers;
    // The handler took it for relayed answers (OpenRelay): it is only
    // written by the handler from then on, and ends at its next frame.
    bool relay = false;
  };
  // Handles one frame. An error means the connection must close; handler
  // failures that the peer should see travel as ERROR frames instead.
  absl::Status ServeFrame(FrameSocket& socket, const FrameHeader& header,
                          const DataPlanePeer& peer, ConnectionState& state);
  // OPS, authorized: read, then applied by the handler before the next
  // frame (an error closes the connection).
  absl::Status ServeOps(FrameSocket& socket, const FrameHeader& header,
                        const DataPlanePeer& peer, ConnectionState& state);
  absl::Status ServeShard(FrameSocket& socket, const FrameHeader& header);
  // PUSH_IPC, its payload read; `allowed`: Authorize's and AdmitGeneration's
  // word. Always answered (ACK or ERROR) unless the stream broke.
  absl::Status ServeIpc(FrameSocket& socket, const FrameHeader& header,
                        const absl::Status& allowed);
  // Joins and closes connections whose threads have returned.
  void ReapFinished();
  // A connection refused at its handshake: logged at most once per second
  // (with how many were refused meanwhile), so that a peer connecting in a
  // loop cannot flood the log.
  void LogRefusal(const FrameSocket& socket, const absl::Status& why);
  bool stopping() const {
    absl::MutexLock lock(&mu_);
    return stopping_;
  }

  const DataPlaneServerOptions options_;
  DataPlaneHandler* const handler_;
  DataPlaneCounters own_counters_;  // used when the owner passes none
  DataPlaneCounters* const counters_;
  std::string tcp_address_;
  std::string unix_name_;
  UniqueFd tcp_listener_;
  UniqueFd unix_listener_;
  std::vector<std::thread> accept_threads_;  // started by Listen only

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  int handshaking_ ABSL_GUARDED_BY(mu_) = 0;  // connections in their handshake
  int proven_ ABSL_GUARDED_BY(mu_) = 0;       // proven and open
  int64_t handshakes_closed_ ABSL_GUARDED_BY(mu_) = 0;  // late or pushed out
  absl::Time last_refusal_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time last_handshake_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t handshakes_unlogged_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, Connection> connections_ ABSL_GUARDED_BY(mu_);
};

absl::Status DataPlaneServerImpl::Listen(
    const DataPlaneServerOptions& options) {
  absl::StatusOr<UniqueFd> tcp =
      internal::ListenTcp(options.tcp_host, &tcp_address_);
  if (!tcp.ok()) return tcp.status();
  tcp_listener_ = *std::move(tcp);
  if (!options.unix_name.empty()) {
    absl::StatusOr<UniqueFd> unix_fd = internal::ListenUnix(options.unix_name);
    if (!unix_fd.ok()) return unix_fd.status();
    unix_listener_ = *std::move(unix_fd);
    unix_name_ = options.unix_name;
  }
  accept_threads_.emplace_back(
      [this, fd = tcp_listener_.get()] { AcceptLoop(fd, /*is_unix=*/false); });
  if (unix_listener_.valid()) {
    accept_threads_.emplace_back([this, fd = unix_listener_.get()] {
      AcceptLoop(fd, /*is_unix=*/true);
    });
  }
  SPDLOG_INFO(
      "data plane listening on {}{}", tcp_address_,
      unix_name_.empty() ? "" : absl::StrCat(" and unix @", unix_name_));
  return absl::OkStatus();
}

DataPlaneServerImpl::~DataPlaneServerImpl() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  // shutdown() makes a blocked accept() return (EINVAL) on Linux.
  if (tcp_listener_.valid()) shutdown(tcp_listener_.get(), SHUT_RDWR);
  if (unix_listener_.valid()) shutdown(unix_listener_.get(), SHUT_RDWR);
  for (std::thread& t : accept_threads_) t.join();
  absl::flat_hash_map<uint64_t, Connection> connections;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, connection] : connections_) connection.socket->Shutdown();
    connections.swap(connections_);
  }
  for (auto& [id, connection] : connections) connection.thread.join();
}

void DataPlaneServerImpl::AcceptLoop(int listen_fd, bool is_unix) {
  pthread_setname_np(pthread_self(), "plexus-dp-accept");
  while (true) {
    // Sleeps until a connection arrives or the next handshake deadline
    // (without handshakes in progress: until a connection arrives).
    absl::Time next_deadline;
    {
      absl::MutexLock lock(&mu_);
      next_deadline = CloseLateHandshakes(options_.clock->Now());
    }
    pollfd p{listen_fd, POLLIN, 0};
    const int ms = next_deadline == absl::InfiniteFuture()
                       ? -1
                       : static_cast<int>(std::clamp<int64_t>(
                             absl::ToInt64Milliseconds(next_deadline -
                                                       options_.clock->Now()) +
                                 1,
                             0, 1 << 30));
    const int ready = poll(&p, 1, ms);
    if (stopping()) return;
    if (ready == 0 || (ready < 0 && errno == EINTR)) continue;
    absl::StatusOr<UniqueFd> fd = internal::Accept(listen_fd);
    if (stopping()) return;
    if (!fd.ok()) {
      // Out of descriptors, say: the pending connection stays queued, so
      // back off instead of spinning, but wake at once on shutdown.
      SPDLOG_WARN("data plane: {}", fd.status().ToString());
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                           absl::Milliseconds(100));
      continue;
    }
    ReapFinished();
    StartConnection(*std::move(fd), is_unix);
  }
}

void DataPlaneServerImpl::StartConnection(UniqueFd fd, bool is_unix) {
  auto socket = std::make_unique<FrameSocket>(std::move(fd), is_unix);
  if (absl::Status s = socket->SetFrameTimeout(options_.frame_timeout);
      !s.ok()) {
    SPDLOG_WARN("data plane: refusing connection from {}: {}", socket->peer(),
                s.ToString());
    return;
  }
  FrameSocket* raw = socket.get();
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  const absl::Time now = options_.clock->Now();
  CloseLateHandshakes(now);
  if (handshaking_ >= options_.max_handshaking) {
    // Anyone may open a connection: the oldest handshake makes room (its
    // thread sees the end of its stream and returns), so a flood without
    // a credential holds at most max_handshaking threads and never a slot
    // of a proven peer. Logged at most once per second.
    auto oldest = connections_.end();
    for (auto it = connections_.begin(); it != connections_.end(); ++it) {
      if (it->second.handshake_deadline != absl::InfiniteFuture() &&
          (oldest == connections_.end() ||
           it->second.handshake_deadline < oldest->second.handshake_deadline)) {
        oldest = it;
      }
    }
    if (oldest != connections_.end()) {
      oldest->second.socket->Shutdown();
      oldest->second.handshake_deadline = absl::InfiniteFuture();
      --handshaking_;
      ++handshakes_closed_;
    }
    if (now - last_refusal_log_ >= absl::Seconds(1)) {
      last_refusal_log_ = now;
      SPDLOG_WARN(
          "data plane: {} connections in their handshake (the limit); "
          "closing the oldest for the one from {} ({} closed so far)",
          options_.max_handshaking, raw->peer(), handshakes_closed_);
    }
  }
  uint64_t id = next_id_++;
  Connection& connection = connections_[id];
  connection.socket = std::move(socket);
  connection.handshake_deadline = now + options_.handshake_timeout;
  ++handshaking_;
  // The thread holds the socket, never the map entry (it may move).
  connection.thread = std::thread([this, raw, id] { Serve(raw, id); });
}

absl::Time DataPlaneServerImpl::CloseLateHandshakes(absl::Time now) {
  absl::Time next = absl::InfiniteFuture();
  for (auto& [id, connection] : connections_) {
    if (connection.handshake_deadline == absl::InfiniteFuture()) continue;
    if (connection.handshake_deadline > now) {
      next = std::min(next, connection.handshake_deadline);
      continue;
    }
    // Its thread, blocked in a read, sees the end of the stream and
    // returns (the handshake fails: logged there).
    connection.socket->Shutdown();
    connection.handshake_deadline = absl::InfiniteFuture();
    --handshaking_;
    ++handshakes_closed_;
  }
  return next;
}

absl::Status DataPlaneServerImpl::AdmitProven(uint64_t id,
                                              const DataPlanePeer& peer) {
  absl::MutexLock lock(&mu_);
  auto it = connections_.find(id);
  if (it == connections_.end() ||
      it->second.handshake_deadline == absl::InfiniteFuture()) {
    // Closed meanwhile (past its deadline, or pushed out by newer ones).
    return absl::DeadlineExceededError(
        absl::StrCat("data-plane handshake: not completed within ",
                     absl::FormatDuration(options_.handshake_timeout),
                     " (or pushed out by ", options_.max_handshaking,
                     " newer connections still in their handshake)"));
  }
  if (proven_ >= options_.max_connections) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "data plane: ", proven_, " connections open (the limit, ",
        options_.max_connections, "); the one of ",
        peer.role == CredentialRole::kWorker ? std::string("a worker")
        : peer.role == CredentialRole::kServer
            ? std::string("the server")
            : absl::StrCat("client ", peer.id),
        " is refused"));
  }
  it->second.handshake_deadline = absl::InfiniteFuture();
  it->second.proven = true;
  --handshaking_;
  ++proven_;
  return absl::OkStatus();
}

void DataPlaneServerImpl::LogRefusal(const FrameSocket& socket,
                                     const absl::Status& why) {
  int64_t unlogged;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = options_.clock->Now();
    if (now - last_handshake_log_ < absl::Seconds(1)) {
      ++handshakes_unlogged_;
      return;
    }
    last_handshake_log_ = now;
    unlogged = std::exchange(handshakes_unlogged_, 0);
  }
  SPDLOG_WARN("data plane: refused connection from {}: {}{}", socket.peer(),
              why.ToString(),
              unlogged == 0 ? ""
                            : absl::StrCat(" (and ", unlogged,
                                           " more since the last report)"));
}

void DataPlaneServerImpl::ReapFinished() {
  std::vector<Connection> finished;
  {
    absl::MutexLock lock(&mu_);
    std::vector<uint64_t> ids;
    for (const auto& [id, connection] : connections_) {
      if (connection.done) ids.push_back(id);
    }
    for (uint64_t id : ids) {
      auto node = connections_.extract(id);
      finished.push_back(std::move(node.mapped()));
    }
  }
  for (Connection& connection : finished) connection.thread.join();
}

void DataPlaneServerImpl::Serve(FrameSocket* socket, uint64_t id) {
  pthread_setname_np(pthread_self(), "plexus-dp-conn");
  SPDLOG_DEBUG("data plane: connection from {} opened", socket->peer());
  // Bound to the identity its handshake proves; nothing is served before.
  // CUDA IPC needs a peer on this host: offered over the unix socket only.
  const uint32_t capabilities =
      socket->is_unix() && handler_->OpensCudaIpc() ? kCapabilityCudaIpc : 0;
  absl::StatusOr<DataPlanePeer> peer = internal::AcceptHandshake(
      *socket,
      [this](const DataPlanePeer& p) { return handler_->CredentialFor(p); },
      capabilities,
      [this, id](const DataPlanePeer& p) { return AdmitProven(id, p); });
  if (!peer.ok() && !stopping()) LogRefusal(*socket, peer.status());
  // Nothing on TCP passes a descriptor: each read may take the next frames.
  if (peer.ok() && !socket->is_unix()) socket->EnableReadAhead();
  ConnectionState state;
  absl::Status ended;
  while (peer.ok()) {
    bool eof = false;
    // A parked answer is finished before the next frame is read.
    absl::Status finished = state.answers != nullptr
                                ? state.answers->FinishParked()
                                : absl::OkStatus();
    absl::StatusOr<FrameHeader> header =
        finished.ok() ? socket->ReadHeader(&eof)
                      : absl::StatusOr<FrameHeader>(finished);
    absl::Status status = header.ok()
                              ? ServeFrame(*socket, *header, *peer, state)
                              : header.status();
    if (status.ok() && state.handed_off) {
      SPDLOG_DEBUG("data plane: connection from {} handed to its handler",
                   socket->peer());
      break;
    }
    if (status.ok()) continue;
    ended = eof ? absl::UnavailableError("the server closed it") : status;
    socket->Break(status).IgnoreError();
    if (eof || stopping()) {
      SPDLOG_DEBUG("data plane: connection from {} closed", socket->peer());
    } else {
      SPDLOG_WARN("data plane: closing connection from {}: {}", socket->peer(),
                  status.ToString());
    }
    break;
  }
  if (state.carried_ops && !state.handed_off) {
    handler_->OpsEnded(*peer, state.ops_generation, ended);
  }
  if (state.relay) handler_->RelayEnded(*peer, socket->fd());
  absl::MutexLock lock(&mu_);
  auto it = connections_.find(id);
  if (it != connections_.end()) {
    Connection& connection = it->second;
    if (connection.handshake_deadline != absl::InfiniteFuture()) {
      connection.handshake_deadline = absl::InfiniteFuture();
      --handshaking_;
    }
    if (connection.proven) {
      connection.proven = false;
      --proven_;
    }
    connection.done = true;
  }
}

absl::Status DataPlaneServerImpl::ServeFrame(FrameSocket& socket,
                                             const FrameHeader& header,
                                             const DataPlanePeer& peer,
                                             ConnectionState& state) {
  std::optional<DataPlaneRequest> request = RequestOf(header.frame_type());
  if (state.relay) {
    return absl::InvalidArgumentError(
        absl::StrCat(FrameTypeName(header.frame_type()),
                     " frame on a relay connection: nothing may follow a "
                     "RELAY"));
  }
  if (!request.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected ", FrameTypeName(header.frame_type()),
                     " frame from a data-plane client"));
  }
  absl::Status allowed = handler_->Authorize(*request, header.key(), peer);
  if (allowed.ok() && (*request == DataPlaneRequest::kPush ||
                       *request == DataPlaneRequest::kPushError ||
                       *request == DataPlaneRequest::kPushIpc)) {
    allowed = handler_->AdmitGeneration(header.generation);
  }
  if (!allowed.ok()) {
    // Refused before anything is done for it; the stream stays in step.
    SPDLOG_WARN("data plane: {} of {} from {} refused: {}",
                FrameTypeName(header.frame_type()), KeyString(header.key()),
                socket.peer(), allowed.ToString());
  }
  // A client's request, on the timeline: from its header to its answer.
  const bool client_request = *request == DataPlaneRequest::kPut ||
                              *request == DataPlaneRequest::kFetch ||
                              *request == DataPlaneRequest::kWait;
  ScopedEvent event(client_request ? options_.timeline : nullptr,
                    *request == DataPlaneRequest::kPut     ? EventKind::kPut
                    : *request == DataPlaneRequest::kFetch ? EventKind::kFetch
                                                           : EventKind::kWait);
  event.event.client_id = peer.role == CredentialRole::kClient ? peer.id : 0;
  event.event.buffer_id = header.buffer_id;
  event.event.shard = header.shard;
  event.event.bytes = static_cast<int64_t>(header.payload_bytes);
  event.event.path =
      socket.is_unix() ? TransferPath::kSharedMemory : TransferPath::kTcp;
  event.event.failed = !allowed.ok();
  switch (*request) {
    case DataPlaneRequest::kPush:
      if (!allowed.ok()) return socket.SkipShard(header);
      return ServeShard(socket, header);
    case DataPlaneRequest::kPut:
      if (!allowed.ok()) {
        if (absl::Status s = socket.SkipShard(header); !s.ok()) return s;
        return socket.SendError(FrameType::kError, header.key(), allowed);
      }
      return ServeShard(socket, header);
    case DataPlaneRequest::kPushError: {
      absl::Status error = socket.ReadErrorStatus(header);  // code intact
      if (socket.broken()) return error;
      if (allowed.ok()) handler_->DeliverError(header.key(), error);
      return absl::OkStatus();
    }
    case DataPlaneRequest::kFetch:
    case DataPlaneRequest::kWait:
      if (!allowed.ok()) {
        return socket.SendError(FrameType::kError, header.key(), allowed);
      }
      if (state.answers == nullptr) {
        state.answers = std::make_unique<FetchAnswers>(
            socket, *handler_, *counters_, *options_.clock);
      }
      return state.answers->Serve(header, event);
    case DataPlaneRequest::kPushIpc:
      return ServeIpc(socket, header, allowed);
    case DataPlaneRequest::kRelay: {
      if (!allowed.ok()) {
        return socket.SendError(FrameType::kError, header.key(), allowed);
      }
      // The handler sends the ACK, and every frame after it.
      absl::Status opened = handler_->OpenRelay(peer, socket.fd());
      if (!opened.ok()) {
        return socket.SendError(FrameType::kError, header.key(), opened);
      }
      state.relay = true;
      return absl::OkStatus();
    }
    case DataPlaneRequest::kOps:
      // One-way: a refused peer is not heard further.
      if (!allowed.ok()) return allowed;
      return ServeOps(socket, header, peer, state);
    case DataPlaneRequest::kFetchExecutable: {
      if (!allowed.ok()) {
        return socket.SendError(FrameType::kError, header.key(), allowed);
      }
      absl::StatusOr<std::shared_ptr<const Storage>> bytes =
          handler_->SerializedExecutable(header.buffer_id);
      if (bytes.ok() && *bytes == nullptr) {
        bytes = absl::InternalError("a serialized executable of no storage");
      }
      if (!bytes.ok()) {
        return socket.SendError(FrameType::kError, header.key(),
                                bytes.status());
      }
      if (absl::Status s =
              socket.SendShard(FrameType::kData, header.key(), **bytes);
          !s.ok()) {
        return s;
      }
      counters_->bytes_sent.fetch_add(static_cast<int64_t>((*bytes)->size()));
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unreachable");
}

absl::Status DataPlaneServerImpl::ServeOps(FrameSocket& socket,
                                           const FrameHeader& header,
                                           const DataPlanePeer& peer,
                                           ConnectionState& state) {
  if (state.carried_ops && header.generation != state.ops_generation) {
    return absl::InvalidArgumentError(
        absl::StrCat("OPS of generation ", header.generation,
                     " on a connection that carried generation ",
                     state.ops_generation, "'s"));
  }
  if (absl::Status s = socket.ReadOps(header, &state.ops); !s.ok()) return s;
  if (!state.carried_ops) {
    if (absl::Status s =
            handler_->OpsConnectionOpened(peer, header.generation, socket.fd());
        !s.ok()) {
      return s;
    }
  }
  const bool first = !state.carried_ops;
  state.carried_ops = true;
  state.ops_generation = header.generation;
  absl::Status applied = handler_->ApplyOps(peer, header.generation, state.ops);
  if (first && applied.ok() && !socket.has_read_ahead() &&
      handler_->TakeOpsConnection(peer, header.generation, socket.fd())) {
    state.handed_off = true;
    return absl::OkStatus();
  }
  // An ops connection carries OPS frames only, never a descriptor.
  if (first) socket.EnableReadAhead();
  // A large message's buffer is not kept (a program's load).
  if (state.ops.capacity() > (size_t{1} << 20)) std::string().swap(state.ops);
  return applied;
}

absl::Status DataPlaneServerImpl::ServeShard(FrameSocket& socket,
                                             const FrameHeader& header) {
  const ShardKey key = header.key();
  const bool from_client = header.frame_type() == FrameType::kPut;
  const char* what = from_client ? "PUT" : "PUSH";
  // Nothing is mapped or allocated before the handler admits the claimed
  // size (for the key's declaration, in its declared size).
  absl::Status admitted =
      handler_->AdmitIncoming(key, header.payload_bytes, from_client);
  if (!admitted.ok()) {
    if (absl::Status s = socket.SkipShard(header); !s.ok()) return s;
    if (from_client) {
      return socket.SendError(FrameType::kError, key, admitted);
    }
    SPDLOG_WARN("data plane: {} of {} from {} refused: {}", what,
                KeyString(key), socket.peer(), admitted.ToString());
    return absl::OkStatus();
  }
  absl::StatusOr<std::shared_ptr<Storage>> data =
      socket.ReadShard(header, [&](size_t bytes) {
        return handler_->AllocateIncoming(key, bytes, from_client);
      });
  absl::Status result = data.status();
  if (result.ok()) {
    (from_client ? counters_->bytes_from_clients : counters_->bytes_received)
        .fetch_add(static_cast<int64_t>(header.payload_bytes));
    result = handler_->Deliver(key, *std::move(data), from_client);
  } else {
    // Admitted bytes that will not arrive: fail the shard, so its readers
    // see why instead of waiting for ever (and its memory comes back).
    SPDLOG_WARN("data plane: receiving {} of {} from {} failed: {}", what,
                KeyString(key), socket.peer(), result.ToString());
    handler_->DeliverError(
        key, absl::AbortedError(absl::StrCat("receiving ", KeyString(key),
                                             " from ", socket.peer(),
                                             " failed: ", result.message())));
  }
  if (socket.broken()) return result;
  if (from_client) {
    return result.ok() ? socket.SendControl(FrameType::kAck, key)
                       : socket.SendError(FrameType::kError, key, result);
  }
  if (!result.ok()) {
    SPDLOG_WARN("data plane: PUSH of {} from {} was not stored: {}",
                KeyString(key), socket.peer(), result.ToString());
  }
  return absl::OkStatus();
}

absl::Status DataPlaneServerImpl::ServeIpc(FrameSocket& socket,
                                           const FrameHeader& header,
                                           const absl::Status& allowed) {
  const ShardKey key = header.key();
  absl::Status result = allowed;
  {
    absl::StatusOr<IpcShard> shard = socket.ReadIpc(header);
    if (socket.broken()) return shard.status();
    // Every refusal is an ERROR, after which the sender sends the bytes: a
    // refused push is then refused again, as a PUSH, and logged there.
    if (result.ok()) result = shard.status();
    if (result.ok() && !socket.is_unix()) {
      result = absl::FailedPreconditionError(
          "PUSH_IPC over TCP: CUDA IPC is offered over the unix socket only");
    }
    if (result.ok() && !handler_->OpensCudaIpc()) {
      result = absl::FailedPreconditionError("this worker opens no CUDA IPC");
    }
    if (result.ok()) result = handler_->ReceiveIpc(key, *shard);
  }  // a descriptor that came with it is closed here, before the answer
  if (!result.ok()) {
    SPDLOG_DEBUG("data plane: PUSH_IPC of {} from {} not taken: {}",
                 KeyString(key), socket.peer(), result.ToString());
    return socket.SendError(FrameType::kError, key, result);
  }
  return socket.SendControl(FrameType::kAck, key);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataPlaneServer>> DataPlaneServer::Start(
    const DataPlaneServerOptions& options, DataPlaneHandler* handler,
    DataPlaneCounters* counters) {
  if (handler == nullptr) {
    return absl::InvalidArgumentError("data plane server needs a handler");
  }
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError(
        "data plane server: max_connections must be at least 1");
  }
  if (options.max_handshaking < 1) {
    return absl::InvalidArgumentError(
        "data plane server: max_handshaking must be at least 1");
  }
  if (options.handshake_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "data plane server: handshake_timeout must be positive");
  }
  auto server =
      std::make_unique<DataPlaneServerImpl>(options, handler, counters);
  if (absl::Status s = server->Listen(options); !s.ok()) return s;
  return server;
}

absl::Status CheckOpsPeer(DataPlaneRequest request, const DataPlanePeer& peer) {
  const bool server = peer.role == CredentialRole::kServer;
  if ((request == DataPlaneRequest::kOps) == server) return absl::OkStatus();
  return absl::PermissionDeniedError(
      server ? "the server's connection carries its ops, nothing else"
             : "ops come from the server; this connection is not its");
}

}  // namespace plexus::transport
