// The server's op stream applied to a worker without a server
// (WorkerImpl::StartLocal + ApplyOps): ops a well-behaved server never
// sends must not crash the worker (found by fuzz/worker_ops_fuzz.cc).
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
  const uint64_t program = (uint64_t{1} << kBufferIdClientShift) | 1;
  const uint64_t output = (uint64_t{1} << kBufferIdClientShift) | 2;
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

  auto result = worker->AwaitReady({output, 0});
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("not loaded"), std::string::npos)
      << result.status();
}

}  // namespace
}  // namespace plexus
