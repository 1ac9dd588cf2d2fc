#include "plexus/common/shard_layouts.h"

#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace plexus {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;

// The template the server sends: one input read as the task's own shard.
proto::Execute OwnShardsExecute(uint64_t layout_id) {
  proto::Execute exec;
  exec.set_call_id(7);
  exec.set_program_id(3);
  exec.set_num_shards(8);
  exec.add_output_ids(99);
  exec.set_layout_id(layout_id);
  proto::InputBinding* in = exec.mutable_own_task()->add_inputs();
  in->set_axis(0);
  in->mutable_local()->set_dtype(proto::F32);
  in->mutable_local()->add_shape(4);
  proto::Piece* piece = in->add_pieces();
  piece->set_buffer_id(42);
  piece->set_length(4);
  return exec;
}

proto::ShardLayout Layout(uint64_t id, uint64_t client,
                          std::vector<std::pair<int, int>> device_shards) {
  proto::ShardLayout layout;
  layout.set_layout_id(id);
  layout.set_client_id(client);
  for (auto [device, shard] : device_shards) {
    layout.add_devices(device);
    layout.add_shards(shard);
  }
  return layout;
}

TEST(ShardLayoutsTest, AnExecuteNamingALayoutGetsTheTasksTheServerWouldList) {
  ShardLayouts layouts;
  layouts.Add(Layout(5, 1, {{0, 6}, {1, 7}}));
  proto::Execute exec = OwnShardsExecute(5);
  ASSERT_TRUE(layouts.Expand(&exec).ok());

  // What the server lists without a layout (ClusterState::RouteCall's
  // AddOwnShard): the same template with each device and shard put in.
  proto::Execute listed = OwnShardsExecute(0);
  listed.clear_own_task();
  for (auto [device, shard] : {std::pair{0, 6}, std::pair{1, 7}}) {
    proto::ShardTask* task = listed.add_tasks();
    *task = OwnShardsExecute(0).own_task();
    task->set_device(device);
    task->set_shard(shard);
    task->mutable_inputs(0)->mutable_pieces(0)->set_shard(shard);
  }
  EXPECT_TRUE(MessageDifferencer::Equals(exec, listed))
      << exec.DebugString() << "\nvs\n"
      << listed.DebugString();
}

TEST(ShardLayoutsTest, AnExecuteWithoutALayoutIsLeftAsItIs) {
  ShardLayouts layouts;
  proto::Execute exec;
  exec.set_call_id(1);
  exec.add_tasks()->set_device(3);
  const proto::Execute before = exec;
  ASSERT_TRUE(layouts.Expand(&exec).ok());
  EXPECT_TRUE(MessageDifferencer::Equals(exec, before));
}

TEST(ShardLayoutsTest, ALayoutNeverToldFailsTheCallNamingBoth) {
  ShardLayouts layouts;
  proto::Execute exec = OwnShardsExecute(12);
  const absl::Status s = layouts.Expand(&exec);
  EXPECT_TRUE(absl::IsFailedPrecondition(s));
  EXPECT_THAT(s.message(), HasSubstr("call 7 names shard layout 12"));
}

TEST(ShardLayoutsTest, AClientsLayoutsGoWithIt) {
  ShardLayouts layouts;
  layouts.Add(Layout(5, 1, {{0, 0}}));
  layouts.Add(Layout(6, 2, {{0, 1}}));
  layouts.ForgetClient(1);
  EXPECT_EQ(layouts.size(), 1u);
  proto::Execute gone = OwnShardsExecute(5);
  EXPECT_FALSE(layouts.Expand(&gone).ok());
  proto::Execute kept = OwnShardsExecute(6);
  EXPECT_TRUE(layouts.Expand(&kept).ok());
  EXPECT_EQ(kept.tasks_size(), 1);
}

}  // namespace
}  // namespace plexus
