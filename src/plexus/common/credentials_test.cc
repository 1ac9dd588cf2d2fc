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
