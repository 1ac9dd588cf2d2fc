// The server in this process, driven over its gRPC API.
#include "plexus/server/server.h"

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "plexus/proto/plexus.grpc.pb.h"

namespace plexus {
namespace {

grpc::Status CallShutdown(const std::string& address) {
  auto stub = proto::Controller::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  proto::ShutdownReply reply;
  return stub->Shutdown(&ctx, proto::ShutdownRequest(), &reply);
}

// The Shutdown RPC shuts the server down before it answers, and leaves no
// thread behind that holds the server: the owner may destroy it as soon as
// Wait() returns. Before, the RPC detached a thread that called Shutdown()
// later on `this`: the reply could come first (the server still up), and a
// server destroyed meanwhile (SIGTERM at the same time) was used after free.
TEST(ServerTest, ShutdownRpcHasShutDownTheServerWhenItAnswers) {
  for (int i = 0; i < 20; ++i) {
    SCOPED_TRACE(i);
    auto server = Server::Start({});
    ASSERT_TRUE(server.ok()) << server.status();
    grpc::Status rpc = CallShutdown((*server)->address());
    ASSERT_TRUE(rpc.ok()) << rpc.error_message();
    // Already shut down: a wait for workers ends at once, saying so.
    absl::Status waited = (*server)->WaitForWorkers(1, absl::ZeroDuration());
    EXPECT_TRUE(absl::IsCancelled(waited)) << waited;
    (*server)->Wait();  // returns: the server is down
    server->reset();    // at once, as plexus-server's main does
  }
}

}  // namespace
}  // namespace plexus
