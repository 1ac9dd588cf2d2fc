// Test helpers shared by the tests that drive ClusterState directly
// (cluster_state_test.cc; the recovery tests through recovery_test_util.h).
#pragma once

#include <string>

#include "gtest/gtest.h"
#include "plexus/common/types.h"
#include "plexus/server/model/cluster_state.h"
#include "plexus/store/object_store.h"

namespace plexus {

// A worker registration of `devices` devices on host `name`.
inline proto::RegisterWorker Host(const std::string& name, int devices,
                                  bool spare = false) {
  proto::RegisterWorker r;
  r.set_host_name(name);
  r.set_spare(spare);
  for (int d = 0; d < devices; ++d) {
    auto* dev = r.add_devices();
    dev->set_index(d);
    dev->set_memory_bytes(1 << 20);
  }
  return r;
}

// Two hosts of two devices and one client.
class ClusterStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_.AddWorker(Host("host0", 2), absl::Now());
    state_.AddWorker(Host("host1", 2), absl::Now());
    client_ = state_.AddClient("test").id;
  }
  proto::SliceInfo Slice(int n, proto::Placement p = proto::PLACEMENT_ANY) {
    proto::SliceRequest req;
    req.set_num_devices(n);
    req.set_placement(p);
    auto s = state_.CreateSlice(client_, req);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : proto::SliceInfo();
  }
  // The client's buffer (or program) id `n`.
  uint64_t Id(uint64_t n) { return ClientMadeId(client_, n); }
  // Registers program `pid` of `kernel`, one input and one output.
  void Register(uint64_t pid, const std::string& kernel, ArgSpec in,
                ArgSpec out) {
    proto::RegisterProgram reg;
    reg.set_program_id(pid);
    reg.mutable_program()->set_name(kernel);
    reg.mutable_program()->set_kernel(kernel);
    *reg.mutable_program()->add_inputs() = ToProto(in);
    *reg.mutable_program()->add_outputs() = ToProto(out);
    ASSERT_TRUE(state_.RegisterProgram(client_, reg).ok());
  }

  ClusterState state_;
  uint64_t client_ = 0;
};

}  // namespace plexus
