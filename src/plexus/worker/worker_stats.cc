// WorkerImpl::CollectStats: a heartbeat's figures, from the parts.
#include <optional>
#include <utility>

#include "plexus/worker/worker_impl.h"

namespace plexus {

proto::WorkerStats WorkerImpl::CollectStats() {
  proto::WorkerStats s;
  if (std::optional<ObjectStoreStats> st = store_->TryStats()) {
    last_store_stats_ = std::move(*st);
  }
  const ObjectStoreStats& st = last_store_stats_;
  s.set_live_buffers(st.live_shards);
  s.set_live_bytes(st.live_bytes);
  for (int64_t b : st.device_bytes) s.add_device_live_bytes(b);
  for (int64_t b : st.device_peak_bytes) s.add_device_peak_bytes(b);
  for (int64_t b : st.device_waiting_bytes) s.add_device_waiting_bytes(b);
  s.set_device_memory_shards(st.device_memory_shards);
  for (size_t d = 0; d < devices_.size(); ++d) {
    // The device thread's own time, and the device time of its XLA runs
    // (which it queues and does not wait for).
    s.add_device_busy_micros(devices_[d]->busy_micros() +
                             tasks_->xla_busy_micros(static_cast<int>(d)));
    s.add_device_tasks_pending(devices_[d]->pending());
  }
  s.set_calls_executed(tasks_->calls_executed());
  s.set_tasks_inline(tasks_->tasks_inline());
  s.set_answers_relayed(counters_.relayed_answers.load());
  s.set_relay_links_shut(counters_.relay_links_shut.load());
  s.set_calls_failed(tasks_->calls_failed());
  s.set_programs_loaded(applier_->programs_loaded());
  s.set_pushes_fenced(data_plane_->pushes_fenced());
  s.set_ops_frames(session_.framed_messages());
  s.set_bytes_host_to_device(MemoryTraffic::host_to_device().load());
  s.set_transfers_alias(TransferPaths::alias().load());
  s.set_donations(xla_programs_->donations());
  s.set_donations_declined(xla_programs_->donations_declined());
  s.set_transfers_device_to_device(TransferPaths::device_to_device().load());
  s.set_transfers_host_staged(TransferPaths::host_staged().load());
  s.set_transfers_ipc(TransferPaths::ipc().load());
  s.set_transfers_nccl(NcclPaths::all_reduce().load());
  proto::TransferBytes* bytes = s.mutable_transfer_bytes();
  bytes->set_alias(TransferBytes::of(TransferBytes::kAlias).load());
  bytes->set_device_to_device(
      TransferBytes::of(TransferBytes::kDeviceToDevice).load());
  bytes->set_ipc(TransferBytes::of(TransferBytes::kIpc).load());
  bytes->set_shared_memory(
      TransferBytes::of(TransferBytes::kSharedMemory).load());
  bytes->set_tcp(TransferBytes::of(TransferBytes::kTcp).load());
  bytes->set_nccl(TransferBytes::of(TransferBytes::kNccl).load());
  s.set_bytes_device_to_host(MemoryTraffic::device_to_host().load());
  s.set_xla_compiles(xla_->compiles());
  s.set_xla_cache_hits(xla_->cache_hits());
  s.set_xla_compile_micros(xla_->compile_micros());
  s.set_xla_serialized_loads(xla_->serialized_loads());
  // Set once, when the plugin has loaded (Describe's lock is never held
  // across the load; after that it is not taken at all).
  if (xla_platform_.empty()) xla_platform_ = xla_->Describe();
  s.set_xla_platform(xla_platform_);
  s.set_bytes_sent(counters_.bytes_sent.load());
  s.set_bytes_received(counters_.bytes_received.load());
  s.set_bytes_from_clients(counters_.bytes_from_clients.load());
  s.set_bytes_to_clients(counters_.bytes_to_clients.load());
  if (std::optional<std::vector<proto::ClientUsage>> usage =
          reports_.TryUsage()) {
    last_usage_ = std::move(*usage);
  }
  for (const proto::ClientUsage& u : last_usage_) *s.add_clients() = u;
  xla_programs_->AddCompiling(&s);
  AddAwaitedInputs(&s);
  return s;
}

void WorkerImpl::AddAwaitedInputs(proto::WorkerStats* stats) {
  // Most beats: no task waits, nothing allocated, no clock reading.
  const int all = store_->AwaitedInputs(kMaxAwaitedInputs, &awaited_);
  if (all == 0) return;
  stats->set_inputs_awaited(all);
  const absl::Time now = options_.clock->Now();
  for (const AwaitedInput& a : awaited_) {
    proto::InputAwaited& p = *stats->add_awaiting_inputs();
    p.set_buffer_id(a.key.buffer_id);
    p.set_shard(a.key.shard);
    p.set_source_worker(a.source_worker);
    p.set_elapsed_ms(absl::ToInt64Milliseconds(now - a.since));
  }
}

}  // namespace plexus
