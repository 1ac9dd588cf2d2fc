// KeptBatches: the batches of calls and puts a session with a journaled
// server keeps to send again after a resume (ClientSession), in the order
// their ops left the session's queue, whatever order they are kept in.
//
// Each batch is kept once its ops left the queue: by the sender once its
// write returned, or by the reader (what was still queued when the stream
// ended) or by Enqueue (ops of a session already ended), whichever thread
// gets there first. Taken in the order they are kept, a batch queued after
// the one the sender was writing could be kept first, and a resume then
// sent its calls before the calls they read. So each batch carries the
// sequence number it was given as it left the queue (under the session's
// lock), and is placed by it.
//
// At most `max_ops` ops are kept: past it the oldest batches go (never the
// last one). Pure data: not thread-safe (ClientSession holds kept_mu_).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>

#include "plexus/proto/plexus.pb.h"

namespace plexus {

class KeptBatches {
 public:
  explicit KeptBatches(size_t max_ops) : max_ops_(max_ops) {}

  // Keeps `batch`, which left the queue as number `seq`.
  void Keep(proto::ClientToServer&& batch, uint64_t seq);
  // Each kept batch, in the order of their seq.
  void ForEach(
      const std::function<void(const proto::ClientToServer&)>& f) const;
  void Clear();
  size_t ops() const { return ops_; }
  size_t batches() const { return batches_.size(); }

 private:
  struct Kept {
    uint64_t seq = 0;
    proto::ClientToServer batch;
  };
  const size_t max_ops_;
  std::deque<Kept> batches_;  // seq ascending
  size_t ops_ = 0;
};

}  // namespace plexus
