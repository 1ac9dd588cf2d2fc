// The server's op stream applied to a worker without a server
// (WorkerImpl::StartLocal + ApplyOps): ops a well-behaved server never
// sends must not crash the worker (found by fuzz/worker_ops_fuzz.cc).
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "plexus/store/object_store.h"
#include "plexus/worker/worker_impl.h"

namespace plexus {
namespace {

std::unique_ptr<WorkerImpl> LocalWorker() {
  WorkerOptions options;
  options.num_devices = 1;
  options.device_memory = 1 << 20;
  auto worker = std::make_unique<WorkerImpl>(options);
  EXPECT_TRUE(worker->StartLocal().ok());
  return worker;
}

TEST(WorkerOpsTest, LoadWithSpecThatDoesNotParseIsRefusedAndItsCallsFail) {
  std::unique_ptr<WorkerImpl> worker = LocalWorker();
  const uint64_t program = ClientMadeId(1, 1);
  const uint64_t output = ClientMadeId(1, 2);
  proto::ServerToWorker msg;
  msg.set_worker_id(1);
  auto* load = msg.add_ops()->mutable_load();
  load->set_program_id(program);
  load->mutable_program()->set_name("bad_fill");
  load->mutable_program()->set_kernel("fill");
  auto* out = load->mutable_program()->add_outputs();
  out->mutable_global()->set_dtype(proto::F32);
  out->mutable_global()->add_shape(-4);  // no such shape
  auto* exec = msg.add_ops()->mutable_execute();
  exec->set_call_id(1);
  exec->set_program_id(program);
  exec->set_num_shards(1);
  exec->set_client_id(1);
  exec->add_output_ids(output);
  exec->add_tasks()->set_device(0);

  worker->ApplyOps(msg);  // aborted here before the fix

  auto result = worker->data_plane().AwaitReady({output, 0});
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("not loaded"), std::string::npos)
      << result.status();
}

// A call reading a buffer released before the call reached the worker used
// to re-create a pending entry that nothing fulfils: the device thread
// waited for good, and every later call on that device with it.
TEST(WorkerOpsTest, ACallReadingAReleasedBufferFailsAndTheDeviceGoesOn) {
  std::unique_ptr<WorkerImpl> worker = LocalWorker();
  auto id = [](uint64_t n) { return ClientMadeId(1, n); };
  const uint64_t program = id(1), input = id(2), first = id(3), second = id(4);
  proto::ServerToWorker msg;
  msg.set_worker_id(1);
  auto* load = msg.add_ops()->mutable_load();
  load->set_program_id(program);
  load->mutable_program()->set_name("copy");
  load->mutable_program()->set_kernel("identity");
  for (auto* arg : {load->mutable_program()->add_inputs(),
                    load->mutable_program()->add_outputs()}) {
    arg->mutable_global()->set_dtype(proto::F32);
    arg->mutable_global()->add_shape(4);
  }
  auto* decl = msg.add_ops()->mutable_declare();  // a put, never sent
  decl->set_buffer_id(input);
  decl->set_device(0);
  decl->mutable_spec()->set_dtype(proto::F32);
  decl->mutable_spec()->add_shape(4);
  msg.add_ops()->mutable_release()->add_buffer_ids(input);
  for (uint64_t output : {first, second}) {
    auto* exec = msg.add_ops()->mutable_execute();
    exec->set_call_id(output);
    exec->set_program_id(program);
    exec->set_num_shards(1);
    exec->set_client_id(1);
    exec->add_output_ids(output);
    auto* task = exec->add_tasks();
    task->set_device(0);
    auto* binding = task->add_inputs();
    binding->mutable_local()->set_dtype(proto::F32);
    binding->mutable_local()->add_shape(4);
    auto* piece = binding->add_pieces();
    piece->set_buffer_id(input);
    piece->set_length(4);
  }
  worker->ApplyOps(msg);

  for (uint64_t output : {first, second}) {
    auto result =
        worker->data_plane().AwaitReady({output, 0});  // returns: no hang
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
    EXPECT_NE(result.status().message().find("program 'copy' argument 0"),
              std::string::npos)
        << result.status();
    EXPECT_NE(result.status().message().find("released"), std::string::npos)
        << result.status();
  }
}

// A task that waits for a transfer must not pass another client's task
// queued ahead of it on its device, however low its start tag. It did: on
// a device it then held, its input's producer on another host sat behind a
// task waiting for one queued behind it here, and the two hosts waited for
// each other for good (two clients, a pipeline and an RL loop, on three
// hosts; no server kill needed). Here: client 3's call runs first, held by
// its put; client 2's call (tag 10) and client 1's (tag 1, reading a
// transfer from worker 7 that never comes) queue behind it. When the put
// arrives, client 2's call must run, not wait behind client 1's.
TEST(WorkerOpsTest, ACallWaitingForATransferDoesNotPassAnotherClientsCall) {
  std::unique_ptr<WorkerImpl> worker = LocalWorker();
  const uint64_t program = ClientMadeId(1, 1);
  const uint64_t gate = ClientMadeId(3, 1), gated = ClientMadeId(3, 2);
  const uint64_t mine = ClientMadeId(2, 1), steady = ClientMadeId(2, 2);
  const uint64_t temp = ClientMadeId(1, 9), waits = ClientMadeId(1, 2);
  auto f32x4 = [](proto::TensorSpec* spec) {
    spec->set_dtype(proto::F32);
    spec->add_shape(4);
  };
  proto::ServerToWorker msg;
  msg.set_worker_id(1);
  auto* load = msg.add_ops()->mutable_load();
  load->set_program_id(program);
  load->mutable_program()->set_name("copy");
  load->mutable_program()->set_kernel("identity");
  f32x4(load->mutable_program()->add_inputs()->mutable_global());
  f32x4(load->mutable_program()->add_outputs()->mutable_global());
  for (uint64_t put : {gate, mine}) {
    auto* decl = msg.add_ops()->mutable_declare();
    decl->set_buffer_id(put);
    decl->set_device(0);
    f32x4(decl->mutable_spec());
  }
  auto* expect = msg.add_ops()->mutable_expect();  // never sent
  expect->set_buffer_id(temp);
  expect->set_device(0);
  expect->set_src_worker_id(7);
  f32x4(expect->mutable_spec());
  struct Call {
    uint64_t client, input, output;
    double tag;
  };
  for (const Call& c : {Call{3, gate, gated, 0}, Call{2, mine, steady, 10},
                        Call{1, temp, waits, 1}}) {
    auto* exec = msg.add_ops()->mutable_execute();
    exec->set_call_id(c.output);
    exec->set_program_id(program);
    exec->set_num_shards(1);
    exec->set_client_id(c.client);
    exec->set_start_tag(c.tag);
    exec->add_output_ids(c.output);
    auto* task = exec->add_tasks();
    task->set_device(0);
    auto* binding = task->add_inputs();
    f32x4(binding->mutable_local());
    auto* piece = binding->add_pieces();
    piece->set_buffer_id(c.input);
    piece->set_length(4);
  }
  // Client 2's put is there; client 3's arrives once all three are queued.
  auto deliver = [&](uint64_t id) {
    ASSERT_TRUE(worker->data_plane().AdmitIncoming({id, 0}, 16, true).ok());
    absl::StatusOr<std::shared_ptr<Storage>> bytes = Storage::Allocate(16);
    ASSERT_TRUE(bytes.ok());
    ASSERT_TRUE(worker->data_plane().Deliver({id, 0}, *bytes, true).ok());
  };
  auto ops = msg.ops();
  msg.mutable_ops()->Clear();
  for (int i = 0; i < ops.size(); ++i) {
    *msg.add_ops() = ops[i];
    if (ops[i].has_expect()) {  // the puts are declared: send client 2's
      worker->ApplyOps(msg);
      msg.mutable_ops()->Clear();
      deliver(mine);
    }
  }
  worker->ApplyOps(msg);
  deliver(gate);

  absl::Notification ran;
  absl::Status steady_status;
  std::thread wait([&] {
    steady_status = worker->data_plane().AwaitReady({steady, 0}).status();
    ran.Notify();
  });
  // Bounded: before the fix it never came (the transfer never does).
  const bool done = ran.WaitForNotificationWithTimeout(absl::Seconds(60));
  worker->data_plane().DeliverError({temp, 0}, absl::CancelledError("end"));
  wait.join();
  EXPECT_TRUE(done) << "client 2's call waited behind client 1's, which "
                       "waits for a transfer";
  EXPECT_TRUE(steady_status.ok()) << steady_status;
}

// A transfer to a worker this one was never told of (the server tells it
// ahead of the first op that needs it: ClusterState::TellPeer) was dropped
// with a log line, and the destination waited for good. It is reported now
// (TransferFailed), so the server fails the shard at the destination.
TEST(WorkerOpsTest, ATransferToAPeerNeverToldOfIsReportedNotDropped) {
  std::unique_ptr<WorkerImpl> worker = LocalWorker();
  const uint64_t buffer = ClientMadeId(1, 1), temp = ClientMadeId(1, 2);
  proto::ServerToWorker msg;
  msg.set_worker_id(1);
  auto* transfer = msg.add_ops()->mutable_transfer();
  transfer->set_buffer_id(buffer);
  transfer->set_dst_worker_id(7);
  transfer->set_dst_buffer_id(temp);
  worker->ApplyOps(msg);
  // A marker after it, so the wait below ends either way.
  worker->reports().TransferFailed(9, {temp + 1, 0},
                                   absl::UnavailableError("marker"));
  std::vector<proto::WorkerToServer> out;
  ASSERT_TRUE(worker->reports().AwaitReports(&out));
  ASSERT_EQ(out.size(), 2u) << "the transfer was dropped unreported";
  const proto::TransferFailed& failed = out[0].transfer_failed();
  EXPECT_EQ(failed.dst_worker_id(), 7);
  EXPECT_EQ(failed.buffer_id(), temp);
  EXPECT_NE(failed.status().message().find("never told"), std::string::npos)
      << failed.status().message();
}

proto::WorkerOp Expect(uint64_t buffer, int64_t from) {
  proto::WorkerOp op;
  op.mutable_expect()->set_buffer_id(buffer);
  op.mutable_expect()->set_src_worker_id(from);
  op.mutable_expect()->mutable_spec()->set_dtype(proto::F32);
  op.mutable_expect()->mutable_spec()->add_shape(4);
  return op;
}

// A failure op whose status reads as OK (no code, no message) failed the
// shard with an OK status, which the store cannot hold (abort).
TEST(WorkerOpsTest, FailuresWithoutAReasonStillFail) {
  std::unique_ptr<WorkerImpl> worker = LocalWorker();
  const uint64_t a = ClientMadeId(1, 1);
  const uint64_t b = a + 1, c = a + 2;
  proto::ServerToWorker msg;
  msg.set_worker_id(1);
  *msg.add_ops() = Expect(a, 2);
  *msg.add_ops() = Expect(b, 2);
  *msg.add_ops() = Expect(c, 3);
  auto* relayed = msg.add_ops()->mutable_transfer_failed();
  relayed->set_dst_worker_id(1);
  relayed->set_buffer_id(a);
  msg.add_ops()->mutable_fail()->add_buffer_ids(b);
  msg.add_ops()->mutable_peer_down()->set_worker_id(3);

  worker->ApplyOps(msg);  // aborted here before the fix

  for (const auto& [buffer, why] :
       {std::pair{a, "transfer failed"}, std::pair{b, "call rejected"},
        std::pair{c, "worker 3 is down"}}) {
    auto result = worker->data_plane().AwaitReady({buffer, 0});
    ASSERT_FALSE(result.ok()) << why;
    EXPECT_EQ(result.status().code(), absl::StatusCode::kUnknown);
    EXPECT_NE(result.status().message().find(why), std::string::npos)
        << result.status();
  }
}

// A collective call whose peers do not list this worker made its rank -1,
// and the collective read peers[-1] (found by worker_ops_fuzz under UBSan).
TEST(WorkerOpsTest, CollectiveCallWithoutThisWorkerAmongItsPeersFails) {
  std::unique_ptr<WorkerImpl> worker = LocalWorker();
  const uint64_t program = ClientMadeId(1, 1);
  const uint64_t output = program + 1;
  proto::ServerToWorker msg;
  msg.set_worker_id(1);
  auto* load = msg.add_ops()->mutable_load();
  load->set_program_id(program);
  load->mutable_program()->set_name("sum");
  load->mutable_program()->set_kernel("all_reduce");
  ArgSpec partial{{DType::kF32, {4}}, Sharding::Partial()};
  ArgSpec whole{{DType::kF32, {4}}, Sharding::Replicated()};
  *load->mutable_program()->add_inputs() = ToProto(partial);
  *load->mutable_program()->add_outputs() = ToProto(whole);
  auto* exec = msg.add_ops()->mutable_execute();
  exec->set_call_id(7);
  exec->set_program_id(program);
  exec->set_num_shards(2);
  exec->set_client_id(1);
  exec->add_output_ids(output);
  exec->add_tasks()->set_device(0);
  auto* peer = exec->add_peers();  // worker 2 only: not this worker (1)
  peer->set_worker_id(2);
  peer->set_local_shards(1);

  worker->ApplyOps(msg);

  auto result = worker->data_plane().AwaitReady({output, 0});
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find(
                "does not list this worker among its peers"),
            std::string::npos)
      << result.status();
}

TEST(WorkerAuthorizeTest, EachRequestNeedsAConnectionOfWhoOwnsWhatItTouches) {
  auto secret = ClusterSecret::Generate();
  ASSERT_TRUE(secret.ok());
  WorkerOptions options;
  options.num_devices = 1;
  options.device_memory = 1 << 20;
  options.secret = *secret;
  auto worker = std::make_unique<WorkerImpl>(options);
  ASSERT_TRUE(worker->StartLocal().ok());
  const transport::DataPlanePeer client1{CredentialRole::kClient, 1};
  const transport::DataPlanePeer peer{CredentialRole::kWorker, 0};
  // What each must prove in its connection's handshake: the credentials
  // derived from this cluster's secret, nothing for other roles.
  EXPECT_EQ(*worker->data_plane().CredentialFor(client1),
            secret->Derive(CredentialRole::kClient, 1));
  EXPECT_EQ(*worker->data_plane().CredentialFor(peer),
            secret->Derive(CredentialRole::kWorker));
  EXPECT_FALSE(
      worker->data_plane().CredentialFor({CredentialRole::kAdmin, 0}).ok());
  EXPECT_FALSE(
      worker->data_plane().CredentialFor({CredentialRole::kTenant, 0}).ok());
  const transport::ShardKey of1{ClientMadeId(1, 5), 0};
  const transport::ShardKey of2{ClientMadeId(uint64_t{2}, 5), 0};
  using R = transport::DataPlaneRequest;
  for (R r : {R::kPut, R::kFetch, R::kWait}) {
    EXPECT_TRUE(worker->data_plane().Authorize(r, of1, client1).ok());
    absl::Status other = worker->data_plane().Authorize(r, of2, client1);
    EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
    EXPECT_NE(other.message().find("belongs to client 2"), std::string::npos)
        << other;
    EXPECT_FALSE(
        worker->data_plane().Authorize(r, of1, peer).ok());  // a worker's
  }
  for (R r : {R::kPush, R::kPushError, R::kPushIpc}) {
    EXPECT_TRUE(worker->data_plane().Authorize(r, of1, peer).ok());
    EXPECT_EQ(worker->data_plane().Authorize(r, of1, client1).code(),
              absl::StatusCode::kPermissionDenied);
  }
  // The server's ops connection proves the server credential, carries its
  // ops and nothing else; nobody else's carries ops.
  const transport::DataPlanePeer server{CredentialRole::kServer, 0};
  EXPECT_EQ(*worker->data_plane().CredentialFor(server),
            secret->Derive(CredentialRole::kServer));
  EXPECT_FALSE(
      worker->data_plane().CredentialFor({CredentialRole::kServer, 3}).ok());
  EXPECT_TRUE(worker->data_plane().Authorize(R::kOps, {}, server).ok());
  for (const transport::DataPlanePeer& other : {client1, peer}) {
    absl::Status ops = worker->data_plane().Authorize(R::kOps, {}, other);
    EXPECT_EQ(ops.code(), absl::StatusCode::kPermissionDenied) << ops;
  }
  for (R r : {R::kPut, R::kFetch, R::kWait, R::kPush, R::kPushError,
              R::kPushIpc, R::kFetchExecutable}) {
    EXPECT_EQ(worker->data_plane().Authorize(r, of1, server).code(),
              absl::StatusCode::kPermissionDenied);
  }
}

// A worker whose devices are not a plugin's CUDA GPUs opens no CUDA IPC:
// it offers none in its handshake, and a PUSH_IPC that comes anyway takes
// nothing (the sender sends the bytes), however it is declared.
TEST(WorkerCudaIpcTest, AWorkerWithoutCudaTakesNothingByIpc) {
  WorkerOptions options;
  options.num_devices = 1;
  options.device_memory = 1 << 20;
  options.secret = *ClusterSecret::Generate();
  auto worker = std::make_unique<WorkerImpl>(options);
  ASSERT_TRUE(worker->StartLocal().ok());
  EXPECT_FALSE(worker->data_plane().OpensCudaIpc());
  transport::IpcShard shard;
  shard.bytes = 16;
  absl::Status s = worker->data_plane().ReceiveIpc({9, 0}, shard);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

// A put of another size than its declaration used to be stored as it came
// and read later as the declared size (a SIGSEGV in CopyRows). The owner's
// own credential does not change that: the buffer fails, naming both sizes.
TEST(WorkerOpsTest, APutOfAnotherSizeFailsItsBuffer) {
  std::unique_ptr<WorkerImpl> worker = LocalWorker();
  const uint64_t id = ClientMadeId(1, 2);
  proto::ServerToWorker msg;
  msg.set_worker_id(1);
  auto* decl = msg.add_ops()->mutable_declare();
  decl->set_buffer_id(id);
  decl->set_device(0);
  decl->mutable_spec()->set_dtype(proto::F32);
  decl->mutable_spec()->add_shape(1024);
  worker->ApplyOps(msg);
  absl::Status admitted =
      worker->data_plane().AdmitIncoming({id, 0}, 16, /*from_client=*/true);
  EXPECT_EQ(admitted.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(admitted.message().find("4096 bytes"), std::string::npos)
      << admitted;
  EXPECT_NE(admitted.message().find("16 bytes"), std::string::npos) << admitted;
  EXPECT_EQ(worker->data_plane().AwaitReady({id, 0}).status(), admitted);
}

// A declaration this worker cannot hold (a device it lacks, a spec that
// does not parse) fails its shard, rather than holding it on a device index
// out of range or as a float32 scalar that a 4-byte put would fulfil.
TEST(WorkerOpsTest, DeclarationsItCannotHoldFailTheirShards) {
  std::unique_ptr<WorkerImpl> worker = LocalWorker();
  const uint64_t a = ClientMadeId(1, 1);
  const uint64_t b = a + 1;
  proto::ServerToWorker msg;
  msg.set_worker_id(1);
  auto* on_device_7 = msg.add_ops()->mutable_declare();
  on_device_7->set_buffer_id(a);
  on_device_7->set_device(7);
  on_device_7->mutable_spec()->set_dtype(proto::F32);
  auto* no_dtype = msg.add_ops()->mutable_expect();
  no_dtype->set_buffer_id(b);
  no_dtype->set_src_worker_id(2);
  worker->ApplyOps(msg);

  auto on_7 = worker->data_plane().AwaitReady({a, 0});
  ASSERT_FALSE(on_7.ok());
  EXPECT_NE(on_7.status().message().find("declared on device 7 but this "
                                         "worker has 1"),
            std::string::npos)
      << on_7.status();
  auto invalid = worker->data_plane().AwaitReady({b, 0});
  ASSERT_FALSE(invalid.ok());
  EXPECT_NE(invalid.status().message().find("invalid dtype"), std::string::npos)
      << invalid.status();
}

// A call naming more output ids than its program has outputs read past the
// outputs it made (heap overflow; found by data_plane_fuzz under ASan).
TEST(WorkerOpsTest, CallWithMoreOutputIdsThanItsProgramHasFails) {
  std::unique_ptr<WorkerImpl> worker = LocalWorker();
  const uint64_t program = ClientMadeId(1, 1);
  const uint64_t first = program + 1, second = program + 2;
  proto::ServerToWorker msg;
  msg.set_worker_id(1);
  auto* load = msg.add_ops()->mutable_load();
  load->set_program_id(program);
  load->mutable_program()->set_name("ones");
  load->mutable_program()->set_kernel("fill");
  ArgSpec out{{DType::kF32, {4}}, Sharding::Replicated()};
  *load->mutable_program()->add_outputs() = ToProto(out);
  auto* exec = msg.add_ops()->mutable_execute();
  exec->set_call_id(9);
  exec->set_program_id(program);
  exec->set_num_shards(1);
  exec->set_client_id(1);
  exec->add_output_ids(first);
  exec->add_output_ids(second);  // the program has one output
  exec->add_tasks()->set_device(0);
  worker->ApplyOps(msg);

  for (uint64_t id : {first, second}) {
    auto result = worker->data_plane().AwaitReady({id, 0});
    ASSERT_FALSE(result.ok());
    EXPECT_NE(
        result.status().message().find("has 1 outputs, but call 9 names 2"),
        std::string::npos)
        << result.status();
  }
}

// A task for a device this worker lacks was skipped with a log line: its
// outputs stayed pending, and a fetch of them waited for good.
TEST(WorkerOpsTest, TaskOnADeviceTheWorkerLacksFailsItsOutputs) {
  std::unique_ptr<WorkerImpl> worker = LocalWorker();
  const uint64_t program = ClientMadeId(1, 1);
  const uint64_t output = program + 1;
  proto::ServerToWorker msg;
  msg.set_worker_id(1);
  auto* load = msg.add_ops()->mutable_load();
  load->set_program_id(program);
  load->mutable_program()->set_name("ones");
  load->mutable_program()->set_kernel("fill");
  *load->mutable_program()->add_outputs() =
      ToProto(ArgSpec{{DType::kF32, {4}}, Sharding::Replicated()});
  auto* exec = msg.add_ops()->mutable_execute();
  exec->set_call_id(3);
  exec->set_program_id(program);
  exec->set_num_shards(1);
  exec->set_client_id(1);
  exec->add_output_ids(output);
  exec->add_tasks()->set_device(5);  // the worker has device 0 only
  worker->ApplyOps(msg);

  auto result = worker->data_plane().AwaitReady({output, 0});
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find(
                "call 3 names device 5 but this worker has 1"),
            std::string::npos)
      << result.status();
}

// An own-shards call's Execute names the slice map's shard layout, told to
// the worker once ahead of it (proto::ShardLayout): one naming a layout the
// worker was never told (or whose client is gone) cannot say which devices
// run which shards. Its outputs fail, naming the layout, and the worker
// goes on; a call naming a told layout runs on the layout's device.
TEST(WorkerOpsTest, ACallNamingALayoutNeverToldFailsItsOutputsAndOthersRun) {
  std::unique_ptr<WorkerImpl> worker = LocalWorker();
  // Ops of client `client`: its program, and a call of it naming a layout.
  auto load = [](proto::ServerToWorker* msg, uint64_t client) {
    auto* op = msg->add_ops()->mutable_load();
    op->set_program_id(ClientMadeId(client, 1));
    op->mutable_program()->set_name("ones");
    op->mutable_program()->set_kernel("fill");
    (*op->mutable_program()->mutable_attrs())["shape"]
        .mutable_ints()
        ->add_values(4);
    *op->mutable_program()->add_outputs() =
        ToProto(ArgSpec{{DType::kF32, {4}}, Sharding::Replicated()});
  };
  auto execute = [](proto::ServerToWorker* msg, uint64_t client,
                    uint64_t output, uint64_t layout_id) {
    auto* exec = msg->add_ops()->mutable_execute();
    exec->set_call_id(output);
    exec->set_program_id(ClientMadeId(client, 1));
    exec->set_num_shards(1);
    exec->set_client_id(client);
    exec->add_output_ids(output);
    exec->set_layout_id(layout_id);
    exec->mutable_own_task();  // no inputs: the template is empty
  };
  const uint64_t lost = ClientMadeId(1, 2), made = ClientMadeId(1, 3);
  proto::ServerToWorker msg;
  msg.set_worker_id(1);
  load(&msg, 1);
  execute(&msg, 1, lost, 9);  // never told
  auto* layout = msg.add_ops()->mutable_shard_layout();
  layout->set_layout_id(10);
  layout->set_client_id(1);
  layout->add_devices(0);
  layout->add_shards(0);
  execute(&msg, 1, made, 10);
  worker->ApplyOps(msg);

  auto failed = worker->data_plane().AwaitReady({lost, 0});
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find(
                absl::StrCat("call ", lost, " names shard layout 9")),
            std::string::npos)
      << failed.status();
  auto ready = worker->data_plane().AwaitReady({made, 0});
  ASSERT_TRUE(ready.ok()) << ready.status();

  // Client 1's layouts go with it: a call naming one fails.
  const uint64_t stale = ClientMadeId(2, 2);
  proto::ServerToWorker after;
  after.add_ops()->mutable_client_gone()->set_client_id(1);
  load(&after, 2);
  execute(&after, 2, stale, 10);
  worker->ApplyOps(after);
  auto forgotten = worker->data_plane().AwaitReady({stale, 0});
  ASSERT_FALSE(forgotten.ok());
  EXPECT_NE(forgotten.status().message().find("shard layout 10"),
            std::string::npos)
      << forgotten.status();
}

#ifdef PLEXUS_TEST_PJRT_PLUGIN
TEST(WorkerDevicesTest, DevicesFromThePluginAreThePluginsWithItsKinds) {
  WorkerOptions options;
  options.pjrt_plugin = PLEXUS_TEST_PJRT_PLUGIN;
  options.devices_from_plugin = true;
  options.num_devices = 3;  // the CPU plugin makes as many
  options.device_memory = 64 << 20;
  options.device_memory_given = true;
  WorkerImpl worker(options);
  ASSERT_TRUE(worker.StartLocal().ok());
  ASSERT_EQ(worker.num_devices(), 3);
  for (int d = 0; d < 3; ++d) {
    EXPECT_EQ(worker.device(d).index(), d);
    // The plugin's word for it; the CPU plugin gives no memory limit, so
    // the budget is the operator's.
    EXPECT_EQ(worker.device(d).kind(), "cpu");
    EXPECT_EQ(worker.device(d).memory_bytes(), 64 << 20);
  }
}
#endif

TEST(WorkerDevicesTest, APluginThatDoesNotLoadEndsTheStartNamingIt) {
  WorkerOptions options;
  options.pjrt_plugin = "/nonexistent/xla_cuda_plugin.so";
  options.devices_from_plugin = true;
  WorkerImpl worker(options);
  absl::Status s = worker.StartLocal();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent/xla_cuda_plugin.so"),
            std::string::npos)
      << s;
}

}  // namespace
}  // namespace plexus
