// Credentials: who may touch what, on both planes. An id is not a
// permission; a credential is.
//
// One secret per cluster (32 random bytes). Every credential is derived from
// it, so the server and every worker can check one without a table or a
// round trip:
//
//   credential(role, id) = first 16 bytes of HMAC-SHA256(secret,
//                                                        "plexus/" role "/" id)
//
//   role      id            held by                 lets it
//   client    client id     that client's session   put, fetch and wait on
//             (decimal)                             keys whose buffer id
//                                                   names it
//   worker    0             every worker            push to peers, register
//   admin     0             the operator            shut the server down
//   tenant    tenant name   the tenant's users      open a client session as
//                                                   that tenant (its share
//                                                   and quotas, tenants.h)
//
// The server issues a client its credential when its session opens; workers
// get the secret from their environment (PLEXUS_CLUSTER_SECRET, hex) or a
// file; an embedded cluster makes a secret of its own and hands it to its
// workers, so loopback needs no set-up and every check applies there too.
// A tenant's credential, written as 32 hex digits, is its *tenant token*:
// the operator prints it (`plexus token --tenant NAME`) and hands it to the
// tenant's users ($PLEXUS_TENANT, $PLEXUS_TENANT_TOKEN); a process that
// holds the secret derives it itself.
//
// A credential is never sent where it can be read off the wire and reused:
// the data plane proves it with ProofOf over fresh nonces instead
// (transport/internal/handshake.h); the control plane sends it inside gRPC,
// which is TLS when the operator gives certificates.
// Secrets and credentials never appear in logs or in status (Redacted()).
//
// Thread-safe: values are immutable.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace plexus {

inline constexpr size_t kCredentialSize = 16;
using Credential = std::array<uint8_t, kCredentialSize>;

// kServer: the server's own, which it proves when it opens the ops
// connection to a worker's data plane (transport/data_plane.h).
enum class CredentialRole { kClient, kWorker, kAdmin, kTenant, kServer };
// "client", "worker", "admin", "tenant", "server": the role's word in the
// derivation.
const char* CredentialRoleName(CredentialRole role);

// A keyed proof of `message` under `credential`: HMAC-SHA256, 32 bytes.
// Whoever holds the credential can make it; seeing it reveals nothing
// reusable about the credential.
inline constexpr size_t kProofSize = 32;
using Proof = std::array<uint8_t, kProofSize>;
Proof ProofOf(const Credential& credential, absl::string_view message);

// A tenant name: 1 to 64 of [A-Za-z0-9._-]. InvalidArgument naming the
// problem otherwise (names are shown in status and written in logs).
absl::Status CheckTenantName(absl::string_view name);

class ClusterSecret {
 public:
  static constexpr size_t kSize = 32;
  // 32 bytes from the kernel's random source.
  static absl::StatusOr<ClusterSecret> Generate();
  // `given` if set, else Generate(): a process that was handed no secret
  // (an in-process server, a worker without a server) still checks every
  // credential, against one of its own.
  static absl::StatusOr<ClusterSecret> GivenOrGenerate(
      const std::optional<ClusterSecret>& given);
  // From 64 hex digits (what ToHex writes).
  static absl::StatusOr<ClusterSecret> FromHex(absl::string_view hex);
  // From $PLEXUS_CLUSTER_SECRET, else the file `path` (its first line, hex),
  // else NotFound naming both.
  static absl::StatusOr<ClusterSecret> Load(const std::string& path);

  std::string ToHex() const;
  // The one derivation rule (the table above); a numeric id is written in
  // decimal, so Derive(role, 7) == Derive(role, "7").
  Credential Derive(CredentialRole role, absl::string_view id) const;
  Credential Derive(CredentialRole role, uint64_t id = 0) const;
  // Constant time; false for a wrong length.
  bool Verify(CredentialRole role, absl::string_view id,
              const uint8_t* credential, size_t size) const;
  bool Verify(CredentialRole role, uint64_t id, const uint8_t* credential,
              size_t size) const;

 private:
  std::array<uint8_t, kSize> bytes_{};
};

// The environment variable that carries the secret to a cluster's processes.
inline constexpr char kClusterSecretEnv[] = "PLEXUS_CLUSTER_SECRET";
// A client's tenant and its token (TenantTokenHex), where it holds no
// secret.
inline constexpr char kTenantEnv[] = "PLEXUS_TENANT";
inline constexpr char kTenantTokenEnv[] = "PLEXUS_TENANT_TOKEN";
// The tenant of a session that names none (server/model/tenants.h's
// kDefaultTenant).
inline constexpr char kDefaultTenantName[] = "default";

// A tenant token: a tenant credential as 32 hex digits, and back
// (InvalidArgument for anything else).
std::string TenantTokenHex(const Credential& credential);
absl::StatusOr<Credential> TenantTokenFromHex(absl::string_view hex);
// The operator's token: the admin credential as 32 hex digits (what the
// live page and /metrics take, web/viewer.h; `plexus token --admin`).
std::string OperatorTokenHex(const ClusterSecret& secret);

// Equality of two byte strings in time independent of their contents.
bool ConstantTimeEqual(const uint8_t* a, const uint8_t* b, size_t size);

// "<redacted 16 bytes>": what a log line shows instead of a credential.
std::string Redacted(size_t size);

}  // namespace plexus
