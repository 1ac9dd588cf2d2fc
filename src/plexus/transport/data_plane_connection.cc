// DataPlaneConnection: the client side of one data-plane socket. Each call
// sends one request and, where the protocol has one, reads its reply.
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/common/clock.h"
#include "plexus/common/logging.h"
#include "plexus/transport/data_plane.h"
#include "plexus/transport/internal/frame_socket.h"
#include "plexus/transport/internal/handshake.h"
#include "plexus/transport/internal/socket_io.h"

namespace plexus::transport {
namespace {

using internal::FrameHeader;
using internal::FrameSocket;
using internal::FrameType;

// Thread-compatible, like the interface. The first I/O or protocol error
// closes the connection; later calls fail at once.
class DataPlaneConnectionImpl : public DataPlaneConnection {
 public:
  DataPlaneConnectionImpl(std::unique_ptr<FrameSocket> socket,
                          std::string address, DataPlaneCounters* counters,
                          uint32_t capabilities, Clock* clock)
      : socket_(std::move(socket)),
        address_(std::move(address)),
        counters_(counters),
        capabilities_(capabilities),
        clock_(clock) {}

  bool uses_shared_memory() const override { return socket_->is_unix(); }
  bool peer_opens_cuda_ipc() const override {
    return socket_->is_unix() && (capabilities_ & kCapabilityCudaIpc) != 0;
  }
  bool healthy() const override { return !socket_->broken(); }

  void Shutdown() override { socket_->Shutdown(); }

  absl::Status Push(const ShardKey& key, const Storage& data) override {
    if (absl::Status s = CheckOpen(); !s.ok()) return s;
    if (absl::Status s = socket_->SendShard(FrameType::kPush, key, data);
        !s.ok()) {
      return Context(FrameType::kPush, key, s);
    }
    if (counters_ != nullptr) {
      counters_->bytes_sent.fetch_add(static_cast<int64_t>(data.size()));
    }
    return absl::OkStatus();
  }

  absl::Status PushError(const ShardKey& key,
                         const absl::Status& error) override {
    if (absl::Status s = CheckOpen(); !s.ok()) return s;
    absl::Status s = socket_->SendError(FrameType::kPushError, key, error);
    return s.ok() ? s : Context(FrameType::kPushError, key, s);
  }

  int socket_fd() const override { return socket_->fd(); }

  bool WritableNow() const override {
    if (socket_->broken()) return false;
    pollfd p{socket_->fd(), POLLOUT, 0};
    return poll(&p, 1, 0) == 1 && (p.revents & POLLOUT) != 0 &&
           (p.revents & (POLLERR | POLLHUP)) == 0;
  }

  absl::Status SendOps(absl::string_view message) override {
    if (absl::Status s = CheckOpen(); !s.ok()) return s;
    absl::Status s = socket_->SendOps(message);
    return s.ok() ? s : Context(FrameType::kOps, ShardKey{}, s);
  }

  using DataPlaneConnection::Fetch;
  using DataPlaneConnection::Put;

  absl::Status Put(const ShardKey& key, const Storage& data,
                   std::atomic<int64_t>* sent) override {
    if (absl::Status s = CheckOpen(); !s.ok()) return s;
    if (absl::Status s = socket_->SendShard(FrameType::kPut, key, data, sent);
        !s.ok()) {
      return Context(FrameType::kPut, key, s);
    }
    return AwaitAck(FrameType::kPut, key);
  }

  absl::Status PushIpc(const ShardKey& key, const IpcShard& shard) override {
    if (absl::Status s = CheckOpen(); !s.ok()) return s;
    if (!peer_opens_cuda_ipc()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "data-plane PUSH_IPC to ", address_,
          ": the worker does not open CUDA IPC on this connection"));
    }
    if (absl::Status s = socket_->SendIpc(key, shard); !s.ok()) {
      return Context(FrameType::kPushIpc, key, s);
    }
    return AwaitAck(FrameType::kPushIpc, key);
  }

  absl::StatusOr<std::shared_ptr<Storage>> Fetch(
      const ShardKey& key, std::atomic<int64_t>* received) override {
    return FetchAs(FrameType::kFetch, key, received);
  }

  absl::StatusOr<std::shared_ptr<Storage>> FetchExecutable(
      uint64_t fingerprint) override {
    return FetchAs(FrameType::kFetchExecutable, ShardKey{fingerprint, 0},
                   nullptr);
  }

  absl::Status Wait(const ShardKey& key) override {
    if (absl::Status s = CheckOpen(); !s.ok()) return s;
    if (absl::Status s = socket_->SendControl(FrameType::kWait, key); !s.ok()) {
      return Context(FrameType::kWait, key, s);
    }
    return AwaitAck(FrameType::kWait, key);
  }

  absl::Status OpenRelay(absl::Time deadline) override {
    if (absl::Status s = CheckOpen(); !s.ok()) return s;
    if (absl::Status s = socket_->SendControl(FrameType::kRelay, {}); !s.ok()) {
      return Context(FrameType::kRelay, {}, s);
    }
    if (absl::Status s = AwaitReadable(deadline); !s.ok()) {
      return Context(FrameType::kRelay, {}, socket_->Break(s));
    }
    return AwaitAck(FrameType::kRelay, {}, /*readable=*/true);
  }

  absl::StatusOr<Relayed> ReadRelayed(absl::Time deadline) override {
    if (absl::Status s = CheckOpen(); !s.ok()) return s;
    if (absl::Status s = AwaitReadable(deadline); !s.ok()) return s;
    bool eof = false;
    absl::StatusOr<FrameHeader> answer =
        socket_->ReadHeader(&eof, /*idle_wait=*/false);
    if (!answer.ok()) return Context(FrameType::kRelay, {}, answer.status());
    Relayed relayed{answer->key(), std::nullopt};
    switch (answer->frame_type()) {
      case FrameType::kSkip:
        return relayed;
      case FrameType::kError: {
        absl::Status error = socket_->ReadErrorStatus(*answer);
        if (socket_->broken()) return Context(FrameType::kRelay, {}, error);
        relayed.result = error;
        return relayed;
      }
      case FrameType::kData: {
        absl::StatusOr<std::shared_ptr<Storage>> data = socket_->ReadShard(
            *answer, [](size_t bytes) { return Storage::Allocate(bytes); });
        if (!data.ok()) return Context(FrameType::kRelay, {}, data.status());
        relayed.result = std::move(data);
        return relayed;
      }
      default:
        return Unexpected(FrameType::kRelay, answer->key(), *answer);
    }
  }

  // At most this many WAITs are unanswered at once: the rest go out as
  // answers come in, so neither side's socket buffer fills with frames the
  // other is not reading (which would stall both).
  static constexpr size_t kWaitsInFlight = 512;

  absl::Status SendWaits(const std::vector<ShardKey>& keys) override {
    if (absl::Status s = CheckOpen(); !s.ok()) return s;
    for (size_t i = 0; i < std::min(keys.size(), kWaitsInFlight); ++i) {
      if (absl::Status s = socket_->SendControl(FrameType::kWait, keys[i]);
          !s.ok()) {
        return Context(FrameType::kWait, keys[i], s);
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<size_t> AwaitWaits(const std::vector<ShardKey>& keys,
                                    absl::Time deadline) override {
    if (absl::Status s = CheckOpen(); !s.ok()) return s;
    for (size_t i = 0; i < keys.size(); ++i) {
      // The next answer, or the deadline: the ones still due leave the
      // stream out of step, so the connection is broken.
      if (!AwaitReadable(deadline).ok()) {
        socket_->Break(absl::DeadlineExceededError("wait deadline"))
            .IgnoreError();
        return i;
      }
      if (absl::Status s =
              AwaitAck(FrameType::kWait, keys[i], /*readable=*/true);
          !s.ok()) {
        if (i + 1 < keys.size()) socket_->Break(s).IgnoreError();
        return s;
      }
      if (const size_t next = i + kWaitsInFlight; next < keys.size()) {
        if (absl::Status s = socket_->SendControl(FrameType::kWait, keys[next]);
            !s.ok()) {
          return Context(FrameType::kWait, keys[next], s);
        }
      }
    }
    return keys.size();
  }

 private:
  // FETCH or FETCH_EXECUTABLE: one request, DATA or ERROR back.
  absl::StatusOr<std::shared_ptr<Storage>> FetchAs(
      FrameType type, const ShardKey& key, std::atomic<int64_t>* received) {
    if (absl::Status s = CheckOpen(); !s.ok()) return s;
    if (absl::Status s = socket_->SendControl(type, key); !s.ok()) {
      return Context(type, key, s);
    }
    absl::StatusOr<FrameHeader> reply = ReadReply(type, key);
    if (!reply.ok()) return reply.status();
    if (reply->frame_type() == FrameType::kError) {
      return ErrorReply(type, key, *reply);
    }
    if (reply->frame_type() != FrameType::kData) {
      return Unexpected(type, key, *reply);
    }
    // A passed memfd is mapped where it lies; inline bytes land in fresh
    // storage (memfd-backed when large, so it can be passed on in turn).
    absl::StatusOr<std::shared_ptr<Storage>> data = socket_->ReadShard(
        *reply, [](size_t bytes) { return Storage::Allocate(bytes); },
        received);
    if (!data.ok()) return Context(type, key, data.status());
    return data;
  }

  // Waits until the socket has something to read (a frame, its end) or
  // `deadline` passes (DeadlineExceeded).
  absl::Status AwaitReadable(absl::Time deadline) {
    while (true) {
      const absl::Duration left = deadline - clock_->Now();
      const int ms =
          deadline == absl::InfiniteFuture()
              ? -1
              : static_cast<int>(absl::ToInt64Milliseconds(std::max(
                    left + absl::Microseconds(999), absl::ZeroDuration())));
      pollfd p{socket_->fd(), POLLIN, 0};
      const int ready = poll(&p, 1, ms);
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) {
        return absl::DeadlineExceededError(
            absl::StrCat("no answer from ", address_, " by the deadline"));
      }
      return absl::OkStatus();  // readable, or an error the read will say
    }
  }

  absl::Status CheckOpen() const {
    if (!socket_->broken()) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("data-plane connection to ", address_,
                     " was closed after an earlier error"));
  }

  // Names the request and the peer in a transport error.
  absl::Status Context(FrameType request, const ShardKey& key,
                       const absl::Status& error) const {
    return absl::Status(
        error.code(),
        absl::StrCat("data-plane ", internal::FrameTypeName(request),
                     " of buffer ", key.buffer_id, " shard ", key.shard, " to ",
                     address_, ": ", error.message()));
  }

  // `readable`: the caller polled the socket already (AwaitWaits), so the
  // header's read need not (this end sets no frame timeout).
  absl::StatusOr<FrameHeader> ReadReply(FrameType request, const ShardKey& key,
                                        bool readable = false) {
    bool eof = false;
    absl::StatusOr<FrameHeader> reply =
        socket_->ReadHeader(&eof, /*idle_wait=*/!readable);
    if (!reply.ok()) return Context(request, key, reply.status());
    if (!(reply->key() == key)) {
      return Context(request, key,
                     socket_->Break(absl::InternalError(
                         absl::StrCat("reply names buffer ", reply->buffer_id,
                                      " shard ", reply->shard))));
    }
    return reply;
  }

  // The worker's status, exactly as it sent it: users read this message.
  absl::Status ErrorReply(FrameType request, const ShardKey& key,
                          const FrameHeader& reply) {
    absl::Status status = socket_->ReadErrorStatus(reply);
    return socket_->broken() ? Context(request, key, status) : status;
  }

  absl::Status Unexpected(FrameType request, const ShardKey& key,
                          const FrameHeader& reply) {
    return Context(
        request, key,
        socket_->Break(absl::InternalError(absl::StrCat(
            "unexpected ", internal::FrameTypeName(reply.frame_type()),
            " reply"))));
  }

  absl::Status AwaitAck(FrameType request, const ShardKey& key,
                        bool readable = false) {
    absl::StatusOr<FrameHeader> reply = ReadReply(request, key, readable);
    if (!reply.ok()) return reply.status();
    switch (reply->frame_type()) {
      case FrameType::kAck:
        return absl::OkStatus();
      case FrameType::kError:
        return ErrorReply(request, key, *reply);
      default:
        return Unexpected(request, key, *reply);
    }
  }

  std::unique_ptr<FrameSocket> socket_;
  std::string address_;          // for messages
  DataPlaneCounters* counters_;  // may be null
  const uint32_t capabilities_;  // the worker's, from its WELCOME
  Clock* const clock_;           // AwaitWaits' deadlines
};

using Opener =
    std::function<absl::StatusOr<std::unique_ptr<DataPlaneConnection>>(
        internal::UniqueFd fd, bool is_unix, std::string address)>;

// One connection attempt: the unix socket if given (and there), else TCP;
// `open` runs the handshake.
absl::StatusOr<std::unique_ptr<DataPlaneConnection>> ConnectOnce(
    const std::string& tcp_address, const std::string& unix_path,
    const Opener& open, Clock* clock, absl::Duration tcp_timeout);

}  // namespace

absl::StatusOr<std::unique_ptr<DataPlaneConnection>>
DataPlaneConnection::Connect(const std::string& tcp_address,
                             const std::string& unix_path,
                             DataPlaneCounters* counters,
                             const DataPlaneIdentity& me,
                             const std::function<bool()>& cancelled,
                             Clock* clock, absl::Duration tcp_timeout) {
  // A connection is handed out only once the handshake proved `me` and the
  // worker proved it holds the same secret.
  auto open = [&](internal::UniqueFd fd, bool is_unix, std::string address)
      -> absl::StatusOr<std::unique_ptr<DataPlaneConnection>> {
    auto socket = std::make_unique<FrameSocket>(std::move(fd), is_unix);
    uint32_t capabilities = 0;
    if (absl::Status s = internal::ConnectHandshake(*socket, me, cancelled,
                                                    &capabilities, clock);
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("data-plane connection to ",
                                                 address, ": ", s.message()));
    }
    socket->set_generation(me.generation);
    return std::make_unique<DataPlaneConnectionImpl>(
        std::move(socket), std::move(address), counters, capabilities, clock);
  };
  // A handshake whose stream ended (the acceptor pushed it out of its pool
  // of handshakes under a flood of connections without a credential, see
  // DataPlaneServerOptions::max_handshaking) is tried again, a few times;
  // a refusal, a deadline or a cancellation is not.
  constexpr int kAttempts = 4;
  absl::StatusOr<std::unique_ptr<DataPlaneConnection>> connection;
  for (int attempt = 1; attempt <= kAttempts; ++attempt) {
    connection = ConnectOnce(tcp_address, unix_path, open, clock, tcp_timeout);
    if (connection.ok() || !absl::IsUnavailable(connection.status()) ||
        (cancelled && cancelled())) {
      break;
    }
    if (attempt < kAttempts) {
      SPDLOG_DEBUG("data plane: {}; trying again",
                   connection.status().ToString());
    }
  }
  return connection;
}

namespace {

absl::StatusOr<std::unique_ptr<DataPlaneConnection>> ConnectOnce(
    const std::string& tcp_address, const std::string& unix_path,
    const Opener& open, Clock* clock, absl::Duration tcp_timeout) {
  absl::Status unix_error;
  if (!unix_path.empty()) {
    absl::StatusOr<internal::UniqueFd> fd = internal::ConnectUnix(unix_path);
    if (fd.ok()) {
      return open(*std::move(fd), /*is_unix=*/true,
                  absl::StrCat("unix @", unix_path));
    }
    if (tcp_address.empty()) return fd.status();
    // The socket is abstract: in another network namespace it does not
    // exist. TCP reaches the same worker wherever it is.
    unix_error = fd.status();
    SPDLOG_INFO("data plane: {}; using TCP ({})",
                std::string(unix_error.message()), tcp_address);
  }
  absl::StatusOr<internal::UniqueFd> fd =
      internal::ConnectTcp(tcp_address, tcp_timeout, clock);
  if (!fd.ok()) {
    if (unix_error.ok()) return fd.status();
    return absl::Status(
        fd.status().code(),
        absl::StrCat(unix_error.message(), "; then ", fd.status().message()));
  }
  return open(*std::move(fd), /*is_unix=*/false, tcp_address);
}

}  // namespace
}  // namespace plexus::transport
