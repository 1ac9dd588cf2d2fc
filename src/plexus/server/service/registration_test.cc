// Registration as the server sees it, over raw gRPC streams (what another
// release, or anything else, would send): the protocol version, each
// registration's generation, the address the server advertises, and what
// a rejoining worker is told.
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "plexus/common/credentials.h"
#include "plexus/common/protocol.h"
#include "plexus/proto/plexus.grpc.pb.h"
#include "plexus/server/server.h"
#include "plexus/transport/data_plane.h"
#include "plexus/transport/internal/frame_socket.h"

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
  // The first status in which `n` workers are all down (each status is a
  // round trip: bounded by count and time), else the last one read.
  proto::ClusterStatus AwaitAllDown(int n) {
    proto::ClusterStatus status;
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    for (int i = 0; i < 100'000 && absl::Now() < deadline; ++i) {
      status = Status();
      if (status.workers_size() == n &&
          std::none_of(status.workers().begin(), status.workers().end(),
                       [](const auto& w) { return w.alive(); })) {
        break;
      }
    }
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

// A worker's data plane as the server's ops connection finds it: proves
// the server credential back, records each OPS frame's message, and
// refuses one once told to (the connection then closes).
class OpsPlane : public transport::DataPlaneHandler {
 public:
  explicit OpsPlane(const ClusterSecret& secret) : secret_(secret) {}
  absl::StatusOr<Credential> CredentialFor(
      const transport::DataPlanePeer& peer) override {
    if (peer.role != CredentialRole::kServer) {
      return absl::PermissionDeniedError("only the server here");
    }
    return secret_.Derive(CredentialRole::kServer);
  }
  absl::Status Authorize(transport::DataPlaneRequest request,
                         const transport::ShardKey&,
                         const transport::DataPlanePeer&) override {
    return request == transport::DataPlaneRequest::kOps
               ? absl::OkStatus()
               : absl::PermissionDeniedError("ops only");
  }
  absl::Status ApplyOps(const transport::DataPlanePeer&, uint64_t generation,
                        std::string& bytes) override {
    absl::MutexLock lock(&mu_);
    proto::ServerToWorker msg;
    if (!msg.ParseFromString(bytes)) return absl::DataLossError("not a msg");
    generations_.push_back(generation);
    messages_.push_back(std::move(msg));
    return refuse_ ? absl::InternalError("told to refuse") : absl::OkStatus();
  }
  void OpsEnded(const transport::DataPlanePeer&, uint64_t,
                const absl::Status&) override {
    absl::MutexLock lock(&mu_);
    ended_ = true;
  }
  absl::Status OpsConnectionOpened(const transport::DataPlanePeer&,
                                   uint64_t generation, int fd) override {
    absl::MutexLock lock(&mu_);
    reply_fd_ = ::dup(fd);
    reply_generation_ = generation;
    return absl::OkStatus();
  }
  // A report back to the server on the ops connection, as a worker sends
  // its calls done.
  absl::Status Report(const proto::WorkerToServer& msg) {
    absl::MutexLock lock(&mu_);
    return transport::internal::FrameSocket::SendMessageOn(
        reply_fd_, transport::internal::FrameType::kReports,
        msg.SerializeAsString(), reply_generation_);
  }
  ~OpsPlane() override {
    absl::MutexLock lock(&mu_);
    if (reply_fd_ >= 0) ::close(reply_fd_);
  }
  // The messages, once one carries a clock echo of `t1`; false at the
  // deadline.
  bool AwaitEcho(int64_t t1, std::vector<proto::ServerToWorker>* messages,
                 std::vector<uint64_t>* generations) {
    absl::MutexLock lock(&mu_);
    auto echoed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const proto::ServerToWorker& m : messages_) {
        for (const proto::WorkerOp& op : m.ops()) {
          if (op.has_clock_echo() && op.clock_echo().t1() == t1) return true;
        }
      }
      return false;
    };
    const bool got =
        mu_.AwaitWithTimeout(absl::Condition(&echoed), absl::Seconds(30));
    *messages = messages_;
    *generations = generations_;
    return got;
  }
  void Refuse() {
    absl::MutexLock lock(&mu_);
    refuse_ = true;
  }
  bool AwaitEnded() {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&ended_), absl::Seconds(30));
  }
  // Unused: this plane takes no shards.
  absl::Status AdmitIncoming(const transport::ShardKey&, size_t,
                             bool) override {
    return absl::UnimplementedError("no shards");
  }
  absl::StatusOr<std::shared_ptr<Storage>> AllocateIncoming(
      const transport::ShardKey&, size_t, bool) override {
    return absl::UnimplementedError("no shards");
  }
  absl::Status Deliver(const transport::ShardKey&, std::shared_ptr<Storage>,
                       bool) override {
    return absl::UnimplementedError("no shards");
  }
  void DeliverError(const transport::ShardKey&, const absl::Status&) override {}
  absl::StatusOr<std::shared_ptr<const Storage>> AwaitReady(
      const transport::ShardKey&) override {
    return absl::UnimplementedError("no shards");
  }

 private:
  const ClusterSecret& secret_;
  absl::Mutex mu_;
  std::vector<proto::ServerToWorker> messages_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> generations_ ABSL_GUARDED_BY(mu_);
  bool refuse_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  int reply_fd_ ABSL_GUARDED_BY(mu_) = -1;
  uint64_t reply_generation_ ABSL_GUARDED_BY(mu_) = 0;
};

proto::WorkerToServer Beat(int64_t sent_ns) {
  proto::WorkerToServer beat;
  beat.mutable_heartbeat()->mutable_clock()->set_sent_ns(sent_ns);
  return beat;
}

// A worker that offers it takes its ops on its data plane: the stream's
// last message says so, every later message comes as an OPS frame stamped
// with the registration's generation (a heartbeat's clock echo here), and
// once that connection breaks the server ends the worker's session, as it
// ends a broken stream's.
TEST_F(RegistrationTest, AWorkersOpsMoveToItsDataPlaneAndTheirEndEndsIt) {
  Start();
  OpsPlane plane(server_->secret());
  auto dp = transport::DataPlaneServer::Start({}, &plane, nullptr);
  ASSERT_TRUE(dp.ok()) << dp.status();
  proto::WorkerToServer hello = Registration(kProtocolVersion);
  hello.mutable_register_()->set_data_address((*dp)->tcp_address());
  hello.mutable_register_()->set_machine_id("another machine");
  hello.mutable_register_()->set_ops_on_data_plane(true);
  auto w = Register(hello);
  ASSERT_TRUE(w->accepted) << w->refusal.error_message();
  proto::ServerToWorker msg = w->first;
  while (!msg.ops_on_data_plane()) ASSERT_TRUE(w->stream->Read(&msg));

  ASSERT_TRUE(w->stream->Write(Beat(42)));
  std::vector<proto::ServerToWorker> framed;
  std::vector<uint64_t> generations;
  ASSERT_TRUE(plane.AwaitEcho(42, &framed, &generations));
  for (size_t i = 0; i < framed.size(); ++i) {
    EXPECT_EQ(framed[i].worker_id(), w->first.worker_id());
    EXPECT_EQ(generations[i], w->first.generation());
  }

  // The worker's calls done come back on the same connection: the server
  // reads them there (its count of control bytes in grows by the report).
  proto::WorkerToServer report;
  report.mutable_calls_done()->add_tickets(123456789);
  report.mutable_calls_done()->add_client_ids(1);
  report.mutable_calls_done()->add_busy_micros(1);
  const int64_t before = Status().control_bytes_in();
  ASSERT_TRUE(plane.Report(report).ok());
  int64_t after = before;
  const absl::Time read_by = absl::Now() + absl::Seconds(30);
  for (int i = 0; i < 100'000 && absl::Now() < read_by; ++i) {
    after = Status().control_bytes_in();
    if (after > before) break;
  }
  EXPECT_EQ(after - before, static_cast<int64_t>(report.ByteSizeLong()));

  // The worker's end refuses the next frame and closes the connection;
  // the server's writes then fail, and it ends the session.
  plane.Refuse();
  ASSERT_TRUE(w->stream->Write(Beat(43)));
  ASSERT_TRUE(plane.AwaitEnded());
  absl::Notification ended;
  std::thread reader([&] {
    proto::ServerToWorker rest;
    // Nothing more comes on the stream: it ends.
    while (w->stream->Read(&rest)) ADD_FAILURE() << rest.DebugString();
    ended.Notify();
  });
  // Each beat makes the server write an echo: one soon fails.
  for (int64_t t = 44; t < 44 + 1000 && !ended.HasBeenNotified(); ++t) {
    if (!w->stream->Write(Beat(t))) break;
    ended.WaitForNotificationWithTimeout(absl::Milliseconds(5));
  }
  reader.join();
  EXPECT_TRUE(ended.HasBeenNotified());
  w->stream->Finish().IgnoreError();
  // The stream ended on this side as the server cancelled it; its handler
  // then declares the worker down.
  const proto::ClusterStatus status = AwaitAllDown(1);
  ASSERT_EQ(status.workers_size(), 1);
  EXPECT_FALSE(status.workers(0).alive());
  EXPECT_NE(status.workers(0).down_reason().find("lost its connection"),
            std::string::npos)
      << status.workers(0).down_reason();
}

// A worker whose data plane the server cannot reach (a port nothing
// listens on) keeps its ops on its stream: the server says why, and the
// worker's heartbeat is answered there.
TEST_F(RegistrationTest, OpsStayOnTheStreamWhereTheDataPlaneCannotBeReached) {
  Start();
  // A port that was bound and closed: a connection to it is refused.
  std::string refused_address;
  {
    OpsPlane plane(server_->secret());
    auto dp = transport::DataPlaneServer::Start({}, &plane, nullptr);
    ASSERT_TRUE(dp.ok()) << dp.status();
    refused_address = (*dp)->tcp_address();
  }
  proto::WorkerToServer hello = Registration(kProtocolVersion);
  hello.mutable_register_()->set_data_address(refused_address);
  hello.mutable_register_()->set_machine_id("another machine");
  hello.mutable_register_()->set_ops_on_data_plane(true);
  auto w = Register(hello);
  ASSERT_TRUE(w->accepted) << w->refusal.error_message();
  ASSERT_TRUE(w->stream->Write(Beat(42)));
  proto::ServerToWorker msg = w->first;
  bool echoed = false;
  while (!echoed) {
    EXPECT_FALSE(msg.ops_on_data_plane());
    for (const proto::WorkerOp& op : msg.ops()) {
      echoed = echoed || (op.has_clock_echo() && op.clock_echo().t1() == 42);
    }
    if (!echoed) ASSERT_TRUE(w->stream->Read(&msg));
  }
  proto::ClusterStatus status = Status();
  ASSERT_EQ(status.workers_size(), 1);
  EXPECT_TRUE(status.workers(0).alive());
  End(*w);
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

// A stream's end names how it ended: the worker closed it (its session
// ended on its side), or the connection was cut under it (a killed
// process, a lost host, an unanswered keepalive: here its call is
// cancelled), with when the worker was last heard from. It used to say
// "process exited or was killed" either way, also of a live worker whose
// connection had dropped.
TEST_F(RegistrationTest, AWorkersEndSaysHowItsStreamEnded) {
  Start();
  auto closed = Register(Registration(kProtocolVersion));
  auto cut = Register(Registration(kProtocolVersion));
  ASSERT_TRUE(closed->accepted && cut->accepted);
  const int64_t closed_id = closed->first.worker_id();
  closed->stream->WritesDone();
  End(*cut);
  const proto::ClusterStatus status = AwaitAllDown(2);
  ASSERT_EQ(status.workers_size(), 2);
  for (const auto& worker : status.workers()) {
    ASSERT_FALSE(worker.alive());
    const std::string& why = worker.down_reason();
    EXPECT_NE(why.find("lost its connection"), std::string::npos) << why;
    EXPECT_NE(why.find(worker.worker_id() == closed_id
                           ? "the worker closed its stream"
                           : "the connection was cut"),
              std::string::npos)
        << why;
    EXPECT_NE(why.find("last heard from"), std::string::npos) << why;
    EXPECT_EQ(why.find("process exited or was killed"), std::string::npos)
        << why;
  }
  End(*closed);
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
