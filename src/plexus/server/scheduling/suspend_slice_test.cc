// ClusterState::SuspendSlice and ResumeSlice driven directly: what a
// suspended slice refuses and frees, and where a resume places it and
// what it moves.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "plexus/common/ids.h"
#include "plexus/server/model/cluster_state_test_util.h"

namespace plexus {
namespace {

const ArgSpec kRows{{DType::kF32, {8, 2}}, Sharding::Split(0)};
const ArgSpec kWhole{{DType::kF32, {3}}, Sharding::Replicated()};

// Four hosts of one device; tenant "small" may hold 2 devices.
class SuspendSliceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tenants =
        TenantTable::FromJson(R"({"tenants": {"small": {"max_devices": 2}}})");
    ASSERT_TRUE(tenants.ok()) << tenants.status();
    state_.SetTenants(*tenants);
    for (int h = 0; h < 4; ++h) {
      state_.AddWorker(Host("host" + std::to_string(h), 1), absl::Now());
    }
    client_ = state_.AddClient("job", "small").id;
    other_ = state_.AddClient("other").id;
  }
  absl::StatusOr<proto::SliceInfo> Slice(uint64_t client, int n,
                                         std::vector<std::string> hosts = {}) {
    proto::SliceRequest req;
    req.set_num_devices(n);
    req.set_placement(proto::PLACEMENT_SPREAD);
    for (const auto& h : hosts) req.add_hosts(h);
    return state_.CreateSlice(client, req);
  }
  uint64_t Put(uint64_t slice, const ArgSpec& spec) {
    proto::PutDecl put;
    put.set_buffer_id(ClientMadeId(client_, next_++));
    put.set_slice_id(slice);
    put.set_slice_resizes(state_.slices().at(slice).resizes);
    *put.mutable_arg() = ToProto(spec);
    WorkerOps ops;
    absl::Status s = state_.RoutePut(client_, put, &ops);
    EXPECT_TRUE(s.ok()) << s;
    return put.buffer_id();
  }
  static std::set<std::string> Hosts(const proto::SliceInfo& s) {
    std::set<std::string> hosts;
    for (const auto& d : s.devices()) hosts.insert(d.host_name());
    return hosts;
  }

  ClusterState state_;
  uint64_t client_ = 0, other_ = 0;
  uint64_t next_ = 1;
};

TEST_F(SuspendSliceTest, ASuspendedSliceRefusesWorkAndHoldsNoQuota) {
  absl::StatusOr<proto::SliceInfo> s = Slice(client_, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  Put(s->slice_id(), kWhole);
  // At its quota: a second slice is refused until the first is suspended.
  EXPECT_TRUE(absl::IsResourceExhausted(Slice(client_, 2).status()));
  auto suspended = state_.SuspendSlice(client_, s->slice_id());
  ASSERT_TRUE(suspended.ok()) << suspended.status();
  EXPECT_TRUE(suspended->slice.suspended());
  EXPECT_EQ(suspended->values_moved, 0);
  EXPECT_TRUE(suspended->work.empty());

  // The client's puts and calls on it are refused; its other ops are not.
  proto::ClientOp put;
  put.mutable_put()->set_buffer_id(ClientMadeId(client_, 50));
  put.mutable_put()->set_slice_id(s->slice_id());
  *put.mutable_put()->mutable_arg() = ToProto(kWhole);
  absl::Status refused = state_.RefuseOnSuspended(client_, put);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_EQ(refused.message(),
            absl::StrCat("put: slice ", s->slice_id(),
                         " is suspended (slice.suspend()); resume it first "
                         "(slice.resume())"));
  proto::ClientOp call;
  call.mutable_call()->set_slice_id(s->slice_id());
  EXPECT_TRUE(
      absl::IsFailedPrecondition(state_.RefuseOnSuspended(client_, call)));
  proto::ClientOp release;
  release.mutable_release()->set_slice_id(s->slice_id());
  EXPECT_TRUE(state_.RefuseOnSuspended(client_, release).ok());
  EXPECT_TRUE(state_.RefuseOnSuspended(other_, put).ok());  // not its slice
  // The server's own routing on it goes on (a lost host's recomputations
  // route calls there).
  WorkerOps ops;
  EXPECT_TRUE(state_.RoutePut(client_, put.put(), &ops).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(
      state_.SuspendSlice(client_, s->slice_id()).status()));
  EXPECT_TRUE(absl::IsNotFound(
      state_.SuspendSlice(other_, s->slice_id()).status()));  // not its slice

  // Its quota is free: another slice of 2 is granted; resuming would
  // bring the tenant to 4, and is refused, the slice staying suspended.
  absl::StatusOr<proto::SliceInfo> second = Slice(client_, 2);
  ASSERT_TRUE(second.ok()) << second.status();
  auto over = state_.ResumeSlice(client_, s->slice_id());
  EXPECT_TRUE(absl::IsResourceExhausted(over.status())) << over.status();
  EXPECT_TRUE(state_.slices().at(s->slice_id()).suspended);
}

TEST_F(SuspendSliceTest, AResumeOnItsOwnFreeDevicesMovesNothing) {
  absl::StatusOr<proto::SliceInfo> s = Slice(client_, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  const uint64_t whole = Put(s->slice_id(), kWhole);
  ASSERT_TRUE(state_.SuspendSlice(client_, s->slice_id()).ok());
  auto resumed = state_.ResumeSlice(client_, s->slice_id());
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_FALSE(resumed->slice.suspended());
  EXPECT_EQ(Hosts(resumed->slice), Hosts(*s));
  EXPECT_EQ(resumed->values_moved, 0);
  EXPECT_TRUE(resumed->work.empty());
  EXPECT_NE(state_.records().FindBuffer(whole), nullptr);  // the same id
  EXPECT_TRUE(absl::IsFailedPrecondition(
      state_.ResumeSlice(client_, s->slice_id()).status()));
}

TEST_F(SuspendSliceTest, AResumeWhereItsDevicesWereTakenMovesEveryValue) {
  absl::StatusOr<proto::SliceInfo> s = Slice(client_, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  const uint64_t rows = Put(s->slice_id(), kRows);
  const uint64_t whole = Put(s->slice_id(), kWhole);
  ASSERT_TRUE(state_.SuspendSlice(client_, s->slice_id()).ok());
  const std::set<std::string> own = Hosts(*s);
  absl::StatusOr<proto::SliceInfo> taker =
      Slice(other_, 2, std::vector<std::string>(own.begin(), own.end()));
  ASSERT_TRUE(taker.ok()) << taker.status();
  auto resumed = state_.ResumeSlice(client_, s->slice_id());
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_FALSE(resumed->slice.suspended());
  for (const std::string& h : Hosts(resumed->slice)) {
    EXPECT_EQ(own.count(h), 0u) << h << " was taken";
  }
  EXPECT_EQ(resumed->slice.devices_size(), 2);
  EXPECT_EQ(resumed->values_moved, 2);
  EXPECT_EQ(resumed->bytes_moved, 8 * 2 * 4 + 3 * 4 * 2);
  // Each value under a new id, moved from the old map; then the releases.
  ASSERT_EQ(resumed->note.old_ids_size(), 2);
  EXPECT_EQ(std::set<uint64_t>(resumed->note.old_ids().begin(),
                               resumed->note.old_ids().end()),
            (std::set<uint64_t>{rows, whole}));
  EXPECT_EQ(resumed->work.size(), 3u);
  EXPECT_TRUE(resumed->note.resized());
  EXPECT_EQ(resumed->slice.resizes(), s->resizes() + 1);
}

// The kernels of the ops in `work`' Execute ops, by program id, as the
// client's programs record them.
std::multiset<std::string> KernelsRouted(
    const ClusterState& state, uint64_t client,
    const std::vector<std::pair<uint64_t, WorkerOps>>& work) {
  std::multiset<std::string> kernels;
  for (const auto& [seq, ops] : work) {
    std::set<uint64_t> programs;  // each call once, whatever its hosts
    for (const auto& [w, list] : ops) {
      for (const proto::WorkerOp& op : list) {
        if (op.has_execute()) programs.insert(op.execute().program_id());
      }
    }
    for (uint64_t p : programs) {
      kernels.insert(state.FindClient(client)->programs.at(p).def.kernel());
    }
  }
  return kernels;
}

// Every park call of `suspended` reported done (`failed` or not), as the
// workers' completions would: the releases that follow, by worker.
WorkerOps FinishParks(ClusterState& state, const SliceResized& suspended,
                      bool failed = false) {
  WorkerOps ops;
  for (const auto& [seq, unit] : suspended.work) {
    if (seq != 0) state.CallDone(seq, failed, &ops);
  }
  return ops;
}

TEST_F(SuspendSliceTest, ToFilesParksEveryValueAndTheResumeReadsThemBack) {
  state_.set_park_dir("/park");
  absl::StatusOr<proto::SliceInfo> s = Slice(client_, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  const uint64_t rows = Put(s->slice_id(), kRows);
  const uint64_t whole = Put(s->slice_id(), kWhole);
  auto suspended = state_.SuspendSlice(client_, s->slice_id(), true);
  ASSERT_TRUE(suspended.ok()) << suspended.status();
  // A park call per value (its token to wait for), then the releases.
  EXPECT_EQ(KernelsRouted(state_, client_, suspended->work),
            (std::multiset<std::string>{"park", "park"}));
  EXPECT_EQ(suspended->wait_ids.size(), 2u);
  EXPECT_EQ(suspended->values_moved, 2);
  EXPECT_EQ(suspended->bytes_moved, 8 * 2 * 4 + 3 * 4 * 2);
  // Nothing is released before its park is done.
  EXPECT_NE(state_.records().FindBuffer(rows), nullptr);
  EXPECT_EQ(state_.LostStatus(rows), nullptr);
  const WorkerOps released = FinishParks(state_, *suspended);
  int releases = 0;
  for (const auto& [w, list] : released) {
    for (const proto::WorkerOp& op : list) {
      releases += op.release().buffer_ids_size();
    }
  }
  EXPECT_EQ(releases, 2 * 2);  // two values, on two hosts each
  // The client hears it; the values are no longer in the records, and
  // read as parked.
  std::map<uint64_t, proto::Recovery> notes = state_.TakeParkedNotes();
  ASSERT_EQ(notes.count(client_), 1u);
  EXPECT_EQ(notes[client_].lost_ids_size(), 2);
  EXPECT_TRUE(notes[client_].resized());
  EXPECT_EQ(state_.records().FindBuffer(rows), nullptr);
  ASSERT_NE(state_.LostStatus(whole), nullptr);
  EXPECT_NE(state_.LostStatus(whole)->message().find("parked in files"),
            std::string::npos);
  EXPECT_EQ(state_.slices().at(s->slice_id()).parked.size(), 2u);
  EXPECT_TRUE(state_.slices().at(s->slice_id()).on_files);
  // The keys name the client and the value; the directory is the server's.
  const auto& park = state_.FindClient(client_)->programs;
  int keyed = 0;
  for (const auto& [pid, prog] : park) {
    if (prog.def.kernel() != "park") continue;
    EXPECT_EQ(prog.def.attrs().at("dir").s(), "/park");
    const std::string key = prog.def.attrs().at("key").s();
    keyed += key == absl::StrCat("c", client_, "-b", rows) ||
             key == absl::StrCat("c", client_, "-b", whole);
  }
  EXPECT_EQ(keyed, 2);
  // The client waits for the tokens, then lets them go.
  for (uint64_t token : suspended->wait_ids) {
    proto::ReleaseRef release;
    release.set_buffer_id(token);
    release.set_slice_id(s->slice_id());
    WorkerOps ops;
    state_.RouteRelease(client_, release, &ops);
  }

  // Both hosts lost while parked: the slice neither breaks nor remaps.
  for (const auto& d : s->devices()) {
    WorkerLoss loss = state_.LoseWorker(d.worker_id(), "killed");
    EXPECT_TRUE(loss.broken.empty() && loss.remapped.empty());
  }
  EXPECT_TRUE(state_.slices().at(s->slice_id()).broken.empty());
  // Resumed on the two live hosts: an unpark per value, under new ids.
  auto resumed = state_.ResumeSlice(client_, s->slice_id());
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_FALSE(resumed->slice.suspended());
  for (const auto& d : resumed->slice.devices()) {
    EXPECT_TRUE(state_.workers().at(d.worker_id()).alive);
  }
  EXPECT_EQ(KernelsRouted(state_, client_, resumed->work),
            (std::multiset<std::string>{"unpark", "unpark"}));
  ASSERT_EQ(resumed->note.old_ids_size(), 2);
  EXPECT_EQ(std::set<uint64_t>(resumed->note.old_ids().begin(),
                               resumed->note.old_ids().end()),
            (std::set<uint64_t>{rows, whole}));
  EXPECT_EQ(state_.LostStatus(whole), nullptr);
  for (uint64_t id : resumed->note.new_ids()) {
    EXPECT_NE(state_.records().FindBuffer(id), nullptr);
  }
  EXPECT_FALSE(state_.slices().at(s->slice_id()).on_files);
}

TEST_F(SuspendSliceTest, ToFilesNeedsAParkDirAndAClientMayNotPark) {
  absl::StatusOr<proto::SliceInfo> s = Slice(client_, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  auto refused = state_.SuspendSlice(client_, s->slice_id(), true);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status()));
  EXPECT_NE(refused.status().message().find("--park-dir"), std::string::npos)
      << refused.status();
  EXPECT_FALSE(state_.slices().at(s->slice_id()).suspended);
  // A client's park program: refused, by its kernel and by a server's id.
  proto::RegisterProgram reg;
  reg.set_program_id(ClientMadeId(client_, 90));
  reg.mutable_program()->set_name("mine");
  reg.mutable_program()->set_kernel("park");
  *reg.mutable_program()->add_inputs() = ToProto(kWhole);
  *reg.mutable_program()->add_outputs() = ToProto(kWhole);
  absl::Status s1 = state_.RegisterClientProgram(client_, reg, nullptr);
  EXPECT_TRUE(absl::IsPermissionDenied(s1)) << s1;
  reg.mutable_program()->set_kernel("identity");
  reg.set_program_id(ServerMadeId(client_, 90));
  absl::Status s2 = state_.RegisterClientProgram(client_, reg, nullptr);
  EXPECT_TRUE(absl::IsPermissionDenied(s2)) << s2;
  reg.set_program_id(ClientMadeId(client_, 90));
  EXPECT_TRUE(state_.RegisterClientProgram(client_, reg, nullptr).ok());
}

TEST_F(SuspendSliceTest, AParkThatFailsLeavesItsValueInMemory) {
  // The park directory full on a host, say: the value is not released.
  state_.set_park_dir("/park");
  absl::StatusOr<proto::SliceInfo> s = Slice(client_, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  const uint64_t whole = Put(s->slice_id(), kWhole);
  auto suspended = state_.SuspendSlice(client_, s->slice_id(), true);
  ASSERT_TRUE(suspended.ok()) << suspended.status();
  const WorkerOps released = FinishParks(state_, *suspended, /*failed=*/true);
  EXPECT_TRUE(released.empty());
  EXPECT_NE(state_.records().FindBuffer(whole), nullptr);
  EXPECT_EQ(state_.LostStatus(whole), nullptr);
  EXPECT_TRUE(state_.slices().at(s->slice_id()).parked.empty());
  EXPECT_TRUE(state_.TakeParkedNotes().empty());
  // Resumed in place: it is there, under its id.
  auto resumed = state_.ResumeSlice(client_, s->slice_id());
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_NE(state_.records().FindBuffer(whole), nullptr);
}

TEST_F(SuspendSliceTest, AValueLetGoOfWhileParkedIsReadBackAndReleased) {
  state_.set_park_dir("/park");
  absl::StatusOr<proto::SliceInfo> s = Slice(client_, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  const uint64_t whole = Put(s->slice_id(), kWhole);
  auto suspended = state_.SuspendSlice(client_, s->slice_id(), true);
  ASSERT_TRUE(suspended.ok()) << suspended.status();
  FinishParks(state_, *suspended);
  proto::ReleaseRef release;
  release.set_buffer_id(whole);
  release.set_slice_id(s->slice_id());
  WorkerOps ops;
  state_.RouteRelease(client_, release, &ops);
  EXPECT_TRUE(ops.empty());
  auto resumed = state_.ResumeSlice(client_, s->slice_id());
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  // Read back (its files go), then released: no new id for the client.
  EXPECT_EQ(KernelsRouted(state_, client_, resumed->work),
            (std::multiset<std::string>{"unpark"}));
  EXPECT_EQ(resumed->note.old_ids_size(), 0);
  bool released = false;
  for (const auto& [w, list] : resumed->work.back().second) {
    for (const proto::WorkerOp& op : list) released |= op.has_release();
  }
  EXPECT_TRUE(released);
}

}  // namespace
}  // namespace plexus
