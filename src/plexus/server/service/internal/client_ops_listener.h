// Internal: the server's ops listener, where client sessions send their
// ops as frames instead of on their gRPC stream.
//
// A client session opens on its gRPC stream as ever (hello, tenant
// credential, resume). Where the server has a listener (not under TLS: the
// data plane does not encrypt; not with --client-ops-on-grpc), the hello
// names it (ServerToClient.ops_*) and gives the stream a generation; the
// client connects, proving its session's client credential (the data
// plane's handshake, transport/internal/handshake.h), sends an empty
// frame (the connection is the session's from its first frame), writes
// one last message on the stream (ClientToServer.ops_on_frames), and every
// later message as one OPS frame, stamped with the generation. The connection's
// thread applies each frame as the stream's reader applied a message: one
// at a time, in order, after the stream's last message (two sockets: a
// frame may arrive first and waits for it). No gRPC thread hand-off, and
// no flow-control frame back per message.
//
//   Open ──(marker read)──▶ frames applied ──Close──▶ gone
//
// The stream stays the session's life: its end ends the session. Close
// first waits (once the marker was read; at most `drain`) for the
// connection's end, so the frames a client wrote before it ended its
// stream are applied first (a client closes its connection before it
// half-closes the stream); then it shuts
// the connection down, cancels what an apply under way waits on (the
// caller's `cancel`), waits for that apply, and forgets the session: no
// frame of it is applied after Close returns.
//
// A frame of another generation, of a session not open, not a
// ClientToServer, a second connection for one session, or one a client
// sends before its session is open closes the connection (logged); the
// client then finds its writes failing and opens a new session. Anyone may
// connect; only a session's own credential passes the handshake, and a
// connection still in its handshake holds a bounded slot
// (DataPlaneServerOptions::max_handshaking).
//
// Thread-safe: connection threads call the handler, the session's handler
// thread Open, MarkerRead and Close. `mu_` is a leaf, never held across an
// apply or I/O.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "plexus/common/clock.h"
#include "plexus/common/credentials.h"
#include "plexus/proto/plexus.pb.h"
#include "plexus/transport/data_plane.h"

namespace plexus {

class ClientOpsListener final : public transport::DataPlaneHandler {
 public:
  // One batch of the session, applied on the connection's thread (the
  // server's HandleClientBatch); an error closes the connection.
  using Apply = std::function<absl::Status(proto::ClientToServer& msg)>;

  // Listens on TCP at `tcp_host` (HOST: a free port; HOST:PORT; "" or
  // "0.0.0.0": every interface) and on an abstract unix socket of a name
  // of its own.
  static absl::StatusOr<std::unique_ptr<ClientOpsListener>> Start(
      const std::string& tcp_host, const ClusterSecret& secret, Clock* clock);
  ~ClientOpsListener() override;  // stops the listener, joins its threads

  std::string unix_name() const { return server_->unix_path(); }
  int tcp_port() const { return tcp_port_; }

  // A session of client `client_id` opened on its stream, with
  // `generation` (unique in this server's life): its frames are taken
  // once MarkerRead, each given to `apply`.
  void Open(uint64_t generation, uint64_t client_id, Apply apply);
  // The stream's last message (ops_on_frames) was read. False: no open
  // session has this generation.
  bool MarkerRead(uint64_t generation);
  // The stream ended: see the header comment. `cancel` wakes an apply
  // that waits (the session's context's TryCancel).
  void Close(uint64_t generation, absl::Duration drain,
             const std::function<void()>& cancel);
  // Frames of ops taken so far for session `generation` (0 if none or
  // closed).
  int64_t frames(uint64_t generation) const;

  // --- transport::DataPlaneHandler (connection threads)
  absl::StatusOr<Credential> CredentialFor(
      const transport::DataPlanePeer& peer) override;
  absl::Status Authorize(transport::DataPlaneRequest request,
                         const ShardKey& key,
                         const transport::DataPlanePeer& peer) override;
  absl::Status OpsConnectionOpened(const transport::DataPlanePeer& peer,
                                   uint64_t generation, int fd) override;
  absl::Status ApplyOps(const transport::DataPlanePeer& peer,
                        uint64_t generation, std::string& message) override;
  void OpsEnded(const transport::DataPlanePeer& peer, uint64_t generation,
                const absl::Status& why) override;
  // Nothing but OPS is served here: every shard request is refused by
  // Authorize before these could run.
  absl::Status AdmitIncoming(const ShardKey&, size_t, bool) override;
  absl::StatusOr<std::shared_ptr<Storage>> AllocateIncoming(const ShardKey&,
                                                            size_t,
                                                            bool) override;
  absl::Status Deliver(const ShardKey&, std::shared_ptr<Storage>,
                       bool) override;
  void DeliverError(const ShardKey&, const absl::Status&) override {}
  absl::StatusOr<std::shared_ptr<const Storage>> AwaitReady(
      const ShardKey&) override;

 private:
  ClientOpsListener(const ClusterSecret& secret) : secret_(secret) {}

  struct Session {
    uint64_t client_id = 0;
    Apply apply;
    bool marker_read = false;  // the stream's last message was read
    bool closing = false;      // Close began: no frame is applied any more
    bool connected = false;    // a connection carries its frames
    bool ended = false;        // that connection ended
    int fd = -1;               // a dup of its socket, until it ends
    int inside = 0;            // frames waiting for the marker or applied
    int64_t frames = 0;
  };

  const ClusterSecret secret_;
  transport::DataPlaneCounters counters_;
  std::unique_ptr<transport::DataPlaneServer> server_;
  int tcp_port_ = 0;
  mutable absl::Mutex mu_;
  // By generation. Node-based: a connection thread keeps its session's
  // address while it waits or applies (Close waits for it to leave).
  absl::node_hash_map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
  // Open sessions per client id (the handshake names a client, not a
  // generation).
  absl::flat_hash_map<uint64_t, int> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace plexus
