#include "plexus/worker/frame_arena.h"

#include "gtest/gtest.h"

namespace plexus {
namespace {

proto::Execute* OnArena(google::protobuf::Arena* arena, uint64_t call_id) {
  auto* op = google::protobuf::Arena::CreateMessage<proto::Execute>(arena);
  op->set_call_id(call_id);
  op->add_tasks()->set_shard(3);
  return op;
}

TEST(FrameArenaTest, AnOpOfTheFrameBeingAppliedIsKeptWithItsArenaNotCopied) {
  std::weak_ptr<google::protobuf::Arena> gone;
  std::shared_ptr<const proto::Execute> kept;
  {
    std::shared_ptr<google::protobuf::Arena> arena = FrameArena::ForFrame(100);
    gone = arena;
    proto::Execute* op = OnArena(arena.get(), 7);
    FrameArena::Applying applying(arena);
    ASSERT_EQ(FrameArena::Current(), &arena);
    kept = KeepOp(*op);
    EXPECT_EQ(kept.get(), op);  // the op itself: no copy
  }
  EXPECT_EQ(FrameArena::Current(), nullptr);  // the scope ended
  ASSERT_FALSE(gone.expired());  // the kept op holds its frame's arena
  EXPECT_EQ(kept->call_id(), 7u);
  EXPECT_EQ(kept->tasks(0).shard(), 3);
  kept.reset();
  EXPECT_TRUE(gone.expired());
}

TEST(FrameArenaTest, AnOpOffTheFrameIsMovedOntoTheHeap) {
  proto::Execute heap;
  heap.set_call_id(9);
  heap.add_tasks()->set_shard(1);
  std::shared_ptr<const proto::Execute> kept = KeepOp(heap);  // no frame
  EXPECT_NE(kept.get(), &heap);
  EXPECT_EQ(kept->call_id(), 9u);
  EXPECT_EQ(heap.tasks_size(), 0);  // consumed

  // On an arena, but not the frame being applied on this thread: copied,
  // so it does not depend on that arena's life.
  std::shared_ptr<google::protobuf::Arena> applied = FrameArena::ForFrame(10);
  auto other = std::make_unique<google::protobuf::Arena>();
  proto::Execute* op = OnArena(other.get(), 11);
  FrameArena::Applying applying(applied);
  kept = KeepOp(*op);
  EXPECT_NE(kept.get(), op);
  other.reset();  // its arena freed: the kept op is its own
  EXPECT_EQ(kept->call_id(), 11u);
  EXPECT_EQ(kept->tasks(0).shard(), 3);
}

TEST(FrameArenaTest, ScopesNest) {
  auto outer = FrameArena::ForFrame(10);
  auto inner = FrameArena::ForFrame(10);
  FrameArena::Applying a(outer);
  {
    FrameArena::Applying b(inner);
    EXPECT_EQ(FrameArena::Current(), &inner);
  }
  EXPECT_EQ(FrameArena::Current(), &outer);
}

}  // namespace
}  // namespace plexus
