// The server's ops on a worker's data plane (ServerToWorker.
// ops_on_data_plane) and a client's ops on the server's ops listener
// (ClientToServer.ops_on_frames): server, workers and client in this
// process, over real sockets. The same calls give the same values whether
// the ops come as frames or on the gRPC streams, and the workers' stats,
// the client's counters and the server's status say which.
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "plexus/client/client.h"
#include "plexus/proto/plexus.grpc.pb.h"
#include "plexus/server/server.h"
#include "plexus/worker/worker.h"
#include "plexus/worker/worker_impl.h"

namespace plexus {
namespace {

// A status that asked each worker for a heartbeat and waited for them.
proto::ClusterStatus FreshStatus(const std::string& address) {
  auto stub = proto::Controller::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  proto::StatusRequest request;
  request.set_fresh_timeout_ms(5000);
  proto::ClusterStatus status;
  EXPECT_TRUE(stub->GetStatus(&ctx, request, &status).ok());
  return status;
}

// Two hosts, a slice over both, 400 chained calls on a split value (scale
// by 2, 40 times, then by 1): the values, each worker's ops_frames after (from
// status), the calls-done reports each sent back as frames, the client's
// messages sent as frames, and the frames the server's status counts for
// its session.
struct Chained {
  std::vector<float> y;
  std::vector<int64_t> frames;
  std::vector<int64_t> reports;
  // Then, with no call running, after two more fresh statuses (each asks
  // every worker for a heartbeat): the frames each worker had sent back
  // (its heartbeats among them, or not).
  std::vector<int64_t> reports_idle;
  int64_t client_frames = -1;
  int64_t client_messages = -1;
  int64_t server_client_frames = -1;
  bool server_says_on_frames = false;
};

Chained ChainOverTwoHosts(bool ops_on_data_plane, bool client_ops_on_frames) {
  ServerOptions options;
  options.worker_ops_on_data_plane = ops_on_data_plane;
  options.client_ops_on_frames = client_ops_on_frames;
  auto server = Server::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return {};
  const std::string address = (*server)->address();
  std::vector<std::unique_ptr<WorkerImpl>> workers;
  for (const char* host : {"a", "b"}) {
    auto worker = std::make_unique<WorkerImpl>(
        WorkerOptions{.server_address = address,
                      .host_name = host,
                      .device_memory = 64 << 20,
                      .secret = (*server)->secret()});
    absl::Status started = worker->Init();
    EXPECT_TRUE(started.ok()) << started;
    if (!started.ok()) return {};
    workers.push_back(std::move(worker));
  }
  EXPECT_TRUE((*server)->WaitForWorkers(2, absl::Seconds(30)).ok());
  auto client = Client::Connect(address);
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return {};
  auto slice = (*client)->CreateSlice({.num_devices = 2});
  EXPECT_TRUE(slice.ok()) << slice.status();
  if (!slice.ok()) return {};
  EXPECT_EQ((*slice)->num_hosts(), 2);
  const ArgSpec arg{{DType::kF32, {4}}, Sharding::Split(0)};
  const std::vector<float> x = {1, 2, 3, 4};
  auto y = (*client)->Put(*slice, x.data(), arg);
  EXPECT_TRUE(y.ok()) << y.status();
  auto twice =
      (*client)->Compile(*slice, "twice", "scale", {{"factor", 2.0}}, {arg});
  auto same =
      (*client)->Compile(*slice, "same", "scale", {{"factor", 1.0}}, {arg});
  EXPECT_TRUE(twice.ok()) << twice.status();
  EXPECT_TRUE(same.ok()) << same.status();
  if (!y.ok() || !twice.ok() || !same.ok()) return {};
  // More calls than admission lets in at once: the chain ends only if
  // the workers' completions reach the server.
  Future at = *y;
  for (int i = 0; i < 400; ++i) {
    auto out = (*client)->Call(i < 40 ? **twice : **same, {at});
    EXPECT_TRUE(out.ok()) << out.status();
    if (!out.ok()) return {};
    at = (*out)[0];
  }
  Chained run;
  run.y.resize(4);
  EXPECT_TRUE((*client)->Fetch(at, run.y.data()).ok());
  const proto::ClusterStatus status = FreshStatus(address);
  for (const proto::WorkerStatus& w : status.workers()) {
    run.frames.push_back(w.stats().ops_frames());
  }
  for (const auto& w : workers) run.reports.push_back(w->framed_reports());
  FreshStatus(address);
  FreshStatus(address);
  for (const auto& w : workers) {
    run.reports_idle.push_back(w->framed_reports());
  }
  const ClientCounters counters = (*client)->counters();
  run.client_frames = counters.messages_sent_as_frames;
  run.client_messages = counters.messages_sent;
  EXPECT_EQ(status.clients_size(), 1);
  if (status.clients_size() == 1) {
    run.server_client_frames = status.clients(0).ops_frames();
    run.server_says_on_frames = status.clients(0).ops_on_frames();
  }
  client->reset();
  workers.clear();
  server->reset();
  return run;
}

TEST(OpsConnectionTest, TheSameCallsGiveTheSameValuesOnFramesAsOnTheStream) {
  const Chained framed = ChainOverTwoHosts(true, true);
  const Chained streamed = ChainOverTwoHosts(false, false);
  // x * 2^40: exact in float32.
  std::vector<float> expected = {1, 2, 3, 4};
  for (float& e : expected) e *= 1099511627776.0f;
  EXPECT_EQ(framed.y, expected);
  EXPECT_EQ(streamed.y, expected);
  // Every worker took each call's Execute as a frame (at least the 40
  // calls' writes, batched as the queue batches them: at least one), and
  // none where the server keeps them on the stream.
  ASSERT_EQ(framed.frames.size(), 2u);
  for (int64_t f : framed.frames) EXPECT_GE(f, 1);
  EXPECT_EQ(streamed.frames, std::vector<int64_t>({0, 0}));
  // Their calls done went back on the same connections, and so did their
  // heartbeats (protocol version 3): with nothing running, two heartbeats
  // each went as frames (a late calls-done report is at most one more).
  for (int64_t r : framed.reports) EXPECT_GE(r, 1);
  EXPECT_EQ(streamed.reports, std::vector<int64_t>({0, 0}));
  ASSERT_EQ(framed.reports_idle.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_GE(framed.reports_idle[i] - framed.reports[i], 2) << "worker " << i;
  }
  EXPECT_EQ(streamed.reports_idle, std::vector<int64_t>({0, 0}));
  // Every message the client sent after its session opened went as a
  // frame (the slice request, puts, programs, the 400 calls: more than
  // one); the server applied each (its status counts them, the stats
  // message of the last second among them, or not yet); none on the
  // stream where the server keeps them there.
  EXPECT_GE(framed.client_frames, 2);
  EXPECT_EQ(framed.client_frames, framed.client_messages);
  EXPECT_TRUE(framed.server_says_on_frames);
  EXPECT_GE(framed.server_client_frames, 2);
  EXPECT_LE(framed.server_client_frames, framed.client_frames);
  EXPECT_EQ(streamed.client_frames, 0);
  EXPECT_GE(streamed.client_messages, 2);
  EXPECT_EQ(streamed.server_client_frames, 0);
}

TEST(OpsConnectionTest, EachSideOfTheServerMovesOnItsOwn) {
  // The client's ops as frames, the workers' on their streams, and the
  // other way round: the same values.
  std::vector<float> expected = {1, 2, 3, 4};
  for (float& e : expected) e *= 1099511627776.0f;
  const Chained client_framed = ChainOverTwoHosts(false, true);
  EXPECT_EQ(client_framed.y, expected);
  EXPECT_EQ(client_framed.frames, std::vector<int64_t>({0, 0}));
  EXPECT_GE(client_framed.client_frames, 2);
  const Chained workers_framed = ChainOverTwoHosts(true, false);
  EXPECT_EQ(workers_framed.y, expected);
  for (int64_t f : workers_framed.frames) EXPECT_GE(f, 1);
  EXPECT_EQ(workers_framed.client_frames, 0);
}

}  // namespace
}  // namespace plexus
