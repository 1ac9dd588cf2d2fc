#include "plexus/worker/frame_arena.h"

#include <algorithm>

namespace plexus {
namespace {

thread_local const std::shared_ptr<google::protobuf::Arena>* g_applying =
    nullptr;

}  // namespace

FrameArena::Applying::Applying(
    const std::shared_ptr<google::protobuf::Arena>& arena)
    : previous_(g_applying) {
  g_applying = &arena;
}

FrameArena::Applying::~Applying() { g_applying = previous_; }

std::shared_ptr<google::protobuf::Arena> FrameArena::ForFrame(size_t bytes) {
  google::protobuf::ArenaOptions options;
  // Blocks grow from there as a large frame needs.
  options.start_block_size = std::clamp<size_t>(4 * bytes, 1024, 64 << 10);
  options.max_block_size = 256 << 10;
  return std::make_shared<google::protobuf::Arena>(options);
}

const std::shared_ptr<google::protobuf::Arena>* FrameArena::Current() {
  return g_applying;
}

std::shared_ptr<const proto::Execute> KeepOp(proto::Execute& op) {
  const std::shared_ptr<google::protobuf::Arena>* frame = FrameArena::Current();
  if (frame != nullptr && *frame != nullptr && op.GetArena() == frame->get()) {
    // Aliasing: the pointer is the op's, the share is the arena's.
    return std::shared_ptr<const proto::Execute>(*frame, &op);
  }
  auto owned = std::make_shared<proto::Execute>();
  owned->Swap(&op);  // both on the heap: no copy
  return owned;
}

}  // namespace plexus
