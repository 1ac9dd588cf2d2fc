#include "plexus/web/metrics.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

namespace plexus::web {

namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

// The families, in the order /metrics writes them. Each Add() names one of
// them by its index in this table, so a name is written once.
struct FamilyDef {
  const char* name;
  MetricType type;
  const char* help;
};
enum Family {
  kWorkers,
  kCallsRouted,
  kControlBytes,
  kSlices,
  kSliceRequestsPending,
  kCallsWaiting,
  kWorkerCalls,
  kWorkerCallsFailed,
  kWorkerTasksInline,
  kWorkerLiveBuffers,
  kWorkerLiveBytes,
  kWorkerBytes,
  kTransfers,
  kTransferBytes,
  kXlaCompiles,
  kXlaCacheHits,
  kXlaCompileSeconds,
  kXlaSerializedLoads,
  kDonations,
  kPushesFenced,
  kDeviceBusySeconds,
  kDeviceMemoryBytes,
  kDeviceTasksPending,
  kClientQueuedSeconds,
  kClientCallsPending,
  kClientCallsInFlight,
  kClientCallsAdmitted,
  kClientDeviceSeconds,
  kClientLiveBytes,
  kClientBytes,
  kTenantDeviceSeconds,
  kTenantCallsPending,
  kTenantCallsInFlight,
  kRecoveries,
  kRecords,
  kFamilies,
};
constexpr FamilyDef kDefs[kFamilies] = {
    {"plexus_workers", MetricType::Gauge,
     "Registered workers by state (alive, spare, down)."},
    {"plexus_calls_routed_total", MetricType::Counter,
     "Calls the server has routed to workers."},
    {"plexus_server_control_bytes_total", MetricType::Counter,
     "Serialized control-plane bytes the server has read."},
    {"plexus_slices", MetricType::Gauge,
     "Granted slices by state (ok, awaiting a host, broken)."},
    {"plexus_slice_requests_pending", MetricType::Gauge,
     "Slice requests waiting for capacity."},
    {"plexus_calls_waiting", MetricType::Gauge,
     "Waits explained by plexus why: calls routed more than a second ago "
     "and not done (a client's calls at admission count once), and slices "
     "waiting for a host."},
    {"plexus_worker_calls_total", MetricType::Counter,
     "Calls a worker has executed."},
    {"plexus_worker_calls_failed_total", MetricType::Counter,
     "Calls that failed on a worker."},
    {"plexus_worker_tasks_inline_total", MetricType::Counter,
     "Tasks a worker ran on its reader as they came rather than on their "
     "device's thread (quick ones on an idle device)."},
    {"plexus_worker_live_buffers", MetricType::Gauge,
     "Buffers a worker holds."},
    {"plexus_worker_live_bytes", MetricType::Gauge,
     "Bytes of the buffers a worker holds."},
    {"plexus_worker_bytes_total", MetricType::Counter,
     "Bytes a worker moved, by direction (sent and received on the data "
     "plane, from and to clients, host to device and device to host)."},
    {"plexus_transfers_total", MetricType::Counter,
     "Shards moved or read, by the path they took (alias, device_to_device, "
     "host_staged, ipc, nccl)."},
    {"plexus_transfer_bytes_total", MetricType::Counter,
     "Bytes moved or read, by the path they took (alias, device_to_device, "
     "ipc, shared_memory, tcp, nccl)."},
    {"plexus_xla_compiles_total", MetricType::Counter,
     "XLA programs a worker compiled."},
    {"plexus_xla_cache_hits_total", MetricType::Counter,
     "XLA compile requests answered from a worker's cache."},
    {"plexus_xla_compile_seconds_total", MetricType::Counter,
     "Time a worker spent compiling XLA programs."},
    {"plexus_xla_serialized_loads_total", MetricType::Counter,
     "Executables a worker loaded from another worker's serialized bytes."},
    {"plexus_donations_total", MetricType::Counter,
     "Donated inputs, by result (done: the output reused the memory; "
     "declined)."},
    {"plexus_pushes_fenced_total", MetricType::Counter,
     "Pushes a worker refused from a sender declared down."},
    {"plexus_device_busy_seconds_total", MetricType::Counter,
     "Time a device spent running tasks."},
    {"plexus_device_memory_bytes", MetricType::Gauge,
     "A device's memory by kind (live, peak since start, capacity)."},
    {"plexus_device_tasks_pending", MetricType::Gauge,
     "Tasks queued or running on a device."},
    {"plexus_client_queued_seconds_total", MetricType::Counter,
     "Time a client's tasks waited in a worker's device queues."},
    {"plexus_client_calls_pending", MetricType::Gauge,
     "A client's calls waiting at admission for its share."},
    {"plexus_client_calls_in_flight", MetricType::Gauge,
     "A client's calls admitted to workers and not finished."},
    {"plexus_client_calls_admitted_total", MetricType::Counter,
     "A client's calls admitted to workers."},
    {"plexus_client_device_seconds_total", MetricType::Counter,
     "Device time of a client's finished calls."},
    {"plexus_client_live_bytes", MetricType::Gauge,
     "Bytes of a client's live buffers, as routed."},
    {"plexus_client_bytes_total", MetricType::Counter,
     "Bytes a client put and fetched, by direction."},
    {"plexus_tenant_device_seconds_total", MetricType::Counter,
     "Device time of a tenant's live clients' finished calls."},
    {"plexus_tenant_calls_pending", MetricType::Gauge,
     "A tenant's calls waiting at admission."},
    {"plexus_tenant_calls_in_flight", MetricType::Gauge,
     "A tenant's calls admitted to workers and not finished."},
    {"plexus_recoveries_total", MetricType::Counter,
     "What recoveries did, by event (hosts_lost, slices_remapped, "
     "slices_broken, calls_recomputed, buffers_restored, buffers_failed, "
     "shards_reput, snapshots_taken, shards_from_snapshots, losses_awaited, "
     "losses_resumed)."},
    {"plexus_records", MetricType::Gauge,
     "Records the server holds, by kind (call, buffer)."},
};

class Families {
 public:
  Families() {
    for (int f = 0; f < kFamilies; ++f) {
      families_[f].name = kDefs[f].name;
      families_[f].help = kDefs[f].help;
      families_[f].type = kDefs[f].type;
    }
  }
  void Add(Family f, Labels labels, double value) {
    ClientMetric m;
    m.label = std::move(labels);
    if (kDefs[f].type == MetricType::Counter) {
      m.counter.value = value;
    } else {
      m.gauge.value = value;
    }
    families_[f].metric.push_back(std::move(m));
  }
  std::vector<MetricFamily> Take() {
    std::vector<MetricFamily> out;
    for (MetricFamily& f : families_) {
      if (!f.metric.empty()) out.push_back(std::move(f));
    }
    return out;
  }

 private:
  MetricFamily families_[kFamilies];
};

void AddWorker(const proto::WorkerStatus& w, Families* out) {
  const std::string id = absl::StrCat(w.worker_id());
  const Labels base = {{"host", w.host_name()}, {"worker", id}};
  auto with = [&](const char* name, std::string value) {
    Labels l = base;
    l.push_back({name, std::move(value)});
    return l;
  };
  const proto::WorkerStats& s = w.stats();
  out->Add(kWorkerCalls, base, s.calls_executed());
  out->Add(kWorkerCallsFailed, base, s.calls_failed());
  out->Add(kWorkerTasksInline, base, s.tasks_inline());
  out->Add(kWorkerLiveBuffers, base, s.live_buffers());
  out->Add(kWorkerLiveBytes, base, s.live_bytes());
  const std::pair<const char*, int64_t> bytes[] = {
      {"sent", s.bytes_sent()},
      {"received", s.bytes_received()},
      {"from_clients", s.bytes_from_clients()},
      {"to_clients", s.bytes_to_clients()},
      {"host_to_device", s.bytes_host_to_device()},
      {"device_to_host", s.bytes_device_to_host()}};
  for (const auto& [direction, n] : bytes) {
    out->Add(kWorkerBytes, with("direction", direction), n);
  }
  const std::pair<const char*, int64_t> paths[] = {
      {"alias", s.transfers_alias()},
      {"device_to_device", s.transfers_device_to_device()},
      {"host_staged", s.transfers_host_staged()},
      {"ipc", s.transfers_ipc()},
      {"nccl", s.transfers_nccl()}};
  for (const auto& [path, n] : paths) {
    out->Add(kTransfers, with("path", path), n);
  }
  const proto::TransferBytes& b = s.transfer_bytes();
  const std::pair<const char*, int64_t> path_bytes[] = {
      {"alias", b.alias()}, {"device_to_device", b.device_to_device()},
      {"ipc", b.ipc()},     {"shared_memory", b.shared_memory()},
      {"tcp", b.tcp()},     {"nccl", b.nccl()}};
  for (const auto& [path, n] : path_bytes) {
    out->Add(kTransferBytes, with("path", path), n);
  }
  out->Add(kXlaCompiles, base, s.xla_compiles());
  out->Add(kXlaCacheHits, base, s.xla_cache_hits());
  out->Add(kXlaCompileSeconds, base, s.xla_compile_micros() / 1e6);
  out->Add(kXlaSerializedLoads, base, s.xla_serialized_loads());
  out->Add(kDonations, with("result", "done"), s.donations());
  out->Add(kDonations, with("result", "declined"), s.donations_declined());
  out->Add(kPushesFenced, base, s.pushes_fenced());
  for (const proto::DeviceInfo& d : w.devices()) {
    Labels device = with("device", absl::StrCat(d.index()));
    const int i = d.index();
    auto at = [i](const auto& field) -> double {
      return i >= 0 && i < field.size() ? static_cast<double>(field.Get(i))
                                        : 0.0;
    };
    out->Add(kDeviceBusySeconds, device, at(s.device_busy_micros()) / 1e6);
    auto kind = [&](const char* k) {
      Labels l = device;
      l.push_back({"kind", k});
      return l;
    };
    out->Add(kDeviceMemoryBytes, kind("live"), at(s.device_live_bytes()));
    out->Add(kDeviceMemoryBytes, kind("peak"), at(s.device_peak_bytes()));
    out->Add(kDeviceMemoryBytes, kind("capacity"),
             static_cast<double>(d.memory_bytes()));
    out->Add(kDeviceTasksPending, device, at(s.device_tasks_pending()));
  }
}

// The cluster's counts: workers and slices by state, calls routed and
// waiting, control-plane bytes.
void AddCounts(const proto::ClusterStatus& status, Families* out) {
  int alive = 0, spare = 0, down = 0;
  for (const proto::WorkerStatus& w : status.workers()) {
    if (!w.alive()) {
      ++down;
    } else if (w.spare()) {
      ++spare;
    } else {
      ++alive;
    }
  }
  out->Add(kWorkers, {{"state", "alive"}}, alive);
  out->Add(kWorkers, {{"state", "spare"}}, spare);
  out->Add(kWorkers, {{"state", "down"}}, down);
  out->Add(kCallsRouted, {}, status.calls_routed());
  out->Add(kControlBytes, {}, status.control_bytes_in());
  int ok = 0, awaiting = 0, broken = 0;
  for (const proto::SliceStatus& s : status.slices()) {
    if (!s.broken().empty()) {
      ++broken;
    } else if (!s.awaiting().empty()) {
      ++awaiting;
    } else {
      ++ok;
    }
  }
  out->Add(kSlices, {{"state", "ok"}}, ok);
  out->Add(kSlices, {{"state", "awaiting"}}, awaiting);
  out->Add(kSlices, {{"state", "broken"}}, broken);
  out->Add(kSliceRequestsPending, {}, status.pending_slices_size());
  out->Add(kCallsWaiting, {}, status.why_size());
}

// Every live worker's counters, and the time each client's calls queued on
// it.
void AddWorkers(const proto::ClusterStatus& status, Families* out) {
  std::map<uint64_t, std::pair<std::string, std::string>>
      names;  // id -> name, tenant
  for (const proto::ClientStatus& c : status.clients()) {
    names[c.client_id()] = {c.name(), c.tenant()};
  }
  for (const proto::WorkerStatus& w : status.workers()) {
    if (!w.alive()) continue;  // its counters stopped with it
    AddWorker(w, out);
    for (const proto::ClientUsage& u : w.stats().clients()) {
      auto it = names.find(u.client_id());
      if (it == names.end()) continue;  // a client that has gone
      out->Add(kClientQueuedSeconds,
               {{"host", w.host_name()},
                {"worker", absl::StrCat(w.worker_id())},
                {"client", absl::StrCat(u.client_id())},
                {"tenant", it->second.second}},
               u.queued_micros() / 1e6);
    }
  }
}

// Every client's calls, device time and bytes, and their sums by tenant.
void AddClients(const proto::ClusterStatus& status, Families* out) {
  struct TenantSums {
    double device_seconds = 0, pending = 0, in_flight = 0;
  };
  std::map<std::string, TenantSums> tenants;
  for (const proto::ClientStatus& c : status.clients()) {
    Labels l = {{"client", absl::StrCat(c.client_id())},
                {"client_name", c.name()},
                {"tenant", c.tenant()}};
    out->Add(kClientCallsPending, l, c.calls_pending());
    out->Add(kClientCallsInFlight, l, c.calls_in_flight());
    out->Add(kClientCallsAdmitted, l, c.calls_admitted());
    out->Add(kClientDeviceSeconds, l, c.device_micros() / 1e6);
    out->Add(kClientLiveBytes, l, c.live_bytes());
    Labels put = l, fetched = l;
    put.push_back({"direction", "put"});
    fetched.push_back({"direction", "fetched"});
    out->Add(kClientBytes, put, c.stats().bytes_put());
    out->Add(kClientBytes, fetched, c.stats().bytes_fetched());
    TenantSums& t = tenants[c.tenant()];
    t.device_seconds += c.device_micros() / 1e6;
    t.pending += c.calls_pending();
    t.in_flight += c.calls_in_flight();
  }
  for (const auto& [tenant, t] : tenants) {
    out->Add(kTenantDeviceSeconds, {{"tenant", tenant}}, t.device_seconds);
    out->Add(kTenantCallsPending, {{"tenant", tenant}}, t.pending);
    out->Add(kTenantCallsInFlight, {{"tenant", tenant}}, t.in_flight);
  }
}

// The recovery counters and the records the server keeps.
void AddRecovery(const proto::ClusterStatus& status, Families* out) {
  const proto::RecoveryCounters& r = status.recovery();
  const std::pair<const char*, int64_t> events[] = {
      {"hosts_lost", r.hosts_lost()},
      {"slices_remapped", r.slices_remapped()},
      {"slices_broken", r.slices_broken()},
      {"calls_recomputed", r.calls_recomputed()},
      {"buffers_restored", r.buffers_restored()},
      {"buffers_failed", r.buffers_failed()},
      {"shards_reput", r.shards_reput()},
      {"snapshots_taken", r.snapshots_taken()},
      {"shards_from_snapshots", r.shards_from_snapshots()},
      {"losses_awaited", r.losses_awaited()},
      {"losses_resumed", r.losses_resumed()}};
  for (const auto& [event, n] : events) {
    out->Add(kRecoveries, {{"event", event}}, n);
  }
  out->Add(kRecords, {{"kind", "call"}}, r.call_records());
  out->Add(kRecords, {{"kind", "buffer"}}, r.buffer_records());
}

}  // namespace

std::string MetricsText(const proto::ClusterStatus& status) {
  Families out;
  AddCounts(status, &out);
  AddWorkers(status, &out);
  AddClients(status, &out);
  AddRecovery(status, &out);
  return prometheus::TextSerializer().Serialize(out.Take());
}

std::vector<std::string> MetricNames() {
  std::vector<std::string> names;
  for (const FamilyDef& d : kDefs) names.push_back(d.name);
  return names;
}

}  // namespace plexus::web
