// JobRecords: the server's model of the job — every call routed and not
// yet done, every live buffer and the call that produces it — as plain
// data, part of ClusterState and under the same lock. Recovery reads them
// (what was lost, what can be recomputed, what must run again); so can
// isolation (owners) and "who waits on what".
//
// A call *holds* its inputs (they stay on the workers, whatever their
// client does) while it is not done, or while one of its outputs may have
// to be recomputed from them: an output whose record lives and that is
// neither replicated (a surviving shard is a copy) nor snapshotted. So the
// lineage of a value reaches back only to replicated values, snapshots and
// puts (which the client keeps): a chain of replicated parameters, or of a
// split state snapshotted each step, holds one step.
//
// Lifetimes, bounded by what is live:
//  - a call record lives while the call is not done (its workers have not
//    all reported it), and after that while one of its outputs lives;
//  - a buffer record lives from its routing (call output or put) until
//    its client releases it and no call holds it. A release of a held
//    buffer is held back and goes (TakeDue) when the last call holding it
//    lets go.
// Not thread-safe (ClusterState's lock).
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "plexus/common/types.h"
#include "plexus/proto/plexus.pb.h"

namespace plexus {

struct CallRecord {
  uint64_t client_id = 0;
  proto::Call call;
  bool done = false;
  bool failed = false;   // done, and a task of it failed
  bool holding = true;   // its inputs (see above)
  int live_outputs = 0;  // outputs whose records live
};

struct BufferRecord {
  uint64_t slice_id = 0;
  ArgSpec spec;
  uint64_t producer = 0;     // the call's sequence number; 0: a put
  int readers = 0;           // calls that hold it
  bool released = false;     // by its client; the release waits for readers
  bool put = false;          // put by its client (which keeps the data)
  bool snapshotted = false;  // a copy of each shard is on another host
};

class JobRecords {
 public:
  // A call routed (seq: its routing order, > 0). It holds its inputs; its
  // outputs get records.
  void AddCall(uint64_t seq, uint64_t client_id, const proto::Call& call,
               const std::vector<ArgSpec>& outputs);
  void AddPut(uint64_t buffer_id, uint64_t slice_id, const ArgSpec& spec);
  // The call's workers have all reported it done. A call that failed
  // keeps holding its inputs (it may have failed because a host was lost,
  // and run again).
  void CallDone(uint64_t seq, bool failed = false);
  // The client released the buffer: it goes now (TakeDue has it), or when
  // the last call holding it lets go. False if it is held back.
  bool Release(uint64_t buffer_id);
  // The buffer has a snapshot: its producer need not hold its inputs for it.
  void Snapshotted(uint64_t buffer_id);
  // The call will not run as recorded (it runs again under another seq, or
  // it failed): it lets go of its inputs, and its record goes.
  void Drop(uint64_t seq);
  // The buffer's record goes, whatever holds it (recovery: it lives on
  // under another id); its release is the caller's.
  void Erase(uint64_t id);
  // Recovery made `from`'s value again as `to`: calls done that hold
  // `from` (for their outputs' lineage) read and hold `to` instead. If that
  // was the last hold of a released `from`, its release is due.
  void Rename(uint64_t from, uint64_t to);
  // Whether done calls hold their inputs for their outputs' lineage. Only
  // a cluster with a spare can recover, so only one keeps lineage (it
  // costs memory: a chain of split values without snapshots stays on the
  // workers until its end is released); calls not done, or failed, hold
  // their inputs either way. Takes effect as calls are next reconsidered.
  void set_keep_lineage(bool keep) { keep_lineage_ = keep; }
  bool keep_lineage() const { return keep_lineage_; }
  // Everything of a client that left.
  void RemoveClient(uint64_t client_id);
  // Buffers whose release may go to the workers now, with their slices.
  std::vector<std::pair<uint64_t, uint64_t>> TakeDue() {
    return std::move(due_);
  }
  // Puts whose records went since the last call (released for good).
  std::vector<uint64_t> TakeReleasedPuts() { return std::move(released_puts_); }

  CallRecord* FindCall(uint64_t seq);
  BufferRecord* FindBuffer(uint64_t id);
  const std::map<uint64_t, CallRecord>& calls() const { return calls_; }
  const absl::flat_hash_map<uint64_t, BufferRecord>& buffers() const {
    return buffers_;
  }

 private:
  // One holder of `id` fewer; its held release goes if it was the last.
  void Unread(uint64_t id);
  // The record goes; its producer may let go of its inputs.
  void Forget(uint64_t id);
  // Lets go of the call's inputs if it no longer needs them; forgets the
  // record when it is done and no output lives. The calls that frees are
  // reconsidered in turn (a loop over reconsider_, not recursion).
  void Reconsider(uint64_t seq);
  void ReconsiderOne(uint64_t seq);

  std::map<uint64_t, CallRecord> calls_;  // by seq: routing order
  absl::flat_hash_map<uint64_t, BufferRecord> buffers_;
  std::vector<std::pair<uint64_t, uint64_t>> due_;
  std::vector<uint64_t> released_puts_;
  bool keep_lineage_ = true;
  std::vector<uint64_t> reconsider_;  // calls to reconsider, last first
  bool reconsidering_ = false;
};

}  // namespace plexus
