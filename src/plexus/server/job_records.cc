#include "plexus/server/job_records.h"

#include <algorithm>

#include "plexus/store/object_store.h"  // ClientOfBuffer

namespace plexus {

void JobRecords::AddCall(uint64_t seq, uint64_t client_id,
                         const proto::Call& call,
                         const std::vector<ArgSpec>& outputs) {
  CallRecord& rec = calls_[seq];
  rec.client_id = client_id;
  rec.call = call;
  for (const proto::InputRef& in : call.inputs()) {
    auto it = buffers_.find(in.buffer_id());
    if (it != buffers_.end()) it->second.readers++;
  }
  for (int o = 0; o < call.output_ids_size(); ++o) {
    BufferRecord& b = buffers_[call.output_ids(o)];
    b.slice_id = call.slice_id();
    if (o < static_cast<int>(outputs.size())) b.spec = outputs[o];
    b.producer = seq;
    rec.live_outputs++;
  }
}

void JobRecords::AddPut(uint64_t buffer_id, uint64_t slice_id,
                        const ArgSpec& spec) {
  BufferRecord& b = buffers_[buffer_id];
  b.slice_id = slice_id;
  b.spec = spec;
  b.producer = 0;
  b.put = true;
}

void JobRecords::Reconsider(uint64_t seq) {
  // A loop, not recursion: letting go of a chain's end lets go of the whole
  // chain, one call per link (a chain of 43,000 split values overflowed a
  // gRPC thread's 8 MiB stack). The calls a reconsideration frees are
  // reconsidered after it, in the order it freed them.
  reconsider_.push_back(seq);
  if (reconsidering_) return;
  reconsidering_ = true;
  while (!reconsider_.empty()) {
    const uint64_t next = reconsider_.back();
    reconsider_.pop_back();
    const size_t before = reconsider_.size();
    ReconsiderOne(next);
    std::reverse(reconsider_.begin() + before, reconsider_.end());
  }
  reconsidering_ = false;
}

void JobRecords::ReconsiderOne(uint64_t seq) {
  auto it = calls_.find(seq);
  if (it == calls_.end()) return;
  CallRecord& rec = it->second;
  if (rec.holding && rec.done && !rec.failed) {
    bool needed = false;  // an output that only its inputs can rebuild
    for (uint64_t o : rec.call.output_ids()) {
      if (!keep_lineage_) break;
      auto b = buffers_.find(o);
      if (b != buffers_.end() && b->second.producer == seq &&
          !b->second.spec.sharding.is_replicated() && !b->second.snapshotted) {
        needed = true;
        break;
      }
    }
    if (!needed) {
      rec.holding = false;
      // Unread may forget buffers; their producers (earlier calls) are
      // reconsidered after this one.
      for (const proto::InputRef& in : rec.call.inputs()) {
        Unread(in.buffer_id());
      }
    }
  }
  // Done and no output lives: the record goes (a failed call lets go of
  // its inputs now).
  it = calls_.find(seq);
  if (it == calls_.end() || !it->second.done || it->second.live_outputs > 0) {
    return;
  }
  if (it->second.holding) {
    it->second.holding = false;
    for (const proto::InputRef& in : it->second.call.inputs()) {
      Unread(in.buffer_id());
    }
  }
  calls_.erase(seq);
}

void JobRecords::Unread(uint64_t id) {
  auto it = buffers_.find(id);
  if (it == buffers_.end()) return;
  if (--it->second.readers > 0 || !it->second.released) return;
  due_.emplace_back(id, it->second.slice_id);
  Forget(id);
}

void JobRecords::CallDone(uint64_t seq, bool failed) {
  auto it = calls_.find(seq);
  if (it == calls_.end() || it->second.done) return;
  it->second.done = true;
  it->second.failed = failed;
  Reconsider(seq);
}

void JobRecords::Drop(uint64_t seq) {
  auto it = calls_.find(seq);
  if (it == calls_.end()) return;
  CallRecord rec = std::move(it->second);
  calls_.erase(it);
  // Its outputs no longer name it as their producer.
  for (uint64_t id : rec.call.output_ids()) {
    auto b = buffers_.find(id);
    if (b != buffers_.end() && b->second.producer == seq)
      b->second.producer = 0;
  }
  if (rec.holding) {
    for (const proto::InputRef& in : rec.call.inputs()) Unread(in.buffer_id());
  }
}

bool JobRecords::Release(uint64_t buffer_id) {
  auto it = buffers_.find(buffer_id);
  if (it == buffers_.end()) return true;
  if (it->second.readers > 0) {
    it->second.released = true;
    return false;
  }
  due_.emplace_back(buffer_id, it->second.slice_id);
  Forget(buffer_id);
  return true;
}

void JobRecords::Snapshotted(uint64_t buffer_id) {
  auto it = buffers_.find(buffer_id);
  if (it == buffers_.end()) return;
  it->second.snapshotted = true;
  if (it->second.producer != 0) Reconsider(it->second.producer);
}

void JobRecords::Erase(uint64_t id) { Forget(id); }

void JobRecords::Rename(uint64_t from, uint64_t to) {
  auto f = buffers_.find(from);
  auto t = buffers_.find(to);
  if (f == buffers_.end() || t == buffers_.end()) return;
  for (auto& [seq, rec] : calls_) {
    if (!rec.done || rec.failed || !rec.holding) continue;
    for (proto::InputRef& in : *rec.call.mutable_inputs()) {
      if (in.buffer_id() != from) continue;
      in.set_buffer_id(to);
      f->second.readers--;
      t->second.readers++;
    }
  }
  if (f->second.readers == 0 && f->second.released) {
    due_.emplace_back(from, f->second.slice_id);
    Forget(from);
  }
}

void JobRecords::Forget(uint64_t id) {
  auto it = buffers_.find(id);
  if (it == buffers_.end()) return;
  const uint64_t producer = it->second.producer;
  if (it->second.put) released_puts_.push_back(id);
  buffers_.erase(it);
  if (producer == 0) return;
  auto call = calls_.find(producer);
  if (call == calls_.end()) return;
  call->second.live_outputs--;
  Reconsider(producer);
}

void JobRecords::RemoveClient(uint64_t client_id) {
  for (auto it = calls_.begin(); it != calls_.end();) {
    it = it->second.client_id == client_id ? calls_.erase(it) : std::next(it);
  }
  for (auto it = buffers_.begin(); it != buffers_.end();) {
    auto next = std::next(it);
    if (ClientOfBuffer(it->first) == client_id) buffers_.erase(it);
    it = next;
  }
}

CallRecord* JobRecords::FindCall(uint64_t seq) {
  auto it = calls_.find(seq);
  return it == calls_.end() ? nullptr : &it->second;
}

BufferRecord* JobRecords::FindBuffer(uint64_t id) {
  auto it = buffers_.find(id);
  return it == buffers_.end() ? nullptr : &it->second;
}

}  // namespace plexus
