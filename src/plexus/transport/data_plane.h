// The data plane: shard bytes moving worker to worker, and client to worker
// for put and fetch. Never through the server.
//
// Two carriers behind one protocol (frames on a stream socket):
//  - a unix socket (abstract namespace) between processes on one machine,
//    where memfd-backed Storage travels as a file descriptor (SCM_RIGHTS)
//    and the receiver maps it: no byte is copied through the socket;
//  - TCP between machines (or when shared memory is disabled), where the
//    payload is streamed in chunks of kChunkBytes, so sender and receiver
//    pipeline a large buffer.
//
// Every connection opens with a handshake (internal/handshake.h) that
// proves who connects (a client session or a worker) without sending a
// credential; requests are then authorized against that identity.
//
// Frames:
//   PUSH   worker -> worker  a shard for (buffer_id, shard); one-way
//   PUSH_ERROR worker -> worker  that shard failed upstream; payload = message
//   PUT    client -> worker  a shard the client declared; replied with ACK
//   FETCH  client -> worker  blocks until the shard is ready; replied with
//                            DATA or ERROR (payload = message)
//   WAIT   client -> worker  like FETCH without the bytes; ACK or ERROR
//   FETCH_EXECUTABLE worker -> worker  a serialized XLA executable by its
//                            content fingerprint; replied with DATA or ERROR
//                            (a spare loads the job's executables from a
//                            live worker instead of compiling them)
//   OPS    server -> worker  one proto::ServerToWorker in wire form: the
//                            control stream's messages once the server
//                            moved them here (ServerToWorker.
//                            ops_on_data_plane); one-way, applied in order
//                            by the connection's thread; only on a
//                            connection that proved the server credential,
//                            and only with the generation of the worker's
//                            current registration in its header
//   REPORTS worker -> server on that connection: one proto::WorkerToServer
//                            (its calls done), one-way
//   OPS    client -> server  one proto::ClientToServer in wire form, on the
//                            server's ops listener (the same protocol: the
//                            server runs a DataPlaneServer that serves OPS
//                            alone), once the client said so on its gRPC
//                            stream (ClientToServer.ops_on_frames); only
//                            from the session's own client credential, with
//                            its stream's ops generation
//   RELAY  client -> worker  this connection takes the answers the server
//                            relays for the client's calls (relay_links.h):
//                            replied with ACK, then, one per relayed
//                            shard, DATA (a small value), ERROR, or SKIP
//                            (not relayed: fetch it), as each is decided,
//                            in no set order; the client sends nothing more
//   PUSH_IPC worker -> worker, unix socket only, to a worker that said in
//                            its handshake it opens CUDA IPC: a shard in the
//                            sender's GPU memory, as an IpcShard (the
//                            exported allocation, not the bytes: a legacy
//                            IPC handle, or the allocation's POSIX fd
//                            passed with the frame, SCM_RIGHTS); replied
//                            with ACK (the receiver copied it into memory
//                            of its own and stored it: the sender may free
//                            it) or ERROR (nothing was taken: the sender
//                            sends the bytes as a PUSH instead)
#pragma once

#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/common/clock.h"
#include "plexus/common/credentials.h"
#include "plexus/common/ids.h"
#include "plexus/store/storage.h"

namespace plexus {
class Timeline;  // timeline/timeline.h
}  // namespace plexus

namespace plexus::transport {

inline constexpr size_t kChunkBytes = 1 << 20;
// The largest value a worker relays (RelayLinks): larger ones are SKIPped.
inline constexpr size_t kRelayedValueBytes = size_t{16} << 10;

using ::plexus::ShardKey;  // common/ids.h

// A file descriptor shared by the copies of what holds it, closed with the
// last of them (an IpcShard's exported allocation). Thread-compatible.
class SharedFd {
 public:
  SharedFd() = default;
  // Takes ownership of `fd` (-1: none).
  explicit SharedFd(int fd)
      : fd_(fd < 0 ? nullptr
                   : std::shared_ptr<const int>(new int(fd), [](const int* p) {
                       ::close(*p);
                       delete p;
                     })) {}
  bool valid() const { return fd_ != nullptr; }
  int get() const { return fd_ == nullptr ? -1 : *fd_; }

 private:
  std::shared_ptr<const int> fd_;
};

// A shard in a GPU's memory, exported by CUDA IPC (PUSH_IPC): where a
// worker on the same host finds it. The sender keeps the memory alive
// until the receiver answers. Two kinds, as the sender's allocation allows:
//  - kLegacyHandle: memory from cudaMalloc, named by `handle`
//    (cudaIpcMemHandle_t), which the receiver opens with
//    cudaIpcOpenMemHandle;
//  - kPosixFd: memory from the virtual memory management API (cuMemCreate,
//    cuMemMap; the CUDA PJRT plugin's allocators), named by `fd` (exported
//    by cuMemExportToShareableHandle, passed over the unix socket with the
//    frame, SCM_RIGHTS): the receiver imports it and maps `mapping_size`
//    bytes of it (the sender's whole mapping; `offset` is from its base).
struct IpcShard {
  enum class Kind : uint32_t { kLegacyHandle = 0, kPosixFd = 1 };
  static constexpr size_t kHandleBytes = 64;
  Kind kind = Kind::kLegacyHandle;
  std::array<char, kHandleBytes> handle{};  // kLegacyHandle: the handle
  SharedFd fd;                // kPosixFd: the allocation; else none
  uint64_t mapping_size = 0;  // kPosixFd: bytes to map; else 0
  uint64_t offset = 0;  // of the value from the exported allocation's base
  uint64_t bytes = 0;   // of the value: dense, row-major
  int32_t ordinal = 0;  // the sender's CUDA device, as it numbers them
};

// What the accepting end of a data-plane connection can do beyond the
// base protocol, said in its handshake (WELCOME).
inline constexpr uint32_t kCapabilityCudaIpc = 1;  // it serves PUSH_IPC

// Byte counters of one process's data plane (payload bytes only).
struct DataPlaneCounters {
  std::atomic<int64_t> bytes_sent{0};          // PUSH payloads sent
  std::atomic<int64_t> bytes_received{0};      // PUSH payloads received
  std::atomic<int64_t> bytes_from_clients{0};  // PUT payloads received
  std::atomic<int64_t> bytes_to_clients{0};    // FETCH payloads sent
  // FETCH or WAIT answers sent by the thread that readied their shard
  // (DataPlaneHandler::AwaitReadyTelling), not the connection's.
  std::atomic<int64_t> early_answers{0};
  // Answers relayed to clients (RelayLinks): values, errors and SKIPs sent,
  // and links shut because a client's socket could not take one.
  std::atomic<int64_t> relayed_answers{0};
  std::atomic<int64_t> relay_links_shut{0};
};

// What a data-plane server asks of its owner (the worker's object store).
// Called from connection threads; implementations are thread-safe and may
// block (back-pressure and waiting for a shard to become ready).
//
// An incoming shard (PUT or PUSH) goes AdmitIncoming -> [AllocateIncoming,
// TCP only] -> Deliver, or, once admitted, DeliverError if its bytes do not
// all arrive. Nothing is allocated or mapped for a shard before it is
// admitted, and never more than the size it was admitted with.
// What a request asks of a worker's data plane.
enum class DataPlaneRequest {
  kPush,
  kPushError,
  kPut,
  kFetch,
  kWait,
  kFetchExecutable,  // key: {fingerprint, 0}
  kPushIpc,
  kOps,    // key: none (zero)
  kRelay,  // key: none (zero)
};

// Who is at the far end of a data-plane connection: what it proved in the
// connection's handshake (internal/handshake.h), once, before any request.
struct DataPlanePeer {
  // kClient, kWorker or kServer (the server's ops connection)
  CredentialRole role = CredentialRole::kClient;
  uint64_t id = 0;  // the client id; 0 for a worker or the server
};

// What a connecting side proves: who it is, and the credential that says so
// (common/credentials.h: issued by the server to a client session, derived
// from the cluster secret by a worker). Never sent on the wire.
struct DataPlaneIdentity {
  DataPlanePeer peer;
  Credential credential{};
  // Every frame the connection sends carries it (the header's generation):
  // a worker's registration generation, so that peers can refuse the
  // pushes of a registration the server declared down. 0 for a client.
  uint64_t generation = 0;
};

// The rule of a data plane that takes the server's ops (a worker's, the
// simulated hosts'): OPS frames come from the server's connection alone,
// and that connection carries nothing else. PermissionDenied naming which
// side broke it; OK otherwise (a Handler's Authorize then decides the
// rest for the other peers).
absl::Status CheckOpsPeer(DataPlaneRequest request, const DataPlanePeer& peer);

class DataPlaneHandler {
 public:
  virtual ~DataPlaneHandler() = default;
  // The credential `peer` must prove it holds to open a connection; an
  // error refuses the connection (say, a role that may not connect here).
  virtual absl::StatusOr<Credential> CredentialFor(
      const DataPlanePeer& peer) = 0;
  // Whether `peer` (proven by the connection's handshake) may make
  // `request` for `key`; called before anything else is done for it. An
  // error refuses the request: a PUT's or FETCH's sender hears it, a PUSH
  // is dropped unread and logged.
  virtual absl::Status Authorize(DataPlaneRequest request, const ShardKey& key,
                                 const DataPlanePeer& peer) = 0;
  // Whether a PUSH or PUSH_ERROR stamped with `generation` (its sender's
  // registration) may be received: a worker refuses a generation the
  // server declared down (fencing). Called after Authorize; an error drops
  // the push unread, as a refusal there does. By default any generation.
  virtual absl::Status AdmitGeneration(uint64_t generation) {
    return absl::OkStatus();
  }
  // Whether `bytes` bytes of `key` may be received now (may block: for the
  // key's declaration, for room on its device). An error drops the payload
  // unread (a PUT's sender hears the error); the handler fails the shard
  // itself where its readers must hear of it (a size that differs from the
  // declared one). `from_client` tells PUT from PUSH.
  virtual absl::Status AdmitIncoming(const ShardKey& key, size_t bytes,
                                     bool from_client) = 0;
  // Storage for the admitted `bytes` bytes of `key` (TCP path).
  virtual absl::StatusOr<std::shared_ptr<Storage>> AllocateIncoming(
      const ShardKey& key, size_t bytes, bool from_client) = 0;
  // The admitted bytes of `key` arrived (either carrier), exactly as many
  // as admitted. `from_client` tells PUT from PUSH.
  virtual absl::Status Deliver(const ShardKey& key,
                               std::shared_ptr<Storage> data,
                               bool from_client) = 0;
  // `key` will not arrive: the sender says it failed upstream (`error` is
  // its status, code and message as the sender had it), or its admitted
  // bytes could not be received.
  virtual void DeliverError(const ShardKey& key, const absl::Status& error) = 0;
  // Whether this end serves PUSH_IPC (it can open CUDA IPC handles and
  // copy into device memory of its own): said to every peer that connects
  // over the unix socket. By default not.
  virtual bool OpensCudaIpc() { return false; }
  // A PUSH_IPC of `key` (after Authorize and AdmitGeneration): admits the
  // shard as AdmitIncoming does, then maps `shard` and copies it into
  // device memory of its own, and stores it. OK: stored (the sender may
  // free its memory). An error: nothing was taken for `key` (no charge,
  // its entry as it was, unless admitting it failed it: a size that
  // differs from the declared one), so the sender sends the bytes instead.
  // Never called unless OpensCudaIpc.
  virtual absl::Status ReceiveIpc(const ShardKey& key, const IpcShard& shard) {
    return absl::UnimplementedError("this worker opens no CUDA IPC");
  }
  // An OPS frame's `message` from `peer` (the server's ops to a worker: a
  // proto::ServerToWorker in wire form; a client's to the server: a
  // proto::ClientToServer; the handler may take its bytes), stamped with
  // `generation`, after Authorize: applied before the next frame of the
  // connection is read. An error closes the connection. By default this
  // end takes no ops.
  virtual absl::Status ApplyOps(const DataPlanePeer& peer, uint64_t generation,
                                std::string& message) {
    return absl::UnimplementedError("this data plane takes no ops");
  }
  // The first OPS frame of a connection, before it is applied: `fd` is
  // the connection's socket, open until OpsEnded returns. The handler may
  // keep a dup of it to send frames back (a worker's REPORTS:
  // FrameSocket::SendMessageOn) or to shut it down (the server, ending a
  // client's session); nothing else reads or writes it here. An error
  // closes the connection (the frame is not applied).
  virtual absl::Status OpsConnectionOpened(const DataPlanePeer& peer,
                                           uint64_t generation, int fd) {
    return absl::OkStatus();
  }
  // After the first OPS frame of a connection is applied: whether the
  // handler reads the connection's later frames itself (the simulated
  // hosts' process reads thousands of them on one epoll thread:
  // FramePoller, frame_poller.h). True: it keeps a dup of `fd` to read,
  // and from then on this end neither reads the connection nor says
  // OpsEnded for it (the handler's reader says when it ends). Asked only
  // when nothing past that frame was read yet. By default the
  // connection's thread reads on.
  virtual bool TakeOpsConnection(const DataPlanePeer& peer, uint64_t generation,
                                 int fd) {
    return false;
  }
  // The connection that carried `peer`'s OPS frames of `generation` ended
  // (`why`: the peer closed it, an I/O error, ApplyOps' error, or the
  // server stopping). Called once per such connection, from its thread.
  virtual void OpsEnded(const DataPlanePeer& peer, uint64_t generation,
                        const absl::Status& why) {}
  // A client's RELAY (after Authorize): the connection's socket `fd`
  // takes the answers relayed to `peer` from now on, until RelayEnded. The
  // handler keeps a dup of it (RelayLinks::Open, which also sends the
  // ACK); nothing else writes it, and this end then only waits for its
  // end (a frame from the client closes it). An error refuses it (the
  // client hears it, and fetches as before). By default relays are
  // refused.
  virtual absl::Status OpenRelay(const DataPlanePeer& peer, int fd) {
    return absl::UnimplementedError("this data plane relays no answers");
  }
  // The connection OpenRelay took ended (the client closed it, an error,
  // the server stopping); `fd` is still open, closed after this returns.
  virtual void RelayEnded(const DataPlanePeer& peer, int fd) {}
  // Blocks until `key` is ready; returns its bytes or its error.
  virtual absl::StatusOr<std::shared_ptr<const Storage>> AwaitReady(
      const ShardKey& key) = 0;
  // AwaitReady that, where it blocks, also hands `on_ready` the result
  // from the thread that readies the shard, as soon as it does: the data
  // plane then answers a FETCH of a small value or a WAIT from there, one
  // thread wake-up fewer on a call's round trip (the connection's thread,
  // woken after, finds it answered). The hook may run after this returned,
  // or more than once; it checks for itself whether it is still wanted.
  // By default it never runs.
  using ReadyHook = std::function<void(
      absl::StatusOr<std::shared_ptr<const Storage>> result)>;
  virtual absl::StatusOr<std::shared_ptr<const Storage>> AwaitReadyTelling(
      const ShardKey& key, const ReadyHook& on_ready) {
    return AwaitReady(key);
  }
  // A FETCH's or WAIT's wait that does not hold the connection's thread:
  // the result now where AwaitReadyTelling would not block; else nullopt,
  // with `on_ready` kept as AwaitReadyTelling keeps it and `poke` called
  // (from under the handler's lock: it only wakes) whenever the wait would
  // look again without a result. The connection's thread then goes back to
  // its socket, and on its next wake-up ends the watch (EndWatch) or
  // finishes the wait (AwaitWatched). By default: AwaitReadyTelling, now.
  struct ReadyWatch {
    uint64_t id = 0;
    absl::Time deadline = absl::InfiniteFuture();  // then AwaitWatched
  };
  virtual std::optional<absl::StatusOr<std::shared_ptr<const Storage>>>
  WatchReady(const ShardKey& key, const ReadyHook& on_ready,
             std::function<void()> poke, ReadyWatch* watch) {
    return AwaitReadyTelling(key, on_ready);
  }
  // Ends a watch WatchReady kept (its hook may still run once).
  virtual void EndWatch(const ShardKey& key, const ReadyWatch& watch) {}
  // EndWatch, then AwaitReady: a key still unknown is waited for until
  // the watch's deadline.
  virtual absl::StatusOr<std::shared_ptr<const Storage>> AwaitWatched(
      const ShardKey& key, const ReadyWatch& watch) {
    return AwaitReady(key);
  }
  // The serialized executable of content fingerprint `fingerprint`, now,
  // or why not (none, still compiling): FETCH_EXECUTABLE's reply, after
  // Authorize. Should not wait long: the asker compiles instead. By
  // default there are none.
  virtual absl::StatusOr<std::shared_ptr<const Storage>> SerializedExecutable(
      uint64_t fingerprint) {
    return absl::UnimplementedError("this data plane serves no executables");
  }
};

struct DataPlaneServerOptions {
  std::string tcp_host = "127.0.0.1";  // TCP listens on port 0 here
  std::string unix_name;  // abstract socket name; empty disables unix
  // Connections that proved a credential, open at once; past it a new one
  // is refused at its handshake (RESOURCE_EXHAUSTED). Each holds a thread.
  int max_connections = 1024;
  // Connections still in their handshake, which anyone can open: past this
  // many, the oldest is closed to make room for the new one, so a flood
  // without a credential costs a bounded set of threads and never takes a
  // proven peer's slot; a legitimate handshake (a round trip) completes
  // long before a flood cycles through the pool.
  int max_handshaking = 256;
  // The whole handshake, from accept to WELCOME, must end within this time
  // (a peer sending a byte now and then keeps no slot for longer).
  absl::Duration handshake_timeout = absl::Seconds(5);
  // Once a frame has begun, each further read of it (header or payload)
  // must make progress within this time, or the connection is closed. An
  // idle connection between frames waits without limit.
  absl::Duration frame_timeout = absl::Seconds(10);
  // Where the puts, fetches and waits it serves to clients are recorded
  // (timeline/timeline.h; not owned, outlives the server), or null.
  Timeline* timeline = nullptr;
  // The clock of the handshake deadlines (not owned, outlives the server).
  Clock* clock = Clock::Real();
};

// Accepts connections on TCP and (optionally) a unix socket; one thread per
// connection, blocking I/O (idle connections sleep in poll).
class DataPlaneServer {
 public:
  static absl::StatusOr<std::unique_ptr<DataPlaneServer>> Start(
      const DataPlaneServerOptions& options, DataPlaneHandler* handler,
      DataPlaneCounters* counters);
  // Stops accepting, shuts every connection down and joins all threads.
  // A thread blocked inside the handler (AwaitReady, AllocateIncoming) is
  // joined too: the handler's owner releases those calls first.
  virtual ~DataPlaneServer() = default;
  virtual std::string tcp_address() const = 0;  // "127.0.0.1:PORT"
  virtual std::string unix_path() const = 0;    // "" when disabled
};

// One connection to one worker's data plane. Not thread-safe: one user at
// a time (the worker keeps one per peer on its sender thread; the client
// keeps a pool), except that on the server's ops connection the reports
// poller reads its socket (socket_fd) while another thread sends (SendOps,
// WritableNow). An I/O error
// closes the connection and is returned; the peer may have died.
class DataPlaneConnection {
 public:
  // Connects to unix_path when non-empty (same machine, see
  // LocalMachineId), else tcp_address; to tcp_address too when the unix
  // socket cannot be reached (uses_shared_memory() tells which).
  // The connection opens with the handshake, proving `me` (a refusal is
  // PermissionDenied, and is not retried over TCP). The handshake waits
  // for the worker at most 10 s, and gives up (Cancelled) once
  // `cancelled`, if given, returns true: checked every 50 ms, it is how a
  // client stops connecting to a worker the server declared down.
  // Every deadline (the handshake's, AwaitWaits') is kept on `clock`,
  // which outlives the connection. A TCP connect that gets no answer gives
  // up after `tcp_timeout` (a port a firewall drops).
  static absl::StatusOr<std::unique_ptr<DataPlaneConnection>> Connect(
      const std::string& tcp_address, const std::string& unix_path,
      DataPlaneCounters* counters, const DataPlaneIdentity& me = {},
      const std::function<bool()>& cancelled = {}, Clock* clock = Clock::Real(),
      absl::Duration tcp_timeout = absl::Seconds(10));
  virtual ~DataPlaneConnection() = default;

  virtual bool uses_shared_memory() const = 0;
  // Whether the worker at the far end said in the handshake that it serves
  // PUSH_IPC (kCapabilityCudaIpc; only ever over the unix socket).
  virtual bool peer_opens_cuda_ipc() const = 0;
  // False once an I/O or protocol error broke the connection. An error the
  // worker sent (an ERROR frame: the shard failed, was not found, ...) leaves
  // it in step and usable.
  virtual bool healthy() const = 0;
  // One-way. Returns once the bytes are handed to the kernel.
  virtual absl::Status Push(const ShardKey& key, const Storage& data) = 0;
  // One-way: `key` failed upstream; the peer's readers get `error`, code
  // and message.
  virtual absl::Status PushError(const ShardKey& key,
                                 const absl::Status& error) = 0;
  // Waits for the worker's ACK (the shard is stored). `sent`, if not null,
  // counts the payload bytes as they go (each chunk on TCP, a passed memfd
  // at once): another thread may read it meanwhile (a client's progress).
  virtual absl::Status Put(const ShardKey& key, const Storage& data,
                           std::atomic<int64_t>* sent) = 0;
  absl::Status Put(const ShardKey& key, const Storage& data) {
    return Put(key, data, nullptr);
  }
  // PUSH_IPC (peer_opens_cuda_ipc only): waits for the worker's answer. OK
  // once it stored the shard (the exported memory may be freed); an error
  // with the connection still healthy() is the worker's reason it took
  // nothing (send the bytes by Push); one that broke it is an I/O error
  // (whether the worker stored it is unknown).
  virtual absl::Status PushIpc(const ShardKey& key, const IpcShard& shard) = 0;
  // Blocks until the shard is ready on the worker; its bytes or its error.
  // `received`, if not null, counts the payload bytes as they arrive, as
  // Put's `sent` does.
  virtual absl::StatusOr<std::shared_ptr<Storage>> Fetch(
      const ShardKey& key, std::atomic<int64_t>* received) = 0;
  absl::StatusOr<std::shared_ptr<Storage>> Fetch(const ShardKey& key) {
    return Fetch(key, nullptr);
  }
  virtual absl::Status Wait(const ShardKey& key) = 0;
  // One-way (the server's ops connection): `message`, a
  // proto::ServerToWorker in wire form, as one OPS frame. Returns once the
  // bytes are handed to the kernel; blocks while the worker's socket is
  // full (Shutdown wakes it).
  virtual absl::Status SendOps(absl::string_view message) = 0;
  // The connection's socket, for a reader that waits on many connections at
  // once (the server's reports poller, which reads it with MSG_DONTWAIT
  // and never writes it; it keeps a dup). Open while the connection is.
  virtual int socket_fd() const = 0;
  // Whether the socket has room for a small frame now (a send would not
  // block), asked without waiting. Safe from another thread while no call
  // is under way.
  virtual bool WritableNow() const = 0;
  // Blocks until the worker answers: the serialized executable of content
  // `fingerprint` (a worker's connection only), or the worker's error.
  virtual absl::StatusOr<std::shared_ptr<Storage>> FetchExecutable(
      uint64_t fingerprint) = 0;
  // Waits for many shards in one round trip: SendWaits sends a WAIT for
  // each of `keys` at once (the worker answers them in order; a client
  // sends to every worker before it reads), then AwaitWaits, given the same
  // keys, reads the answers until all have come or `deadline` passes. It
  // returns how many of `keys`, from the first, were confirmed ready (all
  // of them, or fewer at the deadline), or the error of the first shard
  // that failed. Unless all were answered, the connection is left broken
  // (answers are still due).
  virtual absl::Status SendWaits(const std::vector<ShardKey>& keys) = 0;
  virtual absl::StatusOr<size_t> AwaitWaits(const std::vector<ShardKey>& keys,
                                            absl::Time deadline) = 0;
  // RELAY: from now on this connection takes the answers the server relays
  // for this client's calls (a call sent with Call.relay set); OK once the
  // worker took it, DeadlineExceeded (the connection broken) where its
  // answer did not come by `deadline`. Nothing else may be asked on it
  // afterwards.
  virtual absl::Status OpenRelay(absl::Time deadline) = 0;
  // The next answer relayed on a connection OpenRelay opened, waiting at
  // most until `deadline` (DeadlineExceeded, the connection still in step).
  // `result`: the value or the error of `key` (a shard of -1: every shard
  // of the buffer failed with it), or nullopt where the worker did not
  // relay it (SKIP: fetch it). An I/O error breaks the connection.
  struct Relayed {
    ShardKey key;
    std::optional<absl::StatusOr<std::shared_ptr<Storage>>> result;
  };
  virtual absl::StatusOr<Relayed> ReadRelayed(absl::Time deadline) = 0;
  // Wakes the user blocked in one of the calls above (it returns an error)
  // and breaks the connection. The one method safe to call from another
  // thread, while the connection exists: how a client stops waiting on a
  // worker that the server declared down.
  virtual void Shutdown() = 0;
};

}  // namespace plexus::transport
