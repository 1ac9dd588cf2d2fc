// Slice requests driven directly on ClusterState with an injected time:
// placement on named hosts, away from other slices, and the queue of
// requests that wait for capacity.
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "plexus/server/model/cluster_state.h"

namespace plexus {
namespace {

// Whether `text` holds `part`; the failure message shows both.
::testing::AssertionResult Holds(absl::string_view text,
                                 absl::string_view part) {
  if (absl::StrContains(text, part)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "\"" << text << "\" does not hold \"" << part << "\"";
}

proto::RegisterWorker Host(const std::string& name, int devices) {
  proto::RegisterWorker r;
  r.set_host_name(name);
  for (int d = 0; d < devices; ++d) {
    auto* dev = r.add_devices();
    dev->set_index(d);
    dev->set_memory_bytes(1 << 20);
  }
  return r;
}

proto::SliceRequest Request(int n, proto::Placement placement,
                            absl::Duration timeout = absl::ZeroDuration()) {
  static uint64_t next_request = 1;
  proto::SliceRequest req;
  req.set_request_id(next_request++);
  req.set_num_devices(n);
  req.set_placement(placement);
  req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  return req;
}

std::set<std::string> HostsOf(const proto::SliceInfo& slice) {
  std::set<std::string> hosts;
  for (const auto& d : slice.devices()) hosts.insert(d.host_name());
  return hosts;
}

// Two hosts of two devices; the time is the test's.
class SliceQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_.AddWorker(Host("host0", 2), now_);
    state_.AddWorker(Host("host1", 2), now_);
    client_ = state_.AddClient("test").id;
  }
  proto::SliceInfo Granted(const proto::SliceRequest& req) {
    auto answer = state_.RequestSlice(client_, req, now_);
    EXPECT_TRUE(answer.has_value()) << "the request waits";
    if (!answer.has_value() || !answer->ok()) {
      ADD_FAILURE() << (answer ? answer->status().ToString() : "");
      return {};
    }
    return **answer;
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  ClusterState state_;
  uint64_t client_ = 0;
};

TEST_F(SliceQueueTest, AnUnmetRequestWaitsUntilAHostBigEnoughRegisters) {
  proto::SliceRequest req =
      Request(4, proto::PLACEMENT_ONE_HOST, absl::Seconds(30));
  EXPECT_FALSE(state_.RequestSlice(client_, req, now_).has_value());
  ASSERT_EQ(state_.pending_slices().size(), 1u);
  EXPECT_EQ(state_.WaitingFor(0),
            "asked for 4 devices on one host; the largest live host has 2 "
            "devices; no request ahead");
  // Nothing changed: still waiting.
  EXPECT_TRUE(state_.ServePendingSlices(now_ + absl::Seconds(1)).empty());

  state_.AddWorker(Host("host2", 4), now_ + absl::Seconds(2));
  std::vector<SliceAnswer> answers =
      state_.ServePendingSlices(now_ + absl::Seconds(2));
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].client_id, client_);
  EXPECT_EQ(answers[0].request_id, req.request_id());
  ASSERT_TRUE(answers[0].slice.ok()) << answers[0].slice.status();
  EXPECT_EQ(HostsOf(*answers[0].slice), std::set<std::string>{"host2"});
  EXPECT_TRUE(state_.pending_slices().empty());
  EXPECT_EQ(state_.FindClient(client_)->slices.size(), 1u);
}

// The default placement keeps a slice inside one island (host) where one
// holds it (islands talk over the network), on the least-loaded such host;
// a slice no island holds takes whole islands, as few as it can.
TEST(SlicePlacementTest, TheDefaultKeepsASliceInsideOneIslandWhereItFits) {
  ClusterState state;
  const absl::Time now = absl::FromUnixSeconds(1000);
  state.AddWorker(Host("host0", 2), now);
  state.AddWorker(Host("host1", 2), now);
  state.AddWorker(Host("host2", 4), now);
  const uint64_t client = state.AddClient("test").id;
  auto place = [&](int n, proto::Placement p) {
    auto s = state.RequestSlice(client, Request(n, p), now);
    EXPECT_TRUE(s.has_value() && s->ok());
    return s.has_value() && s->ok() ? **s : proto::SliceInfo();
  };
  // 2 devices: one island (the first registered of the least loaded).
  EXPECT_EQ(HostsOf(place(2, proto::PLACEMENT_ANY)),
            std::set<std::string>{"host0"});
  // 4 devices: only host2 holds 4, so there, though host1 is idler.
  EXPECT_EQ(HostsOf(place(4, proto::PLACEMENT_ANY)),
            std::set<std::string>{"host2"});
  // The next 2 go to the idle island, not next to the first slice.
  EXPECT_EQ(HostsOf(place(2, proto::PLACEMENT_ANY)),
            std::set<std::string>{"host1"});
  // 6 devices fit no island: the fewest whole islands, the larger first
  // (host2's 4 and one 2-device host), not one device per host round robin.
  proto::SliceInfo six = place(6, proto::PLACEMENT_ANY);
  EXPECT_EQ(six.devices_size(), 6);
  EXPECT_EQ(HostsOf(six).size(), 2u);
  EXPECT_EQ(HostsOf(six).count("host2"), 1u);
  // spread still deals one per host.
  EXPECT_EQ(HostsOf(place(3, proto::PLACEMENT_SPREAD)),
            (std::set<std::string>{"host0", "host1", "host2"}));
}

TEST_F(SliceQueueTest, AWaitingRequestTimesOutSayingWhatItWaitedFor) {
  proto::SliceRequest req = Request(5, proto::PLACEMENT_ANY, absl::Seconds(2));
  EXPECT_FALSE(state_.RequestSlice(client_, req, now_).has_value());
  EXPECT_TRUE(
      state_.ServePendingSlices(now_ + absl::Milliseconds(1999)).empty());
  std::vector<SliceAnswer> answers =
      state_.ServePendingSlices(now_ + absl::Seconds(2));
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].slice.status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(answers[0].slice.status().message(),
            "no slice within 2s: asked for 5 devices; the cluster has 4 live "
            "devices on 2 hosts; no request ahead");
  EXPECT_TRUE(state_.pending_slices().empty());
}

TEST_F(SliceQueueTest, ARequestThatMayNotWaitFailsAtOnce) {
  auto answer =
      state_.RequestSlice(client_, Request(5, proto::PLACEMENT_ANY), now_);
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Holds(answer->status().message(),
                    "the cluster has 4 live devices on 2 hosts"));
  EXPECT_TRUE(state_.pending_slices().empty());
}

TEST_F(SliceQueueTest, AnInvalidRequestFailsAtOnceWhateverItsTimeout) {
  proto::SliceRequest req = Request(4, proto::PLACEMENT_ANY, absl::Seconds(30));
  req.add_mesh_shape(3);
  auto answer = state_.RequestSlice(client_, req, now_);
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Holds(answer->status().message(), "mesh shape [3]"));

  proto::SliceRequest typo =
      Request(1, proto::PLACEMENT_ANY, absl::Seconds(30));
  typo.add_hosts("hots0");
  answer = state_.RequestSlice(client_, typo, now_);
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(answer->status().message(),
            "asked for a slice on host 'hots0', but no worker registered as "
            "'hots0' (hosts: host0, host1)");
  EXPECT_TRUE(state_.pending_slices().empty());
}

TEST_F(SliceQueueTest, AClientThatLeavesTakesItsWaitingRequestsAlong) {
  EXPECT_FALSE(
      state_
          .RequestSlice(client_,
                        Request(8, proto::PLACEMENT_ANY, absl::Seconds(30)),
                        now_)
          .has_value());
  state_.RemoveClient(client_);
  EXPECT_TRUE(state_.pending_slices().empty());
  state_.AddWorker(Host("host2", 8), now_);
  EXPECT_TRUE(state_.ServePendingSlices(now_ + absl::Hours(1)).empty());
}

TEST_F(SliceQueueTest, WaitingRequestsAreGrantedInArrivalOrder) {
  const uint64_t other = state_.AddClient("other").id;
  proto::SliceRequest first =
      Request(3, proto::PLACEMENT_ONE_HOST, absl::Seconds(30));
  proto::SliceRequest second =
      Request(6, proto::PLACEMENT_ANY, absl::Seconds(30));
  proto::SliceRequest third =
      Request(3, proto::PLACEMENT_ONE_HOST, absl::Seconds(30));
  EXPECT_FALSE(state_.RequestSlice(client_, first, now_).has_value());
  EXPECT_FALSE(state_.RequestSlice(other, second, now_).has_value());
  EXPECT_FALSE(state_.RequestSlice(client_, third, now_).has_value());
  EXPECT_TRUE(Holds(state_.WaitingFor(2), "; 2 requests ahead"));

  // Three devices on one host meet the first and the third; six in all
  // (2 + 2 + 3 = 7) meet the second too.
  state_.AddWorker(Host("host2", 3), now_);
  std::vector<SliceAnswer> answers = state_.ServePendingSlices(now_);
  ASSERT_EQ(answers.size(), 3u);
  EXPECT_EQ(answers[0].request_id, first.request_id());
  EXPECT_EQ(answers[1].request_id, second.request_id());
  EXPECT_EQ(answers[1].client_id, other);
  EXPECT_EQ(answers[2].request_id, third.request_id());
  for (const auto& a : answers) EXPECT_TRUE(a.slice.ok()) << a.slice.status();
}

TEST_F(SliceQueueTest, ARequestThatCanBeMetIsNotHeldBehindOneThatCannot) {
  EXPECT_FALSE(
      state_
          .RequestSlice(client_,
                        Request(8, proto::PLACEMENT_ANY, absl::Seconds(30)),
                        now_)
          .has_value());
  proto::SliceInfo small = Granted(Request(2, proto::PLACEMENT_ONE_HOST));
  EXPECT_EQ(small.devices_size(), 2);
  EXPECT_EQ(state_.pending_slices().size(), 1u);
}

class SliceQuotaTest : public SliceQueueTest {
 protected:
  void SetUp() override {
    SliceQueueTest::SetUp();
    auto tenants =
        TenantTable::FromJson(R"({"tenants": {"small": {"max_devices": 3}}})");
    ASSERT_TRUE(tenants.ok()) << tenants.status();
    state_.SetTenants(*tenants);
    client_ = state_.AddClient("capped", "small").id;
  }
};

TEST_F(SliceQuotaTest, ARequestOverMaxDevicesWaitsForASliceToBeReleased) {
  proto::SliceInfo held = Granted(Request(2, proto::PLACEMENT_ANY));
  proto::SliceRequest more =
      Request(2, proto::PLACEMENT_ANY, absl::Seconds(30));
  EXPECT_FALSE(state_.RequestSlice(client_, more, now_).has_value());
  EXPECT_EQ(state_.WaitingFor(0),
            absl::StrCat("asked for 2 devices; client ", client_,
                         " holds 2 devices in 1 slice, and tenant 'small' "
                         "may hold 3 (max_devices); no request ahead"));
  // Another tenant's client is not held back by this one's quota.
  const uint64_t free_client = state_.AddClient("free").id;
  auto other =
      state_.RequestSlice(free_client, Request(4, proto::PLACEMENT_ANY), now_);
  ASSERT_TRUE(other.has_value() && other->ok());

  ASSERT_TRUE(state_.ReleaseSlice(client_, held.slice_id()).ok());
  std::vector<SliceAnswer> answers = state_.ServePendingSlices(now_);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_TRUE(answers[0].slice.ok()) << answers[0].slice.status();
}

TEST_F(SliceQuotaTest, ARequestLargerThanMaxDevicesFailsAtOnce) {
  auto answer = state_.RequestSlice(
      client_, Request(4, proto::PLACEMENT_ANY, absl::Seconds(30)), now_);
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(answer->status().message(),
            "asked for 4 devices, but tenant 'small' may hold at most 3 over "
            "all of a client's slices (max_devices)");
}

TEST_F(SliceQueueTest, ASliceOnNamedHostsUsesOnlyThem) {
  proto::SliceRequest req = Request(2, proto::PLACEMENT_ANY);
  req.add_hosts("host1");
  proto::SliceInfo s = Granted(req);
  EXPECT_EQ(HostsOf(s), std::set<std::string>{"host1"});

  proto::SliceRequest too_many = Request(3, proto::PLACEMENT_ANY);
  too_many.add_hosts("host1");
  auto answer = state_.RequestSlice(client_, too_many, now_);
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->status().message(),
            "asked for 3 devices of hosts [host1]; the hosts it may use have "
            "2 live devices on 1 host");
}

TEST_F(SliceQueueTest, ASliceOnADownHostWaitsForItsWorkerToComeBack) {
  proto::SliceRequest req =
      Request(2, proto::PLACEMENT_ONE_HOST, absl::Seconds(30));
  req.add_hosts("host1");
  const int64_t host1 = 2;
  state_.MarkWorkerDown(host1, "killed");
  EXPECT_FALSE(state_.RequestSlice(client_, req, now_).has_value());
  EXPECT_EQ(state_.WaitingFor(0),
            "asked for 2 devices on one host of hosts [host1]; the largest "
            "live host it may use has 0 devices (down: host1); no request "
            "ahead");
  state_.AddWorker(Host("host1", 2), now_);  // it registers again
  std::vector<SliceAnswer> answers = state_.ServePendingSlices(now_);
  ASSERT_EQ(answers.size(), 1u);
  ASSERT_TRUE(answers[0].slice.ok()) << answers[0].slice.status();
  EXPECT_EQ(answers[0].slice->devices(0).worker_id(), 3);
}

TEST_F(SliceQueueTest, ASliceAvoidsTheHostsOfOtherSlices) {
  proto::SliceInfo first = Granted(Request(1, proto::PLACEMENT_ONE_HOST));
  const std::string used = first.devices(0).host_name();
  proto::SliceRequest req = Request(2, proto::PLACEMENT_ANY);
  req.add_avoid_slices(first.slice_id());
  proto::SliceInfo second = Granted(req);
  EXPECT_EQ(second.devices_size(), 2);
  EXPECT_EQ(HostsOf(second).count(used), 0u);

  // Both hosts taken: nothing is left to avoid them with.
  proto::SliceRequest none = Request(1, proto::PLACEMENT_ANY);
  none.add_avoid_slices(first.slice_id());
  none.add_avoid_slices(second.slice_id());
  auto answer = state_.RequestSlice(client_, none, now_);
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->status().message(),
            absl::StrCat("asked for 1 device not on hosts [host0, host1] (of "
                         "slices ",
                         first.slice_id(), ", ", second.slice_id(),
                         "); the hosts it may use have 0 live devices on 0 "
                         "hosts"));
}

TEST_F(SliceQueueTest, AvoidingASliceOfAnotherClientIsRefused) {
  const uint64_t other = state_.AddClient("other").id;
  auto theirs =
      state_.RequestSlice(other, Request(1, proto::PLACEMENT_ANY), now_);
  ASSERT_TRUE(theirs.has_value() && theirs->ok());
  proto::SliceRequest req = Request(1, proto::PLACEMENT_ANY);
  req.add_avoid_slices((*theirs)->slice_id());
  auto answer = state_.RequestSlice(client_, req, now_);
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(
      Holds(answer->status().message(), "which this client does not hold"));
}

}  // namespace
}  // namespace plexus
