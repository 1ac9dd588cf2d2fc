// Fencing: once the server declares a worker down (PeerDown with the
// generation of its registration), its peers refuse whatever it still
// pushes in that registration, so a worker that comes back (a SIGSTOP
// ends, a network heals) never writes into a buffer of the membership that
// replaced it. A real worker's data plane (StartLocal), pushes over real
// connections stamped with each generation.
#include <cstring>

#include "gtest/gtest.h"
#include "plexus/store/storage.h"
#include "plexus/transport/data_plane.h"
#include "plexus/worker/worker_impl.h"

namespace plexus {
namespace {

constexpr uint64_t kOld = 7, kNew = 8;  // generations
constexpr int64_t kSender = 2;          // the sending worker's first id

proto::WorkerOp Peer(int64_t id, uint64_t generation) {
  proto::WorkerOp op;
  op.mutable_peer()->set_worker_id(id);
  op.mutable_peer()->set_generation(generation);
  return op;
}

proto::WorkerOp Expect(uint64_t buffer, int64_t from) {
  proto::WorkerOp op;
  op.mutable_expect()->set_buffer_id(buffer);
  op.mutable_expect()->set_src_worker_id(from);
  op.mutable_expect()->mutable_spec()->set_dtype(proto::F32);
  op.mutable_expect()->mutable_spec()->add_shape(4);
  return op;
}

std::shared_ptr<Storage> Floats(float value) {
  auto s = Storage::Allocate(4 * sizeof(float));
  EXPECT_TRUE(s.ok());
  float* f = static_cast<float*>((*s)->data());
  for (int i = 0; i < 4; ++i) f[i] = value;
  return *s;
}

float First(const Storage& s) {
  float f;
  std::memcpy(&f, s.data(), sizeof(f));
  return f;
}

class FencingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto secret = ClusterSecret::Generate();
    ASSERT_TRUE(secret.ok());
    secret_ = *secret;
    WorkerOptions options;
    options.num_devices = 1;
    options.device_memory = 1 << 20;
    options.secret = secret_;
    worker_ = std::make_unique<WorkerImpl>(options);
    ASSERT_TRUE(worker_->StartLocal().ok());
  }
  void Apply(std::vector<proto::WorkerOp> ops) {
    proto::ServerToWorker msg;
    msg.set_worker_id(1);
    for (auto& op : ops) *msg.add_ops() = std::move(op);
    worker_->ApplyOps(msg);
  }
  // A peer's connection, its frames stamped with `generation`.
  std::unique_ptr<transport::DataPlaneConnection> PeerConnection(
      uint64_t generation) {
    transport::DataPlaneIdentity me;
    me.peer = {CredentialRole::kWorker, 0};
    me.credential = secret_.Derive(CredentialRole::kWorker);
    me.generation = generation;
    auto conn = transport::DataPlaneConnection::Connect(worker_->data_address(),
                                                        "", &counters_, me);
    EXPECT_TRUE(conn.ok()) << conn.status();
    return conn.ok() ? std::move(*conn) : nullptr;
  }

  ClusterSecret secret_;
  transport::DataPlaneCounters counters_;
  std::unique_ptr<WorkerImpl> worker_;
};

TEST_F(FencingTest, APushOfAGenerationDeclaredDownIsRefused) {
  const uint64_t x = ClientMadeId(uint64_t{0xFFFFFF}, 1);
  const uint64_t z = ClientMadeId(uint64_t{0xFFFFFF}, 2);
  Apply({Peer(kSender, kOld), Expect(x, kSender)});
  auto old_conn = PeerConnection(kOld);
  ASSERT_NE(old_conn, nullptr);
  // While its registration is live, its pushes land.
  ASSERT_TRUE(old_conn->Push({x, 0}, *Floats(1)).ok());
  auto got = worker_->data_plane().AwaitReady({x, 0});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(First(**got), 1);

  // The server declares it down; the host rejoins as worker 3 (generation
  // kNew), and a transfer from the new registration is expected.
  proto::WorkerOp down;
  down.mutable_peer_down()->set_worker_id(kSender);
  down.mutable_peer_down()->set_generation(kOld);
  down.mutable_peer_down()->mutable_status()->set_code(14);
  down.mutable_peer_down()->mutable_status()->set_message("missed heartbeats");
  Apply({down, Peer(3, kNew), Expect(z, 3)});

  // The old registration wakes up and pushes late: refused, unread.
  ASSERT_TRUE(old_conn->Push({z, 0}, *Floats(9)).ok());  // one-way
  // A request answered on the same connection comes after the push was
  // handled (a worker's connection may not fetch: refused, in order).
  EXPECT_FALSE(old_conn->Fetch({z, 0}).ok());
  EXPECT_EQ(worker_->pushes_fenced(), 1);

  // The new registration's push is the value.
  auto new_conn = PeerConnection(kNew);
  ASSERT_NE(new_conn, nullptr);
  ASSERT_TRUE(new_conn->Push({z, 0}, *Floats(2)).ok());
  got = worker_->data_plane().AwaitReady({z, 0});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(First(**got), 2);
  EXPECT_EQ(worker_->pushes_fenced(), 1);
}

TEST_F(FencingTest, AdmitGenerationNamesTheFencedWorker) {
  EXPECT_TRUE(worker_->data_plane().AdmitGeneration(kOld).ok());
  proto::WorkerOp down;
  down.mutable_peer_down()->set_worker_id(kSender);
  down.mutable_peer_down()->set_generation(kOld);
  Apply({down});
  absl::Status refused = worker_->data_plane().AdmitGeneration(kOld);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("worker 2 of generation 7"),
            std::string::npos)
      << refused;
  EXPECT_TRUE(worker_->data_plane().AdmitGeneration(kNew).ok());
}

}  // namespace
}  // namespace plexus
