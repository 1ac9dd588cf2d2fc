#include "plexus/timeline/timeline_proto.h"

#include <algorithm>

namespace plexus {

void ToProto(const TimelineEvent& e, proto::TimelineEvent* out) {
  out->set_kind(static_cast<int32_t>(e.kind));
  out->set_start_ns(e.start_ns);
  out->set_end_ns(e.end_ns);
  if (e.client_id != 0) out->set_client_id(e.client_id);
  if (e.call_id != 0) out->set_call_id(e.call_id);
  if (e.program_id != 0) out->set_program_id(e.program_id);
  if (e.buffer_id != 0) out->set_buffer_id(e.buffer_id);
  if (e.graph_id != 0) out->set_graph_id(e.graph_id);
  if (e.peer != 0) out->set_peer(e.peer);
  if (e.bytes != 0) out->set_bytes(e.bytes);
  out->set_device(e.device);
  out->set_shard(e.shard);
  if (e.path != TransferPath::kNone) {
    out->set_path(static_cast<int32_t>(e.path));
  }
  if (e.failed) out->set_failed(true);
  if (e.label != 0) out->set_label(e.label);
}

std::vector<proto::TimelineRing> RingChunks(const Timeline& timeline,
                                            int64_t since_ns, int per_chunk) {
  const std::vector<TimelineEvent> events = timeline.Since(since_ns);
  std::vector<proto::TimelineRing> chunks(1);
  proto::TimelineRing& head = chunks.front();
  head.set_recorded(timeline.recorded());
  head.set_dropped(timeline.dropped());
  head.set_capacity(static_cast<int64_t>(timeline.capacity()));
  // Labels up to the highest id named (ids are dense and small); a call's
  // label is its client's call site, resolved by the server instead.
  uint32_t max_label = 0;
  for (const TimelineEvent& e : events) {
    if (e.kind != EventKind::kCall) max_label = std::max(max_label, e.label);
  }
  for (uint32_t id = 0; id <= max_label; ++id) {
    head.add_labels(timeline.Label(id));
  }
  per_chunk = std::max(per_chunk, 1);
  for (const TimelineEvent& e : events) {
    if (chunks.back().events_size() >= per_chunk) chunks.emplace_back();
    ToProto(e, chunks.back().add_events());
  }
  return chunks;
}

}  // namespace plexus
