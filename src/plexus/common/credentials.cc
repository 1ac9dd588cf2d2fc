#include "plexus/common/credentials.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace plexus {

const char* CredentialRoleName(CredentialRole role) {
  switch (role) {
    case CredentialRole::kClient:
      return "client";
    case CredentialRole::kWorker:
      return "worker";
    case CredentialRole::kAdmin:
      return "admin";
    case CredentialRole::kTenant:
      return "tenant";
    case CredentialRole::kServer:
      return "server";
  }
  return "?";
}

Proof ProofOf(const Credential& credential, absl::string_view message) {
  uint8_t mac[EVP_MAX_MD_SIZE];
  unsigned int mac_size = 0;
  HMAC(EVP_sha256(), credential.data(), static_cast<int>(credential.size()),
       reinterpret_cast<const uint8_t*>(message.data()), message.size(), mac,
       &mac_size);
  Proof proof;
  std::copy(mac, mac + kProofSize, proof.begin());
  return proof;
}

absl::Status CheckTenantName(absl::string_view name) {
  if (name.empty() || name.size() > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("a tenant name is 1 to 64 characters, not ", name.size()));
  }
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' &&
        c != '_' && c != '-') {
      return absl::InvalidArgumentError(
          "a tenant name is letters, digits, '.', '_' and '-' only");
    }
  }
  return absl::OkStatus();
}

std::string OperatorTokenHex(const ClusterSecret& secret) {
  return TenantTokenHex(secret.Derive(CredentialRole::kAdmin, uint64_t{0}));
}

std::string TenantTokenHex(const Credential& credential) {
  return absl::BytesToHexString(absl::string_view(
      reinterpret_cast<const char*>(credential.data()), credential.size()));
}

absl::StatusOr<Credential> TenantTokenFromHex(absl::string_view hex) {
  hex = absl::StripAsciiWhitespace(hex);
  bool digits = hex.size() == 2 * kCredentialSize;
  for (char c : hex) {
    digits = digits && absl::ascii_isxdigit(static_cast<unsigned char>(c));
  }
  if (!digits) {
    return absl::InvalidArgumentError(
        absl::StrCat("a tenant token is ", 2 * kCredentialSize,
                     " hex digits (what `plexus token` prints)"));
  }
  const std::string bytes = absl::HexStringToBytes(hex);
  Credential credential;
  std::copy(bytes.begin(), bytes.end(), credential.begin());
  return credential;
}

absl::StatusOr<ClusterSecret> ClusterSecret::Generate() {
  ClusterSecret secret;
  if (RAND_bytes(secret.bytes_.data(), static_cast<int>(kSize)) != 1) {
    return absl::InternalError(
        "cannot draw a cluster secret: RAND_bytes failed");
  }
  return secret;
}

absl::StatusOr<ClusterSecret> ClusterSecret::GivenOrGenerate(
    const std::optional<ClusterSecret>& given) {
  if (given.has_value()) return *given;
  return Generate();
}

absl::StatusOr<ClusterSecret> ClusterSecret::FromHex(absl::string_view hex) {
  hex = absl::StripAsciiWhitespace(hex);
  if (hex.size() != 2 * kSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a cluster secret is ", 2 * kSize, " hex digits, not ", hex.size()));
  }
  for (char c : hex) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError("a cluster secret is hex digits only");
    }
  }
  std::string bytes = absl::HexStringToBytes(hex);
  ClusterSecret secret;
  std::copy(bytes.begin(), bytes.end(), secret.bytes_.begin());
  return secret;
}

absl::StatusOr<ClusterSecret> ClusterSecret::Load(const std::string& path) {
  if (const char* env = std::getenv(kClusterSecretEnv);
      env != nullptr && *env != '\0') {
    absl::StatusOr<ClusterSecret> secret = FromHex(env);
    if (!secret.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "$", kClusterSecretEnv, ": ", secret.status().message()));
    }
    return secret;
  }
  if (path.empty()) {
    return absl::NotFoundError(absl::StrCat("no cluster secret: set $",
                                            kClusterSecretEnv,
                                            " or give a secret file"));
  }
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) {
    return absl::NotFoundError(
        absl::StrCat("cannot read the cluster secret file ", path));
  }
  absl::StatusOr<ClusterSecret> secret = FromHex(line);
  if (!secret.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", secret.status().message()));
  }
  return secret;
}

std::string ClusterSecret::ToHex() const {
  return absl::BytesToHexString(absl::string_view(
      reinterpret_cast<const char*>(bytes_.data()), bytes_.size()));
}

Credential ClusterSecret::Derive(CredentialRole role, uint64_t id) const {
  return Derive(role, absl::StrCat(id));
}

Credential ClusterSecret::Derive(CredentialRole role,
                                 absl::string_view id) const {
  const std::string message =
      absl::StrCat("plexus/", CredentialRoleName(role), "/", id);
  uint8_t mac[EVP_MAX_MD_SIZE];
  unsigned int mac_size = 0;
  HMAC(EVP_sha256(), bytes_.data(), static_cast<int>(bytes_.size()),
       reinterpret_cast<const uint8_t*>(message.data()), message.size(), mac,
       &mac_size);
  Credential credential;
  std::copy(mac, mac + kCredentialSize, credential.begin());
  return credential;
}

bool ClusterSecret::Verify(CredentialRole role, uint64_t id,
                           const uint8_t* credential, size_t size) const {
  return Verify(role, absl::StrCat(id), credential, size);
}

bool ClusterSecret::Verify(CredentialRole role, absl::string_view id,
                           const uint8_t* credential, size_t size) const {
  if (credential == nullptr || size != kCredentialSize) return false;
  const Credential want = Derive(role, id);
  return ConstantTimeEqual(want.data(), credential, kCredentialSize);
}

bool ConstantTimeEqual(const uint8_t* a, const uint8_t* b, size_t size) {
  return CRYPTO_memcmp(a, b, size) == 0;
}

std::string Redacted(size_t size) {
  return absl::StrCat("<redacted ", size, " bytes>");
}

}  // namespace plexus
