// The fixture of the tests that drive recovery on ClusterState directly
// (recovery_test.cc, recovery_spare_test.cc, recovery_lineage_test.cc,
// recovery_snapshot_test.cc): a client's calls, puts, releases and
// completions, a lost host, and what its recovery made.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "plexus/server/model/cluster_state.h"
#include "plexus/server/model/cluster_state_test_util.h"

namespace plexus {

inline const TensorSpec kVector{DType::kF32, {8}};
inline const ArgSpec kReplicated{kVector, Sharding::Replicated()};

// Call `call_id` of `program` on `slice`, reading `input` of
// `input_slice` laid out as `input_spec`, making `output`.
inline proto::Call OneInputCall(uint64_t program, uint64_t slice,
                                uint64_t input, uint64_t input_slice,
                                uint64_t output,
                                const ArgSpec& input_spec = kReplicated,
                                uint64_t call_id = 0) {
  proto::Call call;
  call.set_call_id(call_id != 0 ? call_id : output);
  call.set_slice_id(slice);
  call.set_program_id(program);
  auto* in = call.add_inputs();
  in->set_buffer_id(input);
  in->set_slice_id(input_slice);
  *in->mutable_arg() = ToProto(input_spec);
  call.add_output_ids(output);
  return call;
}
inline const ArgSpec kSplit{kVector, Sharding::Split(0)};

// --- ClusterState: host0 and host1 (workers 1 and 2, two devices each)
// and spare0 (worker 3, started as a spare).

class RecoveryTest : public ClusterStateTest {
 protected:
  void SetUp() override {
    ClusterStateTest::SetUp();
    spare_ =
        state_.AddWorker(Host("spare0", 2, /*spare=*/true), absl::Now()).id;
  }
  // A slice of `n` devices only on `host`.
  proto::SliceInfo SliceOn(int n, const std::string& host) {
    proto::SliceRequest req;
    req.set_num_devices(n);
    req.add_hosts(host);
    auto s = state_.CreateSlice(client_, req);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : proto::SliceInfo();
  }
  // Four devices: shards 0 and 1 on host0 (worker 1), 2 and 3 on host1.
  uint64_t Spread4() {
    proto::SliceInfo s = Slice(4, proto::PLACEMENT_SPREAD);
    EXPECT_EQ(s.devices(0).worker_id(), 1);
    EXPECT_EQ(s.devices(2).worker_id(), 2);
    return s.slice_id();
  }
  void Put(uint64_t id, uint64_t slice, const ArgSpec& spec) {
    proto::PutDecl put;
    put.set_buffer_id(id);
    put.set_slice_id(slice);
    *put.mutable_arg() = ToProto(spec);
    WorkerOps ops;
    absl::Status s = state_.RoutePut(client_, put, &ops);
    EXPECT_TRUE(s.ok()) << s;
  }
  proto::Call MakeCall(uint64_t program, uint64_t slice, uint64_t input,
                       const ArgSpec& input_spec, uint64_t output) {
    return OneInputCall(program, slice, input, slice, output, input_spec,
                        Id(next_call_++));
  }
  // Routes the call; returns its sequence number (0 if it did not route).
  uint64_t Route(const proto::Call& call, WorkerOps* ops = nullptr) {
    WorkerOps mine;
    uint64_t seq = 0;
    absl::Status s = state_.RouteCall(client_, call, ops ? ops : &mine, &seq);
    EXPECT_TRUE(s.ok()) << s;
    return seq;
  }
  WorkerOps Done(uint64_t seq, bool failed = false) {
    WorkerOps ops;
    state_.CallDone(seq, failed, &ops);
    return ops;
  }
  WorkerOps Release(uint64_t id, uint64_t slice) {
    proto::ReleaseRef r;
    r.set_buffer_id(id);
    r.set_slice_id(slice);
    WorkerOps ops;
    state_.RouteRelease(client_, r, &ops);
    return ops;
  }
  // The ids released by `ops`, on any worker.
  static std::set<uint64_t> Released(const WorkerOps& ops) {
    std::set<uint64_t> ids;
    for (const auto& [w, list] : ops) {
      for (const auto& op : list) {
        if (!op.has_release()) continue;
        for (uint64_t id : op.release().buffer_ids()) ids.insert(id);
      }
    }
    return ids;
  }
  static std::set<uint64_t> Released(const ClientRecovery& rec) {
    std::set<uint64_t> ids;
    for (const RoutedWork& w : rec.work) {
      for (uint64_t id : Released(w.ops)) ids.insert(id);
    }
    return ids;
  }
  // Each op of `kind` in the recovery's work, with its worker.
  template <typename Pred>
  static std::vector<std::pair<int64_t, proto::WorkerOp>> Ops(
      const ClientRecovery& rec, Pred pred) {
    std::vector<std::pair<int64_t, proto::WorkerOp>> found;
    for (const RoutedWork& w : rec.work) {
      for (const auto& [worker, list] : w.ops) {
        for (const auto& op : list) {
          if (pred(op)) found.emplace_back(worker, op);
        }
      }
    }
    return found;
  }
  // The work of a call routed again (call_seq > 0) whose Execute makes
  // `output`, or nullptr.
  static const RoutedWork* CallMaking(const ClientRecovery& rec,
                                      uint64_t output) {
    for (const RoutedWork& w : rec.work) {
      if (w.call_seq == 0) continue;
      for (const auto& [worker, list] : w.ops) {
        for (const auto& op : list) {
          if (!op.has_execute()) continue;
          const auto& ids = op.execute().output_ids();
          if (std::find(ids.begin(), ids.end(), output) != ids.end()) {
            return &w;
          }
        }
      }
    }
    return nullptr;
  }
  // The records, read as the server's other readers do (const).
  const CallRecord* CallOf(uint64_t seq) const {
    return state_.records().FindCall(seq);
  }
  const BufferRecord* BufferOf(uint64_t id) const {
    auto it = state_.records().buffers().find(id);
    return it == state_.records().buffers().end() ? nullptr : &it->second;
  }
  // A new spare (spare1) joins, and the first spare, which took host1's
  // place, is lost too: its recovery, onto spare1.
  ClientRecovery LoseSpareToANewOne(const std::string& reason) {
    const int64_t spare1 =
        state_.AddWorker(Host("spare1", 2, /*spare=*/true), absl::Now()).id;
    WorkerLoss loss = state_.LoseWorker(spare_, reason);
    EXPECT_EQ(loss.spare, spare1);
    return state_.RecoverClient(client_, loss, {});
  }
  ClientRecovery LoseHost1() {
    WorkerLoss loss = state_.LoseWorker(2, "killed");
    EXPECT_EQ(loss.spare, spare_);
    return state_.RecoverClient(client_, loss, {});
  }
  // What the lost host's note said, id by id.
  static std::map<uint64_t, uint64_t> Renamed(const proto::Recovery& note) {
    std::map<uint64_t, uint64_t> renamed;
    EXPECT_EQ(note.old_ids_size(), note.new_ids_size());
    for (int i = 0; i < note.old_ids_size(); ++i) {
      renamed[note.old_ids(i)] = note.new_ids(i);
    }
    return renamed;
  }

  int64_t spare_ = 0;
  uint64_t next_call_ = 500;
};

}  // namespace plexus
