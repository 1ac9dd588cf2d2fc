#include "plexus/transport/internal/handshake.h"

#include <openssl/rand.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "plexus/transport/internal/socket_io.h"

namespace plexus::transport::internal {
namespace {

// Wire codes of the roles that may open a connection (HELLO's shard).
constexpr int32_t kWireClient = 1;
constexpr int32_t kWireWorker = 2;
constexpr int32_t kWireServer = 3;

absl::StatusOr<CredentialRole> RoleOfWire(int32_t code) {
  switch (code) {
    case kWireClient:
      return CredentialRole::kClient;
    case kWireWorker:
      return CredentialRole::kWorker;
    case kWireServer:
      return CredentialRole::kServer;
    default:
      return absl::PermissionDeniedError(
          absl::StrCat("data-plane handshake: unknown role ", code));
  }
}

int32_t WireOfRole(CredentialRole role) {
  switch (role) {
    case CredentialRole::kWorker:
      return kWireWorker;
    case CredentialRole::kServer:
      return kWireServer;
    default:
      return kWireClient;
  }
}

std::string PeerString(const DataPlanePeer& peer) {
  switch (peer.role) {
    case CredentialRole::kWorker:
      return "a worker";
    case CredentialRole::kServer:
      return "the server";
    default:
      return absl::StrCat("client ", peer.id);
  }
}

absl::StatusOr<std::string> Nonce() {
  std::string nonce(kNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<uint8_t*>(nonce.data()), kNonceBytes) != 1) {
    return absl::InternalError("data-plane handshake: RAND_bytes failed");
  }
  return nonce;
}

// The proof of one side (`side`: "connector" or "acceptor"), over both
// nonces and the claimed identity.
Proof SideProof(const Credential& credential, absl::string_view side,
                const DataPlanePeer& peer, absl::string_view nonce_a,
                absl::string_view nonce_c) {
  return ProofOf(credential,
                 absl::StrCat("plexus/dp/", kFrameVersion, "/", side, "/",
                              CredentialRoleName(peer.role), "/", peer.id, "/",
                              nonce_a, nonce_c));
}

bool SameProof(const Proof& want, absl::string_view got) {
  return got.size() == want.size() &&
         ConstantTimeEqual(want.data(),
                           reinterpret_cast<const uint8_t*>(got.data()),
                           want.size());
}

// Waits until `socket` has bytes to read (or an end), at most until
// `deadline` on `clock`, and no longer than `cancelled` allows.
absl::Status AwaitReadable(FrameSocket& socket, Clock& clock,
                           absl::Time deadline,
                           const std::function<bool()>& cancelled) {
  while (true) {
    if (cancelled && cancelled()) {
      return absl::CancelledError(
          "data-plane handshake: given up (the worker was declared down, "
          "or the connection is no longer wanted)");
    }
    const absl::Duration left = deadline - clock.Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("data-plane handshake: no answer within ",
                       absl::FormatDuration(kHandshakeTimeout)));
    }
    pollfd p{socket.fd(), POLLIN, 0};
    const int ms = static_cast<int>(
        absl::ToInt64Milliseconds(std::min(left, kCancelPoll)) + 1);
    const int ready = poll(&p, 1, ms);
    if (ready > 0) return absl::OkStatus();
    if (ready < 0 && errno != EINTR) return IoError("poll", errno);
  }
}

// Reads the next frame, which must be `want`, with its payload.
absl::StatusOr<std::pair<FrameHeader, std::string>> ReadExpected(
    FrameSocket& socket, FrameType want) {
  bool eof = false;
  absl::StatusOr<FrameHeader> header =
      socket.ReadHeader(&eof, /*idle_wait=*/false);
  if (!header.ok()) return header.status();
  if (header->frame_type() == FrameType::kError) {
    return socket.ReadErrorStatus(*header);  // the other side refused
  }
  if (header->frame_type() != want) {
    return absl::PermissionDeniedError(
        absl::StrCat("data-plane handshake: expected ", FrameTypeName(want),
                     ", got ", FrameTypeName(header->frame_type()),
                     " (every connection opens with the handshake)"));
  }
  absl::StatusOr<std::string> payload = socket.ReadMessage(*header);
  if (!payload.ok()) return payload.status();
  return std::make_pair(*header, *std::move(payload));
}

}  // namespace

absl::StatusOr<DataPlanePeer> AcceptHandshake(FrameSocket& socket,
                                              const CredentialLookup& lookup,
                                              uint32_t capabilities,
                                              const Admission& admit) {
  absl::StatusOr<std::string> nonce_a = Nonce();
  if (!nonce_a.ok()) return socket.Break(nonce_a.status());
  FrameHeader challenge;
  challenge.type = static_cast<uint16_t>(FrameType::kChallenge);
  if (absl::Status s = socket.SendFrame(challenge, *nonce_a); !s.ok()) return s;

  // Tells the peer why (while the stream is still in step), then closes.
  auto refuse = [&](absl::Status why) {
    if (!socket.broken()) {
      FrameHeader error;
      error.type = static_cast<uint16_t>(FrameType::kError);
      error.status_code = static_cast<int32_t>(why.code());
      socket.SendFrame(error, why.message()).IgnoreError();
    }
    return socket.Break(why);
  };
  auto hello = ReadExpected(socket, FrameType::kHello);
  if (!hello.ok()) return refuse(hello.status());
  const auto& [header, payload] = *hello;
  absl::StatusOr<CredentialRole> role = RoleOfWire(header.shard);
  if (!role.ok()) return refuse(role.status());
  const DataPlanePeer peer{*role, header.buffer_id};
  absl::StatusOr<Credential> credential = lookup(peer);
  if (!credential.ok()) {
    return refuse(absl::PermissionDeniedError(absl::StrCat(
        "data-plane handshake: ", PeerString(peer),
        " may not connect here: ", credential.status().message())));
  }
  const absl::string_view nonce_c(payload.data(), kNonceBytes);
  const absl::string_view proof_c(payload.data() + kNonceBytes, kProofSize);
  if (!SameProof(SideProof(*credential, "connector", peer, *nonce_a, nonce_c),
                 proof_c)) {
    return refuse(absl::PermissionDeniedError(absl::StrCat(
        "data-plane handshake refused: the proof does not match the "
        "credential of ",
        PeerString(peer),
        " (another cluster's secret, or a session the "
        "server did not issue)")));
  }
  if (admit) {
    if (absl::Status room = admit(peer); !room.ok()) return refuse(room);
  }
  const Proof proof_a =
      SideProof(*credential, "acceptor", peer, *nonce_a, nonce_c);
  FrameHeader welcome;
  welcome.type = static_cast<uint16_t>(FrameType::kWelcome);
  welcome.shard = static_cast<int32_t>(capabilities);
  if (absl::Status s = socket.SendFrame(
          welcome,
          absl::string_view(reinterpret_cast<const char*>(proof_a.data()),
                            proof_a.size()));
      !s.ok()) {
    return s;
  }
  return peer;
}

absl::Status ConnectHandshake(FrameSocket& socket, const DataPlaneIdentity& me,
                              const std::function<bool()>& cancelled,
                              uint32_t* capabilities, Clock* clock) {
  // Bounded: an acceptor that never answers (a stopped worker) does not
  // hold the caller beyond the deadline, or beyond `cancelled`.
  const absl::Time deadline = clock->Now() + kHandshakeTimeout;
  if (absl::Status s = SetRecvTimeout(socket.fd(), kHandshakeTimeout);
      !s.ok()) {
    return socket.Break(s);
  }
  if (absl::Status s = AwaitReadable(socket, *clock, deadline, cancelled);
      !s.ok()) {
    return socket.Break(s);
  }
  auto challenge = ReadExpected(socket, FrameType::kChallenge);
  if (!challenge.ok()) return socket.Break(challenge.status());
  const std::string& nonce_a = challenge->second;
  absl::StatusOr<std::string> nonce_c = Nonce();
  if (!nonce_c.ok()) return socket.Break(nonce_c.status());
  const Proof proof_c =
      SideProof(me.credential, "connector", me.peer, nonce_a, *nonce_c);
  FrameHeader hello;
  hello.type = static_cast<uint16_t>(FrameType::kHello);
  hello.shard = WireOfRole(me.peer.role);
  hello.buffer_id = me.peer.id;
  std::string payload = *nonce_c;
  payload.append(reinterpret_cast<const char*>(proof_c.data()), kProofSize);
  if (absl::Status s = socket.SendFrame(hello, payload); !s.ok()) return s;
  if (absl::Status s = AwaitReadable(socket, *clock, deadline, cancelled);
      !s.ok()) {
    return socket.Break(s);
  }
  auto welcome = ReadExpected(socket, FrameType::kWelcome);
  if (!welcome.ok()) return socket.Break(welcome.status());
  if (!SameProof(
          SideProof(me.credential, "acceptor", me.peer, nonce_a, *nonce_c),
          welcome->second)) {
    return socket.Break(absl::PermissionDeniedError(
        "data-plane handshake: the worker could not prove it holds this "
        "cluster's secret (another cluster, or not a worker)"));
  }
  if (capabilities != nullptr) {
    *capabilities = static_cast<uint32_t>(welcome->first.shard);
  }
  // Replies to requests may take as long as the shard does.
  if (absl::Status s = SetRecvTimeout(socket.fd(), absl::ZeroDuration());
      !s.ok()) {
    return socket.Break(s);
  }
  return absl::OkStatus();
}

}  // namespace plexus::transport::internal
