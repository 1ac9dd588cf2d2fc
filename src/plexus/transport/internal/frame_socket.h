// The data plane's wire format, and one end of a connection that speaks it.
//
// Every frame starts with a fixed 64-byte header, in host byte order (both
// ends are little-endian machines):
//
//   offset  size  field
//        0     4  magic          "PLXD"
//        4     2  version        kFrameVersion; another is refused
//        6     2  type           FrameType
//        8     2  flags          kFlagFd: a descriptor was passed (a
//                                shard's memfd; PUSH_IPC's allocation)
//       10     2  reserved       zero
//       12     4  shard
//       16     8  buffer_id
//       24     8  payload_bytes  logical bytes moved
//       32     4  status_code    absl::StatusCode (ERROR frames)
//       36     4  reserved       zero
//       40     8  generation     the generation of the sender's
//                                registration (0 from a client); a worker
//                                refuses pushes of one the server declared
//                                down (DataPlaneHandler::AdmitGeneration)
//       48    16  reserved       zero (version 2 sent a credential here;
//                                since version 3 the connection's
//                                handshake proves it once, handshake.h)
//
// Reserved fields must be zero, so that a later version can use them and
// an older receiver refuses rather than misreads.
// Every connection begins with the handshake (CHALLENGE, HELLO, WELCOME;
// internal/handshake.h); any other frame before it ends is refused.
// WELCOME's shard field carries the acceptor's capabilities
// (kCapabilityCudaIpc), which the connector may use from then on.
// The payload follows the header, except under kFlagFd on a shard frame,
// where the memfd holding it rides on the header's first byte (SCM_RIGHTS,
// unix sockets only) and no payload bytes follow. (A PUSH_IPC under
// kFlagFd passes the exported allocation's descriptor the same way, and its
// payload still follows.) ERROR and PUSH_ERROR carry the message
// text as payload; ERROR also its status code, so the receiver rebuilds the
// same absl::Status.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "plexus/store/storage.h"
#include "plexus/transport/data_plane.h"
#include "plexus/transport/internal/socket_io.h"

namespace plexus::transport::internal {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the data-plane header is sent in host (little-endian) order");

enum class FrameType : uint16_t {
  kPush = 1,       // worker -> worker: a shard
  kPushError = 2,  // worker -> worker: the shard failed upstream
  kPut = 3,        // client -> worker: a shard; replied with ACK or ERROR
  kFetch = 4,      // client -> worker: replied with DATA or ERROR
  kWait = 5,       // client -> worker: replied with ACK or ERROR
  kAck = 6,
  kData = 7,
  kError = 8,
  kChallenge = 9,  // acceptor -> connector: nonce (handshake.h)
  kHello = 10,     // connector -> acceptor: who, nonce, proof
  kWelcome = 11,   // acceptor -> connector: its proof
  // worker -> worker: the serialized XLA executable whose content
  // fingerprint is buffer_id (shard 0); replied with DATA or ERROR.
  kFetchExecutable = 12,
  // worker -> worker, unix socket: a shard by CUDA IPC (IpcPayload);
  // replied with ACK (stored) or ERROR (not taken: send the bytes).
  kPushIpc = 13,
  // server -> worker: one proto::ServerToWorker in wire form, the ops of a
  // write; one-way, applied in the order sent (data_plane.h, "ops").
  kOps = 14,
  // worker -> server, on the server's ops connection: one
  // proto::WorkerToServer in wire form (its calls done); one-way.
  kReports = 15,
  // client -> worker: this connection takes the answers the server relays
  // for the client's calls (relay_links.h); replied with ACK, then DATA,
  // ERROR or SKIP frames as relayed values are decided; nothing more comes
  // from the client.
  kRelay = 16,
  // worker -> client, on a relay connection: the value of this key is not
  // relayed (too large, not in host memory, still computing): fetch it.
  kSkip = 17,
};
const char* FrameTypeName(FrameType type);

inline constexpr uint32_t kFrameMagic = 0x44584C50;  // "PLXD" on the wire
// 1: the 32-byte header without version; 2: a credential in every header;
// 3: this one (a handshake per connection, no credential in frames).
inline constexpr uint16_t kFrameVersion = 3;
inline constexpr uint16_t kFlagFd = 1;
// Larger claims are malformed frames, not allocations to attempt.
inline constexpr uint64_t kMaxPayloadBytes = uint64_t{64} << 30;
inline constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 20;
// An OPS frame's payload: as large as the server's gRPC messages may be.
inline constexpr uint64_t kMaxOpsBytes = uint64_t{256} << 20;

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint16_t version = kFrameVersion;
  uint16_t type = 0;
  uint16_t flags = 0;
  uint16_t reserved0 = 0;
  int32_t shard = 0;
  uint64_t buffer_id = 0;
  uint64_t payload_bytes = 0;
  int32_t status_code = 0;
  uint32_t reserved1 = 0;
  uint64_t generation = 0;
  uint8_t reserved2[16] = {};

  FrameType frame_type() const { return static_cast<FrameType>(type); }
  ShardKey key() const { return ShardKey{buffer_id, shard}; }
};
static_assert(sizeof(FrameHeader) == 64, "the header layout is the protocol");
static_assert(offsetof(FrameHeader, shard) == 12 &&
                  offsetof(FrameHeader, buffer_id) == 16 &&
                  offsetof(FrameHeader, payload_bytes) == 24 &&
                  offsetof(FrameHeader, status_code) == 32 &&
                  offsetof(FrameHeader, generation) == 40 &&
                  offsetof(FrameHeader, reserved2) == 48,
              "field offsets are those of the table above");

// Whether `header` is one this end may read: magic, version, zero reserved
// fields, a known type, a payload within its type's limit, and a
// descriptor (`fd_passed`: one arrived with it; `is_unix`: on a unix
// socket) exactly where its flag says. A reader of frames other than
// FrameSocket (the server's reports poller) checks headers with it too.
absl::Status CheckFrameHeader(const FrameHeader& header, bool is_unix,
                              bool fd_passed);

// The payload of PUSH_IPC (transport::IpcShard), 96 bytes, host order:
//
//   offset  size  field
//        0    64  handle        kLegacyHandle: cudaIpcMemHandle_t of the
//                               exported allocation; else zero
//       64     8  offset        of the value from the allocation's base
//       72     8  bytes         the value's size; at most kMaxPayloadBytes
//       80     4  ordinal       the sender's CUDA device; >= 0
//       84     4  kind          IpcShard::Kind: 0 legacy handle, 1 POSIX fd
//       88     8  mapping_size  kPosixFd: the bytes to map, holding
//                               offset + bytes, at most kMaxIpcMappingBytes;
//                               else zero
//
// A kPosixFd payload comes with the header's kFlagFd, its descriptor (the
// exported allocation) riding on the header's first byte as a memfd does;
// the payload bytes still follow the header. A legacy one comes without.
// A header of another payload size is a malformed frame (the connection
// closes); a payload that breaks a rule above is refused with an ERROR,
// the stream in step (a passed descriptor is closed).
inline constexpr uint64_t kMaxIpcMappingBytes = uint64_t{1} << 40;
struct IpcPayload {
  char handle[IpcShard::kHandleBytes] = {};
  uint64_t offset = 0;
  uint64_t bytes = 0;
  int32_t ordinal = 0;
  uint32_t kind = 0;
  uint64_t mapping_size = 0;
};
static_assert(sizeof(IpcPayload) == 96, "the PUSH_IPC payload is the protocol");
static_assert(offsetof(IpcPayload, offset) == 64 &&
                  offsetof(IpcPayload, bytes) == 72 &&
                  offsetof(IpcPayload, ordinal) == 80 &&
                  offsetof(IpcPayload, kind) == 84 &&
                  offsetof(IpcPayload, mapping_size) == 88,
              "field offsets are those of the table above");
// Every field but the descriptor, which travels beside the bytes.
IpcPayload EncodeIpc(const IpcShard& shard);
// The shard `payload` and the descriptor that came with it (`fd`, owned;
// none for a legacy handle) describe. InvalidArgument naming the rule a
// payload breaks (`fd` is then closed).
absl::StatusOr<IpcShard> DecodeIpc(const IpcPayload& payload,
                                   SharedFd fd = SharedFd());

// One end of a data-plane connection: sends and reads whole frames.
// Thread-compatible (one reader and one writer at a time). After an I/O or
// protocol error the stream is out of step, broken() is true and the socket
// is shut down (the owner still closes it). Errors that leave the stream in
// step (a shard that could not be stored) do not break it.
class FrameSocket {
 public:
  FrameSocket(UniqueFd fd, bool is_unix);

  int fd() const { return fd_.get(); }
  bool is_unix() const { return is_unix_; }
  bool broken() const { return broken_; }
  const std::string& peer() const { return peer_; }

  // A frame without payload (FETCH, WAIT, ACK).
  absl::Status SendControl(FrameType type, const ShardKey& key);
  // A frame of at most kSmallFrameBytes of inline payload (an ACK, a small
  // DATA) written without blocking, as one buffer: how many of its bytes
  // went (all, some or none), with the frame in `*frame`. What did not go
  // is the caller's to send (SendRemainder) before anything else is
  // written. An I/O error breaks the stream.
  static constexpr size_t kSmallFrameBytes = size_t{16} << 10;
  // `status_code`: the header's (an ERROR's code).
  absl::StatusOr<size_t> TrySendSmall(FrameType type, const ShardKey& key,
                                      absl::string_view payload,
                                      std::string* frame,
                                      int32_t status_code = 0);
  // The bytes of a frame TrySendSmall began, written (blocking).
  absl::Status SendRemainder(absl::string_view rest);
  // PUSH, PUT or DATA. A memfd-backed `data` on a unix socket travels as its
  // descriptor; otherwise its bytes follow in kChunkBytes writes. `sent`,
  // if not null, counts the payload bytes as they go (a passed memfd's
  // all at once).
  absl::Status SendShard(FrameType type, const ShardKey& key,
                         const Storage& data,
                         std::atomic<int64_t>* sent = nullptr);
  // PUSH_IPC of `shard`; a kPosixFd one passes its descriptor (unix
  // sockets only: elsewhere FailedPrecondition, nothing sent).
  absl::Status SendIpc(const ShardKey& key, const IpcShard& shard);
  // PUSH_ERROR or ERROR, with `error`'s code and message (messages beyond
  // kMaxMessageBytes are cut).
  absl::Status SendError(FrameType type, const ShardKey& key,
                         const absl::Status& error);

  // OPS: `message` (at most kMaxOpsBytes) in one frame.
  absl::Status SendOps(absl::string_view message);
  // `type` (OPS or REPORTS) with `message` as its payload, on `fd` as it is
  // (another owner's socket: a worker writing on the connection the server
  // opened), stamped with `generation`.
  static absl::Status SendMessageOn(int fd, FrameType type,
                                    absl::string_view message,
                                    uint64_t generation);

  // Server side: every read once a frame has begun must make progress
  // within `timeout`; ReadHeader first waits, without limit, for a frame to
  // begin (in poll, as on every unix socket: WaitReadable says why).
  absl::Status SetFrameTimeout(absl::Duration timeout);
  // From now on a read of a frame's header takes whatever else has come,
  // up to kReadAheadBytes, and the frame's payload is read from that first:
  // a small frame costs one recv, and frames sent back to back fewer than
  // one each. Only where no descriptor can come (SCM_RIGHTS rides on the
  // bytes, so a read past a frame's end could take the next frame's): on
  // TCP, or on a unix connection whose peer passes none (an ops
  // connection). A descriptor that comes anyway breaks the stream.
  void EnableReadAhead();
  // Whether bytes past the last frame read wait in the read-ahead (a
  // connection handed to another reader then would lose them).
  bool has_read_ahead() const { return ahead_end_ > ahead_begin_; }
  // How many recv calls this end's reads of frames have made (a test's
  // measure of read-ahead).
  int64_t socket_reads() const { return socket_reads_; }

  // Every frame this end sends from now on carries `generation`.
  void set_generation(uint64_t generation) { generation_ = generation; }

  // `header` and `payload` as they are (handshake frames).
  absl::Status SendFrame(FrameHeader header, absl::string_view payload);

  // Reads and checks the next header. Sets `*eof` when the peer closed the
  // connection between frames (an orderly end; still an error result).
  // With `idle_wait` (the default) a timed socket or a unix one first waits
  // in poll for the frame to begin (WaitReadable says why a unix one does).
  // With it false the read begins at once: a timed socket's frame timeout
  // then also limits the wait for the frame to begin (the handshake's
  // frames), and an untimed one reads a frame known to have come.
  absl::StatusOr<FrameHeader> ReadHeader(bool* eof, bool idle_wait = true);
  // The shard of a PUSH, PUT or DATA header: the passed memfd mapped, or the
  // inline bytes read straight into storage from `allocate(bytes)`. If
  // `allocate` fails the bytes are skipped and its error returned.
  // `received`, if not null, counts the payload bytes as they arrive (in
  // kChunkBytes reads; a passed memfd's all at once).
  using Allocator =
      std::function<absl::StatusOr<std::shared_ptr<Storage>>(size_t bytes)>;
  absl::StatusOr<std::shared_ptr<Storage>> ReadShard(
      const FrameHeader& header, const Allocator& allocate,
      std::atomic<int64_t>* received = nullptr);
  // Drops the payload of a PUSH, PUT or DATA header unread (a passed memfd
  // is closed unmapped; inline bytes are read and discarded), keeping the
  // stream in step.
  absl::Status SkipShard(const FrameHeader& header);
  // The payload of a PUSH_IPC header, decoded, with the descriptor that
  // came with it. An I/O error breaks the stream; a payload DecodeIpc
  // refuses leaves it in step.
  absl::StatusOr<IpcShard> ReadIpc(const FrameHeader& header);
  // The message of a PUSH_ERROR or ERROR header.
  absl::StatusOr<std::string> ReadMessage(const FrameHeader& header);
  // The payload of an OPS or REPORTS header (at most kMaxOpsBytes), into
  // `*out` (its capacity reused).
  absl::Status ReadOps(const FrameHeader& header, std::string* out);
  // An ERROR frame as the status it carries (code and message intact); an
  // I/O error if the message cannot be read.
  absl::Status ReadErrorStatus(const FrameHeader& header);

  // Marks the stream out of step (say, a reply that does not match its
  // request) and returns `status`.
  absl::Status Break(absl::Status status);
  // Wakes a reader or writer blocked on this socket (it sees an error).
  void Shutdown();

 private:
  static constexpr size_t kReadAheadBytes = size_t{16} << 10;

  absl::Status CheckHeader(const FrameHeader& header);
  FrameHeader MakeHeader(FrameType type, const ShardKey& key) const;
  // The next header's bytes (ReadHeader's rules on waiting and `*eof`).
  absl::Status ReceiveHeader(FrameHeader* header, bool* eof, bool idle_wait);
  // Exactly `n` bytes of the frame being read: what was read ahead first,
  // then the socket's. Skip drops them.
  absl::Status Read(void* out, size_t n);
  absl::Status Skip(size_t n);
  // Moves up to `n` read-ahead bytes to `out`; the count moved.
  size_t TakeAhead(void* out, size_t n);

  UniqueFd fd_;
  bool is_unix_;
  std::string peer_;
  // Set by the reader or the writer (one of each may run at once).
  std::atomic<bool> broken_{false};
  bool timed_ = false;  // SetFrameTimeout was called
  uint64_t generation_ = 0;
  UniqueFd passed_fd_;  // arrived with the last header
  // The reader's: bytes read past the frame being read (EnableReadAhead),
  // ahead_[ahead_begin_, ahead_end_).
  std::unique_ptr<char[]> ahead_;
  size_t ahead_begin_ = 0;
  size_t ahead_end_ = 0;
  int64_t socket_reads_ = 0;
};

}  // namespace plexus::transport::internal
