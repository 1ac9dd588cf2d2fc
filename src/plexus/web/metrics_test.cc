#include "plexus/web/metrics.h"

#include <set>
#include <sstream>

#include "gtest/gtest.h"

namespace plexus::web {
namespace {

proto::ClusterStatus TwoHosts() {
  proto::ClusterStatus st;
  st.set_calls_routed(42);
  for (int i = 0; i < 2; ++i) {
    auto* w = st.add_workers();
    w->set_worker_id(i + 1);
    w->set_host_name(i == 0 ? "host0" : "host1");
    w->set_alive(true);
    auto* d = w->add_devices();
    d->set_index(0);
    d->set_memory_bytes(1 << 30);
    auto* s = w->mutable_stats();
    s->set_calls_executed(10 + i);
    s->add_device_busy_micros(2'500'000);
    s->add_device_live_bytes(4096);
    s->add_device_peak_bytes(8192);
    s->set_transfers_ipc(3);
    s->mutable_transfer_bytes()->set_tcp(1000 * (i + 1));
    s->add_device_tasks_pending(4);
    auto* u = s->add_clients();
    u->set_client_id(7);
    u->set_queued_micros(1'000'000);
  }
  auto* c = st.add_clients();
  c->set_client_id(7);
  c->set_name("trainer \"one\"");
  c->set_tenant("research");
  c->set_calls_pending(5);
  c->set_device_micros(3'000'000);
  st.add_slices()->set_broken("host lost");
  st.add_why();
  st.mutable_recovery()->set_hosts_lost(1);
  return st;
}

// The value of the sample whose line starts with `prefix` ("name{labels}").
double Sample(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix + " ", 0) == 0) {
      return std::stod(line.substr(prefix.size() + 1));
    }
  }
  ADD_FAILURE() << "no sample " << prefix << " in\n" << text;
  return -1;
}

TEST(MetricsTest, WritesTheStatusAsPrometheusText) {
  const std::string text = MetricsText(TwoHosts());
  EXPECT_NE(text.find("# TYPE plexus_calls_routed_total counter"),
            std::string::npos);
  EXPECT_EQ(Sample(text, "plexus_calls_routed_total"), 42);
  EXPECT_EQ(Sample(text, "plexus_workers{state=\"alive\"}"), 2);
  EXPECT_EQ(
      Sample(text, "plexus_worker_calls_total{host=\"host1\",worker=\"2\"}"),
      11);
  EXPECT_EQ(Sample(text,
                   "plexus_device_busy_seconds_total{host=\"host0\","
                   "worker=\"1\",device=\"0\"}"),
            2.5);
  EXPECT_EQ(Sample(text,
                   "plexus_device_memory_bytes{host=\"host0\","
                   "worker=\"1\",device=\"0\",kind=\"capacity\"}"),
            1 << 30);
  EXPECT_EQ(Sample(text,
                   "plexus_transfers_total{host=\"host0\",worker=\"1\","
                   "path=\"ipc\"}"),
            3);
  EXPECT_EQ(Sample(text,
                   "plexus_transfer_bytes_total{host=\"host1\",worker=\"2\","
                   "path=\"tcp\"}"),
            2000);
  EXPECT_EQ(Sample(text,
                   "plexus_transfer_bytes_total{host=\"host0\",worker=\"1\","
                   "path=\"shared_memory\"}"),
            0);
  EXPECT_EQ(Sample(text,
                   "plexus_device_tasks_pending{host=\"host0\",worker=\"1\","
                   "device=\"0\"}"),
            4);
  // A client's name is escaped as the format says.
  EXPECT_EQ(Sample(text,
                   "plexus_client_calls_pending{client=\"7\","
                   "client_name=\"trainer \\\"one\\\"\","
                   "tenant=\"research\"}"),
            5);
  EXPECT_EQ(Sample(text,
                   "plexus_tenant_device_seconds_total{tenant="
                   "\"research\"}"),
            3);
  EXPECT_EQ(Sample(text, "plexus_slices{state=\"broken\"}"), 1);
  EXPECT_EQ(Sample(text, "plexus_calls_waiting"), 1);
  EXPECT_EQ(Sample(text, "plexus_recoveries_total{event=\"hosts_lost\"}"), 1);
}

TEST(MetricsTest, EveryFamilyWrittenIsNamedInMetricNames) {
  const std::string text = MetricsText(TwoHosts());
  const std::vector<std::string> names = MetricNames();
  const std::set<std::string> known(names.begin(), names.end());
  EXPECT_EQ(known.size(), names.size()) << "a name written twice";
  std::istringstream in(text);
  std::string line;
  std::set<std::string> written;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) != 0) continue;
    const std::string name = line.substr(7, line.find(' ', 7) - 7);
    EXPECT_TRUE(known.count(name)) << name;
    written.insert(name);
  }
  // A status with a host, a client and a slice has every family.
  EXPECT_EQ(written, known);
}

TEST(MetricsTest, ADownWorkerReportsNoCounters) {
  proto::ClusterStatus st = TwoHosts();
  st.mutable_workers(1)->set_alive(false);
  const std::string text = MetricsText(st);
  EXPECT_EQ(Sample(text, "plexus_workers{state=\"down\"}"), 1);
  EXPECT_EQ(text.find("host1"), std::string::npos);
}

}  // namespace
}  // namespace plexus::web
