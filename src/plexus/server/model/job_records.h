// JobRecords: the server's model of the job — every call routed and not
// yet done, every live buffer and the call that produces it — as plain
// data, part of ClusterState and under the same lock. Recovery reads them
// (what was lost, what can be recomputed, what must run again); so can
// isolation (owners) and "who waits on what".
//
// A call *holds* its inputs (they stay on the workers, whatever their
// client does) while it is not done, or while one of its outputs may have
// to be recomputed from them: an output whose record lives and that is
// neither replicated over more than one host (a surviving shard is a
// copy) nor snapshotted. So the lineage of a value reaches back only to
// values replicated over hosts, snapshots and puts (which the client
// keeps): a chain of replicated parameters, or of a split state (or any
// state of a one-host slice, such as a pipeline stage's) snapshotted each
// step, holds one step.
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

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "plexus/common/types.h"
#include "plexus/proto/plexus.pb.h"

namespace plexus {

// One input of a recorded call: the buffer, its slice and its layout as
// the call named them.
struct CallInput {
  CallInput() = default;
  // Laid out as `layout`, which must outlive the record (a program's
  // input: the client's record of the program keeps it, as for outputs).
  CallInput(uint64_t buffer_id, uint64_t slice_id, const ArgSpec* layout)
      : buffer_id(buffer_id), slice_id(slice_id), layout(layout) {}
  // Laid out as `own` (a layout other than its program's).
  CallInput(uint64_t buffer_id, uint64_t slice_id, ArgSpec own)
      : buffer_id(buffer_id),
        slice_id(slice_id),
        own_layout(std::make_unique<const ArgSpec>(std::move(own))),
        layout(own_layout.get()) {}

  uint64_t buffer_id = 0;
  uint64_t slice_id = 0;
  // Never null once set: the program's input (no copy per call: most calls
  // name the layout their program takes), or `own_layout`.
  std::unique_ptr<const ArgSpec> own_layout;
  const ArgSpec* layout = nullptr;
  const ArgSpec& arg() const { return *layout; }
};

// A call as routed (its inputs under the ids they had then): what routing
// it again needs, and no more (routing moves the parsed layouts in; no
// copy of the client's message is kept).
struct CallRecord {
  uint64_t client_id = 0;
  uint64_t call_id = 0;
  uint64_t slice_id = 0;
  uint64_t program_id = 0;
  absl::InlinedVector<CallInput, 2> inputs;
  absl::InlinedVector<uint64_t, 2> output_ids;
  bool done = false;
  bool failed = false;  // done, and a task of it failed
  bool holding = true;  // its inputs (see above)
  // Its slice's devices are all on one host: a replicated output's shards
  // are no copies that the loss of that host would spare.
  bool one_host = false;
  int live_outputs = 0;   // outputs whose records live
  absl::Time routed;      // ClusterState::set_now when it was routed (why.h)
  uint32_t site = 0;      // Call.site: where the client issued it
  uint64_t graph_id = 0;  // Call.graph_id: the client's graph, if any

  // The call as its client would send it (recovery routes it again).
  proto::Call ToCall() const;
  // The record of a call as sent; an input whose layout does not parse
  // keeps a default one (tests record calls with no layouts).
  static CallRecord FromCall(uint64_t client_id, const proto::Call& call);
};

// Call records by sequence number. Seqs come in increasing order, and
// records mostly go in about that order (a call's record goes once it is
// done and its outputs are released): a ring of slots in seq order, with
// holes where records went, trimmed from the front, and compacted when the
// holes outnumber the records by more than a few (a long-lived record, such
// as the producer of a value kept all run, holds the front). Finding a
// record looks at its place (its distance from the front) and, if something
// was compacted or skipped, searches. The ring's slots are reused: adding
// and erasing in seq order allocates nothing once it has room for the
// records in flight (this is the dispatch path). Pointers to records stay
// valid until the next Add or Erase (either may move every record).
class CallTable {
 private:
  struct Slot {
    uint64_t seq = 0;
    bool live = false;
    CallRecord record;
  };

 public:
  // In seq order, skipping holes; each element reads as (seq, record).
  template <bool kConst>
  class Iterator {
    using Table = std::conditional_t<kConst, const CallTable, CallTable>;
    using Record = std::conditional_t<kConst, const CallRecord, CallRecord>;

   public:
    Iterator(Table* table, size_t i) : table_(table), i_(i) { Skip(); }
    std::pair<uint64_t, Record&> operator*() const {
      auto& slot = table_->At(i_);
      return {slot.seq, slot.record};
    }
    Iterator& operator++() {
      ++i_;
      Skip();
      return *this;
    }
    bool operator==(const Iterator& o) const { return i_ == o.i_; }
    bool operator!=(const Iterator& o) const { return i_ != o.i_; }

   private:
    void Skip() {
      while (i_ < table_->count_ && !table_->At(i_).live) ++i_;
    }
    Table* table_;
    size_t i_;
  };
  using iterator = Iterator<false>;
  using const_iterator = Iterator<true>;

  // `record` as the record of `seq` (> 0), replacing one already there.
  // O(1) when `seq` is above every seq in the table.
  CallRecord& Add(uint64_t seq, CallRecord&& record = {});
  CallRecord* Find(uint64_t seq);
  const CallRecord* Find(uint64_t seq) const;
  // False if there was no record.
  bool Erase(uint64_t seq);
  // Erases every record `pred(seq, record)` holds for.
  template <typename Pred>
  void EraseIf(Pred pred);
  size_t size() const { return live_; }
  bool empty() const { return live_ == 0; }
  iterator begin() { return iterator(this, 0); }
  iterator end() { return iterator(this, count_); }
  const_iterator begin() const { return const_iterator(this, 0); }
  const_iterator end() const { return const_iterator(this, count_); }
  // Slots held, holes included (tests: the bound on memory).
  size_t slots() const { return count_; }

 private:
  static constexpr size_t kNone = ~size_t{0};
  // Holes beyond the records' number that a compaction waits for.
  static constexpr size_t kSlack = 64;
  // Slot `i` from the front (i < count_).
  Slot& At(size_t i) { return ring_[(head_ + i) & (ring_.size() - 1)]; }
  const Slot& At(size_t i) const {
    return ring_[(head_ + i) & (ring_.size() - 1)];
  }
  // The first slot whose seq is not below `seq` (count_ if none).
  size_t LowerBound(uint64_t seq) const;
  size_t IndexOf(uint64_t seq) const;  // of a live record, or kNone
  // One slot more at the back (the ring doubles when full).
  Slot& PushBack();
  // Empties slot `i` (a hole): the record's memory goes now.
  void Clear(Slot& slot);
  // Drops holes at the front, and every hole once they outnumber the
  // records by more than kSlack.
  void Trim();

  // Slots in seq order from ring_[head_], count_ of them; the first is
  // live. ring_.size() is 0 or a power of two.
  std::vector<Slot> ring_;
  size_t head_ = 0;
  size_t count_ = 0;
  size_t live_ = 0;
};

template <typename Pred>
void CallTable::EraseIf(Pred pred) {
  for (size_t i = 0; i < count_; ++i) {
    Slot& slot = At(i);
    if (slot.live && pred(slot.seq, slot.record)) {
      Clear(slot);
      live_--;
    }
  }
  Trim();
}

struct BufferRecord {
  uint64_t slice_id = 0;
  // Its layout, never null: its program's output (not a copy per call: the
  // client's record of the program keeps it while the buffer may live,
  // see JobRecords::AddCall), or its own (`own_layout`: a put's).
  const ArgSpec* layout = nullptr;
  std::unique_ptr<const ArgSpec> own_layout;
  uint64_t producer = 0;     // the call's sequence number; 0: a put
  int readers = 0;           // calls that hold it
  bool released = false;     // by its client; the release waits for readers
  bool put = false;          // put by its client (which keeps the data)
  bool snapshotted = false;  // a copy of each shard is on another host
  const ArgSpec& spec() const { return *layout; }
};

class JobRecords {
 public:
  // A call routed (seq: its routing order, > 0). It holds its inputs; its
  // outputs get records, output o laid out as outputs[o] (a default layout
  // past its end), which must outlive the records of the call's outputs.
  void AddCall(uint64_t seq, CallRecord&& call,
               absl::Span<const ArgSpec> outputs);
  // The same from a call as sent, the layouts copied (tests).
  void AddCall(uint64_t seq, uint64_t client_id, const proto::Call& call,
               const std::vector<ArgSpec>& outputs);
  void AddPut(uint64_t buffer_id, uint64_t slice_id, const ArgSpec& spec);
  // A value a resumed client still holds whose shards its workers kept
  // across a server restart: recorded as a put is, but its client keeps no
  // data and its producer is unknown (its lineage went with the server
  // that made it), so a later loss of one of its hosts loses it.
  void AddRestored(uint64_t buffer_id, uint64_t slice_id, const ArgSpec& spec);
  // The call's workers have all reported it done. A call that failed
  // keeps holding its inputs (it may have failed because a host was lost,
  // and run again).
  void CallDone(uint64_t seq, bool failed = false);
  // The client released the buffer: it goes now (TakeDue has it), or when
  // the last call holding it lets go. False if it is held back. True, and
  // `*recorded` false, for a buffer that has no record.
  bool Release(uint64_t buffer_id, bool* recorded = nullptr);
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
  // The same, each handed to `fn` (which must not change the records);
  // keeps the list's room for the next ones (the hot path).
  template <typename Fn>
  void DrainDue(Fn fn) {
    for (const auto& [id, slice] : due_) fn(id, slice);
    due_.clear();
  }
  // Puts whose records went since the last call (released for good).
  std::vector<uint64_t> TakeReleasedPuts() { return std::move(released_puts_); }

  // Pointers stay valid until the next change to the records.
  CallRecord* FindCall(uint64_t seq) { return calls_.Find(seq); }
  const CallRecord* FindCall(uint64_t seq) const { return calls_.Find(seq); }
  BufferRecord* FindBuffer(uint64_t id);
  const BufferRecord* FindBuffer(uint64_t id) const;
  const CallTable& calls() const { return calls_; }
  const absl::flat_hash_map<uint64_t, BufferRecord>& buffers() const {
    return buffers_;
  }

 private:
  // One holder of `id` fewer; its held release goes if it was the last.
  void Unread(uint64_t id);
  // The record goes; its producer may let go of its inputs.
  void Forget(absl::flat_hash_map<uint64_t, BufferRecord>::iterator it);
  // Lets go of the call's inputs if it no longer needs them; forgets the
  // record when it is done and no output lives. The calls that frees are
  // reconsidered in turn (a loop over reconsider_, not recursion).
  // `rec`, if not null, is the record of `seq` (not looked up again).
  void Reconsider(uint64_t seq, CallRecord* rec = nullptr);
  void ReconsiderOne(uint64_t seq, CallRecord* rec);

  CallTable calls_;  // by seq: routing order
  absl::flat_hash_map<uint64_t, BufferRecord> buffers_;
  std::vector<std::pair<uint64_t, uint64_t>> due_;
  std::vector<uint64_t> released_puts_;
  bool keep_lineage_ = true;
  std::vector<uint64_t> reconsider_;  // calls to reconsider, last first
  bool reconsidering_ = false;
};

}  // namespace plexus
