// The pieces of the server's records on their own: the table of call
// records (CallTable) and a call's record as routing keeps it (CallRecord),
// which recovery routes again.
#include "plexus/server/model/job_records.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "plexus/common/ids.h"
#include "plexus/common/types.h"

namespace plexus {
namespace {

std::vector<uint64_t> Seqs(const CallTable& table) {
  std::vector<uint64_t> seqs;
  for (const auto& [seq, rec] : table) seqs.push_back(seq);
  return seqs;
}

TEST(CallTableTest, RecordsAreFoundAndIteratedInSeqOrderWhateverOrderTheyGo) {
  CallTable table;
  for (uint64_t seq = 1; seq <= 6; ++seq) table.Add(seq).call_id = 100 + seq;
  EXPECT_EQ(table.size(), 6u);
  EXPECT_TRUE(table.Erase(4));
  EXPECT_FALSE(table.Erase(4));  // gone already
  EXPECT_TRUE(table.Erase(1));
  EXPECT_EQ(Seqs(table), (std::vector<uint64_t>{2, 3, 5, 6}));
  EXPECT_EQ(table.Find(1), nullptr);
  EXPECT_EQ(table.Find(4), nullptr);
  EXPECT_EQ(table.Find(7), nullptr);
  ASSERT_NE(table.Find(5), nullptr);
  EXPECT_EQ(table.Find(5)->call_id, 105u);
  // The front went: the table no longer holds its slot.
  EXPECT_EQ(table.slots(), 5u);
  // Seqs may skip (a call that did not route took none) and come late.
  table.Add(10).call_id = 110;
  table.Add(8).call_id = 108;
  EXPECT_EQ(Seqs(table), (std::vector<uint64_t>{2, 3, 5, 6, 8, 10}));
  ASSERT_NE(table.Find(8), nullptr);
  EXPECT_EQ(table.Find(8)->call_id, 108u);
  EXPECT_EQ(table.Find(10)->call_id, 110u);
  EXPECT_EQ(table.Find(9), nullptr);
  table.EraseIf([](uint64_t seq, const CallRecord&) { return seq % 2 == 0; });
  EXPECT_EQ(Seqs(table), (std::vector<uint64_t>{3, 5}));
  EXPECT_EQ(table.size(), 2u);
  table.EraseIf([](uint64_t, const CallRecord&) { return true; });
  EXPECT_TRUE(table.empty());
  EXPECT_EQ(table.slots(), 0u);
}

// The ring wraps around (records go from the front as they are added),
// grows while wrapped, and compacts: every record is found where it is.
TEST(CallTableTest, RecordsAreFoundAsTheRingWrapsGrowsAndCompacts) {
  CallTable table;
  std::vector<uint64_t> live;
  for (uint64_t seq = 1; seq <= 1000; ++seq) {
    table.Add(seq).call_id = 100 + seq;
    if (seq > 10 && seq <= 300) ASSERT_TRUE(table.Erase(seq - 10));
    // 291..300 stay (they hold the front); 100 in flight after 400.
    if (seq > 400) ASSERT_TRUE(table.Erase(seq - 100));
  }
  for (uint64_t seq = 291; seq <= 300; ++seq) live.push_back(seq);
  for (uint64_t seq = 901; seq <= 1000; ++seq) live.push_back(seq);
  EXPECT_EQ(Seqs(table), live);
  EXPECT_EQ(table.size(), live.size());
  for (uint64_t seq : live) {
    ASSERT_NE(table.Find(seq), nullptr) << seq;
    EXPECT_EQ(table.Find(seq)->call_id, 100 + seq);
  }
  EXPECT_EQ(table.Find(301), nullptr);
  EXPECT_EQ(table.Find(900), nullptr);
  EXPECT_LE(table.slots(), 2 * table.size() + 64 + 1);
}

// A record that lives all run (the producer of a value kept throughout)
// holds the front; the slots of the records that went after it do not stay.
TEST(CallTableTest, ALongLivedRecordDoesNotHoldTheSlotsOfThoseThatWent) {
  CallTable table;
  table.Add(1).call_id = 1;
  for (uint64_t seq = 2; seq < 100000; ++seq) {
    table.Add(seq).call_id = seq;
    if (seq > 10) ASSERT_TRUE(table.Erase(seq - 8));  // 8 in flight
    ASSERT_LE(table.slots(), 2 * table.size() + 64 + 1) << "seq " << seq;
  }
  EXPECT_EQ(table.size(), 1u + 8u + 1u);  // 1, 2 and the last 8
  // After compactions a record is still found where it now is.
  for (uint64_t seq :
       {uint64_t{1}, uint64_t{2}, uint64_t{99992}, uint64_t{99999}}) {
    ASSERT_NE(table.Find(seq), nullptr) << seq;
    EXPECT_EQ(table.Find(seq)->call_id, seq);
  }
  EXPECT_EQ(table.Find(3), nullptr);
  EXPECT_EQ(table.Find(99991), nullptr);
}

// Recovery routes a recorded call again from its record: the call it
// makes must be the one routed (layouts as parsed from the client's).
TEST(CallRecordTest, ARecordMakesTheCallItWasRecordedFrom) {
  const std::vector<ArgSpec> layouts = {
      {{DType::kF32, {8, 4}}, Sharding::Split(1)},
      {{DType::kI32, {3}}, Sharding::Replicated()},
      {{DType::kF32, {8}}, Sharding::Partial()},
      {{DType::kF32, {8, 6}},
       Sharding::Mesh({2, 3}, {"data", "model"}, {{0}, {1}})},
      {{DType::kF32, {6, 6}}, Sharding::Mesh({2, 3}, {"x", "y"}, {{1, 0}, {}})},
  };
  proto::Call call;
  call.set_call_id(41);
  call.set_slice_id(3);
  call.set_program_id(9);
  call.set_site(7);
  call.set_graph_id(12);
  for (size_t i = 0; i < layouts.size(); ++i) {
    proto::InputRef* in = call.add_inputs();
    in->set_buffer_id(100 + i);
    in->set_slice_id(4 + i);
    *in->mutable_arg() = ToProto(layouts[i]);
  }
  call.add_output_ids(200);
  call.add_output_ids(201);
  const CallRecord rec = CallRecord::FromCall(5, call);
  EXPECT_EQ(rec.client_id, 5u);
  const proto::Call again = rec.ToCall();
  EXPECT_EQ(again.call_id(), 41u);
  EXPECT_EQ(again.slice_id(), 3u);
  EXPECT_EQ(again.program_id(), 9u);
  // Routed again by recovery, it keeps its place in the user's program.
  EXPECT_EQ(again.site(), 7u);
  EXPECT_EQ(again.graph_id(), 12u);
  EXPECT_EQ(std::vector<uint64_t>(again.output_ids().begin(),
                                  again.output_ids().end()),
            (std::vector<uint64_t>{200, 201}));
  ASSERT_EQ(again.inputs_size(), call.inputs_size());
  for (int i = 0; i < call.inputs_size(); ++i) {
    EXPECT_EQ(again.inputs(i).buffer_id(), call.inputs(i).buffer_id());
    EXPECT_EQ(again.inputs(i).slice_id(), call.inputs(i).slice_id());
    // What routing reads of it: the same layout.
    auto sent = FromProto(call.inputs(i).arg());
    auto replayed = FromProto(again.inputs(i).arg());
    ASSERT_TRUE(sent.ok()) << sent.status();
    ASSERT_TRUE(replayed.ok()) << replayed.status();
    EXPECT_EQ(*replayed, *sent) << sent->ToString();
    EXPECT_EQ(replayed->sharding.axis_names, sent->sharding.axis_names);
  }
}

// Without lineage (no spare), a done call's record and its inputs' go as
// soon as nothing reads them: a long chain leaves nothing behind.
TEST(JobRecordsMemoryTest, AChainWithoutLineageHoldsOnlyWhatIsInFlight) {
  JobRecords records;
  records.set_keep_lineage(false);
  const ArgSpec split{{DType::kF32, {4}}, Sharding::Split(0)};
  records.AddPut(1, 7, split);
  for (uint64_t seq = 1; seq <= 10000; ++seq) {
    proto::Call call;
    call.set_slice_id(7);
    call.add_inputs()->set_buffer_id(seq);
    call.add_output_ids(seq + 1);
    records.AddCall(seq, 0, call, {split});
    records.Release(seq);  // the client drops the previous value
    if (seq > 4) records.CallDone(seq - 4);  // 4 in flight
    ASSERT_LE(records.calls().size(), 5u) << seq;
    ASSERT_LE(records.buffers().size(), 6u) << seq;
  }
  for (uint64_t seq = 9997; seq <= 10000; ++seq) records.CallDone(seq);
  records.Release(10001);
  EXPECT_TRUE(records.calls().empty());
  EXPECT_EQ(records.calls().slots(), 0u);
  EXPECT_TRUE(records.buffers().empty());
  EXPECT_EQ(records.TakeDue().size(), 10001u);
}

}  // namespace
}  // namespace plexus

namespace plexus {
namespace {

using Due = std::vector<std::pair<uint64_t, uint64_t>>;  // (buffer, slice)

const TensorSpec kVector{DType::kF32, {8}};
const ArgSpec kReplicated{kVector, Sharding::Replicated()};
const ArgSpec kSplit{kVector, Sharding::Split(0)};

// --- JobRecords on their own: buffers on slice 1, client 1.

class JobRecordsTest : public ::testing::Test {
 protected:
  static uint64_t B(uint64_t n) { return ClientMadeId(1, n); }
  // Records call `seq` reading `inputs` and making `outputs`.
  void AddCall(uint64_t seq, std::vector<uint64_t> inputs,
               std::vector<std::pair<uint64_t, ArgSpec>> outputs) {
    proto::Call call;
    call.set_call_id(B(1000 + seq));
    call.set_slice_id(1);
    for (uint64_t in : inputs) {
      auto* ref = call.add_inputs();
      ref->set_buffer_id(in);
      ref->set_slice_id(1);
    }
    std::vector<ArgSpec> specs;
    for (const auto& [id, spec] : outputs) {
      call.add_output_ids(id);
      specs.push_back(spec);
    }
    records_.AddCall(seq, 1, call, specs);
  }
  void ExpectEmpty() {
    EXPECT_TRUE(records_.calls().empty()) << records_.calls().size();
    EXPECT_TRUE(records_.buffers().empty()) << records_.buffers().size();
  }

  JobRecords records_;
};

TEST_F(JobRecordsTest, AReleaseOfABufferANotDoneCallReadsWaitsForTheCall) {
  records_.AddPut(B(1), 1, kReplicated);
  AddCall(1, {B(1)}, {{B(2), kReplicated}});
  EXPECT_FALSE(records_.Release(B(1)));
  EXPECT_TRUE(records_.TakeDue().empty());
  EXPECT_TRUE(records_.TakeReleasedPuts().empty());
  ASSERT_NE(records_.FindBuffer(B(1)), nullptr);
  EXPECT_TRUE(records_.FindBuffer(B(1))->released);
  // Done, and its only output is replicated (a surviving shard is a copy):
  // it holds nothing any more.
  records_.CallDone(1);
  EXPECT_EQ(records_.TakeDue(), (Due{{B(1), 1}}));
  EXPECT_EQ(records_.FindBuffer(B(1)), nullptr);
  EXPECT_EQ(records_.TakeReleasedPuts(), (std::vector<uint64_t>{B(1)}));
  EXPECT_TRUE(records_.TakeReleasedPuts().empty());  // reported once
  // The call's record lives while its output does.
  ASSERT_NE(records_.FindCall(1), nullptr);
  EXPECT_FALSE(records_.FindCall(1)->holding);
  EXPECT_TRUE(records_.Release(B(2)));
  EXPECT_EQ(records_.TakeDue(), (Due{{B(2), 1}}));
  EXPECT_TRUE(records_.TakeReleasedPuts().empty());  // not a put
  ExpectEmpty();
}

TEST_F(JobRecordsTest, ADoneCallWithASplitOutputHoldsUntilTheOutputGoes) {
  records_.AddPut(B(1), 1, kReplicated);
  AddCall(1, {B(1)}, {{B(2), kReplicated}, {B(3), kSplit}});
  EXPECT_FALSE(records_.Release(B(1)));
  records_.CallDone(1);
  // B(3) can only be rebuilt from B(1): B(1) stays.
  EXPECT_TRUE(records_.TakeDue().empty());
  ASSERT_NE(records_.FindCall(1), nullptr);
  EXPECT_TRUE(records_.FindCall(1)->holding);
  EXPECT_TRUE(records_.Release(B(2)));  // the replicated one changes nothing
  EXPECT_EQ(records_.TakeDue(), (Due{{B(2), 1}}));
  EXPECT_TRUE(records_.TakeReleasedPuts().empty());
  EXPECT_TRUE(records_.Release(B(3)));
  EXPECT_EQ(records_.TakeDue(), (Due{{B(3), 1}, {B(1), 1}}));
  EXPECT_EQ(records_.TakeReleasedPuts(), (std::vector<uint64_t>{B(1)}));
  ExpectEmpty();
}

TEST_F(JobRecordsTest, ASnapshottedSplitOutputLetsItsProducerGo) {
  records_.AddPut(B(1), 1, kReplicated);
  AddCall(1, {B(1)}, {{B(2), kSplit}});
  EXPECT_FALSE(records_.Release(B(1)));
  records_.CallDone(1);
  EXPECT_TRUE(records_.TakeDue().empty());
  records_.Snapshotted(B(2));
  EXPECT_EQ(records_.TakeDue(), (Due{{B(1), 1}}));
  ASSERT_NE(records_.FindCall(1), nullptr);  // B(2) lives
  EXPECT_FALSE(records_.FindCall(1)->holding);
  EXPECT_TRUE(records_.Release(B(2)));
  EXPECT_EQ(records_.TakeDue(), (Due{{B(2), 1}}));
  ExpectEmpty();
}

TEST_F(JobRecordsTest, AFailedCallHoldsUntilItsOutputsGo) {
  records_.AddPut(B(1), 1, kReplicated);
  AddCall(1, {B(1)}, {{B(2), kReplicated}});
  EXPECT_FALSE(records_.Release(B(1)));
  // It may have failed for a lost host and run again: even with a
  // replicated output, it keeps its input.
  records_.CallDone(1, /*failed=*/true);
  EXPECT_TRUE(records_.TakeDue().empty());
  ASSERT_NE(records_.FindCall(1), nullptr);
  EXPECT_TRUE(records_.FindCall(1)->failed);
  EXPECT_TRUE(records_.FindCall(1)->holding);
  EXPECT_TRUE(records_.Release(B(2)));
  EXPECT_EQ(records_.TakeDue(), (Due{{B(2), 1}, {B(1), 1}}));
  ExpectEmpty();
}

TEST_F(JobRecordsTest, DropLetsGoOfTheInputsAndTheOutputsOfTheProducer) {
  records_.AddPut(B(1), 1, kReplicated);
  AddCall(1, {B(1)}, {{B(2), kSplit}});
  EXPECT_FALSE(records_.Release(B(1)));
  records_.Drop(1);  // not done: it runs again elsewhere
  EXPECT_EQ(records_.TakeDue(), (Due{{B(1), 1}}));
  EXPECT_EQ(records_.FindCall(1), nullptr);
  ASSERT_NE(records_.FindBuffer(B(2)), nullptr);
  EXPECT_EQ(records_.FindBuffer(B(2))->producer, 0u);
  EXPECT_TRUE(records_.Release(B(2)));
  EXPECT_EQ(records_.TakeDue(), (Due{{B(2), 1}}));
  ExpectEmpty();
}

// A chain of split values holds back to its root while its end lives, and
// everything goes, end first, when the end is released.
TEST_F(JobRecordsTest, AChainOfSplitValuesGoesWhenItsEndIsReleased) {
  records_.AddPut(B(1), 1, kSplit);
  AddCall(1, {B(1)}, {{B(2), kSplit}});
  AddCall(2, {B(2)}, {{B(3), kSplit}});
  EXPECT_FALSE(records_.Release(B(1)));
  EXPECT_FALSE(records_.Release(B(2)));
  records_.CallDone(2);  // out of order: workers report in batches
  records_.CallDone(1);
  EXPECT_TRUE(records_.TakeDue().empty());
  EXPECT_TRUE(records_.TakeReleasedPuts().empty());
  EXPECT_EQ(records_.calls().size(), 2u);
  EXPECT_TRUE(records_.Release(B(3)));
  EXPECT_EQ(records_.TakeDue(), (Due{{B(3), 1}, {B(2), 1}, {B(1), 1}}));
  EXPECT_EQ(records_.TakeReleasedPuts(), (std::vector<uint64_t>{B(1)}));
  ExpectEmpty();
}

// The end of a long chain lets go of it link by link without recursing
// once per link (a chain of ~43,000 calls overflowed the server's stack:
// plexus-bench-dispatch --calls 262144 crashed it with SIGSEGV).
TEST_F(JobRecordsTest, ALongChainGoesWhenItsEndIsReleased) {
  constexpr uint64_t kLinks = 200000;
  records_.AddPut(B(1), 1, kSplit);
  for (uint64_t i = 1; i <= kLinks; ++i) {
    AddCall(i, {B(i)}, {{B(i + 1), kSplit}});
    EXPECT_FALSE(records_.Release(B(i)));
    records_.CallDone(i);
  }
  EXPECT_TRUE(records_.TakeDue().empty());
  EXPECT_EQ(records_.calls().size(), kLinks);
  EXPECT_TRUE(records_.Release(B(kLinks + 1)));
  const Due due = records_.TakeDue();
  ASSERT_EQ(due.size(), kLinks + 1);
  for (uint64_t i = 0; i <= kLinks; ++i) {  // end first
    ASSERT_EQ(due[i], std::make_pair(B(kLinks + 1 - i), uint64_t{1})) << i;
  }
  EXPECT_EQ(records_.TakeReleasedPuts(), (std::vector<uint64_t>{B(1)}));
  ExpectEmpty();
}

TEST_F(JobRecordsTest, AReleaseOfAnUnreadBufferGoesAtOnce) {
  records_.AddPut(B(1), 1, kSplit);
  EXPECT_TRUE(records_.Release(B(1)));
  EXPECT_EQ(records_.TakeDue(), (Due{{B(1), 1}}));
  EXPECT_EQ(records_.TakeReleasedPuts(), (std::vector<uint64_t>{B(1)}));
  EXPECT_TRUE(records_.Release(B(7)));  // never recorded: nothing holds it
  EXPECT_TRUE(records_.TakeDue().empty());
  ExpectEmpty();
}

// Lineage costs memory; only a cluster that can recover (a spare is
// registered) keeps it. Without one, a done call lets go of its inputs.
TEST(JobRecordsLineageTest, ACallLetsGoOfItsInputsWhenLineageIsNotKept) {
  for (bool keep : {true, false}) {
    JobRecords records;
    records.set_keep_lineage(keep);
    const ArgSpec split =
        ArgSpec{TensorSpec{DType::kF32, {4}}, Sharding::Split(0)};
    records.AddPut(1, 7, split);
    proto::Call call;
    call.set_slice_id(7);
    call.add_inputs()->set_buffer_id(1);
    call.add_output_ids(2);
    records.AddCall(1, 0, call, {split});
    EXPECT_FALSE(records.Release(1));  // the call is not done: held
    records.CallDone(1);
    std::vector<std::pair<uint64_t, uint64_t>> due = records.TakeDue();
    // Kept: the split output may need its input; not kept: it goes.
    EXPECT_EQ(due.empty(), keep) << "keep_lineage " << keep;
  }
}

}  // namespace
}  // namespace plexus
