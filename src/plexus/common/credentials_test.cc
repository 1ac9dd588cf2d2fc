#include "plexus/common/credentials.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace plexus {
namespace {

TEST(CredentialsTest, EachRoleAndIdHasItsOwnCredential) {
  auto secret = ClusterSecret::Generate();
  ASSERT_TRUE(secret.ok());
  const Credential a = secret->Derive(CredentialRole::kClient, 1);
  EXPECT_TRUE(secret->Verify(CredentialRole::kClient, 1, a.data(), a.size()));
  EXPECT_FALSE(secret->Verify(CredentialRole::kClient, 2, a.data(), a.size()));
  EXPECT_FALSE(secret->Verify(CredentialRole::kWorker, 0, a.data(), a.size()));
  EXPECT_FALSE(secret->Verify(CredentialRole::kClient, 1, a.data(), 8));
  Credential zero{};
  EXPECT_FALSE(
      secret->Verify(CredentialRole::kClient, 1, zero.data(), zero.size()));
  // Another cluster's secret derives other credentials.
  auto other = ClusterSecret::Generate();
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->Verify(CredentialRole::kClient, 1, a.data(), a.size()));
}

TEST(CredentialsTest, TenantCredentialsFollowTheOneRuleOverTheName) {
  auto secret = ClusterSecret::Generate();
  ASSERT_TRUE(secret.ok());
  // One rule: a numeric id is its decimal text.
  EXPECT_EQ(secret->Derive(CredentialRole::kClient, 7),
            secret->Derive(CredentialRole::kClient, "7"));
  const Credential research =
      secret->Derive(CredentialRole::kTenant, "research");
  EXPECT_TRUE(secret->Verify(CredentialRole::kTenant, "research",
                             research.data(), research.size()));
  EXPECT_FALSE(secret->Verify(CredentialRole::kTenant, "default",
                              research.data(), research.size()));
  // Not the credential of another role over the same text.
  EXPECT_FALSE(secret->Verify(CredentialRole::kClient, "research",
                              research.data(), research.size()));
  // A token round-trips through its hex; anything else is refused.
  auto back = TenantTokenFromHex(TenantTokenHex(research) + "\n");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, research);
  EXPECT_EQ(TenantTokenFromHex("abc").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TenantTokenFromHex(std::string(32, 'g')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckTenantName("team-a.prod_1").ok());
  EXPECT_FALSE(CheckTenantName("").ok());
  EXPECT_FALSE(CheckTenantName("a b").ok());
  EXPECT_FALSE(CheckTenantName(std::string(65, 'a')).ok());
}

TEST(CredentialsTest, ProofsDependOnCredentialAndMessage) {
  auto secret = ClusterSecret::Generate();
  ASSERT_TRUE(secret.ok());
  const Credential a = secret->Derive(CredentialRole::kClient, 1);
  const Credential b = secret->Derive(CredentialRole::kClient, 2);
  EXPECT_EQ(ProofOf(a, "nonce-1"), ProofOf(a, "nonce-1"));
  EXPECT_NE(ProofOf(a, "nonce-1"), ProofOf(a, "nonce-2"));
  EXPECT_NE(ProofOf(a, "nonce-1"), ProofOf(b, "nonce-1"));
}

TEST(CredentialsTest, HexRoundTripsAndBadHexIsRefused) {
  auto secret = ClusterSecret::Generate();
  ASSERT_TRUE(secret.ok());
  auto back = ClusterSecret::FromHex(secret->ToHex() + "\n");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->Derive(CredentialRole::kAdmin),
            secret->Derive(CredentialRole::kAdmin));
  EXPECT_EQ(ClusterSecret::FromHex("abc").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ClusterSecret::FromHex(std::string(64, 'z')).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CredentialsTest, LoadPrefersTheEnvironmentAndSaysWhatIsMissing) {
  unsetenv(kClusterSecretEnv);
  absl::Status missing = ClusterSecret::Load("").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.message().find(kClusterSecretEnv), std::string::npos);
  auto secret = ClusterSecret::Generate();
  setenv(kClusterSecretEnv, secret->ToHex().c_str(), 1);
  auto loaded = ClusterSecret::Load("/nonexistent");
  unsetenv(kClusterSecretEnv);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->Derive(CredentialRole::kWorker),
            secret->Derive(CredentialRole::kWorker));
}

}  // namespace
}  // namespace plexus
