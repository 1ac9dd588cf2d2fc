#include "plexus/web/history.h"

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace plexus::web {
namespace {

proto::ClusterStatus WithDevices(int workers, int64_t busy) {
  proto::ClusterStatus st;
  for (int i = 0; i < workers; ++i) {
    auto* w = st.add_workers();
    w->set_worker_id(i + 1);
    w->set_alive(true);
    w->add_devices()->set_index(0);
    w->mutable_stats()->add_device_busy_micros(busy);
    w->mutable_stats()->add_device_live_bytes(100);
    w->mutable_stats()->mutable_transfer_bytes()->set_tcp(busy);
  }
  return st;
}

TEST(HistoryTest, KeepsTheLastCapacitySamples) {
  History h(3);
  for (int i = 1; i <= 10; ++i) h.Add(Sample::Of(WithDevices(1, i), i * 1000));
  EXPECT_EQ(h.size(), 3u);
  std::vector<Sample> all = h.Since(0);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all.front().unix_ms, 8000);
  EXPECT_EQ(all.back().devices[0].busy_micros, 10);
  EXPECT_EQ(h.Since(9000).size(), 1u);
}

TEST(HistoryTest, JsonAlignsDevicesThatCameAndWent) {
  std::vector<Sample> s = {Sample::Of(WithDevices(1, 5), 1000),
                           Sample::Of(WithDevices(2, 6), 2000),
                           Sample::Of(WithDevices(1, 7), 3000)};
  nlohmann::json j = nlohmann::json::parse(HistoryJson(s));
  EXPECT_EQ(j["t"].size(), 3u);
  EXPECT_EQ(j["devices"]["1/0"]["busy_micros"],
            nlohmann::json::parse("[5, 6, 7]"));
  EXPECT_EQ(j["devices"]["2/0"]["busy_micros"],
            nlohmann::json::parse("[null, 6, null]"));
  EXPECT_EQ(j["transfer_bytes"]["tcp"], nlohmann::json::parse("[5, 12, 7]"));
  EXPECT_EQ(j["transfer_bytes"]["nccl"], nlohmann::json::parse("[0, 0, 0]"));
}

}  // namespace
}  // namespace plexus::web
