// The server's ops on a worker's data plane (ServerToWorker.
// ops_on_data_plane): server, workers and client in this process, over
// real sockets. The same calls give the same values whether the ops come
// as frames or on the gRPC stream, and the workers' stats say which.
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

// The workers' ops_frames, from a status that waited for a heartbeat of
// each sent after it was asked for.
std::vector<int64_t> OpsFrames(const std::string& address) {
  auto stub = proto::Controller::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  proto::StatusRequest request;
  request.set_fresh_timeout_ms(5000);
  proto::ClusterStatus status;
  EXPECT_TRUE(stub->GetStatus(&ctx, request, &status).ok());
  std::vector<int64_t> frames;
  for (const proto::WorkerStatus& w : status.workers()) {
    frames.push_back(w.stats().ops_frames());
  }
  return frames;
}

// Two hosts, a slice over both, 400 chained calls on a split value (scale
// by 2, 40 times, then by 1): the values, each worker's ops_frames after (from
// status), and the calls-done reports each sent back as frames.
struct Chained {
  std::vector<float> y;
  std::vector<int64_t> frames;
  std::vector<int64_t> reports;
};

Chained ChainOverTwoHosts(bool ops_on_data_plane) {
  ServerOptions options;
  options.worker_ops_on_data_plane = ops_on_data_plane;
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
  run.frames = OpsFrames(address);
  for (const auto& w : workers) run.reports.push_back(w->framed_reports());
  client->reset();
  workers.clear();
  server->reset();
  return run;
}

TEST(OpsConnectionTest, TheSameCallsGiveTheSameValuesOnFramesAsOnTheStream) {
  const Chained framed = ChainOverTwoHosts(true);
  const Chained streamed = ChainOverTwoHosts(false);
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
  // Their calls done went back on the same connections.
  for (int64_t r : framed.reports) EXPECT_GE(r, 1);
  EXPECT_EQ(streamed.reports, std::vector<int64_t>({0, 0}));
}

}  // namespace
}  // namespace plexus
