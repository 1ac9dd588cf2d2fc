#include "plexus/server/job_records.h"

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

void JobRecords::Unread(uint64_t id, std::vector<uint64_t>* due,
                        std::vector<uint64_t>* slices) {
  auto it = buffers_.find(id);
  if (it == buffers_.end()) return;
  if (--it->second.readers > 0 || !it->second.released) return;
  due->push_back(id);
  slices->push_back(it->second.slice_id);
  Forget(id);
}

std::vector<uint64_t> JobRecords::CallDone(uint64_t seq,
                                           std::vector<uint64_t>* slices) {
  std::vector<uint64_t> due;
  auto it = calls_.find(seq);
  if (it == calls_.end() || it->second.done) return due;
  it->second.done = true;
  for (const proto::InputRef& in : it->second.call.inputs()) {
    Unread(in.buffer_id(), &due, slices);
  }
  MaybeForgetCall(calls_.find(seq));
  return due;
}

std::vector<uint64_t> JobRecords::Drop(uint64_t seq,
                                       std::vector<uint64_t>* slices) {
  std::vector<uint64_t> due;
  auto it = calls_.find(seq);
  if (it == calls_.end()) return due;
  if (!it->second.done) {
    for (const proto::InputRef& in : it->second.call.inputs()) {
      Unread(in.buffer_id(), &due, slices);
    }
  }
  // Its outputs no longer name it as their producer.
  for (uint64_t id : it->second.call.output_ids()) {
    auto b = buffers_.find(id);
    if (b != buffers_.end() && b->second.producer == seq)
      b->second.producer = 0;
  }
  calls_.erase(seq);
  return due;
}

bool JobRecords::Release(uint64_t buffer_id) {
  auto it = buffers_.find(buffer_id);
  if (it == buffers_.end()) return true;
  if (it->second.readers > 0) {
    it->second.released = true;
    return false;
  }
  Forget(buffer_id);
  return true;
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
  MaybeForgetCall(call);
}

void JobRecords::MaybeForgetCall(std::map<uint64_t, CallRecord>::iterator it) {
  if (it == calls_.end()) return;
  if (it->second.done && it->second.live_outputs <= 0) calls_.erase(it);
}

void JobRecords::RemoveClient(uint64_t client_id) {
  for (auto it = calls_.begin(); it != calls_.end();) {
    it = it->second.client_id == client_id ? calls_.erase(it) : std::next(it);
  }
  for (auto it = buffers_.begin(); it != buffers_.end();) {
    auto next = std::next(it);
    if ((it->first >> 40) == client_id) buffers_.erase(it);
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
