#include "plexus/transport/internal/frame_socket.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace plexus::transport::internal {
namespace {

bool IsShardFrame(FrameType type) {
  return type == FrameType::kPush || type == FrameType::kPut ||
         type == FrameType::kData;
}

bool IsMessageFrame(FrameType type) {
  return type == FrameType::kPushError || type == FrameType::kError;
}

// The exact payload size of a handshake frame (handshake.h); 0 for others.
uint64_t HandshakePayload(FrameType type) {
  switch (type) {
    case FrameType::kChallenge:
    case FrameType::kWelcome:
      return 32;
    case FrameType::kHello:
      return 64;
    default:
      return 0;
  }
}

}  // namespace

const char* FrameTypeName(FrameType type) {
  switch (type) {
    case FrameType::kPush:
      return "PUSH";
    case FrameType::kPushError:
      return "PUSH_ERROR";
    case FrameType::kPut:
      return "PUT";
    case FrameType::kFetch:
      return "FETCH";
    case FrameType::kWait:
      return "WAIT";
    case FrameType::kAck:
      return "ACK";
    case FrameType::kData:
      return "DATA";
    case FrameType::kError:
      return "ERROR";
    case FrameType::kChallenge:
      return "CHALLENGE";
    case FrameType::kHello:
      return "HELLO";
    case FrameType::kWelcome:
      return "WELCOME";
    case FrameType::kFetchExecutable:
      return "FETCH_EXECUTABLE";
    case FrameType::kPushIpc:
      return "PUSH_IPC";
    case FrameType::kOps:
      return "OPS";
    case FrameType::kReports:
      return "REPORTS";
    case FrameType::kRelay:
      return "RELAY";
    case FrameType::kSkip:
      return "SKIP";
  }
  return "UNKNOWN";
}

IpcPayload EncodeIpc(const IpcShard& shard) {
  IpcPayload payload;
  std::memcpy(payload.handle, shard.handle.data(), sizeof(payload.handle));
  payload.offset = shard.offset;
  payload.bytes = shard.bytes;
  payload.ordinal = shard.ordinal;
  payload.kind = static_cast<uint32_t>(shard.kind);
  payload.mapping_size = shard.mapping_size;
  return payload;
}

absl::StatusOr<IpcShard> DecodeIpc(const IpcPayload& payload, SharedFd fd) {
  auto refused = [](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed PUSH_IPC payload: ", why));
  };
  if (payload.bytes > kMaxPayloadBytes) {
    return refused(absl::StrCat("a value of ", payload.bytes,
                                " bytes (more than 64 GiB)"));
  }
  if (payload.ordinal < 0) {
    return refused(absl::StrCat("CUDA device ", payload.ordinal));
  }
  if (payload.offset > kMaxPayloadBytes * 4) {
    return refused(
        absl::StrCat("offset ", payload.offset, " beyond any GPU's memory"));
  }
  IpcShard shard;
  switch (payload.kind) {
    case static_cast<uint32_t>(IpcShard::Kind::kLegacyHandle):
      if (fd.valid()) return refused("a descriptor with a legacy IPC handle");
      if (payload.mapping_size != 0) {
        return refused("a mapping size with a legacy IPC handle");
      }
      break;
    case static_cast<uint32_t>(IpcShard::Kind::kPosixFd):
      if (!fd.valid()) return refused("a POSIX fd export without its fd");
      if (payload.mapping_size == 0 ||
          payload.mapping_size > kMaxIpcMappingBytes) {
        return refused(absl::StrCat("mapping size ", payload.mapping_size,
                                    " (0, or more than 1 TiB)"));
      }
      if (payload.offset > payload.mapping_size ||
          payload.bytes > payload.mapping_size - payload.offset) {
        return refused(absl::StrCat(
            "a value of ", payload.bytes, " bytes at offset ", payload.offset,
            " lies outside the mapping of ", payload.mapping_size, " bytes"));
      }
      break;
    default:
      return refused(absl::StrCat("unknown export kind ", payload.kind));
  }
  shard.kind = static_cast<IpcShard::Kind>(payload.kind);
  std::memcpy(shard.handle.data(), payload.handle, sizeof(payload.handle));
  shard.fd = std::move(fd);
  shard.mapping_size = payload.mapping_size;
  shard.offset = payload.offset;
  shard.bytes = payload.bytes;
  shard.ordinal = payload.ordinal;
  return shard;
}

FrameSocket::FrameSocket(UniqueFd fd, bool is_unix)
    : fd_(std::move(fd)), is_unix_(is_unix), peer_(PeerName(fd_.get())) {}

FrameHeader FrameSocket::MakeHeader(FrameType type, const ShardKey& key) const {
  FrameHeader header;
  header.type = static_cast<uint16_t>(type);
  header.buffer_id = key.buffer_id;
  header.shard = key.shard;
  header.generation = generation_;
  return header;
}

absl::Status FrameSocket::Break(absl::Status status) {
  if (!broken_) Shutdown();  // the peer sees the end now, not at close
  broken_ = true;
  return status;
}

absl::Status FrameSocket::SendControl(FrameType type, const ShardKey& key) {
  FrameHeader header = MakeHeader(type, key);
  iovec iov{&header, sizeof(header)};
  if (absl::Status s = SendAll(fd(), &iov, 1); !s.ok()) return Break(s);
  return absl::OkStatus();
}

absl::StatusOr<size_t> FrameSocket::TrySendSmall(FrameType type,
                                                 const ShardKey& key,
                                                 absl::string_view payload,
                                                 std::string* frame,
                                                 int32_t status_code) {
  if (payload.size() > kSmallFrameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a frame of ", payload.size(), " bytes is not small"));
  }
  FrameHeader header = MakeHeader(type, key);
  header.payload_bytes = payload.size();
  header.status_code = status_code;
  frame->assign(reinterpret_cast<const char*>(&header), sizeof(header));
  frame->append(payload.data(), payload.size());
  while (true) {
    const ssize_t went =
        ::send(fd(), frame->data(), frame->size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (went >= 0) return static_cast<size_t>(went);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
    return Break(IoError("send", errno));
  }
}

absl::Status FrameSocket::SendRemainder(absl::string_view rest) {
  if (rest.empty()) return absl::OkStatus();
  iovec iov{const_cast<char*>(rest.data()), rest.size()};
  if (absl::Status s = SendAll(fd(), &iov, 1); !s.ok()) return Break(s);
  return absl::OkStatus();
}

absl::Status FrameSocket::SendFrame(FrameHeader header,
                                    absl::string_view payload) {
  header.payload_bytes = payload.size();
  iovec iov[2] = {{&header, sizeof(header)},
                  {const_cast<char*>(payload.data()), payload.size()}};
  if (absl::Status s = SendAll(fd(), iov, payload.empty() ? 1 : 2); !s.ok()) {
    return Break(s);
  }
  return absl::OkStatus();
}

absl::Status FrameSocket::SendOps(absl::string_view message) {
  if (message.size() > kMaxOpsBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ops of ", message.size(),
                     " bytes: larger than an OPS frame's 256 MiB"));
  }
  return SendFrame(MakeHeader(FrameType::kOps, ShardKey{}), message);
}

absl::Status FrameSocket::SendMessageOn(int fd, FrameType type,
                                        absl::string_view message,
                                        uint64_t generation) {
  if (message.size() > kMaxOpsBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        FrameTypeName(type), " of ", message.size(), " bytes: over 256 MiB"));
  }
  FrameHeader header;
  header.type = static_cast<uint16_t>(type);
  header.generation = generation;
  header.payload_bytes = message.size();
  iovec iov[2] = {{&header, sizeof(header)},
                  {const_cast<char*>(message.data()), message.size()}};
  return SendAll(fd, iov, message.empty() ? 1 : 2);
}

absl::Status FrameSocket::SendShard(FrameType type, const ShardKey& key,
                                    const Storage& data,
                                    std::atomic<int64_t>* sent_bytes) {
  auto count = [sent_bytes](size_t n) {
    if (sent_bytes != nullptr) sent_bytes->fetch_add(static_cast<int64_t>(n));
  };
  FrameHeader header = MakeHeader(type, key);
  header.payload_bytes = data.size();
  if (is_unix_ && data.shared()) {
    header.flags = kFlagFd;
    iovec iov{&header, sizeof(header)};
    if (absl::Status s = SendAll(fd(), &iov, 1, data.fd()); !s.ok()) {
      return Break(s);
    }
    count(data.size());
    return absl::OkStatus();
  }
  // The header rides with the first chunk; each further write is one chunk,
  // so the receiver starts reading while the rest is still being sent.
  const auto* bytes = static_cast<const char*>(data.data());
  size_t sent = std::min(data.size(), kChunkBytes);
  iovec first[2] = {{&header, sizeof(header)},
                    {const_cast<char*>(bytes), sent}};
  if (absl::Status s = SendAll(fd(), first, sent > 0 ? 2 : 1); !s.ok()) {
    return Break(s);
  }
  count(sent);
  while (sent < data.size()) {
    size_t step = std::min(data.size() - sent, kChunkBytes);
    iovec iov{const_cast<char*>(bytes + sent), step};
    if (absl::Status s = SendAll(fd(), &iov, 1); !s.ok()) return Break(s);
    sent += step;
    count(step);
  }
  return absl::OkStatus();
}

absl::Status FrameSocket::SendIpc(const ShardKey& key, const IpcShard& shard) {
  FrameHeader header = MakeHeader(FrameType::kPushIpc, key);
  const IpcPayload payload = EncodeIpc(shard);
  header.payload_bytes = sizeof(payload);
  int pass_fd = -1;
  if (shard.kind == IpcShard::Kind::kPosixFd) {
    if (!is_unix_ || !shard.fd.valid()) {
      return absl::FailedPreconditionError(
          "PUSH_IPC of a POSIX fd export needs the fd and a unix socket");
    }
    header.flags = kFlagFd;
    pass_fd = shard.fd.get();
  }
  iovec iov[2] = {{&header, sizeof(header)},
                  {const_cast<IpcPayload*>(&payload), sizeof(payload)}};
  if (absl::Status s = SendAll(fd(), iov, 2, pass_fd); !s.ok()) {
    return Break(s);
  }
  return absl::OkStatus();
}

absl::Status FrameSocket::SendError(FrameType type, const ShardKey& key,
                                    const absl::Status& error) {
  FrameHeader header = MakeHeader(type, key);
  absl::string_view message = error.message();
  if (message.size() > kMaxMessageBytes) {
    message.remove_suffix(message.size() - kMaxMessageBytes);
  }
  header.status_code = static_cast<int32_t>(error.code());
  header.payload_bytes = message.size();
  iovec iov[2] = {{&header, sizeof(header)},
                  {const_cast<char*>(message.data()), message.size()}};
  if (absl::Status s = SendAll(fd(), iov, message.empty() ? 1 : 2); !s.ok()) {
    return Break(s);
  }
  return absl::OkStatus();
}

absl::Status FrameSocket::CheckHeader(const FrameHeader& header) {
  return CheckFrameHeader(header, is_unix_, passed_fd_.valid());
}

absl::Status CheckFrameHeader(const FrameHeader& header, bool is_unix,
                              bool fd_passed) {
  auto malformed = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "malformed data-plane frame: %s (magic 0x%08x, type %d, flags 0x%x, "
        "payload %d bytes)",
        what, header.magic, header.type, header.flags, header.payload_bytes));
  };
  if (header.magic != kFrameMagic) return malformed("bad magic");
  if (header.version != kFrameVersion) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "data-plane frame of protocol version %d; this end speaks version %d",
        header.version, kFrameVersion));
  }
  bool reserved_zero = header.reserved0 == 0 && header.reserved1 == 0;
  for (uint8_t b : header.reserved2) reserved_zero = reserved_zero && b == 0;
  if (!reserved_zero) return malformed("reserved header fields are not zero");
  if (header.type < static_cast<uint16_t>(FrameType::kPush) ||
      header.type > static_cast<uint16_t>(FrameType::kSkip)) {
    return malformed("unknown frame type");
  }
  FrameType type = header.frame_type();
  if (const uint64_t size = HandshakePayload(type); size != 0) {
    if (header.payload_bytes != size || header.flags != 0) {
      return malformed("handshake frame of the wrong size");
    }
    if (fd_passed) {
      return malformed("descriptor arrived without the descriptor flag");
    }
    return absl::OkStatus();
  }
  if ((header.flags & ~kFlagFd) != 0) return malformed("unknown flags");
  if (type == FrameType::kPushIpc &&
      header.payload_bytes != sizeof(IpcPayload)) {
    return malformed(
        absl::StrCat("PUSH_IPC payload is not ", sizeof(IpcPayload), " bytes"));
  }
  if (header.payload_bytes > kMaxPayloadBytes) {
    return malformed("payload larger than 64 GiB");
  }
  if (IsMessageFrame(type) && header.payload_bytes > kMaxMessageBytes) {
    return malformed("error message larger than 1 MiB");
  }
  const bool ops = type == FrameType::kOps || type == FrameType::kReports;
  if (ops && header.payload_bytes > kMaxOpsBytes) {
    return malformed("ops or reports larger than 256 MiB");
  }
  if (!IsShardFrame(type) && !IsMessageFrame(type) &&
      type != FrameType::kPushIpc && !ops && header.payload_bytes != 0) {
    return malformed("payload on a control frame");
  }
  bool wants_fd = (header.flags & kFlagFd) != 0;
  if (wants_fd &&
      (!(IsShardFrame(type) || type == FrameType::kPushIpc) || !is_unix)) {
    return malformed("descriptor flag on a frame that cannot carry one");
  }
  if (wants_fd && !fd_passed) {
    return malformed("descriptor flag set but no descriptor arrived");
  }
  if (!wants_fd && fd_passed) {
    return malformed("descriptor arrived without the descriptor flag");
  }
  return absl::OkStatus();
}

absl::Status FrameSocket::SetFrameTimeout(absl::Duration timeout) {
  timed_ = true;
  return SetRecvTimeout(fd(), timeout);
}

void FrameSocket::EnableReadAhead() {
  if (!ahead_) ahead_ = std::make_unique<char[]>(kReadAheadBytes);
}

size_t FrameSocket::TakeAhead(void* out, size_t n) {
  const size_t take = std::min(n, ahead_end_ - ahead_begin_);
  if (take > 0) {
    std::memcpy(out, ahead_.get() + ahead_begin_, take);
    ahead_begin_ += take;
  }
  return take;
}

absl::Status FrameSocket::ReceiveHeader(FrameHeader* header, bool* eof,
                                        bool idle_wait) {
  auto* out = reinterpret_cast<char*>(header);
  constexpr size_t kBytes = sizeof(FrameHeader);
  size_t done = TakeAhead(out, kBytes);
  if (done == 0 && idle_wait && (timed_ || is_unix_)) {
    // Idle between frames: no limit. The frame timeout applies from its
    // first byte on. On a unix socket a reader blocked in recv is also
    // woken each time the peer reads what this end sent (the kernel's
    // write-space wake-up does not tell readers from writers), and sleeps
    // again: a client waiting for the answer to its FETCH woke once for
    // nothing per round trip. poll's wait wakes for bytes only.
    if (absl::Status s = WaitReadable(fd()); !s.ok()) return s;
  }
  while (done < kBytes) {
    // Reading ahead: whatever has come, into the (now empty) buffer; else
    // exactly the header's rest, with a descriptor passed on its first byte.
    char* into = ahead_ ? ahead_.get() : out + done;
    const size_t room = ahead_ ? kReadAheadBytes : kBytes - done;
    UniqueFd stray;
    UniqueFd* passed = !is_unix_ ? nullptr : ahead_ ? &stray : &passed_fd_;
    ++socket_reads_;
    absl::StatusOr<size_t> got = RecvSome(fd(), into, room, passed);
    if (!got.ok()) {
      if (!absl::IsDeadlineExceeded(got.status())) return got.status();
      return absl::DeadlineExceededError(
          absl::StrCat("recv: the peer stopped sending after ", done, " of ",
                       kBytes, " bytes"));
    }
    if (stray.valid()) {
      return absl::InvalidArgumentError(
          "malformed data-plane frame: a descriptor passed on a connection "
          "that takes none");
    }
    if (*got == 0) {
      *eof = done == 0;
      return absl::UnavailableError(
          absl::StrCat("recv: connection closed by peer after ", done, " of ",
                       kBytes, " bytes"));
    }
    if (ahead_) {
      ahead_begin_ = 0;
      ahead_end_ = *got;
      done += TakeAhead(out + done, kBytes - done);
    } else {
      done += *got;
    }
  }
  return absl::OkStatus();
}

absl::Status FrameSocket::Read(void* out, size_t n) {
  const size_t ahead = TakeAhead(out, n);
  if (ahead == n) return absl::OkStatus();
  ++socket_reads_;
  return RecvAll(fd(), static_cast<char*>(out) + ahead, n - ahead);
}

absl::Status FrameSocket::Skip(size_t n) {
  const size_t ahead = std::min(n, ahead_end_ - ahead_begin_);
  ahead_begin_ += ahead;
  if (ahead == n) return absl::OkStatus();
  return Discard(fd(), n - ahead);
}

absl::StatusOr<FrameHeader> FrameSocket::ReadHeader(bool* eof, bool idle_wait) {
  *eof = false;
  if (broken_) {
    return absl::FailedPreconditionError(
        absl::StrCat("data-plane connection to ", peer_, " is closed"));
  }
  FrameHeader header;
  passed_fd_.Reset();
  absl::Status s = ReceiveHeader(&header, eof, idle_wait);
  if (!s.ok()) return Break(s);
  if (s = CheckHeader(header); !s.ok()) {
    passed_fd_.Reset();
    return Break(s);
  }
  return header;
}

absl::StatusOr<std::shared_ptr<Storage>> FrameSocket::ReadShard(
    const FrameHeader& header, const Allocator& allocate,
    std::atomic<int64_t>* received) {
  size_t bytes = header.payload_bytes;
  if (header.flags & kFlagFd) {
    // A failed mapping leaves the stream in step: no payload bytes follow.
    absl::StatusOr<std::shared_ptr<Storage>> mapped =
        Storage::FromFd(passed_fd_.Release(), bytes);
    if (mapped.ok() && received != nullptr) {
      received->fetch_add(static_cast<int64_t>(bytes));
    }
    return mapped;
  }
  absl::StatusOr<std::shared_ptr<Storage>> storage = allocate(bytes);
  if (storage.ok() && (*storage == nullptr || (*storage)->size() < bytes)) {
    storage = absl::InternalError(absl::StrCat("storage allocated for ", bytes,
                                               " incoming bytes is too small"));
  }
  if (!storage.ok()) {
    if (absl::Status s = Skip(bytes); !s.ok()) return Break(s);
    return storage.status();
  }
  if (received == nullptr) {
    if (absl::Status s = Read((*storage)->data(), bytes); !s.ok()) {
      return Break(s);
    }
    return storage;
  }
  auto* into = static_cast<char*>((*storage)->data());
  for (size_t got = 0; got < bytes;) {
    const size_t step = std::min(bytes - got, kChunkBytes);
    if (absl::Status s = Read(into + got, step); !s.ok()) {
      return Break(s);
    }
    got += step;
    received->fetch_add(static_cast<int64_t>(step));
  }
  return storage;
}

absl::Status FrameSocket::SkipShard(const FrameHeader& header) {
  if (header.flags & kFlagFd) {
    passed_fd_.Reset();
    return absl::OkStatus();
  }
  if (absl::Status s = Skip(header.payload_bytes); !s.ok()) {
    return Break(s);
  }
  return absl::OkStatus();
}

absl::StatusOr<IpcShard> FrameSocket::ReadIpc(const FrameHeader& header) {
  IpcPayload payload;
  if (header.payload_bytes != sizeof(payload)) {  // CheckHeader's rule
    return Break(absl::InternalError("PUSH_IPC payload of the wrong size"));
  }
  SharedFd passed;
  if (header.flags & kFlagFd) passed = SharedFd(passed_fd_.Release());
  if (absl::Status s = Read(&payload, sizeof(payload)); !s.ok()) {
    return Break(s);
  }
  return DecodeIpc(payload, std::move(passed));
}

absl::StatusOr<std::string> FrameSocket::ReadMessage(
    const FrameHeader& header) {
  std::string message(header.payload_bytes, '\0');
  if (absl::Status s = Read(message.data(), message.size()); !s.ok()) {
    return Break(s);
  }
  return message;
}

absl::Status FrameSocket::ReadOps(const FrameHeader& header, std::string* out) {
  out->resize(header.payload_bytes);
  if (absl::Status s = Read(out->data(), out->size()); !s.ok()) {
    return Break(s);
  }
  return absl::OkStatus();
}

absl::Status FrameSocket::ReadErrorStatus(const FrameHeader& header) {
  absl::StatusOr<std::string> message = ReadMessage(header);
  if (!message.ok()) return message.status();
  auto code = static_cast<absl::StatusCode>(header.status_code);
  if (header.status_code <= 0 ||
      header.status_code >
          static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
    code = absl::StatusCode::kUnknown;  // an ERROR is never OK
  }
  return absl::Status(code, *message);
}

void FrameSocket::Shutdown() { shutdown(fd(), SHUT_RDWR); }

}  // namespace plexus::transport::internal
