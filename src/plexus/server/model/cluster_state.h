// ClusterState: what the resource manager knows — workers and their
// devices, clients, slices and programs — and the routing of calls into
// per-worker ops. Plain data plus pure functions: the server holds it under
// its scheduler mutex (one consistent order of everything that reaches the
// workers); tests drive it directly. Not thread-safe by itself.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "plexus/common/ids.h"
#include "plexus/common/types.h"
#include "plexus/proto/model_journal.pb.h"
#include "plexus/proto/plexus.pb.h"
#include "plexus/server/model/cluster_changes.h"
#include "plexus/server/model/job_records.h"
#include "plexus/server/model/model_journal.h"
#include "plexus/server/model/tenants.h"
#include "plexus/server/scheduling/worker_wire.h"

namespace plexus {

struct WorkerRecord {
  int64_t id = 0;
  // Unique to this registration, and newer than every earlier one (also a
  // restarted server's predecessor's): the worker's pushes carry it, and
  // once the worker is declared down its peers refuse it (fencing).
  uint64_t generation = 0;
  proto::RegisterWorker info;
  bool alive = true;
  // Restored from the journal by a restarted server and not back yet (not
  // alive meanwhile): it may register again as this host, with what it
  // kept (ClusterState::ResumeWorker), until the server's resume wait ends.
  bool away = false;
  std::string down_reason;
  proto::WorkerStats stats;
  absl::Time last_heartbeat;
  int64_t heartbeats = 0;  // received so far
  // The highest SendStats request its heartbeats answered (a fresh
  // status waits for its own).
  uint64_t stats_answered = 0;
  std::set<uint64_t> loaded_programs;
  // The peers it was told of (WorkerOp.peer), by id: a bit each. A worker
  // is told of a peer only as an op it is sent needs it (ClusterState::
  // TellPeer), not of every host as each registers (O(hosts²) ops).
  std::vector<uint64_t> told_peers;
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
  // Non-empty while the slice waits for a host to take a lost one's place
  // (ClusterState::AwaitedLoss): why, since `awaiting_since`, until
  // `awaiting_until`.
  std::string awaiting;
  absl::Time awaiting_since;
  absl::Time awaiting_until;
  // The map whose hosts were all told of each other (a collective's ranks
  // send to each other: RouteCall); empty until its first collective.
  mutable std::vector<DeviceRef> peers_told_for;  // a cache of routing
  // Routing's cache of the map (RouteCall), valid while `for_devices`
  // equals `devices`: its workers in slice order, each once with its count
  // of shards (`hosts`), each shard's index in `hosts` (`host_of`), and
  // the programs every one of them has loaded, as of
  // ClusterState::programs_unloaded_ == `programs_epoch` (a program
  // forgotten on any worker empties it). So a call on a wide slice looks
  // up neither its hosts nor their programs host by host.
  // Also each host's devices and shards of the map, under a layout id new
  // for each map (`layout`), and whether its hosts were told it
  // (`layout_told`: an own-shards call then sends them all the same
  // Execute naming it; ClusterState::RouteCall).
  struct RouteCache {
    std::vector<DeviceRef> for_devices;
    std::vector<std::pair<int64_t, int>> hosts;
    std::vector<int> host_of;
    uint64_t programs_epoch = 0;
    absl::flat_hash_set<uint64_t> loaded_everywhere;
    std::shared_ptr<const ShardLayoutMap> layout;
    bool layout_told = false;
  };
  mutable RouteCache route_cache;
  // generation of the map from virtual devices (indices into `devices`)
  // to physical ones: +1 on every remap (SliceInfo.generation).
  uint64_t generation = 0;
  // Times it was resized (ClusterState::ResizeSlice; SliceInfo.resizes).
  uint64_t resizes = 0;
  // What a loss with no spare free does to it (SliceRequest.on_loss), along
  // mesh axis `elastic_axis`; no shrink below `min_devices`; with `grow`,
  // it grows back towards `full_devices` (its size when granted) as hosts
  // join or come free (ClusterState::GrowSlices).
  proto::LossPolicy on_loss = proto::LOSS_WAIT;
  int32_t min_devices = 0;
  bool grow = false;
  int32_t elastic_axis = 0;
  int32_t full_devices = 0;
  // Workers the map held before its last resize and holds no more: a put
  // cut for the old map may have pushed shards there (FailRefusedPut).
  std::vector<int64_t> dropped_workers;
  // What a higher priority mapped to its devices does to it
  // (SliceRequest.on_preempt; ClusterState::YieldToPriorities).
  proto::PreemptPolicy on_preempt = proto::PREEMPT_DEFAULT;
  // Suspended (ClusterState::SuspendSlice) until resumed: no call or put
  // routes on it, and its devices count for no quota or priority.
  bool suspended = false;
  // Non-empty while the server holds it suspended for a higher priority
  // (PREEMPT_SUSPEND): why. Its client's calls and puts on it wait at the
  // server (ClusterState::HeldByPreemption) rather than being refused, and
  // GrowSlices resumes it once its own devices free.
  std::string preempted;
  absl::Time preempted_since;  // not journaled: a restart counts from then
  // Suspended to files (SliceResize.to_files): its values are parked in
  // files of the park directory, none in the workers' memory, so a lost
  // host changes nothing for it (LoseWorker passes it by); its resume
  // reads them back (ResumeSlice) on any devices. `released`: the client
  // let go of it while parked (read back and released at the resume, so
  // that its files go).
  bool on_files = false;
  struct Parked {
    uint64_t id = 0;
    ArgSpec spec;
    bool released = false;
  };
  std::vector<Parked> parked;
};

// Whether every device of the slice is on one host (worker): then no
// shard of its values survives the loss of that host, replicated or not.
bool OnOneHost(const SliceRecord& slice);

// What a higher priority mapped to the slice's devices does to it:
// on_preempt, with PREEMPT_DEFAULT resolved (PREEMPT_SHRINK where it
// shrinks on a loss, else PREEMPT_SHARE).
proto::PreemptPolicy PreemptionOf(const SliceRecord& slice);

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

// One input of a program as each device of a slice holds it.
struct LocalInput {
  absl::StatusOr<TensorSpec> spec;
  proto::TensorSpec proto;  // of `spec`, if it is ok
  std::string bytes;        // `proto`, serialized
};

struct ProgramRecord {
  proto::ProgramDef def;
  std::vector<ArgSpec> inputs;
  std::vector<ArgSpec> outputs;
  bool collective = false;
  // Inputs each call consumes (an XLA program's donated_inputs): their
  // memory may become the aliased output's (RouteCall decides per call).
  std::vector<int> donated;
  // Bytes each output holds over all shards of a slice of
  // `output_bytes_shards` devices, and their sum (computed on the first
  // call on such a slice).
  std::vector<int64_t> output_bytes;
  int64_t output_bytes_total = 0;
  int output_bytes_shards = 0;
  // Each input as each device of a slice of `local_inputs_shards` devices
  // holds it (computed on the first call on such a slice; RouteCall).
  std::vector<LocalInput> local_inputs;
  int local_inputs_shards = 0;
  // Non-empty once the slice its XLA islands were compiled for was
  // resized: why its calls are refused (ResizeSlice).
  std::string stale;
};

struct ClientRecord {
  uint64_t id = 0;
  // Restored from the journal by a restarted server, its session not
  // resumed yet (ClusterState::ResumeClient).
  bool away = false;
  // Resumed, and still telling what it holds (LiveBuffers, until `done`):
  // the live buffers whose shards the workers did not all give back, each
  // kept until a call sent again makes it (else lost at the end).
  bool resuming = false;
  std::set<uint64_t> missing;
  // For the server's log, the first few missing ones: what the workers
  // gave back of each against the slice's map (RestoreLiveBuffers), and
  // at `done` those of them lost (`lost_detail`).
  std::map<uint64_t, std::string> missing_why;
  std::string lost_detail;
  // The buffers the calls and puts sent again must make (PlanResent): the
  // missing ones and, back along the calls, the inputs no worker holds;
  // and those of them the client no longer holds, released once the
  // batch sent again is routed.
  std::set<uint64_t> needed;
  std::vector<proto::ReleaseRef> released_after_resend;
  // What its resume did: live buffers kept as the workers gave them back,
  // calls and puts sent again that ran again.
  int64_t resume_kept = 0;
  int64_t resume_ran_again = 0;
  std::string name;
  // The tenant it authenticated as (server/model/tenants.h): its share and
  // quotas.
  std::string tenant = kDefaultTenant;
  proto::ClientStats stats;
  std::set<uint64_t> slices;
  absl::flat_hash_map<uint64_t, ProgramRecord> programs;
  // The identity programs resizes move its values with (ResizeSlice), one
  // per layout, by the layout's serialized ArgDef.
  absl::flat_hash_map<std::string, uint64_t> move_programs;
  // Where it issues calls (CallSite), for the timeline: at most
  // kMaxCallSites; later ones go unnamed.
  absl::flat_hash_map<uint32_t, std::string> call_sites;
  static constexpr size_t kMaxCallSites = 4096;
  // Its live buffers as routed (call outputs and puts, until released):
  // bytes over all shards, which the tenant's max_bytes bounds.
  absl::flat_hash_map<uint64_t, int64_t> buffer_bytes;
  int64_t live_bytes = 0;
  // The records of its calls and of the buffers they make point at their
  // programs' `inputs` and `outputs` (JobRecords::AddCall, RouteCall): a
  // program registered again under its id leaves its old layouts here, for
  // the records made before, until the client leaves.
  std::vector<std::vector<ArgSpec>> replaced_layouts;
};

class ClusterState {
 public:
  // --- tenants: the operator's shares and quotas (server/model/tenants.h)
  void SetTenants(TenantTable tenants) { tenants_ = std::move(tenants); }
  const TenantTable& tenants() const { return tenants_; }
  const TenantPolicy& PolicyOf(const ClientRecord& client) const {
    return tenants_.For(client.tenant);
  }

  // --- workers
  // `generation`: the registration's (WorkerRecord::generation).
  WorkerRecord& AddWorker(const proto::RegisterWorker& info, absl::Time now,
                          uint64_t generation = 0);
  // Whether a host stands by: alive, in no slice, in a cluster that can
  // recover (a spare has registered, or this one is one). LoseWorker takes
  // such hosts for a lost host's place, so each is loaded with every XLA
  // program of every client (LoadProgram.stand_by) and has its executables
  // ahead: a spare as it joins, a host that rejoined after it was declared
  // down, one whose slices were all released.
  bool StandsBy(const WorkerRecord& w) const;
  // The loads a standing-by host lacks (none for another host), marked
  // loaded (server/recovery/recovery.cc).
  // Each comes with the peers it may load the executable from (the
  // island's workers; LoadFromPeers).
  std::vector<proto::WorkerOp> LoadsForStandby(int64_t worker_id);
  // The op that tells a worker where peer `w` is.
  static proto::WorkerOp PeerOp(const WorkerRecord& w);
  // Tells `worker` of `peer` unless it was told already: called as an op
  // for `worker` that names `peer` is made (a transfer to it, a collective
  // with it, an island to load from). The PeerOp goes into TakePeerOps,
  // which the server sends to the workers at once, ahead of any unit not
  // yet admitted: a unit made later (another client's) may be admitted
  // before the one that made the PeerOp, and taken work routed again
  // after a loss makes none.
  void TellPeer(int64_t worker, int64_t peer);
  // TellPeer of every worker of `def`'s islands: a host standing by loads
  // their executables from them (XlaPrograms::LoadFromPeers).
  void TellIslandWorkers(int64_t worker, const proto::ProgramDef& def);
  // Whether `worker` was told of `peer`.
  bool ToldPeer(int64_t worker, int64_t peer) const;
  // The PeerOps TellPeer made, and the ShardLayout ops RouteCall made (a
  // map's hosts told their part), since the last call, to send now.
  WorkerOps TakePeerOps() { return std::exchange(peer_ops_, {}); }
  // LoadsForStandby of every host, into `ops`: after hosts may have become
  // idle (slices released, a client gone).
  void LoadStandbys(WorkerOps* ops);
  WorkerRecord* FindWorker(int64_t id);
  const std::map<int64_t, WorkerRecord>& workers() const { return workers_; }
  // Marks the worker dead and every slice on it broken. Returns the ids of
  // the clients that own such slices.
  std::set<uint64_t> MarkWorkerDown(int64_t id, const std::string& reason);
  // Marks the worker dead and remaps each slice on it onto a spare host
  // (one live host in no slice, preferably started as a spare, with devices
  // of the same indices): the slice's virtual devices keep their order and
  // its generation goes up; the client's XLA programs name the spare in
  // place of the lost host. Slices no spare can take break, as in
  // MarkWorkerDown. (server/recovery/recovery.cc)
  // With `spare_wait` > 0 in a cluster given spares, slices no spare can
  // take now wait for one until `now + spare_wait` (AwaitedLoss,
  // ResumeAwaited) instead of breaking.
  WorkerLoss LoseWorker(int64_t id, const std::string& reason,
                        absl::Time now = absl::InfinitePast(),
                        absl::Duration spare_wait = absl::ZeroDuration());
  // The awaited losses a host can take now (one that joined or came free,
  // as LoseWorker chooses a spare), oldest first: their slices remapped
  // onto it as LoseWorker would have (`remapped`, `spare` set), each to
  // recover with RecoverClient. (server/recovery/recovery.cc)
  std::vector<WorkerLoss> ResumeAwaited();
  // The awaited losses whose wait ends without a host: the deadline is not
  // after `now`, or (`lost` > 0) a slice of theirs is on worker `lost`,
  // which is being lost too (a slice waits for one host at a time). Their
  // slices break (`broken` set), saying how long they waited.
  std::vector<WorkerLoss> EndAwaited(absl::Time now, int64_t lost = 0);
  const std::deque<AwaitedLoss>& awaited() const { return awaited_; }
  // Whether one of the client's slices waits for a host.
  bool Awaiting(uint64_t client_id) const;
  // Whether the client holds one of `slice_ids`.
  bool HoldsAny(uint64_t client_id, const std::set<uint64_t>& slice_ids) const;
  // Recovers what `client_id` lost with `loss` (server/recovery/recovery.cc):
  //  - calls not done that ran on a remapped slice, or read a buffer of one
  //    or an output of such a call, run again in their order, with new
  //    call and output ids (the old output ids become aliases of the new,
  //    for the client's later calls, fetches and releases);
  //  - done buffers with a shard on the lost host: a replicated one is
  //    copied from a surviving shard; one whose producer's inputs are all
  //    available is recomputed by running that call again; the rest are
  //    lost (DATA_LOSS: calls that read them fail, the client is told);
  //  - `taken`, its work that had not reached the workers, is routed again
  //    on the new map after all that.
  ClientRecovery RecoverClient(uint64_t client_id, const WorkerLoss& loss,
                               std::vector<TakenWork> taken);
  // The call's workers all reported it done (`failed`: a task of it
  // failed): held-back releases it frees are appended to `ops`. A park
  // (SuspendSlice to files) done: its value leaves the workers' memory
  // (FinishPark). With `shared`, the releases of values on slices over
  // several hosts are gathered there by slice instead (a release costs
  // O(1) per id, not an op per host).
  void CallDone(uint64_t seq, bool failed, WorkerOps* ops,
                SharedReleases* shared = nullptr);
  // Park call `seq` is done: its value is released from the workers'
  // memory (into `ops`) and recorded as parked (its id reads so, the
  // slice's record lists it, journaled), and its client is told
  // (TakeParkedNotes). Failed: the value stays where it is, in memory.
  void FinishPark(uint64_t seq, bool failed, WorkerOps* ops);
  // The notes of values parked since the last call, by client: each a
  // Recovery with the values' ids as lost, their status saying parked.
  std::map<uint64_t, proto::Recovery> TakeParkedNotes();
  const JobRecords& records() const { return records_; }
  // Lineage is kept once a spare has registered (JobRecords::
  // set_keep_lineage): a cluster given spares recovers, and keeps it
  // between a spare taking a lost host's place and the next one joining
  // (dropped then, the values made meanwhile could not be rebuilt once the
  // next spare came). Called as workers come and go.
  void UpdateLineagePolicy();
  // Puts released for good since the last call, by client: each client
  // drops the data it kept to put them again.
  std::map<uint64_t, std::vector<uint64_t>> TakeReleasedPuts();
  const proto::RecoveryCounters& recovery_counters() const { return counters_; }
  // Shards of complete snapshots copied again after a loss took the host
  // that held their copy, whose new copy has not arrived yet: until then
  // such a shard has one copy, and its producer no longer holds what
  // would recompute it.
  int64_t SnapshotRecopiesPending() const;
  // Snapshots asked for whose copies have not all arrived.
  int64_t SnapshotsIncomplete() const;

  // --- restart (server/model/restart.cc): the journal of the records no
  // worker or client can give back, and a restarted server's rebuild.
  //
  // Every change to workers, clients, slices, programs and the server's
  // ids is written to `journal` (not owned; null: none) as it is made.
  void set_journal(ModelJournalSink* journal) { journal_ = journal; }
  // Applies one journaled change, in order, to a model that has served
  // nothing yet. Workers come back away (WorkerRecord::away), clients away
  // (ClientRecord::away). InvalidArgument naming the record if it does not
  // fit what came before (a slice of an unknown client, ...).
  absl::Status Restore(const proto::ModelRecord& change);
  // After the last Restore: the next ids follow the largest restored.
  void FinishRestore();
  // A worker that kept its state asks to be the host it was
  // (RegisterWorker.kept_state): if an away worker of that id, generation
  // and host name is restored, it is alive again under its id with
  // `generation`, its held shards (inventory) are noted for its clients'
  // resumes, and its XLA programs count as loaded. Null otherwise (it
  // registers as a fresh host).
  WorkerRecord* ResumeWorker(const proto::RegisterWorker& info,
                             uint64_t generation, absl::Time now);
  // Whether one of `client_id`'s slices has a device on an away worker.
  bool WaitsForWorkers(uint64_t client_id) const;
  // The away worker ids (restored, not back).
  std::vector<int64_t> AwayWorkers() const;
  // An away worker whose wait is over becomes a live one again, for the
  // caller to lose at once (LoseWorker: its slices are remapped onto a
  // spare or break, as for any lost host).
  void EndAway(int64_t worker_id);
  // Resumes client `client_id`'s session (it was restored and is away):
  // NotFound if no such session is restored, FailedPrecondition if it
  // already resumed.
  absl::Status ResumeClient(uint64_t client_id);
  // What a resuming client holds (LiveBuffers): each buffer whose shards
  // the workers of its slice all gave back is recorded as live
  // (JobRecords::AddRestored); the others wait for a call sent again
  // (RouteResentCall) until `done`, when what is still missing is lost
  // (recorded in LostStatus, returned as lost_ids with the status) and
  // the shards the workers gave back that no live buffer of the client
  // names are released (ops).
  proto::Recovery RestoreLiveBuffers(uint64_t client_id,
                                     const proto::LiveBuffers& live,
                                     WorkerOps* ops);
  // Before a batch sent again after a resume (ClientToServer.resent): which
  // of its calls and puts must run again, from the last back: those that
  // make a missing buffer, or an input of such a call that no worker holds
  // (a chain whose intermediate values the client released runs again
  // from the last value held). An input the client released that the
  // workers gave back whole is recorded as it is (never made twice) and
  // released at the resume's end.
  void PlanResent(
      uint64_t client_id,
      const google::protobuf::RepeatedPtrField<proto::ClientOp>& ops);
  // A call of a batch sent again after a resume: not run unless PlanResent
  // found it needed; else routed as RouteCall does, if every input is
  // recorded (held, or made by a call sent again before it), its outputs
  // the client no longer holds released at the end of the resume; else its
  // missing outputs are lost, naming the input. `*routed` says whether it
  // was routed (`seq` set).
  absl::Status RouteResentCall(uint64_t client_id, const proto::Call& call,
                               WorkerOps* ops, uint64_t* seq, bool* routed);
  // A put of a batch sent again after a resume: declared again on the
  // workers, and all its shards asked of the client again (`reput`: the
  // client kept the data), if PlanResent found it needed; else nothing.
  absl::Status RouteResentPut(uint64_t client_id, const proto::PutDecl& put,
                              WorkerOps* ops, proto::Recovery* reput);
  // The records that rebuild what the journal keeps of the model now (a
  // compacted journal's snapshot, proto::ModelSnapshot).
  proto::ModelSnapshot SnapshotRecords() const;

  // --- clients
  // A client id is the top 24 bits of every id its client makes
  // (kBufferIdClientShift), and the session's data-plane credential
  // derives from it, so no id is given twice: ids run from 1 up to
  // kServerClientId (the server's own, excluded). OK while one is left,
  // else RESOURCE_EXHAUSTED saying so (after 16,777,214 sessions: the
  // server must restart). AddClient needs one.
  absl::Status CheckClientIdsLeft() const;
  ClientRecord& AddClient(const std::string& name,
                          const std::string& tenant = kDefaultTenant);
  // The id the next client gets (tests; a server restoring its records).
  void set_next_client_id(uint64_t id) { next_client_id_ = id; }
  // The count the next server-made id takes (ServerMadeIds; tests start
  // it near the layout's limit).
  void set_next_server_id(uint64_t n) { next_server_id_ = n; }
  // The count the next transfer temporary (ClientMadeId(kServerClientId,
  // n)) takes; it goes back to 1 after kMaxIdCount (tests start it there).
  void set_next_transfer(uint64_t n) { next_transfer_ = n; }
  // The directory a slice suspended to files is parked in (the server's
  // --park-dir): every worker's path to one shared directory. Empty: a
  // suspend to files is refused.
  void set_park_dir(std::string dir) { park_dir_ = std::move(dir); }
  // The count of the first temporary this server makes (its next one once
  // restored from a journal: past every earlier server's). Workers refuse
  // undeclared temporaries before it (ServerToWorker.temp_floor).
  uint64_t temporary_floor() const { return temporary_floor_; }
  ClientRecord* FindClient(uint64_t id);
  const ClientRecord* FindClient(uint64_t id) const;
  // The time calls routed from now on record (CallRecord.routed): the
  // server sets it once per batch, from its clock.
  void set_now(absl::Time now) { now_ = now; }
  // Transfers between workers routed for calls so far (the timeline test
  // counts them against the trace).
  int64_t transfers_routed() const { return transfers_routed_; }
  // Why a buffer was lost (its reads fail with this), or null.
  const absl::Status* LostStatus(uint64_t buffer_id) const {
    auto it = lost_.find(buffer_id);
    return it == lost_.end() ? nullptr : &it->second;
  }
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
  // slice.resize(n): the slice's devices become `req.num_devices` along
  // mesh axis `req.axis`, the other axes keeping their sizes. Devices along
  // the axis up to the new length stay where they are (virtual device
  // order kept); a shrink frees the rest, a growth takes free devices,
  // off the slice's hosts first (as a slice request would, the tenant's
  // max_devices counted). Every live value of the slice moves onto the
  // new map under a new id, by a call of a built-in identity program
  // routed from the old map (pieces where they are, transfers where not;
  // no lineage through the move), and its old copy is released after it.
  // XLA programs compiled for the old map are refused from then on
  // (ProgramRecord::stale). Refused before anything changes, naming what
  // and why: a slice not held, broken or waiting for a host; an axis or a
  // size that does not fit the mesh; a value whose dimension the new size
  // does not divide (naming the value and the sizes that would), a value
  // still partial, or one laid out over a multi-axis mesh PartitionSpec
  // (not supported yet); too few free devices (ResourceExhausted).
  absl::StatusOr<SliceResized> ResizeSlice(uint64_t client_id,
                                           const proto::SliceResize& req);
  // slice.suspend(): the slice stops serving calls and puts (refused,
  // FailedPrecondition, saying so) and its devices stop counting against
  // its tenant's max_devices and claiming devices for its priority; its
  // values stay where they are, in the workers' memory, and a lost host is
  // recovered as for any slice. Refused for a slice that is broken, waits
  // for a host, or is already suspended.
  // With `to_files`: every live value of the slice is also written to
  // files of the park directory (set_park_dir; refused without one) by a
  // `park` call per value, then released from the workers' memory; its
  // id reads as parked (FailedPrecondition, saying to resume) until the
  // resume. The parks' tokens are in `wait_ids` (for the client to wait
  // on and release), or, `by_server` (a preemption: no one waits), each
  // released by the server as its park ends (FinishPark).
  absl::StatusOr<SliceResized> SuspendSlice(uint64_t client_id,
                                            uint64_t slice_id,
                                            bool to_files = false,
                                            bool by_server = false);
  // A SliceResize op: ResizeSlice, or SuspendSlice / ResumeSlice when
  // `suspend` / `resume` is set.
  absl::StatusOr<SliceResized> ChangeSlice(uint64_t client_id,
                                           const proto::SliceResize& req);
  // A call or put the client sends on a slice it suspended is refused
  // (FailedPrecondition, naming the program or the put and the slice);
  // the server's own routing on it is not (a lost host's recomputations,
  // a resume's moves), nor a read of its values by a call on another
  // slice. OK for any other op.
  absl::Status RefuseOnSuspended(uint64_t client_id,
                                 const proto::ClientOp& op) const;
  // slice.resume(): placed again at its size and mesh. On its own devices
  // while no other slice maps them (nothing moves); else on the least
  // loaded devices the tenant may hold (PlaceGrowth's rules: quota,
  // higher priorities' devices avoided), where every live value moves
  // under a new id (the resize core: the note's old_ids/new_ids, the moves
  // and releases in `work`). A slice suspended to files places its values
  // by an `unpark` call each (reading their files, on whichever devices it
  // got), under new ids as a move's. Refused while not suspended, or where
  // too few devices are free (it stays suspended).
  absl::StatusOr<SliceResized> ResumeSlice(uint64_t client_id,
                                           uint64_t slice_id);
  // Slices the server suspended for a higher priority (SliceRecord.
  // preempted) whose own devices are free again (no other slice maps them,
  // no higher priority claims them) resume there, nothing moved, and then
  // slices that grow back (SliceRequest.grow) and are under the size they
  // were granted at grow along their elastic axis by as many whole
  // positions as free devices allow (PlaceGrowth), as a resize would: each
  // one's owner and resume or resize. Called as hosts join or come free. A
  // slice whose values do not fit a larger size (a split dimension it does
  // not divide) stays as it is, and a preempted one whose devices are still
  // held stays suspended; `why_not`, if given, gets why, by slice.
  std::vector<std::pair<uint64_t, SliceResized>> GrowSlices(
      std::map<uint64_t, std::string>* why_not = nullptr);
  // Priorities (TenantPolicy::priority): a slice gives up the devices that
  // a slice of a higher-priority tenant is mapped to, as its on_preempt
  // says (PreemptionOf). PREEMPT_SHRINK: it shrinks off them along its
  // elastic axis (a position goes if any of its devices is so claimed), no
  // further than its minimum (min_devices, one position), as a resize
  // would: every value moves (split ones re-split), none is lost.
  // PREEMPT_SUSPEND: it is suspended as SuspendSlice would (its values
  // kept in the workers' memory; PREEMPT_PARK: parked in files, where the
  // server has a park directory), SliceRecord.preempted saying for whom;
  // GrowSlices resumes it. Each resize's or suspend's owner, with `why`
  // naming the slice and tenant it yielded to. A slice that cannot (at its
  // minimum, or a value the smaller size does not divide), or that shares
  // (PREEMPT_SHARE), keeps time-sharing those devices; `why_not`, if
  // given, gets why. A slice does not grow onto devices a higher priority
  // holds (PlaceGrowth), so it grows back (grow=True) once they free.
  // Called whenever a slice is granted; a no-op while every tenant has one
  // priority.
  std::vector<std::pair<uint64_t, SliceResized>> YieldToPriorities(
      std::map<uint64_t, std::string>* why_not = nullptr);
  // Whether a batch of `client_id`'s ops waits at the server: the first
  // call or put of `ops` on a slice the server holds suspended for a
  // higher priority (SliceRecord.preempted), unless an earlier op of
  // `ops` resumes that slice (SliceResize.resume) or releases it. Its
  // client did not ask for the suspend: the batch routes, in its order,
  // once the slice resumes, instead of being refused (RefuseOnSuspended).
  std::optional<PreemptionHold> HeldByPreemption(
      uint64_t client_id,
      const google::protobuf::RepeatedPtrField<proto::ClientOp>& ops) const;
  bool IsPreempted(uint64_t slice_id) const;
  const std::map<uint64_t, SliceRecord>& slices() const { return slices_; }
  proto::SliceInfo DescribeSlice(const SliceRecord& slice) const;

  // --- programs and calls
  // RegisterProgram for a program the client sent: refused first where its
  // id is one of the server's (ServerMadeId) or its kernel the server's
  // own (park, unpark: KernelSignature::server_only), PermissionDenied.
  absl::Status RegisterClientProgram(uint64_t client_id,
                                     const proto::RegisterProgram& reg,
                                     WorkerOps* ops);
  // Validates and records a program the client compiled.
  // XLA programs are also loaded onto their islands' workers now (ops
  // appended to `ops`), so that those compile them before the first call.
  absl::Status RegisterProgram(uint64_t client_id,
                               const proto::RegisterProgram& reg,
                               WorkerOps* ops = nullptr);
  // Turns one call into ops for the workers involved (appended to `ops`):
  // program loads, transfers between workers, expectations and the
  // per-worker Execute. Errors name the program and the argument.
  // `seq`, if given, gets the call's sequence number (its record's key).
  absl::Status RouteCall(uint64_t client_id, const proto::Call& call,
                         WorkerOps* ops, uint64_t* seq = nullptr);
  // The same, with the Executes in wire form, encoded once for all the
  // call's hosts (`*executes`; each host's goes after its ops in `ops`),
  // not as one proto op per host: the path of a client's calls.
  absl::Status RouteCall(uint64_t client_id, const proto::Call& call,
                         WorkerOps* ops, uint64_t* seq,
                         std::shared_ptr<CallExecutes>* executes);
  // `reput`, if given, gets the shards the client must put again: all of
  // them when it put by an older map of the slice than the server's.
  absl::Status RoutePut(uint64_t client_id, const proto::PutDecl& put,
                        WorkerOps* ops, proto::Recovery* reput = nullptr);
  // A call that did not route: its outputs fail on the workers of its
  // slice (WorkersAClientMayAsk), for a consumer that already waits there. Only
  // the client's own outputs on its own slice: a refused call must not fail
  // another client's buffers by naming them. They are lost with `status`
  // (LostStatus, until the client releases them), so a call that reads one
  // is refused in turn, naming the refusal, and never sent to wait at the
  // workers for a value no call will make.
  void FailCallOutputs(uint64_t client_id, const proto::Call& call,
                       const absl::Status& status, WorkerOps* ops);
  // The live workers a client may push to or ask for a value of `slice`:
  // those of its map, and those its last resize dropped (the client may
  // not have heard of it yet).
  std::set<int64_t> WorkersAClientMayAsk(const SliceRecord& slice) const;
  // A put that did not route: its client pushes its shards to the workers
  // of the map it cut them by, which wait for a declaration that will not
  // come. The buffer fails there with `status` (the pushes end with it, at
  // once): on the slice's workers and those its last resize dropped. Only
  // the client's own buffer on its own slice, as for FailCallOutputs.
  void FailRefusedPut(uint64_t client_id, const proto::PutDecl& put,
                      const absl::Status& status, WorkerOps* ops) const;
  // The client's own buffers among `ids` fail with `status` on
  // WorkersAClientMayAsk of its slice `slice_id` (nothing if it does not
  // hold that slice): what FailCallOutputs and FailRefusedPut share.
  // `relay`: the call's Call.relay (FailBuffers.relay).
  void FailOnSlice(uint64_t client_id, uint64_t slice_id,
                   const std::vector<uint64_t>& ids, const absl::Status& status,
                   WorkerOps* ops, bool relay = false) const;
  // What a loss that no spare took (`loss.broken`) costs `client_id`:
  // every value of its broken slices, and every output of its calls not
  // done that reads one (on any slice, transitively), can never be read.
  // They are recorded as lost (a call that reads one is refused) and
  // returned as a note (lost_ids, and a status naming the host), so that
  // every future depending on them fails at once, not after a wait.
  proto::Recovery LoseOnBrokenSlices(uint64_t client_id,
                                     const WorkerLoss& loss);
  // How recovery's errors name a value of a client's: "buffer <id>", and
  // what made it where the records still say: "(put by its client)" or
  // "(output <o> of program '<name>', call <call id>)".
  std::string NameOfBuffer(uint64_t id) const;
  // client.snapshot: copies each shard of the client's buffer to the next
  // shard's host (another host of the slice; for a slice on one host,
  // another live host of the cluster: SnapshotHolder), replacing the
  // buffer's previous snapshot if that is not complete yet (a complete one
  // stays: the value is the same) (server/recovery/recovery.cc). Buffers
  // replicated over more than one host need none and get none; nor does
  // anything in a cluster that never had a spare (it cannot recover:
  // keep_lineage).
  void RouteSnapshot(uint64_t client_id, uint64_t buffer_id, WorkerOps* ops);
  // A worker holds a shard of snapshot copy `copy_id` (CallsDone
  // .copies_done). Once every shard has arrived the snapshot counts:
  // recovery restores from it, and the buffer's producer lets go of its
  // inputs (releases that frees go to `ops`).
  void CopyArrived(uint64_t copy_id, WorkerOps* ops);
  // Releases one of `client_id`'s buffers on the workers of its slice; a
  // release of another client's buffer is ignored.
  void RouteRelease(uint64_t client_id, const proto::ReleaseRef& release,
                    WorkerOps* ops);

  int64_t calls_routed() const { return calls_routed_; }

 private:
  // TellPeer's, and the shard layouts RouteCall tells, until TakePeerOps.
  WorkerOps peer_ops_;
  // A copy of shard `src_shard` of buffer `src_id`, on worker `src_worker`,
  // into (dst_id, dst_shard) on `dst`: the source pushes it once it is
  // ready (told of `dst` first) and the destination takes it as the
  // client's (`report`: and says when it arrived, CallsDone.copies_done).
  // Shared by recovery and snapshots (server/recovery/copy_shard.cc).
  void CopyShard(uint64_t src_id, int32_t src_shard, int64_t src_worker,
                 uint64_t dst_id, int32_t dst_shard, const DeviceRef& dst,
                 const TensorSpec& spec, bool report, WorkerOps* ops);
  // The release of `id` to the live workers of slice `slice_id` (every
  // live worker if the slice is gone), merged into a trailing Release op.
  // Its snapshot goes too.
  void ReleaseOps(uint64_t id, uint64_t slice_id, WorkerOps* ops,
                  SharedReleases* shared = nullptr);
  // Where shard `j` of a value on `devices` keeps its snapshot copy: the
  // next device of the slice on another host (NextHostShard), or, when the
  // slice is on one host, device 0 of the next live host of the cluster
  // after it (by worker id, cyclically; spares last); none if there is no
  // other live host.
  std::optional<DeviceRef> SnapshotHolder(const std::vector<DeviceRef>& devices,
                                          int j) const;
  // The releases the records let go now (JobRecords::TakeDue).
  void DrainReleases(WorkerOps* ops, SharedReleases* shared = nullptr) {
    records_.DrainDue([&](uint64_t id, uint64_t slice) {
      ReleaseOps(id, slice, ops, shared);
    });
  }
  // The live workers among `targets` (sorted, each once), walked beside
  // workers_ (ReleaseOps).
  template <typename Fn>
  void ForEachLive(absl::Span<const int64_t> targets, Fn fn) const {
    if (targets.empty()) return;
    auto rec = workers_.lower_bound(targets.front());
    for (int64_t w : targets) {
      while (rec != workers_.end() && rec->first < w) ++rec;
      if (rec != workers_.end() && rec->first == w && rec->second.alive) {
        fn(w);
      }
    }
  }
  // The call with its inputs named by their current ids (aliases_), made
  // in `storage`, or nullptr if none changed (then `storage` stays empty:
  // no message is built on the dispatch path).
  const proto::Call* Translated(const proto::Call& call,
                                std::optional<proto::Call>* storage) const;
  // The first of `count` new ids in the client's namespace, made by the
  // server (recovery's calls run again and their outputs, snapshot
  // copies), the others following it; RESOURCE_EXHAUSTED, and none made,
  // once the server's count of them would pass the layout's limit
  // (CheckIdsLeft, common/ids.h).
  absl::StatusOr<uint64_t> ServerMadeIds(uint64_t client_id,
                                         uint64_t count = 1);

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

  // The host LoseWorker takes for a lost one whose slices use its device
  // indices up to `highest`: live, in no slice, with that many devices; a
  // spare first, then the oldest. Null if none.
  WorkerRecord* FindSpare(int32_t highest);
  // Maps `loss`'s slices `sids` onto `spare` in place of the lost host
  // (same device indices; XLA programs name it in its place), each
  // slice's generation +1; fills `loss.remapped` and `loss.spare`.
  void RemapOnto(WorkerLoss& loss, const std::set<uint64_t>& sids,
                 WorkerRecord& spare);

  // The slice is gone (released, its client left): no loss waits for it.
  void ForgetAwaitedSlice(uint64_t slice_id);

  // RecoverClient's steps (server/recovery/recovery.cc), over what one
  // client's recovery from one loss has decided so far.
  struct RecoveryPass;
  // The note's remapped and broken slices of the client.
  void DescribeLoss(RecoveryPass& r) const;
  // The calls of the work taken from admission, and their outputs; the
  // program loads it carried are marked not loaded (sent again with it).
  void NoteTakenWork(RecoveryPass& r);
  // Step 1: the client's calls not done (or failed) that ran on a remapped
  // slice or read a value of one or an output of such a call, and their
  // outputs (`again`, `produced`).
  void FindCallsToRunAgain(RecoveryPass& r) const;
  // Step 2's buffers: (producer, id) of the client's values on a remapped
  // slice that no call of step 1 or of the taken work makes again, each
  // after the others its producer reads.
  std::vector<std::pair<uint64_t, uint64_t>> HitBuffers(
      const RecoveryPass& r) const;
  // Whether a call run again finds `id`: not lost, still recorded, and
  // unharmed by the loss or restored, remade or routed again by it.
  bool AvailableAfterLoss(const RecoveryPass& r, uint64_t id) const;
  // One of HitBuffers: a replicated value is copied from a surviving
  // shard, one with a complete snapshot whose holders live from the
  // snapshot (both into `copies`), a put one is declared on the spare for
  // the client to put again; otherwise RecomputeOrLose.
  void RestoreBuffer(RecoveryPass& r, uint64_t producer, uint64_t id,
                     WorkerOps* copies);
  // Its producer runs again if all its inputs are available after the
  // loss; else it is lost (DATA_LOSS naming it, the host and why).
  void RecomputeOrLose(RecoveryPass& r, uint64_t producer, uint64_t id);
  // Snapshots being made of remapped values are noted for step 5; shards
  // of complete snapshots whose copy was on the lost host are copied again.
  void RecopySnapshots(RecoveryPass& r);
  // `seqs`, each after those of them that make its inputs.
  std::vector<uint64_t> CallsInOrder(const std::set<uint64_t>& seqs) const;
  // Step 3 for one call: routed again with new call and output ids (the
  // old ids become aliases); without new ids its outputs are lost.
  void RunCallAgain(RecoveryPass& r, uint64_t seq);
  // A call's old output `old_id`, run again as `new_id`: its record goes,
  // its entries on the workers are released with the new id's; one the
  // client had released is released again under the new id at the end.
  void SupersedeOutput(RecoveryPass& r, uint64_t old_id, uint64_t new_id);
  // Step 4: the taken work routed again on the new map, the lost host's
  // part of what names no call dropped.
  void RouteTakenAgain(RecoveryPass& r);
  // Step 5: snapshots that were being made, asked for again of the value
  // as it is now (under its new id), their old copies released.
  void RemakeSnapshots(RecoveryPass& r);
  // Outputs run again that the client had released, released again.
  void ReleaseRunAgainOutputs(RecoveryPass& r);

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
  // Devices of all the client's slices (what its tenant's max_devices
  // bounds).
  int64_t DevicesHeld(const ClientRecord& client) const;
  // `need` devices for `slice` to grow by (ResizeSlice): of usable hosts,
  // none it holds, hosts it is not on first; ResourceExhausted saying what
  // is short (devices, or room under the tenant's max_devices).
  absl::StatusOr<std::vector<DeviceRef>> PlaceGrowth(const ClientRecord& client,
                                                     const SliceRecord& slice,
                                                     int need) const;
  // The highest-priority slice mapped to a device: its priority, id and
  // tenant (YieldToPriorities, PlaceGrowth, PlaceSlice).
  struct Claim {
    int32_t priority = 0;
    uint64_t slice_id = 0;
    std::string tenant;
  };
  using Claims = std::map<std::pair<int64_t, int>, Claim>;  // (worker, device)
  // Every device's claim; empty while every client has one priority.
  Claims ClaimsByPriority() const;
  // Whether every device of `slice` is alive and claimed by no priority
  // above `priority`, and, with `alone`, mapped by no other slice
  // (ResumeSlice in place; ResumePreempted, where the slice shared them
  // before the higher priority came, does not ask `alone`).
  bool OwnDevicesFree(const SliceRecord& slice, int32_t priority,
                      const Claims& claims, bool alone) const;
  // YieldToPriorities for a PREEMPT_SUSPEND slice `slice` of `client`
  // whose devices `by` claims, and GrowSlices' resume of one: each answer.
  absl::StatusOr<SliceResized> Preempt(ClientRecord& client, SliceRecord& slice,
                                       const Claim& by);
  std::vector<std::pair<uint64_t, SliceResized>> ResumePreempted(
      std::map<uint64_t, std::string>* why_not);
  // A change of a slice's size along one mesh axis (ResizeSlice, a loss's
  // shrink, GrowSlices): the positions of the axis that stay, in order,
  // then the devices of the positions added after them.
  struct ResizePlan {
    int axis = 0;
    std::vector<int32_t> keep;     // coordinates along `axis` of the old mesh
    std::vector<DeviceRef> grown;  // whole positions: a multiple of the others
    // The mesh keeps its shape (a resume onto other devices): every value
    // moves as laid out, partial and mesh-sharded ones too.
    bool same_shape = false;
    // A loss's shrink: a value that cannot move (split over the lost host,
    // still being computed, partial) is lost, `lost_why` saying what
    // happened, where a client's resize would refuse it.
    bool on_loss = false;
    int64_t lost_worker = 0;
    std::string lost_why;
  };
  // Checks every value against the plan, then commits it: the new map,
  // the moves routed from the old one, the old copies released, stale XLA
  // programs marked (resize_slice.cc).
  absl::StatusOr<SliceResized> CommitResize(ClientRecord& client,
                                            SliceRecord& slice,
                                            const ResizePlan& plan);
  // A loss's shrink: `lost` (value: what became of it) and the outputs of
  // the client's calls not done that read them are lost, with one status
  // naming the first few (into `note`).
  void LoseOnShrink(const ClientRecord& client, const ResizePlan& plan,
                    const std::map<uint64_t, std::string>& lost,
                    proto::Recovery& note);
  // LoseWorker's shrink of a LOSS_SHRINK slice off worker `lost`: the
  // positions of its elastic axis with a device there go. FailedPrecondition
  // if that would leave it under its min_devices (or nothing).
  absl::StatusOr<SliceResized> ShrinkOnLoss(SliceRecord& slice, int64_t lost,
                                            const std::string& reason);
  // The client's built-in identity program for values laid out as `spec`
  // (ResizeSlice's moves), registered on first use.
  absl::StatusOr<uint64_t> MoveProgram(ClientRecord& client,
                                       const ArgSpec& spec);
  // A `park` (`unpark`: !to_file) program of the client for the value
  // `id` laid out as `spec`, its files keyed by the client and the id.
  absl::StatusOr<uint64_t> ParkProgram(ClientRecord& client, uint64_t id,
                                       const ArgSpec& spec, bool to_file);
  // Routes a park of every live value of `slice` (SuspendSlice with
  // to_files); each is released once its park is done (FinishPark).
  absl::Status ParkValues(ClientRecord& client, SliceRecord& slice,
                          SliceResized& out, bool by_server);
  // Reads back every value `slice` parked, on its devices as they are now.
  absl::Status UnparkValues(ClientRecord& client, SliceRecord& slice,
                            SliceResized& out);
  // Why a parked value cannot be read or used.
  absl::Status ParkedStatus(uint64_t id, uint64_t slice_id) const;
  // The client let go of `id`: if parked, it is marked so (the resume
  // releases it once read back). True if it was.
  bool ReleaseParked(ClientRecord& client, uint64_t id);
  // The slice of the client's that parked `id` (and its entry), or null.
  SliceRecord* FindParked(const ClientRecord& client, uint64_t id,
                          SliceRecord::Parked** parked = nullptr);
  // Records a placed slice for the client.
  proto::SliceInfo GrantSlice(ClientRecord& client,
                              const proto::SliceRequest& req,
                              std::vector<DeviceRef> devices);

  TenantTable tenants_;
  std::map<int64_t, WorkerRecord> workers_;
  std::map<uint64_t, ClientRecord> clients_;
  std::map<uint64_t, SliceRecord> slices_;
  std::deque<PendingSlice> pending_slices_;  // in arrival order
  std::deque<AwaitedLoss> awaited_;          // oldest first
  int64_t next_worker_id_ = 1;
  uint64_t next_client_id_ = 1;
  absl::Time now_ = absl::InfinitePast();  // set_now
  int64_t transfers_routed_ = 0;
  uint64_t next_slice_id_ = 1;
  uint64_t next_transfer_ = 1;
  // +1 each time a program is forgotten on a worker (its loaded_programs
  // erased): the slices' RouteCache::loaded_everywhere is stale then.
  uint64_t programs_unloaded_ = 1;
  uint64_t temporary_floor_ = 1;  // FinishRestore
  std::string park_dir_;          // set_park_dir
  // Park calls routed and not done, by seq (ParkValues, FinishPark).
  struct Parking {
    uint64_t client_id = 0;
    uint64_t slice_id = 0;
    uint64_t id = 0;
    ArgSpec spec;
    uint64_t token = 0;  // released by FinishPark (a server's suspend)
  };
  std::map<uint64_t, Parking> parking_;
  std::map<uint64_t, proto::Recovery> parked_notes_;  // TakeParkedNotes
  int64_t parked_values_ = 0;  // over every slice: ReleaseParked's shortcut
  int64_t calls_routed_ = 0;
  uint64_t next_seq_ = 1;
  // The next shard layout's id (SliceRecord::RouteCache::layout): a map's
  // hosts are told theirs once, ahead of the calls that name it.
  uint64_t next_layout_id_ = 1;
  uint64_t next_server_id_ = 1;
  JobRecords records_;
  // Buffers recovery gave new ids (old -> new) and buffers it lost (-> why).
  absl::flat_hash_map<uint64_t, uint64_t> aliases_;
  absl::flat_hash_map<uint64_t, absl::Status> lost_;
  // Ids a recovery replaced, by the id that holds their value now: their
  // entries are released on the workers with it (the client may still read
  // an old id until it hears of the new one).
  absl::flat_hash_map<uint64_t, std::vector<std::pair<uint64_t, uint64_t>>>
      superseded_;
  // Each snapshotted buffer's copy: its id there, and the worker holding
  // the copy of each shard.
  struct Snapshot {
    uint64_t id = 0;
    std::vector<int64_t> holders;
    int arrived = 0;   // shards of the copy reported arrived (CopyArrived)
    int recopies = 0;  // shards copied again after a loss, not arrived
    bool complete() const {
      return arrived >= static_cast<int>(holders.size());
    }
  };
  absl::flat_hash_map<uint64_t, Snapshot> snapshots_;
  absl::flat_hash_map<uint64_t, uint64_t> snapshot_of_;  // copy id -> buffer
  // The release of snapshot copy `snap` of a value on slice `slice_id`:
  // on the slice's workers and on the holders of its shards.
  void ReleaseCopyOps(const Snapshot& snap, uint64_t slice_id, WorkerOps* ops);
  // Whether input `i` of `call` may give its memory to the program's
  // output (InputBinding.donate): the program donates it, and nothing else
  // reads the buffer: no call holds it (in flight, or for lineage, which a
  // cluster with spares keeps), no snapshot copies it, the call names it
  // once, and it is laid out on the call's slice as the program takes it.
  bool MayDonate(const ProgramRecord& prog, const proto::Call& call, int i,
                 bool same_layout) const;
  // Routing's scratch, reused from call to call (RouteCall lists a call's
  // own-shard inputs, or builds each shard's task, in it and encodes them;
  // no allocation per call once warm).
  std::vector<std::unique_ptr<proto::ShardTask>> route_tasks_;
  std::vector<OwnShardInput> route_own_;
  std::vector<const proto::TensorSpec*> route_own_local_;
  proto::Execute route_shared_;
  proto::RecoveryCounters counters_;
  bool spares_seen_ = false;
  ModelJournalSink* journal_ = nullptr;  // set_journal
  // Writes `change` to the journal, if there is one.
  void Journal(const proto::ModelRecord& change) {
    if (journal_ != nullptr) journal_->Record(change);
  }
  void JournalSlice(const SliceRecord& slice);
  // With a journal: keeps next_transfer_ below a count the journal holds,
  // reserving blocks of kTransferBlock ahead (restart.cc).
  static constexpr uint64_t kTransferBlock = uint64_t{1} << 20;
  uint64_t transfers_reserved_ = 0;
  // A new transfer temporary's id (a copy's destination, a collective's
  // exchange): the count goes on, and back to 1 after the layout's last.
  uint64_t NextTemporary();
  void ReserveTransfers() {
    if (journal_ != nullptr &&
        (next_transfer_ >= transfers_reserved_ ||
         next_transfer_ + kTransferBlock < transfers_reserved_)) {
      ReserveTransfersSlow();
    }
  }
  void ReserveTransfersSlow();
  void JournalWorker(const WorkerRecord& w);
  void JournalWorkerGone(const WorkerRecord& w);
  // Shards resumed workers gave back, by buffer: (worker, shard).
  absl::flat_hash_map<uint64_t, std::vector<std::pair<int64_t, int32_t>>> held_;
  // Whether every shard of `id` on `slice` was given back.
  bool HeldWhole(uint64_t id, const SliceRecord& slice)
      const;  // a spare has registered (UpdateLineagePolicy)
};

}  // namespace plexus
