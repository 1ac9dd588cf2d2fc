// Resizes the server decides itself (a yield to a higher priority, a growth
// back) reach every worker after the calls the client sent before them:
// their moves read what those calls make, and their releases of the old
// copies follow every call that reads them. Driven over raw gRPC, with
// raw workers that record the order of the ops they are sent.
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "plexus/common/types.h"
#include "plexus/server/model/tenants.h"
#include "plexus/server/server.h"
#include "plexus/server/service/server_test_util.h"

namespace plexus {
namespace {

const ArgSpec kWhole{{DType::kF32, {4}}, Sharding::Replicated()};
const ArgSpec kSum{{DType::kF32, {4}}, Sharding::Partial()};

proto::ClientOp Program(uint64_t id, const char* kernel, const ArgSpec& in,
                        const ArgSpec& out) {
  proto::ClientOp op;
  op.mutable_program()->set_program_id(id);
  auto* def = op.mutable_program()->mutable_program();
  def->set_name(kernel);
  def->set_kernel(kernel);
  *def->add_inputs() = ToProto(in);
  *def->add_outputs() = ToProto(out);
  return op;
}

proto::ClientOp Call(uint64_t call_id, uint64_t slice, uint64_t program,
                     uint64_t input, const ArgSpec& in, uint64_t output) {
  proto::ClientOp op;
  proto::Call* call = op.mutable_call();
  call->set_call_id(call_id);
  call->set_slice_id(slice);
  call->set_program_id(program);
  proto::InputRef* ref = call->add_inputs();
  ref->set_buffer_id(input);
  ref->set_slice_id(slice);
  *ref->mutable_arg() = ToProto(in);
  call->add_output_ids(output);
  return op;
}

proto::ClientOp Put(uint64_t buffer, uint64_t slice) {
  proto::ClientOp op;
  op.mutable_put()->set_buffer_id(buffer);
  op.mutable_put()->set_slice_id(slice);
  *op.mutable_put()->mutable_arg() = ToProto(kWhole);
  return op;
}

proto::ClientOp Release(uint64_t buffer, uint64_t slice) {
  proto::ClientOp op;
  op.mutable_release()->set_buffer_id(buffer);
  op.mutable_release()->set_slice_id(slice);
  return op;
}

proto::ClientOp SliceOp(int n, bool elastic) {
  proto::ClientOp op;
  proto::SliceRequest* req = op.mutable_slice_request();
  req->set_request_id(1);
  req->set_num_devices(n);
  req->set_placement(proto::PLACEMENT_SPREAD);
  if (elastic) {
    req->set_on_loss(proto::LOSS_SHRINK);
    req->set_min_devices(2);
  }
  return op;
}

class ServerResizeOrderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    secret_ = NewSecret();
    ServerOptions options;
    options.secret = secret_;
    options.heartbeat_timeout = absl::Hours(1);  // raw workers are silent
    // Raw workers report nothing done: admission must not hold the calls.
    options.admission.min_window_calls = 1000;
    auto tenants =
        TenantTable::FromJson(R"({"tenants": {"prod": {"priority": 10}}})");
    ASSERT_TRUE(tenants.ok()) << tenants.status();
    options.tenants = *tenants;
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = Stub(server_->address());
    for (int h = 0; h < 4; ++h) {
      workers_.push_back(std::make_unique<RawWorker>(
          *stub_, Bytes(secret_.Derive(CredentialRole::kWorker)),
          "host" + std::to_string(h), /*devices=*/1));
      ASSERT_NE(workers_.back()->worker_id(), 0);
    }
  }
  void TearDown() override {
    workers_.clear();
    server_.reset();
  }

  ClusterSecret secret_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<proto::Controller::Stub> stub_;
  std::vector<std::unique_ptr<RawWorker>> workers_;
};

// The trainer's slice holds a partial sum, so the urgent client's request
// cannot take its hosts yet (a partial value does not move). The trainer's
// next batch reduces the sum and releases it; that release lets the yield
// go, decided while that batch is routed. The reduction's output moves
// onto the smaller map, so on every worker the reduction comes first, then
// the move that reads it or the release of its old copy. Before the fix
// the yield's ops went to the workers ahead of the batch that let it go: a
// move read a value not yet made, and a host given up released the
// reduction's output before running it.
TEST_F(ServerResizeOrderTest,
       AYieldAReleaseLetsGoFollowsTheBatchOfThatRelease) {
  RawClient low(*stub_, "trainer", {SliceOp(4, /*elastic=*/true)});
  low.ReadUntil([&] { return !low.slices_.empty(); });
  ASSERT_TRUE(low.slices_[0].has_slice()) << low.slices_[0].error().message();
  const uint64_t s = low.slices_[0].slice().slice_id();
  ASSERT_EQ(low.slices_[0].slice().devices_size(), 4);
  const uint64_t grad = low.Id(1), reduce = low.Id(2), x = low.Id(3),
                 g = low.Id(4), r = low.Id(5);
  // The last call names a program never registered: its refusal is the
  // answer that says the batch was routed (the partial sum g is live)
  // before the urgent client's request.
  low.Send({Program(grad, "scale", kWhole, kSum),
            Program(reduce, "all_reduce", kSum, kWhole), Put(x, s),
            Call(low.Id(6), s, grad, x, kWhole, g),
            Call(low.Id(8), s, low.Id(9), x, kWhole, low.Id(10))});
  low.ReadUntil([&] { return !low.errors_.empty(); });
  ASSERT_EQ(low.errors_.size(), 1u);

  RawClient high(*stub_, "urgent", {SliceOp(2, /*elastic=*/false)}, "prod",
                 Bytes(secret_.Derive(CredentialRole::kTenant, "prod")));
  high.ReadUntil([&] { return !high.slices_.empty(); });
  ASSERT_TRUE(high.slices_[0].has_slice()) << high.slices_[0].error().message();

  // Routed under the state lock after the urgent client's batch, whose
  // yield was refused: the partial sum g was live.
  low.Send({Call(low.Id(7), s, reduce, g, kSum, r), Release(g, s)});
  low.ReadUntil([&] {
    for (const auto& note : low.recoveries_) {
      if (note.resized()) return true;
    }
    return false;
  });
  ASSERT_FALSE(low.recoveries_.empty()) << "the trainer never yielded";
  ASSERT_EQ(low.recoveries_.back().remapped(0).devices_size(), 2);

  // Every worker: the reduction making r, before anything reads or
  // releases r (the move on a kept host, the old copy's release on all).
  for (size_t h = 0; h < workers_.size(); ++h) {
    SCOPED_TRACE("host" + std::to_string(h));
    bool made = false;
    proto::WorkerOp op;
    for (;;) {
      ASSERT_TRUE(workers_[h]->NextOp(&op))
          << "the session ended before r was read or released";
      if (Makes(op, r)) made = true;
      if (Reads(op, r) || Releases(op, r)) break;
    }
    EXPECT_TRUE(made) << "r was read or released before the call making it: "
                      << op.ShortDebugString();
  }
}

}  // namespace
}  // namespace plexus
