// The server in this process, driven over its gRPC API: raw requests, as a
// hostile process would send them, so that each check is the server's own.
#include "plexus/server/server.h"

#include <unistd.h>

#include <cstdio>
#include <functional>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "plexus/common/credentials.h"
#include "plexus/common/protocol.h"
#include "plexus/common/status_proto.h"
#include "plexus/common/types.h"
#include "plexus/proto/plexus.grpc.pb.h"
#include "plexus/server/service/server_test_util.h"
#include "plexus/store/object_store.h"

namespace plexus {
namespace {

grpc::Status CallShutdown(const std::string& address,
                          const std::string& credential) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  proto::ShutdownRequest request;
  request.set_credential(credential);
  proto::ShutdownReply reply;
  return Stub(address)->Shutdown(&ctx, request, &reply);
}

TEST(ServerTest, ItsOwnStallIsALivenessCheckLateByHalfTheDeadline) {
  ServerOptions options;
  options.heartbeat_timeout = absl::Seconds(1);  // checked every 100 ms
  EXPECT_FALSE(ServerStalled(absl::Milliseconds(100), options));
  EXPECT_FALSE(ServerStalled(absl::Milliseconds(600), options));
  EXPECT_TRUE(ServerStalled(absl::Milliseconds(601), options));
  EXPECT_TRUE(ServerStalled(absl::Seconds(2), options));
  options.liveness_check_period = absl::Seconds(1);  // as a test may set
  EXPECT_FALSE(ServerStalled(absl::Milliseconds(1500), options));
  EXPECT_TRUE(ServerStalled(absl::Milliseconds(1501), options));
}

// A server started again on its journal and stopped before it appended
// anything (as a SIGKILL right after a restart leaves it) starts a third
// time on it. Before, that start failed: "cannot compact up to record N: it
// must be after the snapshot (N)" (found by bench/server_kill.py).
TEST(ServerJournalTest, AJournalThatIsOneSnapshotServesAnotherStart) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/journal-",
                                        getpid(), "-one-snapshot.db");
  for (const char* suffix : {"", "-wal", "-shm"}) {
    std::remove(absl::StrCat(path, suffix).c_str());
  }
  const ClusterSecret secret = NewSecret();
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE(absl::StrCat("start ", run + 1));
    ServerOptions options;
    options.secret = secret;
    options.journal_path = path;
    options.heartbeat_timeout = absl::Hours(1);
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    if (run == 0) {  // a worker registration: a record to compact
      auto stub = Stub((*server)->address());
      RawWorker worker(*stub, Bytes(secret.Derive(CredentialRole::kWorker)));
      ASSERT_NE(worker.worker_id(), 0);
    }
  }
  // Not left in the temporary folder (every run of the suite made one).
  for (const char* suffix : {"", "-wal", "-shm"}) {
    std::remove(absl::StrCat(path, suffix).c_str());
  }
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
    grpc::Status rpc =
        CallShutdown((*server)->address(),
                     Bytes((*server)->secret().Derive(CredentialRole::kAdmin)));
    ASSERT_TRUE(rpc.ok()) << rpc.error_message();
    // Already shut down: a wait for workers ends at once, saying so.
    absl::Status waited = (*server)->WaitForWorkers(1, absl::ZeroDuration());
    EXPECT_TRUE(absl::IsCancelled(waited)) << waited;
    (*server)->Wait();  // returns: the server is down
    server->reset();    // at once, as plexus-server's main does
  }
}

class ServerCredentialsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    secret_ = NewSecret();
    ServerOptions options;
    options.secret = secret_;
    options.heartbeat_timeout = absl::Seconds(60);  // raw workers are silent
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = Stub(server_->address());
  }
  void TearDown() override { server_.reset(); }

  proto::ClusterStatus Status() {
    grpc::ClientContext ctx;
    proto::ClusterStatus status;
    grpc::Status s = stub_->GetStatus(&ctx, proto::StatusRequest(), &status);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return status;
  }
  bool Up() { return server_->WaitForWorkers(0, absl::ZeroDuration()).ok(); }

  ClusterSecret secret_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<proto::Controller::Stub> stub_;
};

TEST_F(ServerCredentialsTest, ShutdownNeedsTheAdminCredential) {
  const ClusterSecret other = NewSecret();
  const std::string admin = Bytes(secret_.Derive(CredentialRole::kAdmin));
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"none", ""},
      {"another cluster's", Bytes(other.Derive(CredentialRole::kAdmin))},
      {"the worker credential", Bytes(secret_.Derive(CredentialRole::kWorker))},
      {"a client credential",
       Bytes(secret_.Derive(CredentialRole::kClient, 1))},
      {"a prefix of the right one", admin.substr(0, kCredentialSize - 1)},
      {"the secret itself", secret_.ToHex()},
  };
  for (const auto& [what, credential] : refused) {
    SCOPED_TRACE(what);
    grpc::Status rpc = CallShutdown(server_->address(), credential);
    EXPECT_EQ(rpc.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_NE(rpc.error_message().find("shutdown refused"), std::string::npos)
        << rpc.error_message();
    EXPECT_TRUE(Up()) << "the server shut down";
  }
  EXPECT_EQ(Status().address(), server_->address());  // still serving
  grpc::Status rpc = CallShutdown(server_->address(), admin);
  EXPECT_TRUE(rpc.ok()) << rpc.error_message();
  EXPECT_FALSE(Up());
}

TEST_F(ServerCredentialsTest, WorkerRegistrationNeedsTheWorkerCredential) {
  const ClusterSecret other = NewSecret();
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"none", ""},
      {"another cluster's", Bytes(other.Derive(CredentialRole::kWorker))},
      {"the admin credential", Bytes(secret_.Derive(CredentialRole::kAdmin))},
  };
  for (const auto& [what, credential] : refused) {
    SCOPED_TRACE(what);
    RawWorker intruder(*stub_, credential);
    grpc::Status refusal = intruder.Refusal();
    EXPECT_EQ(refusal.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_NE(refusal.error_message().find("worker registration refused"),
              std::string::npos)
        << refusal.error_message();
  }
  EXPECT_EQ(Status().workers_size(), 0);
  RawWorker worker(*stub_, Bytes(secret_.Derive(CredentialRole::kWorker)));
  EXPECT_NE(worker.worker_id(), 0);
  EXPECT_EQ(Status().workers_size(), 1);
}

TEST_F(ServerCredentialsTest, EachClientSessionGetsItsOwnCredential) {
  RawClient a(*stub_, "a", {});
  RawClient b(*stub_, "b", {});
  a.ReadUntil([&] { return !a.credential_.empty(); });
  b.ReadUntil([&] { return !b.credential_.empty(); });
  ASSERT_NE(a.id_, b.id_);
  EXPECT_EQ(a.credential_,
            Bytes(secret_.Derive(CredentialRole::kClient, a.id_)));
  EXPECT_EQ(b.credential_,
            Bytes(secret_.Derive(CredentialRole::kClient, b.id_)));
  // Status shows neither credential nor the secret, in any form.
  RawWorker worker(*stub_, Bytes(secret_.Derive(CredentialRole::kWorker)));
  ASSERT_NE(worker.worker_id(), 0);
  const std::string status = Status().SerializeAsString();
  for (const std::string& hidden :
       {a.credential_, b.credential_,
        Bytes(secret_.Derive(CredentialRole::kWorker)), secret_.ToHex(),
        absl::HexStringToBytes(secret_.ToHex())}) {
    EXPECT_EQ(status.find(hidden), std::string::npos);
  }
}

// Opens a client session whose first message names `tenant` with
// `credential`; the session's client id, or how the server refused it.
absl::StatusOr<uint64_t> OpenSession(proto::Controller::Stub& stub,
                                     const std::string& tenant,
                                     const std::string& credential) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  auto stream = stub.ClientSession(&ctx);
  proto::ClientToServer hello;
  hello.set_client_name("t");
  hello.set_protocol_version(kProtocolVersion);
  hello.set_tenant(tenant);
  hello.set_tenant_credential(credential);
  stream->Write(hello);
  proto::ServerToClient first;
  const bool opened = stream->Read(&first);
  stream->WritesDone();
  proto::ServerToClient drain;
  while (stream->Read(&drain)) {
  }
  grpc::Status end = stream->Finish();
  if (opened) return first.client_id();
  return absl::Status(static_cast<absl::StatusCode>(end.error_code()),
                      end.error_message());
}

TEST_F(ServerCredentialsTest, AnonymousSessionsOpenAsDefaultOnLoopback) {
  absl::StatusOr<uint64_t> id = OpenSession(*stub_, "", "");
  ASSERT_TRUE(id.ok()) << id.status();
  RawClient a(*stub_, "a", {});
  a.ReadUntil([&] { return a.id_ != 0; });
  ASSERT_EQ(Status().clients_size(), 1);
  EXPECT_EQ(Status().clients(0).tenant(), "default");
}

TEST(ServerTenantTest, ASessionMustProveItsTenantWhereAnonymousIsRefused) {
  const ClusterSecret secret = NewSecret();
  ServerOptions options;
  options.secret = secret;
  options.anonymous_clients = false;
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = Stub((*server)->address());
  const std::string research =
      Bytes(secret.Derive(CredentialRole::kTenant, "research"));
  struct Attempt {
    const char* what;
    std::string tenant;
    std::string credential;
    const char* says;
  };
  const std::vector<Attempt> refused = {
      {"anonymous", "", "", "PLEXUS_TENANT_TOKEN"},
      {"no token", "research", "", "no tenant token for tenant 'research'"},
      {"another tenant's token", "ops", research,
       "does not match tenant 'ops'"},
      {"another cluster's token", "research",
       Bytes(NewSecret().Derive(CredentialRole::kTenant, "research")),
       "does not match tenant 'research'"},
      {"a client credential", "research",
       Bytes(secret.Derive(CredentialRole::kClient, 1)), "does not match"},
      {"a prefix", "research", research.substr(0, 8), "does not match"},
      {"a bad name", "a b", research, "tenant 'a b'"},
  };
  for (const Attempt& attempt : refused) {
    SCOPED_TRACE(attempt.what);
    absl::StatusOr<uint64_t> id =
        OpenSession(*stub, attempt.tenant, attempt.credential);
    ASSERT_FALSE(id.ok());
    EXPECT_EQ(id.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_NE(id.status().message().find(attempt.says), std::string::npos)
        << id.status();
  }
  // The right token opens a session that status shows under its tenant,
  // and never the token.
  grpc::ClientContext ctx;
  auto stream = stub->ClientSession(&ctx);
  proto::ClientToServer hello;
  hello.set_protocol_version(kProtocolVersion);
  hello.set_tenant("research");
  hello.set_tenant_credential(research);
  ASSERT_TRUE(stream->Write(hello));
  proto::ServerToClient first;
  ASSERT_TRUE(stream->Read(&first));
  EXPECT_NE(first.client_id(), 0u);
  grpc::ClientContext status_ctx;
  proto::ClusterStatus status;
  ASSERT_TRUE(
      stub->GetStatus(&status_ctx, proto::StatusRequest(), &status).ok());
  ASSERT_EQ(status.clients_size(), 1);
  EXPECT_EQ(status.clients(0).tenant(), "research");
  EXPECT_EQ(status.SerializeAsString().find(research), std::string::npos);
  stream->WritesDone();
  while (stream->Read(&first)) {
  }
  stream->Finish().IgnoreError();
}

proto::ClientOp SliceOp(uint64_t request_id) {
  proto::ClientOp op;
  op.mutable_slice_request()->set_request_id(request_id);
  op.mutable_slice_request()->set_num_devices(1);
  return op;
}

const ArgSpec kArg{{DType::kF32, {4}}, Sharding::Replicated()};

proto::ClientOp ProgramOp(uint64_t id) {
  proto::ClientOp op;
  op.mutable_program()->set_program_id(id);
  auto* def = op.mutable_program()->mutable_program();
  def->set_name("twice");
  def->set_kernel("scale");
  *def->add_inputs() = ToProto(kArg);
  *def->add_outputs() = ToProto(kArg);
  return op;
}

proto::ClientOp PutOp(uint64_t buffer, uint64_t slice) {
  proto::ClientOp op;
  op.mutable_put()->set_buffer_id(buffer);
  op.mutable_put()->set_slice_id(slice);
  *op.mutable_put()->mutable_arg() = ToProto(kArg);
  return op;
}

bool Names(const proto::WorkerOp& op, uint64_t id) {
  if (op.has_declare()) return op.declare().buffer_id() == id;
  if (op.has_transfer()) return op.transfer().buffer_id() == id;
  for (uint64_t b : op.fail().buffer_ids()) {
    if (b == id) return true;
  }
  return Releases(op, id) || Makes(op, id) || Reads(op, id);
}

// Client B knows client A's buffer id (ids are sequential; status shows
// client ids) and names it in raw requests: as a call input, as a call
// output, as a put, in a release. Each is refused or ignored by the
// server, the refusals say PERMISSION_DENIED, and no op naming A's buffer
// reaches the worker.
TEST_F(ServerCredentialsTest, AnotherClientsBufferIdsGetNothing) {
  RawWorker worker(*stub_, Bytes(secret_.Derive(CredentialRole::kWorker)));
  ASSERT_NE(worker.worker_id(), 0);
  RawClient a(*stub_, "a", {SliceOp(1)});
  a.ReadUntil([&] { return !a.slices_.empty(); });
  ASSERT_TRUE(a.slices_[0].has_slice()) << a.slices_[0].error().message();
  const uint64_t a_slice = a.slices_[0].slice().slice_id();
  const uint64_t a_buffer = a.Id(2);
  a.Send({PutOp(a_buffer, a_slice)});
  proto::WorkerOp op;
  do {
    ASSERT_TRUE(worker.NextOp(&op));
  } while (!Names(op, a_buffer));  // A's own declare

  RawClient b(*stub_, "b", {SliceOp(1)});
  b.ReadUntil([&] { return !b.slices_.empty(); });
  ASSERT_TRUE(b.slices_[0].has_slice()) << b.slices_[0].error().message();
  const uint64_t b_slice = b.slices_[0].slice().slice_id();
  proto::ClientOp read;  // B's program reading A's buffer
  read.mutable_call()->set_call_id(b.Id(2));
  read.mutable_call()->set_slice_id(b_slice);
  read.mutable_call()->set_program_id(b.Id(1));
  auto* in = read.mutable_call()->add_inputs();
  in->set_buffer_id(a_buffer);
  in->set_slice_id(b_slice);
  *in->mutable_arg() = ToProto(kArg);
  read.mutable_call()->add_output_ids(b.Id(3));
  proto::ClientOp write = read;  // ... and one writing it
  write.mutable_call()->set_call_id(b.Id(4));
  write.mutable_call()->mutable_inputs(0)->set_buffer_id(b.Id(5));
  write.mutable_call()->set_output_ids(0, a_buffer);
  proto::ClientOp release;
  release.mutable_release()->set_buffer_id(a_buffer);
  release.mutable_release()->set_slice_id(a_slice);
  const uint64_t marker = b.Id(9);
  b.Send({ProgramOp(b.Id(1)), PutOp(b.Id(5), b_slice), read, write,
          PutOp(a_buffer, b_slice), release, PutOp(marker, b_slice)});
  b.ReadUntil([&] { return b.errors_.size() >= 3; });
  ASSERT_EQ(b.errors_.size(), 3u);
  const std::vector<std::string> want = {"argument 0: buffer id", "output id",
                                         "put: buffer id"};
  for (size_t i = 0; i < want.size(); ++i) {
    absl::Status s = StatusFromProto(b.errors_[i].status());
    EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
    EXPECT_NE(s.message().find(want[i]), std::string::npos) << s;
    EXPECT_NE(s.message().find("belongs to another client"), std::string::npos)
        << s;
  }
  EXPECT_EQ(b.errors_[0].call_id(), b.Id(2));
  EXPECT_EQ(b.errors_[1].call_id(), b.Id(4));

  // The worker's ops, in order, up to B's marker: none names A's buffer.
  do {
    ASSERT_TRUE(worker.NextOp(&op));
    EXPECT_FALSE(Names(op, a_buffer)) << op.ShortDebugString();
  } while (!Names(op, marker));
}

// A raw call with the wrong number of inputs (no client library checked
// it) is refused by the server with the rule's one message
// (common/argument_count.h), and nothing reaches the worker.
TEST_F(ServerCredentialsTest, ARawCallWithTheWrongArgumentCountIsRefused) {
  RawWorker worker(*stub_, Bytes(secret_.Derive(CredentialRole::kWorker)));
  ASSERT_NE(worker.worker_id(), 0);
  RawClient c(*stub_, "c", {SliceOp(1)});
  c.ReadUntil([&] { return !c.slices_.empty(); });
  ASSERT_TRUE(c.slices_[0].has_slice()) << c.slices_[0].error().message();
  const uint64_t slice = c.slices_[0].slice().slice_id();
  proto::ClientOp call;  // "twice" takes one input; this passes two
  call.mutable_call()->set_call_id(c.Id(3));
  call.mutable_call()->set_slice_id(slice);
  call.mutable_call()->set_program_id(c.Id(1));
  for (int i = 0; i < 2; ++i) {
    auto* in = call.mutable_call()->add_inputs();
    in->set_buffer_id(c.Id(2));
    in->set_slice_id(slice);
    *in->mutable_arg() = ToProto(kArg);
  }
  call.mutable_call()->add_output_ids(c.Id(4));
  const uint64_t marker = c.Id(9);
  c.Send(
      {ProgramOp(c.Id(1)), PutOp(c.Id(2), slice), call, PutOp(marker, slice)});
  c.ReadUntil([&] { return !c.errors_.empty(); });
  ASSERT_EQ(c.errors_.size(), 1u);
  EXPECT_EQ(c.errors_[0].call_id(), c.Id(3));
  absl::Status s = StatusFromProto(c.errors_[0].status());
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(s.message(), "program 'twice' takes 1 arguments, got 2");
  proto::WorkerOp op;
  do {
    ASSERT_TRUE(worker.NextOp(&op));
    EXPECT_FALSE(op.has_execute()) << op.ShortDebugString();
  } while (!Names(op, marker));
}

// Slice requests that cannot be met wait at the server, on its injected
// clock, without holding up the rest of their client's stream.
class SliceWaitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    secret_ = NewSecret();
    ServerOptions options;
    options.secret = secret_;
    options.clock = &clock_;
    options.heartbeat_timeout = absl::Hours(1);  // raw workers are silent
    options.tenants = tenants_;
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = Stub(server_->address());
  }
  void TearDown() override { server_.reset(); }

  std::unique_ptr<RawWorker> AddWorker() {
    auto w = std::make_unique<RawWorker>(
        *stub_, Bytes(secret_.Derive(CredentialRole::kWorker)));
    EXPECT_NE(w->worker_id(), 0);
    return w;
  }
  static proto::ClientOp SliceOp(uint64_t request_id, int n,
                                 absl::Duration timeout) {
    proto::ClientOp op;
    auto* req = op.mutable_slice_request();
    req->set_request_id(request_id);
    req->set_num_devices(n);
    req->set_timeout_ms(absl::ToInt64Milliseconds(timeout));
    return op;
  }
  proto::ClusterStatus Status() {
    grpc::ClientContext ctx;
    proto::ClusterStatus status;
    grpc::Status s = stub_->GetStatus(&ctx, proto::StatusRequest(), &status);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return status;
  }

  FakeClock clock_{absl::FromUnixSeconds(1000)};
  TenantTable tenants_;
  ClusterSecret secret_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<proto::Controller::Stub> stub_;
};

TEST_F(SliceWaitTest, AWaitingRequestIsGrantedWhenAWorkerRegisters) {
  auto first = AddWorker();  // 2 devices
  RawClient client(
      *stub_, "c",
      {SliceOp(1, 4, absl::Seconds(30)), SliceOp(2, 1, absl::Seconds(30))});
  // The second request is answered while the first waits.
  client.ReadUntil([&] { return !client.slices_.empty(); });
  ASSERT_EQ(client.slices_.size(), 1u);
  EXPECT_EQ(client.slices_[0].request_id(), 2u);
  EXPECT_FALSE(client.slices_[0].has_error());

  proto::ClusterStatus status = Status();
  ASSERT_EQ(status.pending_slices_size(), 1);
  EXPECT_EQ(status.pending_slices(0).request_id(), 1u);
  EXPECT_EQ(status.pending_slices(0).waiting_for(),
            "asked for 4 devices; the cluster has 2 live devices on 1 host; "
            "no request ahead");
  EXPECT_EQ(status.pending_slices(0).left_ms(), 30000);

  auto second = AddWorker();
  client.ReadUntil([&] { return client.slices_.size() == 2; });
  ASSERT_EQ(client.slices_.size(), 2u);
  EXPECT_EQ(client.slices_[1].request_id(), 1u);
  EXPECT_FALSE(client.slices_[1].has_error());
  EXPECT_EQ(client.slices_[1].slice().devices_size(), 4);
  EXPECT_EQ(Status().pending_slices_size(), 0);
}

TEST_F(SliceWaitTest, AWaitingRequestTimesOutOnTheServersClock) {
  auto worker = AddWorker();
  // Request 8 cannot wait (no timeout): its refusal comes back once the
  // server has routed request 7 ahead of it, so 7 is pending by then.
  // (The client's id alone says only that the session opened.)
  RawClient client(
      *stub_, "c",
      {SliceOp(7, 3, absl::Seconds(5)), SliceOp(8, 3, absl::ZeroDuration())});
  client.ReadUntil([&] { return !client.slices_.empty(); });
  ASSERT_EQ(client.slices_.size(), 1u);
  ASSERT_EQ(client.slices_[0].request_id(), 8u);
  ASSERT_TRUE(client.slices_[0].has_error());
  ASSERT_EQ(Status().pending_slices_size(), 1);
  clock_.Advance(absl::Milliseconds(4999));
  server_->CheckLiveness();
  EXPECT_EQ(Status().pending_slices_size(), 1);
  clock_.Advance(absl::Milliseconds(1));
  server_->CheckLiveness();
  client.ReadUntil([&] { return client.slices_.size() == 2; });
  ASSERT_EQ(client.slices_.size(), 2u);
  EXPECT_EQ(client.slices_[1].request_id(), 7u);
  absl::Status refused = StatusFromProto(client.slices_[1].error());
  EXPECT_TRUE(absl::IsDeadlineExceeded(refused)) << refused;
  EXPECT_EQ(refused.message(),
            "no slice within 5s: asked for 3 devices; the cluster has 2 live "
            "devices on 1 host; no request ahead");
  EXPECT_EQ(Status().pending_slices_size(), 0);
}

// Anonymous loopback sessions are tenant "default": here it may hold 3
// devices over all of a client's slices.
class SliceQuotaWaitTest : public SliceWaitTest {
 protected:
  SliceQuotaWaitTest() {
    auto tenants = TenantTable::FromJson(R"({"default": {"max_devices": 3}})");
    EXPECT_TRUE(tenants.ok()) << tenants.status();
    if (tenants.ok()) tenants_ = *tenants;
  }
};

TEST_F(SliceQuotaWaitTest, ARequestOverMaxDevicesIsGrantedOnceASliceGoes) {
  auto first = AddWorker();
  auto second = AddWorker();  // 4 devices: the quota binds, not the cluster
  RawClient client(
      *stub_, "c",
      {SliceOp(1, 2, absl::Seconds(30)), SliceOp(2, 2, absl::Seconds(30))});
  client.ReadUntil([&] { return !client.slices_.empty(); });
  ASSERT_EQ(client.slices_.size(), 1u);
  ASSERT_EQ(client.slices_[0].request_id(), 1u);
  const uint64_t held = client.slices_[0].slice().slice_id();

  proto::ClusterStatus status = Status();
  ASSERT_EQ(status.pending_slices_size(), 1);
  EXPECT_EQ(status.pending_slices(0).waiting_for(),
            absl::StrCat("asked for 2 devices; client ", client.id_,
                         " holds 2 devices in 1 slice, and tenant 'default' "
                         "may hold 3 (max_devices); no request ahead"));

  proto::ClientOp release;
  release.set_slice_release(held);
  client.Send({release});
  client.ReadUntil([&] { return client.slices_.size() == 2; });
  ASSERT_EQ(client.slices_.size(), 2u);
  EXPECT_EQ(client.slices_[1].request_id(), 2u);
  EXPECT_FALSE(client.slices_[1].has_error());
  EXPECT_EQ(Status().pending_slices_size(), 0);
}

}  // namespace
}  // namespace plexus
