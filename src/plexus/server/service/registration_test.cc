// Registration as the server sees it, over raw gRPC streams (what another
// release, or anything else, would send): the protocol version, each
// registration's generation, the address the server advertises, and what
// a rejoining worker is told.
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "plexus/common/credentials.h"
#include "plexus/common/protocol.h"
#include "plexus/proto/plexus.grpc.pb.h"
#include "plexus/server/server.h"

namespace plexus {
namespace {

using WorkerStream =
    grpc::ClientReaderWriter<proto::WorkerToServer, proto::ServerToWorker>;
using ClientStream =
    grpc::ClientReaderWriter<proto::ClientToServer, proto::ServerToClient>;

class RegistrationTest : public ::testing::Test {
 protected:
  void Start(ServerOptions options = {}) {
    auto secret = ClusterSecret::Generate();
    ASSERT_TRUE(secret.ok()) << secret.status();
    options.secret = *secret;
    // Raw workers send no heartbeats.
    options.heartbeat_timeout = absl::Seconds(600);
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = proto::Controller::NewStub(grpc::CreateChannel(
        server_->address(), grpc::InsecureChannelCredentials()));
  }

  proto::WorkerToServer Registration(int32_t version) {
    proto::WorkerToServer hello;
    auto* reg = hello.mutable_register_();
    reg->set_host_name("rawhost");
    reg->set_pid(1);
    reg->add_devices()->set_memory_bytes(1 << 20);
    reg->set_data_address("10.0.0.7:7071");
    const Credential c = server_->secret().Derive(CredentialRole::kWorker);
    reg->set_credential(std::string(c.begin(), c.end()));
    reg->set_protocol_version(version);
    return hello;
  }

  // A registration on its own stream; the first reply, or the refusal.
  struct Session {
    grpc::ClientContext ctx;
    std::unique_ptr<WorkerStream> stream;
    proto::ServerToWorker first;
    bool accepted = false;
    grpc::Status refusal;
  };
  std::unique_ptr<Session> Register(const proto::WorkerToServer& hello) {
    auto s = std::make_unique<Session>();
    s->ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    s->stream = stub_->WorkerSession(&s->ctx);
    EXPECT_TRUE(s->stream->Write(hello));
    s->accepted = s->stream->Read(&s->first);
    if (!s->accepted) s->refusal = s->stream->Finish();
    return s;
  }
  void End(Session& s) {
    s.ctx.TryCancel();
    proto::ServerToWorker drain;
    while (s.stream->Read(&drain)) {
    }
    s.stream->Finish().IgnoreError();
  }

  proto::ClusterStatus Status() {
    grpc::ClientContext ctx;
    proto::ClusterStatus status;
    EXPECT_TRUE(stub_->GetStatus(&ctx, {}, &status).ok());
    return status;
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<proto::Controller::Stub> stub_;
};

TEST_F(RegistrationTest, AWorkerOfAnotherProtocolVersionIsRefused) {
  Start();
  auto s = Register(Registration(kProtocolVersion + 1));
  ASSERT_FALSE(s->accepted) << "the server accepted the worker";
  EXPECT_EQ(s->refusal.error_code(), grpc::FAILED_PRECONDITION);
  EXPECT_NE(s->refusal.error_message().find(absl::StrCat(
                "the worker speaks protocol version ", kProtocolVersion + 1)),
            std::string::npos)
      << s->refusal.error_message();
  EXPECT_NE(s->refusal.error_message().find(absl::StrCat(
                "this server speaks protocol version ", kProtocolVersion)),
            std::string::npos)
      << s->refusal.error_message();
  EXPECT_EQ(Status().workers_size(), 0);

  // A worker that sends none (an older release) is refused too.
  s = Register(Registration(0));
  ASSERT_FALSE(s->accepted);
  EXPECT_EQ(s->refusal.error_code(), grpc::FAILED_PRECONDITION);
  EXPECT_NE(s->refusal.error_message().find("no protocol version"),
            std::string::npos)
      << s->refusal.error_message();
}

TEST_F(RegistrationTest, AClientOfAnotherProtocolVersionIsRefused) {
  Start();
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  std::unique_ptr<ClientStream> stream = stub_->ClientSession(&ctx);
  proto::ClientToServer hello;
  hello.set_client_name("from the future");
  hello.set_protocol_version(kProtocolVersion + 7);
  ASSERT_TRUE(stream->Write(hello));
  proto::ServerToClient reply;
  EXPECT_FALSE(stream->Read(&reply)) << "the server accepted the client";
  grpc::Status refusal = stream->Finish();
  EXPECT_EQ(refusal.error_code(), grpc::FAILED_PRECONDITION);
  EXPECT_NE(refusal.error_message().find(absl::StrCat(
                "the client speaks protocol version ", kProtocolVersion + 7)),
            std::string::npos)
      << refusal.error_message();
  EXPECT_NE(refusal.error_message().find(absl::StrCat(
                "this server speaks protocol version ", kProtocolVersion)),
            std::string::npos)
      << refusal.error_message();
  EXPECT_EQ(Status().clients_size(), 0);
}

TEST_F(RegistrationTest, TheFirstReplySaysVersionGenerationAndHeartbeat) {
  ServerOptions options;
  Start(options);
  auto a = Register(Registration(kProtocolVersion));
  auto b = Register(Registration(kProtocolVersion));
  ASSERT_TRUE(a->accepted && b->accepted);
  EXPECT_EQ(a->first.protocol_version(), kProtocolVersion);
  // Each registration has its own generation, newer than the last.
  EXPECT_GT(a->first.generation(), 0u);
  EXPECT_GT(b->first.generation(), a->first.generation());
  // The server asks for heartbeats at a tenth of its deadline (600 s here).
  EXPECT_EQ(a->first.heartbeat_interval_ms(), 60'000);
  EXPECT_TRUE(a->first.rejoined().empty());
  // Status shows each generation with the address the worker advertised.
  proto::ClusterStatus status = Status();
  ASSERT_EQ(status.workers_size(), 2);
  EXPECT_EQ(status.workers(0).generation(), a->first.generation());
  EXPECT_EQ(status.workers(0).data_address(), "10.0.0.7:7071");
  // A newcomer is told of itself (PeerInfo, with its generation), and of
  // no other host: of each only as an op it is sent needs it
  // (ClusterState::TellPeer), not of all as each registers (O(hosts²)).
  int told = 0;
  proto::ServerToWorker msg = b->first;
  for (const proto::WorkerOp& op : msg.ops()) {
    if (!op.has_peer()) continue;
    EXPECT_EQ(op.peer().worker_id(), b->first.worker_id());
    EXPECT_EQ(op.peer().generation(), b->first.generation());
    told++;
  }
  EXPECT_EQ(told, 1) << msg.DebugString();
  End(*a);
  End(*b);
}

// A worker declared down is told, when it rejoins, that its old
// registration was; the others heard of the down with its generation (the
// one they now refuse).
TEST_F(RegistrationTest, ARejoiningWorkerHearsItWasDeclaredDown) {
  Start();
  auto a = Register(Registration(kProtocolVersion));
  auto b = Register(Registration(kProtocolVersion));
  ASSERT_TRUE(a->accepted && b->accepted);
  const int64_t a_id = a->first.worker_id();
  const uint64_t a_gen = a->first.generation();
  End(*a);  // its stream breaks: declared down
  proto::ServerToWorker msg;
  bool heard = false;
  while (!heard && b->stream->Read(&msg)) {
    for (const proto::WorkerOp& op : msg.ops()) {
      if (op.has_peer_down() && op.peer_down().worker_id() == a_id) {
        EXPECT_EQ(op.peer_down().generation(), a_gen);
        heard = true;
      }
    }
  }
  ASSERT_TRUE(heard);

  proto::WorkerToServer again = Registration(kProtocolVersion);
  again.mutable_register_()->set_previous_worker_id(a_id);
  again.mutable_register_()->set_previous_generation(a_gen);
  auto rejoined = Register(again);
  ASSERT_TRUE(rejoined->accepted);
  EXPECT_NE(rejoined->first.worker_id(), a_id);  // a fresh host
  EXPECT_GT(rejoined->first.generation(), a_gen);
  EXPECT_NE(
      rejoined->first.rejoined().find(absl::StrCat(
          "worker ", a_id, " (generation ", a_gen, ") was declared down")),
      std::string::npos)
      << rejoined->first.rejoined();

  // One this server never knew (it restarted): said so.
  proto::WorkerToServer stranger = Registration(kProtocolVersion);
  stranger.mutable_register_()->set_previous_worker_id(99);
  stranger.mutable_register_()->set_previous_generation(5);
  auto s = Register(stranger);
  ASSERT_TRUE(s->accepted);
  EXPECT_NE(s->first.rejoined().find("the server restarted"), std::string::npos)
      << s->first.rejoined();
  End(*rejoined);
  End(*s);
  End(*b);
}

TEST_F(RegistrationTest, StatusShowsTheAdvertisedAddress) {
  ServerOptions options;
  options.listen_address = "0.0.0.0:0";
  options.advertise_address = "plexus-head.example";
  Start(options);
  const std::string port =
      server_->address().substr(server_->address().rfind(':') + 1);
  EXPECT_EQ(server_->advertised_address(), "plexus-head.example:" + port);
  EXPECT_EQ(Status().address(), "plexus-head.example:" + port);
}

TEST(AdvertisedAddressTest, CompletesThePort) {
  EXPECT_EQ(AdvertisedAddress("", "0.0.0.0:5000"), "0.0.0.0:5000");
  EXPECT_EQ(AdvertisedAddress("head", "0.0.0.0:5000"), "head:5000");
  EXPECT_EQ(AdvertisedAddress("head:443", "0.0.0.0:5000"), "head:443");
  EXPECT_EQ(AdvertisedAddress("fd00::1", "[::]:5000"), "[fd00::1]:5000");
  EXPECT_EQ(AdvertisedAddress("[fd00::1]:7", "[::]:5000"), "[fd00::1]:7");
  EXPECT_EQ(AdvertisedAddress("[fd00::1]", "[::]:5000"), "[fd00::1]:5000");
}

}  // namespace
}  // namespace plexus
