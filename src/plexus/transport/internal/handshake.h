// The data-plane handshake: the first frames on every data-plane connection,
// unix socket or TCP. The connecting side proves which credential it holds
// (common/credentials.h) without sending it, the accepting side (a worker,
// which derives every credential from the cluster secret) proves it knows
// the same credential, and the connection is then bound to that identity:
// every later request on it is authorized against the bound peer, and no
// frame carries a credential. A sniffer sees two fresh nonces and two
// proofs over them: nothing it can replay on another connection.
//
//   connector (client, worker, server)       acceptor (worker)
//                    <-- CHALLENGE   payload: nonce_a (32 random bytes),
//                                    sent as soon as the connection is
//                                    accepted
//   HELLO  -->                       shard: role (1 client, 2 worker,
//                                    3 server), buffer_id: id (client id;
//                                    0 otherwise), payload: nonce_c (32 random
//                                    bytes) then proof_c (32 bytes)
//                    <-- WELCOME     payload: proof_a (32 bytes); shard:
//                                    the acceptor's capabilities
//                                    (kCapability*, data_plane.h)
//                    <-- or ERROR    PERMISSION_DENIED and why; the acceptor
//                                    closes the connection
//
//   proof_c = ProofOf(credential, "plexus/dp/" kFrameVersion "/connector/"
//                                 role "/" id "/" nonce_a nonce_c)
//   proof_a = the same with "acceptor" for "connector"
//
// The connector checks proof_a before it sends a request, so it never
// hands a put's bytes to a process that does not hold the cluster's secret.
// Both sides read each handshake frame within a deadline; a connection
// that sends anything but a valid HELLO first is refused and closed.
//
// What it does not do: encrypt or authenticate the frames that follow (a
// party that can rewrite packets in flight can still change them; see
// docs/security.md).
#pragma once

#include <functional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/common/clock.h"
#include "plexus/common/credentials.h"
#include "plexus/transport/data_plane.h"
#include "plexus/transport/internal/frame_socket.h"

namespace plexus::transport::internal {

inline constexpr size_t kNonceBytes = 32;
inline constexpr absl::Duration kHandshakeTimeout = absl::Seconds(10);

// The credential a peer must prove it holds; an error refuses it.
using CredentialLookup =
    std::function<absl::StatusOr<Credential>(const DataPlanePeer& peer)>;

// Whether a peer that proved its credential may stay (room for it); an
// error refuses it with that status.
using Admission = std::function<absl::Status(const DataPlanePeer& peer)>;

// Acceptor side. Returns the proven peer, or the reason it was refused
// (the peer was told, and the socket is broken).
// `capabilities`: what WELCOME tells the connector this end serves.
// `admit`, if given, is asked once the peer's proof checks out, before
// WELCOME.
absl::StatusOr<DataPlanePeer> AcceptHandshake(FrameSocket& socket,
                                              const CredentialLookup& lookup,
                                              uint32_t capabilities = 0,
                                              const Admission& admit = {});

// Connector side. PermissionDenied when the acceptor refuses `me` or
// cannot prove it knows `me`'s credential; the socket is then broken.
// Each wait for the acceptor ends at kHandshakeTimeout, or, checked every
// kCancelPoll, once `cancelled` (if given) returns true: Cancelled, saying
// so (the acceptor's owner was declared down, the caller is closing).
inline constexpr absl::Duration kCancelPoll = absl::Milliseconds(50);
// `*capabilities`, if given, is set to what the acceptor said it serves.
// The deadline is kept on `clock`.
absl::Status ConnectHandshake(FrameSocket& socket, const DataPlaneIdentity& me,
                              const std::function<bool()>& cancelled = {},
                              uint32_t* capabilities = nullptr,
                              Clock* clock = Clock::Real());

}  // namespace plexus::transport::internal
