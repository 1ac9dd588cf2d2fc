// ClusterState: what the resource manager knows — workers and their
// devices, clients, slices and programs — and the routing of calls into
// per-worker ops. Plain data plus pure functions: the server holds it under
// its scheduler mutex (one consistent order of everything that reaches the
// workers); tests drive it directly. Not thread-safe by itself.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/common/types.h"
#include "plexus/proto/plexus.pb.h"
#include "plexus/server/tenants.h"

namespace plexus {

struct WorkerRecord {
  int64_t id = 0;
  // Unique to this registration, and newer than every earlier one (also a
  // restarted server's predecessor's): the worker's pushes carry it, and
  // once the worker is declared down its peers refuse it (fencing).
  uint64_t generation = 0;
  proto::RegisterWorker info;
  bool alive = true;
  std::string down_reason;
  proto::WorkerStats stats;
  absl::Time last_heartbeat;
  int64_t heartbeats = 0;  // received so far
  std::set<uint64_t> loaded_programs;
  int64_t slices_mapped = 0;     // load used for placement
  std::vector<int> device_load;  // slices mapped onto each device
};

struct DeviceRef {
  int64_t worker_id = 0;
  int32_t device = 0;
  bool operator==(const DeviceRef& o) const {
    return worker_id == o.worker_id && device == o.device;
  }
};

struct SliceRecord {
  uint64_t id = 0;
  uint64_t client_id = 0;
  std::vector<DeviceRef> devices;
  std::vector<int32_t> mesh_shape;
  std::vector<std::string> axis_names;
  std::string broken;  // non-empty once a worker of the slice died
};

// A slice request that could not be met when it came. It waits at the
// server, in arrival order, until it can be met (ServePendingSlices), its
// deadline passes, or its client leaves.
struct PendingSlice {
  uint64_t client_id = 0;
  proto::SliceRequest request;
  // The hosts of request.avoid_slices, resolved when it came (a slice
  // released meanwhile still names the hosts it avoided).
  std::set<std::string> avoid_hosts;
  absl::Time since;
  absl::Time deadline;
};

// The answer to a slice request: the slice, or why none was granted.
struct SliceAnswer {
  uint64_t client_id = 0;
  uint64_t request_id = 0;
  absl::StatusOr<proto::SliceInfo> slice;
};

struct ProgramRecord {
  proto::ProgramDef def;
  std::vector<ArgSpec> inputs;
  std::vector<ArgSpec> outputs;
  bool collective = false;
  // Bytes each output holds over all shards of a slice of
  // `output_bytes_shards` devices, and their sum (computed on the first
  // call on such a slice).
  std::vector<int64_t> output_bytes;
  int64_t output_bytes_total = 0;
  int output_bytes_shards = 0;
};

struct ClientRecord {
  uint64_t id = 0;
  std::string name;
  // The tenant it authenticated as (server/tenants.h): its share and quotas.
  std::string tenant = kDefaultTenant;
  proto::ClientStats stats;
  std::set<uint64_t> slices;
  absl::flat_hash_map<uint64_t, ProgramRecord> programs;
  // Its live buffers as routed (call outputs and puts, until released):
  // bytes over all shards, which the tenant's max_bytes bounds.
  absl::flat_hash_map<uint64_t, int64_t> buffer_bytes;
  int64_t live_bytes = 0;
};

// Ops for each worker, in order.
using WorkerOps = std::map<int64_t, std::vector<proto::WorkerOp>>;

class ClusterState {
 public:
  // --- tenants: the operator's shares and quotas (server/tenants.h)
  void SetTenants(TenantTable tenants) { tenants_ = std::move(tenants); }
  const TenantTable& tenants() const { return tenants_; }
  const TenantPolicy& PolicyOf(const ClientRecord& client) const {
    return tenants_.For(client.tenant);
  }

  // --- workers
  WorkerRecord& AddWorker(const proto::RegisterWorker& info, absl::Time now);
  WorkerRecord* FindWorker(int64_t id);
  const std::map<int64_t, WorkerRecord>& workers() const { return workers_; }
  // Marks the worker dead and every slice on it broken. Returns the ids of
  // the clients that own such slices.
  std::set<uint64_t> MarkWorkerDown(int64_t id, const std::string& reason);

  // --- clients
  ClientRecord& AddClient(const std::string& name,
                          const std::string& tenant = kDefaultTenant);
  ClientRecord* FindClient(uint64_t id);
  // Forgets the client and its slices; returns the workers that held any.
  std::set<int64_t> RemoveClient(uint64_t id);
  const std::map<uint64_t, ClientRecord>& clients() const { return clients_; }

  // --- slices
  // Asks for a slice. Returns the answer when there is one now: the slice,
  // or an error for a request that is invalid (a bad mesh, a host name no
  // worker ever registered with, an avoided slice the client does not
  // hold, more devices than its tenant's max_devices) or that cannot be met
  // now and may not wait (timeout_ms 0: ResourceExhausted saying what it
  // lacks). Otherwise the request waits until `now` + its timeout_ms and
  // nullopt is returned: ServePendingSlices answers it later.
  std::optional<absl::StatusOr<proto::SliceInfo>> RequestSlice(
      uint64_t client_id, const proto::SliceRequest& req, absl::Time now);
  // RequestSlice that never waits, whatever the request's timeout_ms.
  absl::StatusOr<proto::SliceInfo> CreateSlice(uint64_t client_id,
                                               const proto::SliceRequest& req);
  // Answers waiting requests: grants, in arrival order, each that can be
  // met now, and fails each whose deadline is not after `now`
  // (DeadlineExceeded, saying what it waited for). Call it whenever
  // capacity may have appeared (a worker registered, a slice was released,
  // a client left) and periodically, for the deadlines.
  std::vector<SliceAnswer> ServePendingSlices(absl::Time now);
  const std::deque<PendingSlice>& pending_slices() const {
    return pending_slices_;
  }
  // What pending_slices()[i] waits for, in words: what it lacks and how
  // many requests wait ahead of it.
  std::string WaitingFor(size_t i) const;
  absl::Status ReleaseSlice(uint64_t client_id, uint64_t slice_id);
  const std::map<uint64_t, SliceRecord>& slices() const { return slices_; }
  proto::SliceInfo DescribeSlice(const SliceRecord& slice) const;

  // --- programs and calls
  // Validates and records a program the client compiled.
  // XLA programs are also loaded onto their islands' workers now (ops
  // appended to `ops`), so that those compile them before the first call.
  absl::Status RegisterProgram(uint64_t client_id,
                               const proto::RegisterProgram& reg,
                               WorkerOps* ops = nullptr);
  // Turns one call into ops for the workers involved (appended to `ops`):
  // program loads, transfers between workers, expectations and the
  // per-worker Execute. Errors name the program and the argument.
  absl::Status RouteCall(uint64_t client_id, const proto::Call& call,
                         WorkerOps* ops);
  absl::Status RoutePut(uint64_t client_id, const proto::PutDecl& put,
                        WorkerOps* ops);
  // A call that did not route: its outputs fail on the workers of its
  // slice, for a consumer that already waits there. Only the client's own
  // outputs on its own slice: a refused call must not fail another
  // client's buffers by naming them.
  void FailCallOutputs(uint64_t client_id, const proto::Call& call,
                       const absl::Status& status, WorkerOps* ops) const;
  // Releases one of `client_id`'s buffers on the workers of its slice; a
  // release of another client's buffer is ignored.
  void RouteRelease(uint64_t client_id, const proto::ReleaseRef& release,
                    WorkerOps* ops);

  int64_t calls_routed() const { return calls_routed_; }

 private:
  // `what` names the caller in errors; it is only called on an error.
  absl::StatusOr<const SliceRecord*> UsableSlice(
      uint64_t client_id, uint64_t slice_id,
      absl::FunctionRef<std::string()> what);

  // Refuses (RESOURCE_EXHAUSTED, naming the quota) `bytes` more of live
  // buffers for `client` over its tenant's max_bytes.
  absl::Status CheckBytesQuota(const ClientRecord& client, int64_t bytes,
                               absl::FunctionRef<std::string()> what) const;
  // Records buffer `id` of `bytes` as live (replacing a record of the same
  // id), or forgets it.
  static void RecordBuffer(ClientRecord& client, uint64_t id, int64_t bytes);
  static void ForgetBuffer(ClientRecord& client, uint64_t id);

  // Placement load of a slice's devices and hosts, +1 when it is mapped and
  // -1 when it goes.
  void AddLoad(const std::vector<DeviceRef>& devices, int delta);
  // The parts of a slice request that never change while it waits:
  // InvalidArgument, NotFound or ResourceExhausted if it can never be met
  // as asked. Fills the hosts of its avoided slices.
  absl::Status CheckSliceRequest(const ClientRecord& client,
                                 const proto::SliceRequest& req,
                                 std::set<std::string>* avoid_hosts) const;
  // The devices for a checked request now, or ResourceExhausted saying
  // what it lacks (live devices or hosts, room under max_devices).
  absl::StatusOr<std::vector<DeviceRef>> PlaceSlice(
      const ClientRecord& client, const proto::SliceRequest& req,
      const std::set<std::string>& avoid_hosts) const;
  // Records a placed slice for the client.
  proto::SliceInfo GrantSlice(ClientRecord& client,
                              const proto::SliceRequest& req,
                              std::vector<DeviceRef> devices);

  TenantTable tenants_;
  std::map<int64_t, WorkerRecord> workers_;
  std::map<uint64_t, ClientRecord> clients_;
  std::map<uint64_t, SliceRecord> slices_;
  std::deque<PendingSlice> pending_slices_;  // in arrival order
  int64_t next_worker_id_ = 1;
  uint64_t next_client_id_ = 1;
  uint64_t next_slice_id_ = 1;
  uint64_t next_transfer_ = 1;
  int64_t calls_routed_ = 0;
};

// Buffer ids the server makes (transfer temporaries) carry this client id.
inline constexpr uint64_t kServerClientId = 0xFFFFFF;

}  // namespace plexus
