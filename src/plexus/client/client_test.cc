// The C++ client against a real embedded cluster: a plexus-server process
// with two plexus-worker processes, on loopback.
#include "plexus/client/client.h"

#include <limits>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "plexus/client/cluster_fixture.h"

namespace plexus {
namespace {

using ClientTest = EmbeddedClusterTest<2, 2>;

TEST_F(ClientTest, SplitPutScaleAndFetchOverTwoHosts) {
  auto slice = client_->CreateSlice({.num_devices = 4});
  ASSERT_TRUE(slice.ok()) << slice.status();
  EXPECT_EQ((*slice)->num_hosts(), 2);
  ArgSpec arg{{DType::kF32, {8}}, Sharding::Split(0)};
  std::vector<float> x = {0, 1, 2, 3, 4, 5, 6, 7};
  auto fx = client_->Put(*slice, x.data(), arg);
  ASSERT_TRUE(fx.ok()) << fx.status();
  auto scale =
      client_->Compile(*slice, "triple", "scale", {{"factor", 3.0}}, {arg});
  ASSERT_TRUE(scale.ok()) << scale.status();
  auto out = client_->Call(**scale, {*fx});
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<float> y(8);
  ASSERT_TRUE(client_->Fetch((*out)[0], y.data()).ok());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(y[i], 3 * i);
}

// A client with `options`, a 1-device slice holding x = [1, 2, 3, 4], and
// `twice` (scale by 2) compiled for it; what it sent so far flushed.
struct Doubler {
  std::unique_ptr<Client> client;
  Future x;
  std::shared_ptr<Program> twice;
};

absl::StatusOr<Doubler> ConnectDoubler(const std::string& address,
                                       const ClientOptions& options) {
  Doubler d;
  auto client = Client::Connect(address, options);
  if (!client.ok()) return client.status();
  d.client = *std::move(client);
  auto slice = d.client->CreateSlice({.num_devices = 1});
  if (!slice.ok()) return slice.status();
  ArgSpec arg{{DType::kF32, {4}}, Sharding::Replicated()};
  std::vector<float> x = {1, 2, 3, 4};
  auto fx = d.client->Put(*slice, x.data(), arg);
  if (!fx.ok()) return fx.status();
  d.x = *fx;
  auto twice =
      d.client->Compile(*slice, "twice", "scale", {{"factor", 2.0}}, {arg});
  if (!twice.ok()) return twice.status();
  d.twice = *twice;
  d.client->Flush();
  return d;
}

// A dropped future's release waits (ClientOptions::release_linger) for the
// next op and goes to the server with it: a loop of call, fetch, drop sends
// one message per call, not two.
TEST_F(ClientTest, ADroppedFuturesReleaseGoesWithTheNextCall) {
  ClientOptions options;
  options.release_linger = absl::Hours(1);  // only an op or Flush moves it
  auto d = ConnectDoubler(cluster_->address(), options);
  ASSERT_TRUE(d.ok()) << d.status();
  Client* client = d->client.get();
  Future* fx = &d->x;
  Program* twice = d->twice.get();
  const int64_t before = client->counters().messages_sent;
  constexpr int kRounds = 20;
  for (int i = 0; i < kRounds; ++i) {
    auto out = client->Call(*twice, {*fx});
    ASSERT_TRUE(out.ok()) << out.status();
    std::vector<float> y(4);
    ASSERT_TRUE(client->Fetch((*out)[0], y.data()).ok());
    EXPECT_EQ(y, (std::vector<float>{2, 4, 6, 8}));
    out->clear();  // its release is queued: it waits for the next call
    // A read between the drop and the next call, as a loop's own work
    // would be: time in which a release sent at once would go alone.
    std::vector<float> again(4);
    ASSERT_TRUE(client->Fetch(*fx, again.data()).ok());
  }
  // Every call written (a fetch can return before its call's write has),
  // and the last round's release, which only Flush moves.
  client->Flush();
  const int64_t sent = client->counters().messages_sent - before;
  // One per call and the last release (and a stats report each second); a
  // release sent alone would have been another message per round.
  EXPECT_GE(sent, kRounds + 1);
  EXPECT_LE(sent, kRounds + 4);
}

// A call made after the client waited on a result, while nothing is being
// written, is written by the thread that made it (no wake-up of the
// sender): it is on the wire when Call returns. A loop that issues calls
// without waiting hands them to the sender, which batches them.
TEST_F(ClientTest, ARoundTripsCallIsWrittenByItsOwnThread) {
  for (const bool inline_writes : {true, false}) {
    SCOPED_TRACE(inline_writes ? "inline" : "never inline");
    ClientOptions options;
    options.send_inline_after_wait = inline_writes;
    auto d = ConnectDoubler(cluster_->address(), options);
    ASSERT_TRUE(d.ok()) << d.status();
    Client* client = d->client.get();
    Future* fx = &d->x;
    Program* twice = d->twice.get();
    // Calls issued without a wait between them: none is written inline.
    std::vector<Future> chain = {*fx};
    for (int i = 0; i < 20; ++i) {
      auto out = client->Call(*twice, {chain.back()});
      ASSERT_TRUE(out.ok()) << out.status();
      chain.push_back((*out)[0]);
    }
    client->Flush();
    EXPECT_EQ(client->counters().messages_sent_inline, 0);
    ASSERT_TRUE(client->Wait(chain.back()).ok());
    chain.clear();
    // Round trips: each call after the last one's fetch.
    const ClientCounters before = client->counters();
    constexpr int kRounds = 20;
    int on_the_wire = 0;  // calls written by the time Call returned
    for (int i = 0; i < kRounds; ++i) {
      const int64_t sent = client->counters().messages_sent;
      auto out = client->Call(*twice, {*fx});
      ASSERT_TRUE(out.ok()) << out.status();
      if (client->counters().messages_sent > sent) ++on_the_wire;
      std::vector<float> y(4);
      ASSERT_TRUE(client->Fetch((*out)[0], y.data()).ok());
      EXPECT_EQ(y, (std::vector<float>{2, 4, 6, 8}));
    }
    client->Flush();
    const ClientCounters after = client->counters();
    const int64_t inlined =
        after.messages_sent_inline - before.messages_sent_inline;
    if (inline_writes) {
      // Every call but those the sender was writing beside (a stats
      // report each second; a release that lingered out its 1 ms while
      // this thread was descheduled, on a loaded machine).
      EXPECT_GE(inlined, kRounds / 2);
      EXPECT_GE(on_the_wire, kRounds / 2);
    } else {
      EXPECT_EQ(after.messages_sent_inline, 0);
    }
    EXPECT_GE(after.messages_sent - before.messages_sent, kRounds);
  }
}

TEST_F(ClientTest, GraphOfChainedCallsMatchesTheLoop) {
  auto slice = client_->CreateSlice({.num_devices = 2});
  ASSERT_TRUE(slice.ok());
  ArgSpec arg{{DType::kF64, {4}}, Sharding::Replicated()};
  std::vector<double> x = {1, 2, 3, 4};
  auto f = client_->Put(*slice, x.data(), arg);
  ASSERT_TRUE(f.ok());
  auto add = client_->Compile(*slice, "add", "add", {}, {arg, arg});
  ASSERT_TRUE(add.ok());
  Graph graph = client_->NewGraph();
  Future acc = *f;
  for (int i = 0; i < 100; ++i) acc = (*graph.Call(**add, {acc, *f}))[0];
  ASSERT_TRUE(graph.Submit().ok());
  std::vector<double> y(4);
  ASSERT_TRUE(client_->Fetch(acc, y.data()).ok());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(y[i], 101 * x[i]);
}

// A 1-device slice holding x = [1, 2, 3, 4] (float64) and `add` compiled
// for it (null, with the failure reported, where either failed).
struct Adder {
  Future x;
  std::shared_ptr<Program> add;
};
Adder MakeAdder(Client& client) {
  auto slice = client.CreateSlice({.num_devices = 1});
  if (!slice.ok()) {
    ADD_FAILURE() << slice.status();
    return {};
  }
  ArgSpec arg{{DType::kF64, {4}}, Sharding::Replicated()};
  std::vector<double> x = {1, 2, 3, 4};
  auto f = client.Put(*slice, x.data(), arg);
  auto add = client.Compile(*slice, "add", "add", {}, {arg, arg});
  if (!f.ok() || !add.ok()) {
    ADD_FAILURE() << f.status() << " " << add.status();
    return {};
  }
  return {*f, *add};
}

TEST_F(ClientTest, AGraphDroppedUnsubmittedFailsItsOutputsAtOnce) {
  Adder a = MakeAdder(*client_);
  ASSERT_NE(a.add, nullptr);
  Future out;
  {
    Graph graph = client_->NewGraph();
    Graph moved = std::move(graph);  // the one dropped: the moved-to
    out = (*moved.Call(*a.add, {a.x, a.x}))[0];
  }
  // Its call was never sent: the fetch says so (it used to wait forever).
  std::vector<double> y(4);
  absl::Status read = client_->Fetch(out, y.data());
  EXPECT_TRUE(absl::IsFailedPrecondition(read)) << read;
  EXPECT_NE(read.message().find("graph dropped before it was submitted"),
            std::string::npos)
      << read;
  // The client goes on.
  auto again = client_->Call(*a.add, {a.x, a.x});
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(client_->Fetch((*again)[0], y.data()).ok());
  EXPECT_EQ(y[3], 8);
}

TEST_F(ClientTest, ALongGraphSendsItsCallsInBatchesAsTheyAreRecorded) {
  Adder a = MakeAdder(*client_);
  ASSERT_NE(a.add, nullptr);
  Graph graph = client_->NewGraph();
  Future first = (*graph.Call(*a.add, {a.x, a.x}))[0];
  Future acc = first;
  for (size_t i = 1; i < Graph::kStreamedOps + 10; ++i) {
    acc = (*graph.Call(*a.add, {acc, a.x}))[0];
  }
  EXPECT_EQ(graph.size(), 10u);  // the first batch went
  std::vector<double> y(4);
  ASSERT_TRUE(client_->Fetch(first, y.data()).ok());  // before Submit
  EXPECT_EQ(y[3], 8);
  ASSERT_TRUE(graph.Submit().ok());
  ASSERT_TRUE(client_->Fetch(acc, y.data()).ok());
  EXPECT_EQ(y[3], 4.0 * (Graph::kStreamedOps + 11));
}

TEST_F(ClientTest, AGraphAfterAWaitSendsItsFirstCallsSoonThenLargerBatches) {
  Adder a = MakeAdder(*client_);
  ASSERT_NE(a.add, nullptr);
  std::vector<double> y(4);
  ASSERT_TRUE(client_->Fetch(a.x, y.data()).ok());  // the client waited
  Graph graph = client_->NewGraph();
  Future acc = a.x;
  std::vector<size_t> unsent;  // after each call
  const size_t first = Graph::kFirstOpsAfterWait;
  for (size_t i = 0; i < first + 2 * first + 1; ++i) {
    acc = (*graph.Call(*a.add, {acc, a.x}))[0];
    unsent.push_back(graph.size());
  }
  EXPECT_EQ(unsent[first - 2], first - 1);
  EXPECT_EQ(unsent[first - 1], 0u);  // the first batch went at 16
  EXPECT_EQ(unsent[first + 2 * first - 2], 2 * first - 1);
  EXPECT_EQ(unsent[first + 2 * first - 1], 0u);  // the next at 32
  EXPECT_EQ(unsent.back(), 1u);
  ASSERT_TRUE(graph.Submit().ok());
  ASSERT_TRUE(client_->Fetch(acc, y.data()).ok());
  EXPECT_EQ(y[3], 4.0 * (3 * first + 2));
}

// Sequential dispatch (each op sent once its inputs are computed) keeps a
// list of inputs per recorded op: its batches, sent as they fill, must
// keep the two in step.
TEST_F(ClientTest, AGraphInSequentialDispatchSendsItsBatchesInStep) {
  ClientOptions options;
  options.sequential_dispatch = true;
  auto d = ConnectDoubler(cluster_->address(), options);
  ASSERT_TRUE(d.ok()) << d.status();
  std::vector<float> y(4);
  ASSERT_TRUE(d->client->Fetch(d->x, y.data()).ok());  // a wait: batches
  Graph graph = d->client->NewGraph();                 // of 16, 32, ...
  Future acc = d->x;
  constexpr int kCalls = 3 * Graph::kFirstOpsAfterWait + 5;
  for (int i = 0; i < kCalls; ++i) acc = (*graph.Call(*d->twice, {acc}))[0];
  EXPECT_LT(graph.size(), static_cast<size_t>(kCalls));  // some were sent
  ASSERT_TRUE(graph.Submit().ok());
  ASSERT_TRUE(d->client->Fetch(acc, y.data()).ok());
  EXPECT_EQ(y[3], 4.0f * static_cast<float>(uint64_t{1} << kCalls));
}

TEST_F(ClientTest, MismatchedArgumentFailsAtCallTimeNamingBothSpecs) {
  auto slice = client_->CreateSlice({.num_devices = 1});
  ASSERT_TRUE(slice.ok());
  ArgSpec want{{DType::kF32, {4}}, Sharding::Replicated()};
  ArgSpec got{{DType::kF32, {3}}, Sharding::Replicated()};
  std::vector<float> x(3, 1.0f);
  auto f = client_->Put(*slice, x.data(), got);
  ASSERT_TRUE(f.ok());
  auto relu = client_->Compile(*slice, "act", "relu", {}, {want});
  ASSERT_TRUE(relu.ok());
  auto out = client_->Call(**relu, {*f});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(),
            "program 'act' argument 0 has float32[3] replicated but the "
            "program was compiled for float32[4] replicated");
}

TEST_F(ClientTest, AWrongArgumentCountNamesTheProgramAndBothCounts) {
  auto slice = client_->CreateSlice({.num_devices = 1});
  ASSERT_TRUE(slice.ok());
  ArgSpec arg{{DType::kF32, {4}}, Sharding::Replicated()};
  std::vector<float> x(4, 1.0f);
  auto f = client_->Put(*slice, x.data(), arg);
  ASSERT_TRUE(f.ok());
  auto add = client_->Compile(*slice, "sum2", "add", {}, {arg, arg});
  ASSERT_TRUE(add.ok());
  auto out = client_->Call(**add, {*f});
  ASSERT_FALSE(out.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(out.status())) << out.status();
  EXPECT_EQ(out.status().message(), "program 'sum2' takes 2 arguments, got 1");
  Graph graph = client_->NewGraph();  // a graph's call: the same rule
  auto recorded = graph.Call(**add, {*f, *f, *f});
  ASSERT_FALSE(recorded.ok());
  EXPECT_EQ(recorded.status().message(),
            "program 'sum2' takes 2 arguments, got 3");
}

TEST_F(ClientTest, KernelFailureReachesTheFutureAndWorkersKeepServing) {
  auto slice = client_->CreateSlice({.num_devices = 2});
  ASSERT_TRUE(slice.ok());
  ArgSpec arg{{DType::kF32, {2}}, Sharding::Replicated()};
  std::vector<float> bad = {1.0f, std::numeric_limits<float>::infinity()};
  auto f = client_->Put(*slice, bad.data(), arg);
  ASSERT_TRUE(f.ok());
  auto check = client_->Compile(*slice, "check", "assert_finite", {}, {arg});
  ASSERT_TRUE(check.ok());
  auto out = client_->Call(**check, {*f});
  ASSERT_TRUE(out.ok());
  absl::Status waited = client_->Wait((*out)[0]);
  EXPECT_NE(waited.message().find("non-finite value inf at index 1"),
            std::string::npos)
      << waited;
  std::vector<float> good = {1.0f, 2.0f};
  auto g = client_->Put(*slice, good.data(), arg);
  ASSERT_TRUE(g.ok());
  auto ok = client_->Call(**check, {*g});
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(client_->Wait((*ok)[0]).ok());
}

TEST_F(ClientTest, SliceRequestErrorsKeepTheServersCode) {
  // The server refuses these; its status code reaches the caller intact.
  auto none = client_->CreateSlice({.num_devices = 0});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument)
      << none.status();
  auto negative = client_->CreateSlice({.num_devices = -3});
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument)
      << negative.status();
  auto mesh = client_->CreateSlice({.num_devices = 2, .mesh_shape = {3}});
  EXPECT_EQ(mesh.status().code(), absl::StatusCode::kInvalidArgument)
      << mesh.status();
  // No timeout: refused at once rather than waiting for more hosts.
  auto too_big =
      client_->CreateSlice({.num_devices = 9, .timeout = absl::ZeroDuration()});
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted)
      << too_big.status();
}

// Slice::Close from one thread while another calls a program on the slice
// in a loop: each call is either refused (FailedPrecondition, naming the
// closed slice) or reaches the server before the slice's release, so its
// future computes. Before the fix Close() reset the slice's state under the
// caller's check, and a call that passed the check could be queued after the
// release: its future failed with "slice N is not held by this client".
TEST_F(ClientTest, CloseRacingCallsEitherRefusesOrComputesEachCall) {
  ArgSpec arg{{DType::kF32, {4}}, Sharding::Replicated()};
  std::vector<float> x = {1, 2, 3, 4};
  for (int trial = 0; trial < 10; ++trial) {
    SCOPED_TRACE(trial);
    auto slice = client_->CreateSlice({.num_devices = 2});
    ASSERT_TRUE(slice.ok()) << slice.status();
    auto fx = client_->Put(*slice, x.data(), arg);
    ASSERT_TRUE(fx.ok()) << fx.status();
    auto twice =
        client_->Compile(*slice, "twice", "scale", {{"factor", 2.0}}, {arg});
    ASSERT_TRUE(twice.ok()) << twice.status();

    absl::Notification calling;
    Future last;  // the last call accepted
    absl::Status refused;
    int accepted = 0;
    std::thread caller([&] {
      for (int i = 0; i < 200000 && refused.ok(); ++i) {
        auto out = client_->Call(**twice, {*fx});
        if (out.ok()) {
          last = (*out)[0];
          accepted++;
        } else {
          refused = out.status();
        }
        if (i == 10) calling.Notify();
      }
      if (!calling.HasBeenNotified()) calling.Notify();
    });
    calling.WaitForNotification();
    (*slice)->Close();
    caller.join();

    ASSERT_FALSE(refused.ok()) << "the caller never saw the slice closed";
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
    EXPECT_EQ(refused.message(), "program 'twice': its slice was closed");
    ASSERT_GT(accepted, 10);
    // A round trip to the server: its answers to everything sent before
    // (errors for rejected calls included) have reached the client.
    ASSERT_TRUE(client_->CreateSlice({.num_devices = 1}).ok());
    std::vector<float> y(4);
    absl::Status fetched = client_->Fetch(last, y.data());
    ASSERT_TRUE(fetched.ok()) << fetched;
    EXPECT_EQ(y, (std::vector<float>{2, 4, 6, 8}));
  }
}

}  // namespace
}  // namespace plexus
