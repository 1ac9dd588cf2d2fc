#include "plexus/server/model/job_records.h"

#include <algorithm>

#include "plexus/common/ids.h"

namespace plexus {

proto::Call CallRecord::ToCall() const {
  proto::Call call;
  call.set_call_id(call_id);
  call.set_slice_id(slice_id);
  call.set_program_id(program_id);
  call.set_site(site);
  call.set_graph_id(graph_id);
  for (const CallInput& in : inputs) {
    proto::InputRef* ref = call.add_inputs();
    ref->set_buffer_id(in.buffer_id);
    ref->set_slice_id(in.slice_id);
    *ref->mutable_arg() = ToProto(in.arg());
  }
  for (uint64_t id : output_ids) call.add_output_ids(id);
  return call;
}

CallRecord CallRecord::FromCall(uint64_t client_id, const proto::Call& call) {
  CallRecord rec;
  rec.client_id = client_id;
  rec.call_id = call.call_id();
  rec.slice_id = call.slice_id();
  rec.program_id = call.program_id();
  rec.site = call.site();
  rec.graph_id = call.graph_id();
  for (const proto::InputRef& ref : call.inputs()) {
    auto arg = FromProto(ref.arg());
    rec.inputs.emplace_back(ref.buffer_id(), ref.slice_id(),
                            arg.ok() ? *std::move(arg) : ArgSpec());
  }
  rec.output_ids.assign(call.output_ids().begin(), call.output_ids().end());
  return rec;
}

// --- CallTable

CallTable::Slot& CallTable::PushBack() {
  if (count_ == ring_.size()) {
    std::vector<Slot> bigger(ring_.empty() ? 16 : 2 * ring_.size());
    for (size_t i = 0; i < count_; ++i) bigger[i] = std::move(At(i));
    ring_ = std::move(bigger);
    head_ = 0;
  }
  return At(count_++);
}

void CallTable::Clear(Slot& slot) {
  slot.live = false;
  // Without building an empty record to assign (this is the hot path).
  slot.record.inputs.clear();
  slot.record.output_ids.clear();
}

CallRecord& CallTable::Add(uint64_t seq, CallRecord&& record) {
  if (count_ == 0 || seq > At(count_ - 1).seq) {
    Slot& slot = PushBack();
    slot.seq = seq;
    slot.live = true;
    slot.record = std::move(record);
    live_++;
    return slot.record;
  }
  // Out of order (not the server's way): in its place.
  size_t i = LowerBound(seq);
  if (i == count_ || At(i).seq != seq) {
    PushBack();  // the slots from i on move one back
    for (size_t k = count_ - 1; k > i; --k) At(k) = std::move(At(k - 1));
    Slot& slot = At(i);
    slot.seq = seq;
    slot.live = false;
  }
  Slot& slot = At(i);
  if (!slot.live) live_++;
  slot.live = true;
  slot.record = std::move(record);
  return slot.record;
}

size_t CallTable::LowerBound(uint64_t seq) const {
  size_t lo = 0, hi = count_;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (At(mid).seq < seq) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

size_t CallTable::IndexOf(uint64_t seq) const {
  if (count_ == 0 || seq < At(0).seq) return kNone;
  // Its place if no seq was skipped and nothing compacted since the front.
  const uint64_t guess = seq - At(0).seq;
  size_t i;
  if (guess < count_ && At(guess).seq == seq) {
    i = guess;
  } else {
    i = LowerBound(seq);
    if (i == count_ || At(i).seq != seq) return kNone;
  }
  return At(i).live ? i : kNone;
}

CallRecord* CallTable::Find(uint64_t seq) {
  const size_t i = IndexOf(seq);
  return i == kNone ? nullptr : &At(i).record;
}

const CallRecord* CallTable::Find(uint64_t seq) const {
  const size_t i = IndexOf(seq);
  return i == kNone ? nullptr : &At(i).record;
}

bool CallTable::Erase(uint64_t seq) {
  const size_t i = IndexOf(seq);
  if (i == kNone) return false;
  Clear(At(i));
  live_--;
  Trim();
  return true;
}

void CallTable::Trim() {
  while (count_ > 0 && !At(0).live) {
    head_ = (head_ + 1) & (ring_.size() - 1);
    count_--;
  }
  if (count_ == 0) head_ = 0;
  if (count_ - live_ <= live_ + kSlack) return;
  size_t kept = 0;
  for (size_t i = 0; i < count_; ++i) {
    if (!At(i).live) continue;
    if (kept != i) {
      At(kept) = std::move(At(i));
      Clear(At(i));
    }
    kept++;
  }
  count_ = kept;
}

// --- JobRecords

namespace {

// The layout of an output its program does not say (a record made by
// hand): the default one.
const ArgSpec* DefaultLayout() {
  static const ArgSpec* layout = new ArgSpec();
  return layout;
}

}  // namespace

void JobRecords::AddCall(uint64_t seq, CallRecord&& call,
                         absl::Span<const ArgSpec> outputs) {
  CallRecord& rec = calls_.Add(seq, std::move(call));
  rec.done = false;
  rec.failed = false;
  rec.holding = true;
  rec.live_outputs = 0;
  for (const CallInput& in : rec.inputs) {
    auto it = buffers_.find(in.buffer_id);
    if (it != buffers_.end()) it->second.readers++;
  }
  for (size_t o = 0; o < rec.output_ids.size(); ++o) {
    BufferRecord& b = buffers_[rec.output_ids[o]];
    b.slice_id = rec.slice_id;
    b.layout = o < outputs.size() ? &outputs[o] : DefaultLayout();
    b.own_layout.reset();
    b.producer = seq;
    rec.live_outputs++;
  }
}

void JobRecords::AddCall(uint64_t seq, uint64_t client_id,
                         const proto::Call& call,
                         const std::vector<ArgSpec>& outputs) {
  AddCall(seq, CallRecord::FromCall(client_id, call), {});
  for (size_t o = 0;
       o < outputs.size() && static_cast<int>(o) < call.output_ids_size();
       ++o) {
    BufferRecord& b = buffers_[call.output_ids(static_cast<int>(o))];
    b.own_layout = std::make_unique<const ArgSpec>(outputs[o]);
    b.layout = b.own_layout.get();
  }
}

void JobRecords::AddPut(uint64_t buffer_id, uint64_t slice_id,
                        const ArgSpec& spec) {
  BufferRecord& b = buffers_[buffer_id];
  b.slice_id = slice_id;
  b.own_layout = std::make_unique<const ArgSpec>(spec);
  b.layout = b.own_layout.get();
  b.producer = 0;
  b.put = true;
}

void JobRecords::AddRestored(uint64_t buffer_id, uint64_t slice_id,
                             const ArgSpec& spec) {
  AddPut(buffer_id, slice_id, spec);
  buffers_[buffer_id].put = false;
}

void JobRecords::Reconsider(uint64_t seq, CallRecord* rec) {
  // A loop, not recursion: letting go of a chain's end lets go of the whole
  // chain, one call per link (a chain of 43,000 split values overflowed a
  // gRPC thread's 8 MiB stack). The calls a reconsideration frees are
  // reconsidered after it, in the order it freed them.
  if (reconsidering_) {
    reconsider_.push_back(seq);
    return;
  }
  reconsidering_ = true;
  ReconsiderOne(seq, rec);
  std::reverse(reconsider_.begin(), reconsider_.end());
  while (!reconsider_.empty()) {
    const uint64_t next = reconsider_.back();
    reconsider_.pop_back();
    const size_t before = reconsider_.size();
    ReconsiderOne(next, nullptr);
    std::reverse(reconsider_.begin() + before, reconsider_.end());
  }
  reconsidering_ = false;
}

void JobRecords::ReconsiderOne(uint64_t seq, CallRecord* rec) {
  // Records are not added or erased until the end (Unread and Forget only
  // queue calls to reconsider), so `rec` stays valid.
  if (rec == nullptr) rec = calls_.Find(seq);
  if (rec == nullptr) return;
  if (rec->holding && rec->done && !rec->failed) {
    bool needed = false;  // an output that only its inputs can rebuild
    for (uint64_t o : rec->output_ids) {
      if (!keep_lineage_) break;
      auto b = buffers_.find(o);
      if (b != buffers_.end() && b->second.producer == seq &&
          (rec->one_host || !b->second.spec().sharding.is_replicated()) &&
          !b->second.snapshotted) {
        needed = true;
        break;
      }
    }
    if (!needed) {
      rec->holding = false;
      // Unread may forget buffers; their producers (earlier calls) are
      // reconsidered after this one.
      for (const CallInput& in : rec->inputs) Unread(in.buffer_id);
    }
  }
  // Done and no output lives: the record goes (a failed call lets go of
  // its inputs now).
  if (!rec->done || rec->live_outputs > 0) return;
  if (rec->holding) {
    rec->holding = false;
    for (const CallInput& in : rec->inputs) Unread(in.buffer_id);
  }
  calls_.Erase(seq);
}

void JobRecords::Unread(uint64_t id) {
  auto it = buffers_.find(id);
  if (it == buffers_.end()) return;
  if (--it->second.readers > 0 || !it->second.released) return;
  due_.emplace_back(id, it->second.slice_id);
  Forget(it);
}

void JobRecords::CallDone(uint64_t seq, bool failed) {
  CallRecord* rec = calls_.Find(seq);
  if (rec == nullptr || rec->done) return;
  rec->done = true;
  rec->failed = failed;
  Reconsider(seq, rec);
}

void JobRecords::Drop(uint64_t seq) {
  CallRecord* found = calls_.Find(seq);
  if (found == nullptr) return;
  CallRecord rec = std::move(*found);
  calls_.Erase(seq);
  // Its outputs no longer name it as their producer.
  for (uint64_t id : rec.output_ids) {
    auto b = buffers_.find(id);
    if (b != buffers_.end() && b->second.producer == seq)
      b->second.producer = 0;
  }
  if (rec.holding) {
    for (const CallInput& in : rec.inputs) Unread(in.buffer_id);
  }
}

bool JobRecords::Release(uint64_t buffer_id, bool* recorded) {
  auto it = buffers_.find(buffer_id);
  if (recorded != nullptr) *recorded = it != buffers_.end();
  if (it == buffers_.end()) return true;
  if (it->second.readers > 0) {
    it->second.released = true;
    return false;
  }
  due_.emplace_back(buffer_id, it->second.slice_id);
  Forget(it);
  return true;
}

void JobRecords::Snapshotted(uint64_t buffer_id) {
  auto it = buffers_.find(buffer_id);
  if (it == buffers_.end()) return;
  it->second.snapshotted = true;
  if (it->second.producer != 0) Reconsider(it->second.producer);
}

void JobRecords::Erase(uint64_t id) {
  auto it = buffers_.find(id);
  if (it != buffers_.end()) Forget(it);
}

void JobRecords::Rename(uint64_t from, uint64_t to) {
  auto f = buffers_.find(from);
  auto t = buffers_.find(to);
  if (f == buffers_.end() || t == buffers_.end()) return;
  for (auto [seq, rec] : calls_) {
    if (!rec.done || rec.failed || !rec.holding) continue;
    for (CallInput& in : rec.inputs) {
      if (in.buffer_id != from) continue;
      in.buffer_id = to;
      f->second.readers--;
      t->second.readers++;
    }
  }
  if (f->second.readers == 0 && f->second.released) {
    due_.emplace_back(from, f->second.slice_id);
    Forget(f);
  }
}

void JobRecords::Forget(
    absl::flat_hash_map<uint64_t, BufferRecord>::iterator it) {
  const uint64_t producer = it->second.producer;
  if (it->second.put) released_puts_.push_back(it->first);
  buffers_.erase(it);
  if (producer == 0) return;
  CallRecord* call = calls_.Find(producer);
  if (call == nullptr) return;
  call->live_outputs--;
  Reconsider(producer, call);
}

void JobRecords::RemoveClient(uint64_t client_id) {
  calls_.EraseIf([client_id](uint64_t, const CallRecord& rec) {
    return rec.client_id == client_id;
  });
  for (auto it = buffers_.begin(); it != buffers_.end();) {
    auto next = std::next(it);
    if (ClientOfBuffer(it->first) == client_id) buffers_.erase(it);
    it = next;
  }
}

BufferRecord* JobRecords::FindBuffer(uint64_t id) {
  auto it = buffers_.find(id);
  return it == buffers_.end() ? nullptr : &it->second;
}

const BufferRecord* JobRecords::FindBuffer(uint64_t id) const {
  auto it = buffers_.find(id);
  return it == buffers_.end() ? nullptr : &it->second;
}

}  // namespace plexus
