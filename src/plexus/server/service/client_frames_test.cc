// A client session's ops as frames, as the server sees them from a raw
// client (gRPC stream and data-plane connection by hand, as another
// release or anything else would send them): the hello names the ops
// listener; a batch sent as a frame after the stream's last message is
// routed; the stream carrying anything after that message, or a marker
// where no listener was offered, ends the session; no listener under the
// option.
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "plexus/common/credentials.h"
#include "plexus/common/protocol.h"
#include "plexus/proto/plexus.grpc.pb.h"
#include "plexus/server/server.h"
#include "plexus/transport/data_plane.h"

namespace plexus {
namespace {

using ClientStream =
    grpc::ClientReaderWriter<proto::ClientToServer, proto::ServerToClient>;

class ClientFramesTest : public ::testing::Test {
 protected:
  void Start(bool client_ops_on_frames) {
    ServerOptions options;
    options.client_ops_on_frames = client_ops_on_frames;
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = proto::Controller::NewStub(grpc::CreateChannel(
        server_->address(), grpc::InsecureChannelCredentials()));
  }

  // A session opened by hand: its stream and the server's first answer.
  struct Session {
    grpc::ClientContext ctx;
    std::unique_ptr<ClientStream> stream;
    proto::ServerToClient first;
  };
  std::unique_ptr<Session> Open() {
    auto s = std::make_unique<Session>();
    s->ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    s->stream = stub_->ClientSession(&s->ctx);
    proto::ClientToServer hello;
    hello.set_client_name("by-hand");
    hello.set_protocol_version(kProtocolVersion);
    EXPECT_TRUE(s->stream->Write(hello));
    EXPECT_TRUE(s->stream->Read(&s->first));
    return s;
  }

  // The session's connection to the ops listener, proving its credential.
  std::unique_ptr<transport::DataPlaneConnection> ConnectOps(const Session& s) {
    transport::DataPlaneIdentity me;
    me.peer = {CredentialRole::kClient, s.first.client_id()};
    std::copy(s.first.credential().begin(), s.first.credential().end(),
              me.credential.begin());
    me.generation = s.first.ops_generation();
    auto conn = transport::DataPlaneConnection::Connect(
        "", s.first.ops_unix_name(), &counters_, me);
    EXPECT_TRUE(conn.ok()) << conn.status();
    return conn.ok() ? std::move(*conn) : nullptr;
  }

  static proto::ClientToServer Marker() {
    proto::ClientToServer moved;
    moved.set_ops_on_frames(true);
    return moved;
  }

  // The stream's end as the client reads it: every message until then
  // (the slice replies among them), then the status.
  static grpc::Status ReadToEnd(Session& s, int* slices_granted) {
    proto::ServerToClient msg;
    while (s.stream->Read(&msg)) {
      for (const proto::SliceReply& r : msg.slices()) {
        if (!r.has_error()) ++*slices_granted;
      }
    }
    return s.stream->Finish();
  }

  int Clients() {
    grpc::ClientContext ctx;
    proto::ClusterStatus status;
    EXPECT_TRUE(stub_->GetStatus(&ctx, {}, &status).ok());
    return status.clients_size();
  }

  transport::DataPlaneCounters counters_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<proto::Controller::Stub> stub_;
};

TEST_F(ClientFramesTest,
       ABatchAfterTheMarkerIsRoutedAndTheStreamMayCarryNoMore) {
  Start(/*client_ops_on_frames=*/true);
  auto s = Open();
  ASSERT_NE(s->first.ops_generation(), 0u);
  EXPECT_GT(s->first.ops_tcp_port(), 0);
  EXPECT_FALSE(s->first.ops_unix_name().empty());
  auto conn = ConnectOps(*s);
  ASSERT_NE(conn, nullptr);
  ASSERT_TRUE(conn->SendOps("").ok());
  ASSERT_TRUE(s->stream->Write(Marker()));
  // A slice request as a frame: the server routes it and answers on the
  // stream (a slice of no devices is refused; the answer is what counts).
  proto::ClientToServer batch;
  proto::SliceRequest* req = batch.add_ops()->mutable_slice_request();
  req->set_request_id(1);
  req->set_num_devices(1);
  req->set_timeout_ms(0);
  ASSERT_TRUE(conn->SendOps(batch.SerializeAsString()).ok());
  proto::ServerToClient answer;
  ASSERT_TRUE(s->stream->Read(&answer));
  ASSERT_EQ(answer.slices_size(), 1);
  EXPECT_EQ(answer.slices(0).request_id(), 1u);
  // Anything more on the stream has no order with the frames: the session
  // ends.
  proto::ClientToServer late;
  late.add_ops()->set_slice_release(1);
  ASSERT_TRUE(s->stream->Write(late));
  int granted = 0;
  EXPECT_TRUE(ReadToEnd(*s, &granted).ok());
  EXPECT_EQ(Clients(), 0);
}

TEST_F(ClientFramesTest, AMarkerWhereNoListenerWasOfferedEndsTheSession) {
  Start(/*client_ops_on_frames=*/false);
  auto s = Open();
  EXPECT_EQ(s->first.ops_generation(), 0u);
  EXPECT_EQ(s->first.ops_tcp_port(), 0);
  EXPECT_TRUE(s->first.ops_unix_name().empty());
  EXPECT_EQ(Clients(), 1);
  ASSERT_TRUE(s->stream->Write(Marker()));
  int granted = 0;
  EXPECT_TRUE(ReadToEnd(*s, &granted).ok());
  EXPECT_EQ(Clients(), 0);
}

TEST_F(ClientFramesTest, TheStreamsEndWaitsForTheFramesSentBeforeIt) {
  Start(/*client_ops_on_frames=*/true);
  auto s = Open();
  auto conn = ConnectOps(*s);
  ASSERT_NE(conn, nullptr);
  ASSERT_TRUE(conn->SendOps("").ok());
  ASSERT_TRUE(s->stream->Write(Marker()));
  // Many batches, the connection closed, the stream half-closed at once:
  // the server applies every frame before it ends the session, so the
  // last one's answer reaches the client before the stream's end.
  constexpr int kBatches = 50;
  for (int i = 1; i <= kBatches; ++i) {
    proto::ClientToServer batch;
    proto::SliceRequest* req = batch.add_ops()->mutable_slice_request();
    req->set_request_id(i);
    req->set_num_devices(1);
    req->set_timeout_ms(0);
    ASSERT_TRUE(conn->SendOps(batch.SerializeAsString()).ok());
  }
  conn.reset();
  ASSERT_TRUE(s->stream->WritesDone());
  proto::ServerToClient msg;
  int answered = 0;
  while (s->stream->Read(&msg)) answered += msg.slices_size();
  EXPECT_TRUE(s->stream->Finish().ok());
  EXPECT_EQ(answered, kBatches);
}

}  // namespace
}  // namespace plexus
