// ClusterState: slices — where a slice request is placed, and the queue of
// requests that wait for capacity.
#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "plexus/common/names.h"
#include "plexus/server/model/cluster_state.h"

namespace plexus {
namespace {

// The worker's devices, least loaded first (ties by index).
std::vector<int> LeastLoaded(const WorkerRecord& w) {
  std::vector<int> order(w.info.devices_size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return w.device_load[a] < w.device_load[b];
  });
  return order;
}

std::string Plural(int64_t n, const char* one, const char* many) {
  return absl::StrCat(n, " ", n == 1 ? one : many);
}

std::vector<int32_t> MeshOf(const proto::SliceRequest& req) {
  std::vector<int32_t> mesh(req.mesh_shape().begin(), req.mesh_shape().end());
  if (mesh.empty()) mesh = {req.num_devices()};
  return mesh;
}

std::vector<std::string> AxesOf(const proto::SliceRequest& req, size_t rank) {
  std::vector<std::string> axes(req.axis_names().begin(),
                                req.axis_names().end());
  if (axes.empty()) {
    for (size_t i = 0; i < rank; ++i) {
      axes.push_back(rank == 1 ? "devices" : absl::StrCat("axis", i));
    }
  }
  return axes;
}

// "asked for 4 devices on one host of hosts [host0, host2] not on hosts
// [host1] (of slices 3)": the request, in the words its errors use.
std::string Asked(const proto::SliceRequest& req,
                  const std::set<std::string>& avoid_hosts) {
  std::string s = absl::StrCat("asked for ",
                               Plural(req.num_devices(), "device", "devices"));
  if (req.placement() == proto::PLACEMENT_ONE_HOST) {
    absl::StrAppend(&s, " on one host");
  }
  if (req.hosts_size() > 0) {
    absl::StrAppend(&s, " of hosts [", absl::StrJoin(req.hosts(), ", "), "]");
  }
  if (!avoid_hosts.empty()) {
    absl::StrAppend(&s, " not on hosts [", absl::StrJoin(avoid_hosts, ", "),
                    "] (of slices ", absl::StrJoin(req.avoid_slices(), ", "),
                    ")");
  }
  return s;
}

// The live hosts a slice request may use, and what it cannot.
struct UsableHosts {
  std::vector<const WorkerRecord*> usable;  // registration order
  std::set<std::string> down;  // hosts named in the request, none live
  int total = 0;               // their devices
  int largest = 0;             // devices of the largest
};

// The hosts of `workers` a request naming `wanted` (empty: any) and not
// `avoid_hosts` may use. Spares are kept for remapping (LoseWorker),
// unless asked for by name.
UsableHosts FindUsableHosts(const std::map<int64_t, WorkerRecord>& workers,
                            const std::set<std::string>& wanted,
                            const std::set<std::string>& avoid_hosts) {
  UsableHosts u;
  for (const std::string& h : wanted) u.down.insert(h);
  for (const auto& [id, w] : workers) {
    const std::string& host = w.info.host_name();
    if (!w.alive || (!wanted.empty() && wanted.count(host) == 0) ||
        avoid_hosts.count(host) > 0 || (w.info.spare() && wanted.empty())) {
      continue;
    }
    u.down.erase(host);
    u.usable.push_back(&w);
    u.total += w.info.devices_size();
    u.largest = std::max(u.largest, w.info.devices_size());
  }
  return u;
}

// What the usable hosts lack for the request (devices on one host, if
// `one_host`); `filtered`: the request named or avoided hosts.
std::string Lack(const UsableHosts& u, bool one_host, bool filtered) {
  std::string lack;
  if (one_host) {
    lack = absl::StrCat(
        filtered ? "the largest live host it may use" : "the largest live host",
        " has ", Plural(u.largest, "device", "devices"));
  } else {
    lack = absl::StrCat(
        filtered ? "the hosts it may use have " : "the cluster has ",
        Plural(u.total, "live device", "live devices"), " on ",
        Plural(u.usable.size(), "host", "hosts"));
  }
  if (!u.down.empty()) {
    absl::StrAppend(&lack, " (down: ", absl::StrJoin(u.down, ", "), ")");
  }
  return lack;
}

// `n` devices of the first host in `usable` that has as many.
std::vector<DeviceRef> OnOneHost(const std::vector<const WorkerRecord*>& usable,
                                 int n) {
  std::vector<DeviceRef> chosen;
  for (const WorkerRecord* w : usable) {
    if (w->info.devices_size() < n) continue;
    for (int d : LeastLoaded(*w)) {
      if (static_cast<int>(chosen.size()) < n) chosen.push_back({w->id, d});
    }
    std::sort(chosen.begin(), chosen.end(),
              [](const DeviceRef& a, const DeviceRef& b) {
                return a.device < b.device;
              });
    break;
  }
  return chosen;
}

// `n` devices of whole islands, least loaded first and the larger first
// among equals, until the slice is full.
std::vector<DeviceRef> WholeIslands(
    const std::vector<const WorkerRecord*>& usable, int n) {
  std::vector<DeviceRef> chosen;
  std::vector<const WorkerRecord*> by_size = usable;
  std::stable_sort(by_size.begin(), by_size.end(),
                   [](const WorkerRecord* a, const WorkerRecord* b) {
                     return a->slices_mapped < b->slices_mapped ||
                            (a->slices_mapped == b->slices_mapped &&
                             a->info.devices_size() > b->info.devices_size());
                   });
  for (const WorkerRecord* w : by_size) {
    for (int d : LeastLoaded(*w)) {
      if (static_cast<int>(chosen.size()) < n) chosen.push_back({w->id, d});
    }
  }
  return chosen;
}

// `n` devices dealt to the hosts round robin, so a slice of H devices on
// H hosts has one per host; ordered host by host.
// By host, then device: a slice's shards in order, neighbours on one host.
void OrderHostByHost(std::vector<DeviceRef>& devices) {
  std::stable_sort(devices.begin(), devices.end(),
                   [](const DeviceRef& a, const DeviceRef& b) {
                     return a.worker_id < b.worker_id ||
                            (a.worker_id == b.worker_id && a.device < b.device);
                   });
}

std::vector<DeviceRef> Spread(const std::vector<const WorkerRecord*>& usable,
                              int n) {
  std::vector<DeviceRef> chosen;
  std::vector<int> next(usable.size(), 0);
  std::vector<std::vector<int>> order;
  for (const WorkerRecord* w : usable) order.push_back(LeastLoaded(*w));
  while (static_cast<int>(chosen.size()) < n) {
    for (size_t h = 0; h < usable.size() && static_cast<int>(chosen.size()) < n;
         ++h) {
      if (next[h] < usable[h]->info.devices_size()) {
        chosen.push_back({usable[h]->id, order[h][next[h]++]});
      }
    }
  }
  // Shards are ordered host by host, so neighbours share a host.
  OrderHostByHost(chosen);
  return chosen;
}

}  // namespace

absl::Status ClusterState::CheckSliceRequest(
    const ClientRecord& client, const proto::SliceRequest& req,
    std::set<std::string>* avoid_hosts) const {
  const int n = req.num_devices();
  if (n <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a slice needs at least 1 device, asked for ", n));
  }
  const std::vector<int32_t> mesh = MeshOf(req);
  int64_t mesh_size = 1;
  for (int32_t m : mesh) {
    if (m <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh shape [", absl::StrJoin(mesh, ", "),
                       "] has a dimension of ", m, "; each must be positive"));
    }
    // Past n it can only be a mismatch; stopping there keeps it in range.
    if (mesh_size <= n) mesh_size *= m;
  }
  if (mesh_size != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mesh shape [", absl::StrJoin(mesh, ", "), "] holds ",
        mesh_size > n ? "more than " : "", mesh_size > n ? n : mesh_size,
        " devices, but the slice has ", n));
  }
  const std::vector<std::string> axes = AxesOf(req, mesh.size());
  if (axes.size() != mesh.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        axes.size(), " axis names for a mesh of rank ", mesh.size()));
  }
  if (req.timeout_ms() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a slice request's timeout must not be negative, got ",
                     req.timeout_ms(), " ms"));
  }
  if (!proto::LossPolicy_IsValid(req.on_loss())) {
    return absl::InvalidArgumentError(
        absl::StrCat("a slice request's loss policy ", req.on_loss(),
                     " is none of wait, break, shrink"));
  }
  if (!proto::PreemptPolicy_IsValid(req.on_preempt())) {
    return absl::InvalidArgumentError(
        absl::StrCat("a slice request's preemption policy ", req.on_preempt(),
                     " is none of share, shrink, suspend"));
  }
  if (req.elastic_axis() < 0 ||
      req.elastic_axis() >= static_cast<int>(mesh.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a slice request's elastic axis ", req.elastic_axis(),
        " is not an axis of mesh shape [", absl::StrJoin(mesh, ", "), "]"));
  }
  if (req.min_devices() < 0 || req.min_devices() > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("a slice request's min_devices ", req.min_devices(),
                     " is not between 0 and its ", n, " devices"));
  }
  if ((req.grow() || req.min_devices() > 0) &&
      req.on_loss() != proto::LOSS_SHRINK &&
      req.on_preempt() != proto::PREEMPT_SHRINK) {
    return absl::InvalidArgumentError(
        "a slice request's min_devices and grow apply to a slice that "
        "shrinks (on_loss or on_preempt shrink)");
  }
  // Checked first: the messages below name them, and the slice keeps its
  // axis names (status shows them).
  for (const std::string& a : req.axis_names()) {
    if (absl::Status s = CheckName("mesh axis name", a); !s.ok()) return s;
  }
  for (const std::string& h : req.hosts()) {
    if (absl::Status s = CheckName("host name", h); !s.ok()) return s;
  }
  // A host that went down may come back (its name registers again); a name
  // no worker ever registered with is a mistake, not a wait.
  std::set<std::string> known;
  for (const auto& [id, w] : workers_) known.insert(w.info.host_name());
  for (const std::string& h : req.hosts()) {
    if (known.count(h) == 0) {
      return absl::NotFoundError(absl::StrCat(
          "asked for a slice on host '", h, "', but no worker registered as '",
          h, "' (hosts: ", absl::StrJoin(known, ", "), ")"));
    }
  }
  for (uint64_t sid : req.avoid_slices()) {
    auto it = slices_.find(sid);
    if (it == slices_.end() || it->second.client_id != client.id) {
      return absl::NotFoundError(
          absl::StrCat("asked for a slice not on the hosts of slice ", sid,
                       ", which this client does not hold"));
    }
    for (const DeviceRef& d : it->second.devices) {
      avoid_hosts->insert(workers_.at(d.worker_id).info.host_name());
    }
  }
  const int32_t quota = PolicyOf(client).max_devices;
  if (quota > 0 && n > quota) {
    return absl::ResourceExhaustedError(
        absl::StrCat("asked for ", Plural(n, "device", "devices"),
                     ", but tenant '", client.tenant, "' may hold at most ",
                     quota, " over all of a client's slices (max_devices)"));
  }
  return absl::OkStatus();
}

int64_t ClusterState::DevicesHeld(const ClientRecord& client) const {
  int64_t held = 0;
  for (uint64_t sid : client.slices) {
    auto it = slices_.find(sid);
    // A suspended slice holds none (SuspendSlice).
    if (it != slices_.end() && !it->second.suspended) {
      held += it->second.devices.size();
    }
  }
  return held;
}

absl::StatusOr<std::vector<DeviceRef>> ClusterState::PlaceSlice(
    const ClientRecord& client, const proto::SliceRequest& req,
    const std::set<std::string>& avoid_hosts) const {
  const int n = req.num_devices();
  const int32_t quota = PolicyOf(client).max_devices;
  if (quota > 0) {
    const int64_t held = DevicesHeld(client);
    if (held + n > quota) {
      return absl::ResourceExhaustedError(absl::StrCat(
          Asked(req, avoid_hosts), "; client ", client.id, " holds ",
          Plural(held, "device", "devices"), " in ",
          Plural(client.slices.size(), "slice", "slices"), ", and tenant '",
          client.tenant, "' may hold ", quota, " (max_devices)"));
    }
  }
  const std::set<std::string> wanted(req.hosts().begin(), req.hosts().end());
  const bool filtered = !wanted.empty() || !avoid_hosts.empty();
  UsableHosts u = FindUsableHosts(workers_, wanted, avoid_hosts);
  const bool one_host = req.placement() == proto::PLACEMENT_ONE_HOST;
  if (u.total < n || (one_host && u.largest < n)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        Asked(req, avoid_hosts), "; ", Lack(u, one_host, filtered)));
  }
  // Hosts a higher priority holds last (time-shared with it only if no
  // other will do); then the least loaded; ties keep registration order.
  const Claims claims = ClaimsByPriority();
  std::set<int64_t> higher;
  for (const auto& [device, claim] : claims) {
    if (claim.priority > PolicyOf(client).priority) higher.insert(device.first);
  }
  std::stable_sort(u.usable.begin(), u.usable.end(),
                   [&](const WorkerRecord* a, const WorkerRecord* b) {
                     const bool ah = higher.count(a->id) > 0;
                     const bool bh = higher.count(b->id) > 0;
                     if (ah != bh) return !ah;
                     return a->slices_mapped < b->slices_mapped;
                   });
  // The default keeps a slice inside one island (host) where one can hold
  // it: between islands data moves over the network, inside one it does
  // not. One that no island can hold takes as few islands as it can.
  const bool any = req.placement() == proto::PLACEMENT_ANY;
  if (one_host || (any && u.largest >= n)) return OnOneHost(u.usable, n);
  if (any) return WholeIslands(u.usable, n);
  return Spread(u.usable, n);
}

absl::StatusOr<std::vector<DeviceRef>> ClusterState::PlaceGrowth(
    const ClientRecord& client, const SliceRecord& slice, int need) const {
  const int32_t quota = PolicyOf(client).max_devices;
  if (quota > 0) {
    const int64_t held = DevicesHeld(client);
    if (held + need > quota) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "slice ", slice.id, " cannot take ",
          Plural(need, "device", "devices"), " more: client ", client.id,
          " holds ", Plural(held, "device", "devices"), ", and tenant '",
          client.tenant, "' may hold ", quota, " (max_devices)"));
    }
  }
  // Devices of usable hosts the slice does not have: hosts it is not on
  // first (a growth adds hosts), then the least loaded; registration order
  // breaks ties.
  std::set<std::pair<int64_t, int>> in_slice;
  std::set<int64_t> its_hosts;
  for (const DeviceRef& d : slice.devices) {
    in_slice.insert({d.worker_id, d.device});
    its_hosts.insert(d.worker_id);
  }
  UsableHosts u = FindUsableHosts(workers_, {}, {});
  std::stable_sort(u.usable.begin(), u.usable.end(),
                   [&](const WorkerRecord* a, const WorkerRecord* b) {
                     const bool ain = its_hosts.count(a->id) > 0;
                     const bool bin = its_hosts.count(b->id) > 0;
                     if (ain != bin) return !ain;
                     return a->slices_mapped < b->slices_mapped;
                   });
  // Not onto devices a higher priority holds (YieldToPriorities would take
  // them back at once): it grows there once they free.
  const Claims claims = ClaimsByPriority();
  const int32_t priority = PolicyOf(client).priority;
  std::vector<DeviceRef> chosen;
  int higher = 0;
  for (const WorkerRecord* w : u.usable) {
    for (int d : LeastLoaded(*w)) {
      if (static_cast<int>(chosen.size()) == need) break;
      if (in_slice.count({w->id, d}) > 0) continue;
      auto claim = claims.find({w->id, d});
      if (claim != claims.end() && claim->second.priority > priority) {
        ++higher;
        continue;
      }
      chosen.push_back({w->id, d});
    }
  }
  if (static_cast<int>(chosen.size()) < need) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "slice ", slice.id, " needs ", Plural(need, "device", "devices"),
        " more to grow, and the live hosts have ",
        Plural(chosen.size(), "device", "devices"), " it does not hold (",
        Plural(u.usable.size(), "usable host", "usable hosts"),
        "; spares are kept for lost hosts",
        higher > 0 ? absl::StrCat("; ", Plural(higher, "device", "devices"),
                                  " held by a higher priority")
                   : "",
        ")"));
  }
  // Shards ordered host by host, as a slice's are.
  OrderHostByHost(chosen);
  return chosen;
}

proto::SliceInfo ClusterState::GrantSlice(ClientRecord& client,
                                          const proto::SliceRequest& req,
                                          std::vector<DeviceRef> devices) {
  SliceRecord& slice = slices_[next_slice_id_];
  slice.id = next_slice_id_++;
  slice.client_id = client.id;
  slice.mesh_shape = MeshOf(req);
  slice.axis_names = AxesOf(req, slice.mesh_shape.size());
  slice.devices = std::move(devices);
  slice.on_loss = req.on_loss();
  slice.min_devices = req.min_devices();
  slice.grow = req.grow();
  slice.elastic_axis = req.elastic_axis();
  slice.on_preempt = req.on_preempt();
  slice.full_devices = static_cast<int32_t>(slice.devices.size());
  AddLoad(slice.devices, +1);
  client.slices.insert(slice.id);
  JournalSlice(slice);
  return DescribeSlice(slice);
}

std::optional<absl::StatusOr<proto::SliceInfo>> ClusterState::RequestSlice(
    uint64_t client_id, const proto::SliceRequest& req, absl::Time now) {
  ClientRecord* client = FindClient(client_id);
  if (client == nullptr) return absl::NotFoundError("unknown client");
  std::set<std::string> avoid_hosts;
  if (absl::Status s = CheckSliceRequest(*client, req, &avoid_hosts); !s.ok()) {
    return s;
  }
  auto devices = PlaceSlice(*client, req, avoid_hosts);
  if (devices.ok()) return GrantSlice(*client, req, *std::move(devices));
  if (req.timeout_ms() <= 0) return devices.status();
  PendingSlice& p = pending_slices_.emplace_back();
  p.client_id = client_id;
  p.request = req;
  p.avoid_hosts = std::move(avoid_hosts);
  p.since = now;
  p.deadline = now + absl::Milliseconds(req.timeout_ms());
  return std::nullopt;
}

absl::StatusOr<proto::SliceInfo> ClusterState::CreateSlice(
    uint64_t client_id, const proto::SliceRequest& req) {
  proto::SliceRequest now_or_never = req;
  now_or_never.set_timeout_ms(0);
  return *RequestSlice(client_id, now_or_never, absl::InfinitePast());
}

std::vector<SliceAnswer> ClusterState::ServePendingSlices(absl::Time now) {
  std::vector<SliceAnswer> answers;
  for (auto it = pending_slices_.begin(); it != pending_slices_.end();) {
    ClientRecord* client = FindClient(it->client_id);
    if (client == nullptr) {  // RemoveClient drops them; never answered
      it = pending_slices_.erase(it);
      continue;
    }
    auto devices = PlaceSlice(*client, it->request, it->avoid_hosts);
    if (devices.ok()) {
      answers.push_back(
          {it->client_id, it->request.request_id(),
           GrantSlice(*client, it->request, *std::move(devices))});
    } else if (now >= it->deadline) {
      answers.push_back({it->client_id, it->request.request_id(),
                         absl::DeadlineExceededError(absl::StrCat(
                             "no slice within ",
                             absl::FormatDuration(
                                 absl::Milliseconds(it->request.timeout_ms())),
                             ": ", WaitingFor(it - pending_slices_.begin())))});
    } else {
      ++it;
      continue;
    }
    it = pending_slices_.erase(it);
  }
  return answers;
}

std::string ClusterState::WaitingFor(size_t i) const {
  const PendingSlice& p = pending_slices_.at(i);
  std::string lack;
  auto c = clients_.find(p.client_id);
  if (c != clients_.end()) {
    auto placed = PlaceSlice(c->second, p.request, p.avoid_hosts);
    lack = placed.ok() ? Asked(p.request, p.avoid_hosts) + "; it can be met now"
                       : std::string(placed.status().message());
  }
  return absl::StrCat(lack, "; ",
                      i == 0 ? std::string("no request ahead")
                             : Plural(i, "request ahead", "requests ahead"));
}

proto::SliceInfo ClusterState::DescribeSlice(const SliceRecord& slice) const {
  proto::SliceInfo info;
  info.set_slice_id(slice.id);
  info.set_generation(slice.generation);
  info.set_resizes(slice.resizes);
  info.set_suspended(slice.suspended);
  info.set_preempted(slice.preempted);
  for (int32_t m : slice.mesh_shape) info.add_mesh_shape(m);
  for (const auto& a : slice.axis_names) info.add_axis_names(a);
  for (const DeviceRef& d : slice.devices) {
    const WorkerRecord& w = workers_.at(d.worker_id);
    auto* sd = info.add_devices();
    sd->set_worker_id(d.worker_id);
    sd->set_device(d.device);
    sd->set_host_name(w.info.host_name());
    sd->set_machine_id(w.info.machine_id());
    sd->set_data_address(w.info.data_address());
    sd->set_unix_path(w.info.unix_path());
    sd->set_memory_bytes(w.info.devices(d.device).memory_bytes());
    sd->set_stablehlo_version(w.info.stablehlo_version());
  }
  return info;
}

void ClusterState::AddLoad(const std::vector<DeviceRef>& devices, int delta) {
  std::set<int64_t> hosts;
  for (const DeviceRef& d : devices) {
    hosts.insert(d.worker_id);
    workers_[d.worker_id].device_load[d.device] += delta;
  }
  for (int64_t h : hosts) workers_[h].slices_mapped += delta;
}

absl::Status ClusterState::ReleaseSlice(uint64_t client_id, uint64_t slice_id) {
  auto it = slices_.find(slice_id);
  if (it == slices_.end() || it->second.client_id != client_id) {
    return absl::NotFoundError(
        absl::StrCat("slice ", slice_id, " is not held by this client"));
  }
  AddLoad(it->second.devices, -1);
  slices_.erase(it);
  ForgetAwaitedSlice(slice_id);
  if (ClientRecord* c = FindClient(client_id)) c->slices.erase(slice_id);
  if (journal_ != nullptr) {
    proto::ModelRecord r;
    r.set_slice_gone(slice_id);
    Journal(r);
  }
  return absl::OkStatus();
}

}  // namespace plexus
