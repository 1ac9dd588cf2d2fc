// Executables shared between workers (XlaPrograms::LoadFromPeers), with two
// real workers without a server (StartLocal + ApplyOps) that load the CPU
// PJRT plugin and talk over their real data planes: a host standing by asks
// the island's worker for its serialized executable instead of compiling.
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "plexus/store/object_store.h"
#include "plexus/worker/worker_impl.h"

namespace plexus {
namespace {

constexpr int64_t kIslandWorker = 1;
constexpr int64_t kStandingBy = 2;
constexpr uint64_t kClient = 1;

uint64_t IdOfClient(uint64_t n) { return ClientMadeId(uint64_t{kClient}, n); }

// xla.CompileOptionsProto for one replica and one partition
// (executable_build_options { num_replicas: 1 num_partitions: 1 }).
const std::string kOneDevice("\x1a\x04\x20\x01\x28\x01", 6);

std::unique_ptr<WorkerImpl> XlaWorker(const ClusterSecret& secret) {
  WorkerOptions options;
  options.num_devices = 1;
  options.device_memory = 64 << 20;
  options.pjrt_plugin = PLEXUS_TEST_PJRT_PLUGIN;
  options.secret = secret;
  auto worker = std::make_unique<WorkerImpl>(options);
  absl::Status started = worker->StartLocal();
  EXPECT_TRUE(started.ok()) << started;
  return worker;
}

// Loads program `program_id` (an XLA module XLA cannot compile, one island
// on device 0 that worker kIslandWorker runs), then calls it on device 0
// with output `output`.
void LoadAndCall(proto::ServerToWorker& msg, uint64_t program_id,
                 uint64_t output, bool stand_by) {
  auto* load = msg.add_ops()->mutable_load();
  load->set_program_id(program_id);
  load->set_stand_by(stand_by);
  proto::ProgramDef* def = load->mutable_program();
  def->set_name("broken");
  def->set_kernel("xla");
  def->mutable_xla()->set_module("module { this is not mlir }");
  proto::XlaIsland* island = def->mutable_xla()->add_islands();
  island->add_devices(0);
  island->set_compile_options(kOneDevice);
  island->add_workers(kIslandWorker);
  auto* out = def->add_outputs();
  out->mutable_global()->set_dtype(proto::F32);
  out->mutable_global()->add_shape(2);
  auto* exec = msg.add_ops()->mutable_execute();
  exec->set_call_id(output);
  exec->set_program_id(program_id);
  exec->set_num_shards(1);
  exec->set_client_id(kClient);
  exec->add_output_ids(output);
  exec->add_tasks()->set_device(0);
}

// A peer whose own compile of the program failed will never have its
// executable. It used to answer NOT_FOUND, as one still compiling does, so
// the host standing by asked it again for kAwaitPeerCompile (30 s) before
// it compiled (and failed the same way). It answers FAILED_PRECONDITION
// now, and the host standing by compiles at once.
TEST(ExecutableSharingTest, APeerWhoseCompileFailedIsNotWaitedFor) {
  absl::StatusOr<ClusterSecret> secret = ClusterSecret::Generate();
  ASSERT_TRUE(secret.ok());
  const uint64_t program = IdOfClient(1);

  // The island's worker compiles the program and fails.
  std::unique_ptr<WorkerImpl> island_worker = XlaWorker(*secret);
  proto::ServerToWorker to_island;
  to_island.set_worker_id(kIslandWorker);
  LoadAndCall(to_island, program, IdOfClient(2), /*stand_by=*/false);
  island_worker->ApplyOps(to_island);
  auto failed = island_worker->data_plane().AwaitReady({IdOfClient(2), 0});
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("XLA compile"), std::string::npos)
      << failed.status();

  // A host standing by is loaded with it and asks that worker for it.
  std::unique_ptr<WorkerImpl> spare = XlaWorker(*secret);
  proto::ServerToWorker to_spare;
  to_spare.set_worker_id(kStandingBy);
  proto::PeerInfo* peer = to_spare.add_ops()->mutable_peer();
  peer->set_worker_id(kIslandWorker);
  peer->set_data_address(island_worker->data_address());
  const uint64_t output = IdOfClient(3);
  LoadAndCall(to_spare, program, output, /*stand_by=*/true);
  spare->ApplyOps(to_spare);

  // The client's wait on the call's output is answered with the compile
  // error well within kAwaitPeerCompile.
  transport::DataPlaneCounters counters;
  transport::DataPlaneIdentity me;
  me.peer = {CredentialRole::kClient, kClient};
  me.credential = secret->Derive(CredentialRole::kClient, kClient);
  auto conn = transport::DataPlaneConnection::Connect(spare->data_address(), "",
                                                      &counters, me);
  ASSERT_TRUE(conn.ok()) << conn.status();
  const std::vector<transport::ShardKey> keys = {{output, 0}};
  ASSERT_TRUE((*conn)->SendWaits(keys).ok());
  absl::StatusOr<size_t> waited =
      (*conn)->AwaitWaits(keys, absl::Now() + absl::Seconds(10));
  ASSERT_FALSE(waited.ok())
      << "the host standing by still waits for a peer whose compile failed";
  EXPECT_NE(waited.status().message().find("XLA compile"), std::string::npos)
      << waited.status();
}

}  // namespace
}  // namespace plexus
