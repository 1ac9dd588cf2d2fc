#include "plexus/server/scheduling/worker_wire.h"

#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "plexus/common/shard_layouts.h"

namespace plexus {
namespace {

using google::protobuf::util::MessageDifferencer;

proto::ShardTask Task(int device, int shard, uint64_t input) {
  proto::ShardTask task;
  task.set_device(device);
  task.set_shard(shard);
  proto::InputBinding* in = task.add_inputs();
  in->mutable_local()->add_shape(4);
  proto::Piece* piece = in->add_pieces();
  piece->set_buffer_id(input);
  piece->set_shard(shard);
  piece->set_length(4);
  return task;
}

proto::Execute Shared() {
  proto::Execute shared;
  shared.set_call_id(7);
  shared.set_program_id(300000000000);  // a multi-byte varint
  shared.set_num_shards(3);
  shared.set_client_id(2);
  shared.add_output_ids(11);
  shared.add_output_ids(12);
  return shared;
}

// What the server built for each host before: the shared fields, the
// host's tasks, the ticket and start tag, in one proto.
proto::Execute Whole(const std::vector<proto::ShardTask>& tasks,
                     uint64_t ticket, double start_tag) {
  proto::Execute exec = Shared();
  for (const proto::ShardTask& t : tasks) *exec.add_tasks() = t;
  exec.set_ticket(ticket);
  exec.set_start_tag(start_tag);
  return exec;
}

TEST(CallExecutesTest, EachHostReadsTheExecuteItWouldHaveBeenSent) {
  const proto::ShardTask t0 = Task(0, 0, 99), t1 = Task(1, 1, 99),
                         t2 = Task(0, 2, 99);
  CallExecutes executes(Shared());
  executes.AddHost(5, {&t0, &t1});
  executes.AddHost(6, {&t2});
  executes.Stamp(1234567, 2.5);

  ASSERT_EQ(executes.hosts(), 2);
  EXPECT_EQ(executes.worker(0), 5);
  EXPECT_EQ(executes.worker(1), 6);
  EXPECT_EQ(executes.call_id(), 7u);
  EXPECT_EQ(executes.program_id(), 300000000000u);
  EXPECT_EQ(std::vector<uint64_t>(executes.output_ids().begin(),
                                  executes.output_ids().end()),
            (std::vector<uint64_t>{11, 12}));
  EXPECT_TRUE(MessageDifferencer::Equals(executes.Execute(0),
                                         Whole({t0, t1}, 1234567, 2.5)));
  EXPECT_TRUE(MessageDifferencer::Equals(executes.Execute(1),
                                         Whole({t2}, 1234567, 2.5)));
}

TEST(CallExecutesTest, UnstampedHostsReadNoTicket) {
  const proto::ShardTask t0 = Task(0, 0, 1);
  CallExecutes executes(Shared());
  executes.AddHost(5, {&t0});
  EXPECT_TRUE(
      MessageDifferencer::Equals(executes.Execute(0), Whole({t0}, 0, 0)));
}

// Host `worker`'s tasks for `shards` reading `inputs` as each shard's own
// piece, built as protos (what RouteCall builds when it cannot encode them
// directly).
std::vector<proto::ShardTask> OwnShardTasks(
    const std::vector<DeviceShard>& shards,
    const std::vector<OwnShardInput>& inputs) {
  std::vector<proto::ShardTask> tasks;
  for (const DeviceShard& s : shards) {
    proto::ShardTask& task = tasks.emplace_back();
    task.set_device(s.device);
    task.set_shard(s.shard);
    for (const OwnShardInput& in : inputs) {
      proto::InputBinding* binding = task.add_inputs();
      binding->mutable_local()->ParseFromString(*in.local);
      if (in.donate) binding->set_donate(true);
      binding->set_axis(in.axis);
      proto::Piece* p = binding->add_pieces();
      p->set_buffer_id(in.buffer_id);
      p->set_shard(s.shard);
      p->set_length(in.length);
    }
  }
  return tasks;
}

TEST(CallExecutesTest, OwnShardTasksAreTheBytesProtobufWrites) {
  // Zeros (fields protobuf leaves out), multi-byte varints, a negative
  // int32 (ten bytes), an empty local spec, no inputs at all.
  proto::TensorSpec spec;
  spec.set_dtype(proto::F32);
  spec.add_shape(300);
  spec.add_shape(2);
  const std::string local = spec.SerializeAsString();
  const std::string empty;
  const std::vector<std::vector<OwnShardInput>> input_sets = {
      {},
      {{99, 4, 0, false, &local}},
      {{0, 0, 0, false, &empty}, {1ull << 40, 1 << 20, 3, true, &local}},
      {{7, -1, -2, true, &local},
       {8, 300, 1, false, &empty},
       {(1ull << 63) + 5, 1, 0, true, &local}},
  };
  const std::vector<std::vector<DeviceShard>> shard_sets = {
      {{0, 0}},
      {{1, 1}, {0, 2}},
      {{0, 127}, {3, 128}, {200, 20000}, {-1, -7}},
      // Every one-byte class (device and shard each 0 or 1-127), mixed
      // with tasks outside them, each class more than once.
      {{0, 0},
       {0, 1},
       {1, 0},
       {1, 1},
       {0, 2},
       {5, 127},
       {127, 3},
       {0, 128},
       {2, 0},
       {0, 64},
       {9, 9}},
  };
  for (const auto& inputs : input_sets) {
    for (const auto& shards : shard_sets) {
      const std::vector<proto::ShardTask> tasks = OwnShardTasks(shards, inputs);
      std::vector<const proto::ShardTask*> pointers;
      for (const auto& t : tasks) pointers.push_back(&t);
      CallExecutes built(Shared()), direct(Shared());
      built.AddHost(5, pointers);
      const std::pair<int64_t, int> host{5, static_cast<int>(shards.size())};
      direct.AddOwnShardsHosts({&host, 1}, shards, inputs);
      built.Stamp(77, 1.5);
      direct.Stamp(77, 1.5);
      ASSERT_EQ(direct.WorkerOpSize(0), built.WorkerOpSize(0));
      std::string a(built.WorkerOpSize(0), '\0'), b(a.size(), '\0');
      built.WriteWorkerOp(0, reinterpret_cast<uint8_t*>(a.data()));
      direct.WriteWorkerOp(0, reinterpret_cast<uint8_t*>(b.data()));
      EXPECT_EQ(a, b) << inputs.size() << " inputs, " << shards.size()
                      << " shards";
      EXPECT_TRUE(
          MessageDifferencer::Equals(direct.Execute(0), Whole(tasks, 77, 1.5)));
    }
  }
}

TEST(CallExecutesTest, ALayoutsHostsGetTheSameBytesAndExpandToTheirTasks) {
  proto::TensorSpec spec;
  spec.set_dtype(proto::F32);
  spec.add_shape(300);
  const std::string local = spec.SerializeAsString();
  const std::vector<OwnShardInput> inputs = {
      {99, 4, 0, false, &local}, {1ull << 40, 1 << 20, 3, true, &local}};
  // Three hosts of a 5-device map: shards beyond one varint byte, a host
  // with two devices, device 0 and shard 0 (fields protobuf leaves out).
  auto layout = std::make_shared<ShardLayoutMap>();
  layout->layout_id = 300;  // a two-byte varint
  layout->tasks = {{0, 0}, {1, 200}, {0, 1}, {3, 4}, {2, 20000}};
  layout->begin = {0, 2, 3, 5};
  layout->workers = {5, 6, 9};
  const std::vector<std::pair<int64_t, int>> hosts = {{5, 2}, {6, 1}, {9, 2}};

  CallExecutes shared(Shared()), listed(Shared());
  shared.AddOwnShardsLayout(layout, inputs);
  listed.AddOwnShardsHosts(hosts, layout->tasks, inputs);
  shared.Stamp(77, 1.5);
  listed.Stamp(77, 1.5);
  ASSERT_EQ(shared.hosts(), 3);
  std::string first(shared.WorkerOpSize(0), '\0');
  shared.WriteWorkerOp(0, reinterpret_cast<uint8_t*>(first.data()));
  for (int h = 0; h < 3; ++h) {
    EXPECT_EQ(shared.worker(h), hosts[h].first);
    // The same bytes for every host: nothing of them is the host's.
    std::string bytes(shared.WorkerOpSize(h), '\0');
    shared.WriteWorkerOp(h, reinterpret_cast<uint8_t*>(bytes.data()));
    EXPECT_EQ(bytes, first) << "host " << h;
    // A worker told its part (OpFor) expands them into the Execute the
    // host would have been sent with its tasks listed; so does Execute(h).
    proto::WorkerOp op;
    ASSERT_TRUE(op.ParseFromString(bytes));
    EXPECT_EQ(op.execute().layout_id(), 300u);
    EXPECT_EQ(op.execute().tasks_size(), 0);
    ShardLayouts worker;
    worker.Add(layout->OpFor(h, 2));
    ASSERT_TRUE(worker.Expand(op.mutable_execute()).ok());
    EXPECT_TRUE(MessageDifferencer::Equals(op.execute(), listed.Execute(h)))
        << op.execute().DebugString() << "\nvs\n"
        << listed.Execute(h).DebugString();
    EXPECT_TRUE(
        MessageDifferencer::Equals(shared.Execute(h), listed.Execute(h)));
  }
  // One host's op is smaller than any host's listed one.
  EXPECT_LT(shared.WorkerOpSize(1), listed.WorkerOpSize(0));
  // A queued op of it carries those bytes (a writer reads nothing else),
  // and one of a call listing its hosts' tasks does not.
  const OutOp queued(&shared, 2);
  ASSERT_NE(queued.bytes, nullptr);
  EXPECT_EQ(std::string(queued.bytes, queued.size), first);
  EXPECT_EQ(OutOp(&listed, 2).bytes, nullptr);
  std::vector<OutOp> ops;
  ops.emplace_back(&shared, 1);
  std::string appended;
  AppendOps(ops, &appended);
  proto::ServerToWorker parsed;
  ASSERT_TRUE(parsed.ParseFromString(appended));
  ASSERT_EQ(parsed.ops_size(), 1);
  proto::WorkerOp written;
  ASSERT_TRUE(written.ParseFromString(first));
  EXPECT_TRUE(MessageDifferencer::Equals(parsed.ops(0), written));
}

TEST(AppendOpsTest, AWorkerParsesProtoAndEncodedOpsInQueueOrder) {
  const proto::ShardTask t0 = Task(0, 0, 1), t1 = Task(0, 1, 1);
  auto executes = std::make_shared<CallExecutes>(Shared());
  executes->AddHost(5, {&t0});
  executes->AddHost(6, {&t1});
  executes->Stamp(9, 0.25);
  proto::WorkerOp release;
  release.mutable_release()->add_buffer_ids(3);
  proto::WorkerOp load;
  load.mutable_load()->set_program_id(300000000000);
  proto::WorkerOp wide;  // encoded once for several workers
  wide.mutable_release()->add_buffer_ids(4);
  wide.mutable_release()->add_buffer_ids(5);
  auto encoded = std::make_shared<EncodedOp>();
  encoded->bytes = wide.SerializeAsString();
  encoded->workers = {5, 6};
  std::vector<OutOp> ops;
  ops.emplace_back(load);
  ops.emplace_back(executes, 1);
  ops.emplace_back(encoded);
  ops.emplace_back(release);
  ops.emplace_back(executes, 0);

  // Another field first, as the writer puts the worker id there.
  proto::ServerToWorker head;
  head.set_worker_id(6);
  std::string bytes = head.SerializeAsString();
  AppendOps(ops, &bytes);
  proto::ServerToWorker parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));

  proto::ServerToWorker expected;
  expected.set_worker_id(6);
  *expected.add_ops() = load;
  *expected.add_ops()->mutable_execute() = Whole({t1}, 9, 0.25);
  *expected.add_ops() = wide;
  *expected.add_ops() = release;
  *expected.add_ops()->mutable_execute() = Whole({t0}, 9, 0.25);
  EXPECT_TRUE(MessageDifferencer::Equals(parsed, expected))
      << parsed.DebugString();
}

}  // namespace
}  // namespace plexus
