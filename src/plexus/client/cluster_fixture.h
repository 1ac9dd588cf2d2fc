// Test-only: a GoogleTest fixture with one real embedded cluster (a
// plexus-server process and its plexus-worker processes on loopback) per
// suite, and a fresh client per test.
#pragma once

#include <memory>

#include "gtest/gtest.h"
#include "plexus/client/client.h"
#include "plexus/client/embedded_cluster.h"

namespace plexus {

template <int kHosts, int kDevicesPerHost>
class EmbeddedClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    EmbeddedClusterOptions options;
    options.hosts = kHosts;
    options.devices_per_host = kDevicesPerHost;
    auto cluster = EmbeddedCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() {
    // Every process of the cluster exits cleanly: a crash at shutdown
    // fails the suite.
    if (cluster_ != nullptr) {
      absl::Status stopped = cluster_->Stop();
      EXPECT_TRUE(stopped.ok()) << stopped;
    }
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(cluster_, nullptr) << "the cluster did not start";
    auto client = Client::Connect(cluster_->address());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
  }

  static inline EmbeddedCluster* cluster_ = nullptr;
  std::unique_ptr<Client> client_;
};

}  // namespace plexus
