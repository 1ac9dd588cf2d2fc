// The arena an OPS frame from the server is parsed onto, for the ops kept
// past the frame. ServerSession::ApplyFramed parses each frame onto an
// arena of its own (its hundreds of small messages are neither allocated
// nor freed one by one) and applies it inside a FrameArena::Applying
// scope; an op that outlives its frame (a call's Execute, held by its
// CallContext until its tasks end) takes a share of the arena instead of
// a copy (KeepOp). An op that is not on the frame being applied on this
// thread (the gRPC stream's, a test's) is moved onto the heap, as before.
#pragma once

#include <memory>

#include "google/protobuf/arena.h"
#include "plexus/proto/plexus.pb.h"

namespace plexus {

class FrameArena {
 public:
  // While alive, `arena` is the frame being applied on this thread.
  class Applying {
   public:
    explicit Applying(const std::shared_ptr<google::protobuf::Arena>& arena);
    ~Applying();
    Applying(const Applying&) = delete;
    Applying& operator=(const Applying&) = delete;

   private:
    const std::shared_ptr<google::protobuf::Arena>* previous_;
  };
  // A new arena for a frame of `bytes` bytes (its first block four times
  // that, from 1 KiB to 64 KiB: parsed messages take a few times their
  // wire size).
  static std::shared_ptr<google::protobuf::Arena> ForFrame(size_t bytes);
  // The frame being applied on this thread, or null.
  static const std::shared_ptr<google::protobuf::Arena>* Current();
};

// `op`, kept for as long as the pointer lives: a share of its frame's
// arena when it lies on the frame being applied on this thread, else
// moved onto the heap (`op` is left empty).
std::shared_ptr<const proto::Execute> KeepOp(proto::Execute& op);

}  // namespace plexus
