// GangScheduler: puts the calls of all clients into one consistent order
// per island and hands every worker its ops in that order.
//
// Islands are hosts here (the devices of one worker share memory). A batch
// of routed units (one unit = the ops of one call, put or release, for every
// worker involved) is admitted as a whole: every worker queue receives the
// batch's ops before any op of the next batch, in unit order. So two calls
// that share islands start in the same relative order on all of them —
// programs whose shards communicate start together, and concurrent
// collectives over overlapping devices cannot deadlock. The order is made
// by appending to in-memory queues under one lock: microseconds per batch,
// never a round trip per call.
//
// Which unit is ordered next, and when, is admission's choice
// (server/scheduling/admission.h: fair shares, windows, quotas); this class
// only keeps the order it is given consistent. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "plexus/proto/plexus.pb.h"
#include "plexus/server/model/cluster_state.h"
#include "plexus/server/scheduling/out_queue.h"
#include "plexus/server/scheduling/worker_wire.h"

namespace plexus {

using WorkerQueue = OutQueue<OutOp>;

// One unit as the gang scheduler orders it: ops for each worker, then the
// ops encoded once for several workers (`shared`, each to its workers),
// then, for a call routed in wire form, each of its hosts' Execute.
struct GangUnit {
  WorkerOps ops;
  std::shared_ptr<const CallExecutes> executes;
  std::vector<std::shared_ptr<const EncodedOp>> shared;
};

class GangScheduler {
 public:
  struct Options {
    // TEST ONLY. False removes the consistent order: each island orders a
    // batch on its own, as independent per-host schedulers would — here
    // adversarially (every other island takes the batch's units in reverse).
    // Concurrent collectives over overlapping devices can then deadlock;
    // tests show it. Never use it for real work.
    bool consistent_order = true;
  };

  explicit GangScheduler(Options options);

  void AddWorker(int64_t worker_id, std::shared_ptr<WorkerQueue> queue);
  // Returns the queue so its owner can close and join it.
  std::shared_ptr<WorkerQueue> RemoveWorker(int64_t worker_id);
  // Queues of every worker (to wait for room outside the lock).
  std::vector<std::shared_ptr<WorkerQueue>> Queues();
  // One op to one worker, outside any batch (peer info, failures).
  void Send(int64_t worker_id, proto::WorkerOp op);
  void Broadcast(const proto::WorkerOp& op, int64_t except = -1);

  // Orders one batch: `units` in order, after everything submitted before.
  // Returns the epoch (position in the global order) it was given. Costs
  // the ops it moves, whatever the number of workers that have queues.
  uint64_t Submit(std::vector<GangUnit> units);
  uint64_t Submit(std::vector<WorkerOps> units);

  uint64_t epoch() const;

 private:
  const Options options_;
  mutable absl::Mutex mu_;
  std::map<int64_t, std::shared_ptr<WorkerQueue>> queues_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // By worker id, which the server counts from 1 (ClusterState): each
  // worker's queue (as in queues_; null: none) and Submit's room, kept from
  // batch to batch, for its ops of the batch. Found by index for each host
  // of every call, not looked up in a tree.
  struct Slot {
    std::shared_ptr<WorkerQueue> queue;
    std::vector<OutOp> staged;
  };
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  // The workers the batch touched (their slots' index).
  std::vector<size_t> touched_ ABSL_GUARDED_BY(mu_);
  // One reference to every wire Execute of `units` (null: none), which
  // one op of each worker's push holds (OutOp::keep); moved out of them.
  static std::shared_ptr<const void> KeepExecutes(std::vector<GangUnit>& units);
  // `keep` held by one op of a worker's push: the first with no reference
  // of its own, which every call's op of the batch is (nothing if none).
  static void HoldIn(std::vector<OutOp>& ops,
                     const std::shared_ptr<const void>& keep);
  // The test-only order without consistency (Options::consistent_order).
  void SubmitInconsistentLocked(std::vector<GangUnit>& units)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace plexus
