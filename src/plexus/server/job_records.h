// JobRecords: the server's model of the job — every call routed and not
// yet done, every live buffer and the call that produces it — as plain
// data, part of ClusterState and under the same lock. Recovery reads them
// (what was lost, what can be recomputed, what must run again); so can
// isolation (owners) and "who waits on what".
//
// Lifetimes, bounded by what is live:
//  - a call record lives while the call is not done (its workers have not
//    all reported it), and after that while one of its outputs is live
//    (its lineage: the call that recomputes a lost output);
//  - a buffer record lives from its routing (call output or put) until
//    its client releases it and no call that reads it is still not done.
//    A release of a buffer that such a call reads is held back (Release
//    returns false) and goes when the last of those calls is done
//    (CallDone returns it), so that the buffer is still there if the call
//    must run again.
// Not thread-safe (ClusterState's lock).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "plexus/common/types.h"
#include "plexus/proto/plexus.pb.h"

namespace plexus {

struct CallRecord {
  uint64_t client_id = 0;
  proto::Call call;
  bool done = false;
  int live_outputs = 0;  // outputs whose buffers are not released
};

struct BufferRecord {
  uint64_t slice_id = 0;
  ArgSpec spec;
  uint64_t producer = 0;  // the call's sequence number; 0: a put
  int readers = 0;        // calls not done that read it
  bool released = false;  // by its client; the release waits for readers
  bool put = false;       // put by its client (which keeps the data)
};

class JobRecords {
 public:
  // A call routed (seq: its routing order, > 0). Its inputs gain a reader,
  // its outputs a record.
  void AddCall(uint64_t seq, uint64_t client_id, const proto::Call& call,
               const std::vector<ArgSpec>& outputs);
  void AddPut(uint64_t buffer_id, uint64_t slice_id, const ArgSpec& spec);
  // The call's workers have all reported it done. Returns the buffers whose
  // release was held back for it (their slice ids in *slices).
  std::vector<uint64_t> CallDone(uint64_t seq, std::vector<uint64_t>* slices);
  // The client released the buffer. False: a call that reads it is not
  // done yet, and the release is held back until it is.
  bool Release(uint64_t buffer_id);
  // The call will not run as recorded (it runs again under `new_seq`, or
  // it failed): its readers go, its record goes unless an output is live.
  // Returns held-back releases now due, as CallDone does.
  std::vector<uint64_t> Drop(uint64_t seq, std::vector<uint64_t>* slices);
  // Everything of a client that left.
  void RemoveClient(uint64_t client_id);
  // The buffer's record goes, whatever holds it (recovery: it lives on
  // under another id).
  void Erase(uint64_t id) { Forget(id); }

  CallRecord* FindCall(uint64_t seq);
  BufferRecord* FindBuffer(uint64_t id);
  const std::map<uint64_t, CallRecord>& calls() const { return calls_; }
  const absl::flat_hash_map<uint64_t, BufferRecord>& buffers() const {
    return buffers_;
  }
  // Puts whose records went since the last call (released for good).
  std::vector<uint64_t> TakeReleasedPuts() { return std::move(released_puts_); }

 private:
  // One reader of `id` fewer; appends it to `due` if its held release may
  // go now.
  void Unread(uint64_t id, std::vector<uint64_t>* due,
              std::vector<uint64_t>* slices);
  void Forget(uint64_t id);  // the buffer record goes; its producer's count
  void MaybeForgetCall(std::map<uint64_t, CallRecord>::iterator it);

  std::map<uint64_t, CallRecord> calls_;  // by seq: routing order
  absl::flat_hash_map<uint64_t, BufferRecord> buffers_;
  std::vector<uint64_t> released_puts_;
};

}  // namespace plexus
