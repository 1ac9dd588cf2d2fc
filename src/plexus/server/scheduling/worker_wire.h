// The server's side of the worker stream in wire form: a call over H hosts
// is encoded once, not built and serialized H times.
//
// A call's Execute differs between its hosts only in the shard tasks each
// runs; everything else (call, program and client ids, outputs, peers, and
// the ticket and start tag admission gives it) is the same. CallExecutes
// encodes the shared fields once and each host's tasks once, and a
// worker's writer splices them into its ServerToWorker message (AppendOps).
// Protobuf's wire format lets a message's fields come in any order and a
// repeated field's elements in several runs, so what a worker reads parses
// as the same proto::Execute the server would have built for it: nothing
// in the protocol changes (common/protocol.h), the worker parses
// proto::ServerToWorker as before.
//
// A CallExecutes is filled by routing (AddHost), stamped by admission
// (Stamp), then shared read-only by the hosts' out queues. Not thread-safe
// while it is filled or stamped; safe for concurrent reads after.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "plexus/proto/plexus.pb.h"

namespace plexus {

// An argument every shard of a call reads from its own shard of one value,
// on its own device (the value lies on the call's slice in the layout its
// program takes): its binding is one piece, the whole shard, and differs
// between shards only in the shard's index. RouteCall's usual case, which
// CallExecutes::AddOwnShardsHosts encodes without building protos.
struct OwnShardInput {
  uint64_t buffer_id = 0;
  int64_t length = 0;  // the piece's length (Piece.length)
  int32_t axis = 0;    // InputBinding.axis
  bool donate = false;
  // InputBinding.local (a proto::TensorSpec), serialized.
  const std::string* local = nullptr;
};

// One shard task of a host: the worker's device and the shard's index.
struct DeviceShard {
  int32_t device = 0;
  int32_t shard = 0;
};

// Where each host of a slice's map runs its shards: each host's tasks
// (device and shard), host after host in the map's order, and the id the
// hosts know it by (proto::ShardLayout; ClusterState::TellLayout). Made once
// per map (SliceRecord::RouteCache), shared by the calls routed on it.
struct ShardLayoutMap {
  uint64_t layout_id = 0;
  std::vector<int64_t> workers;  // host h's worker
  std::vector<DeviceShard> tasks;
  std::vector<uint32_t> begin;  // host h's tasks: [begin[h], begin[h + 1])
  // Host `host`'s part as the op that tells it (proto::ShardLayout).
  proto::ShardLayout OpFor(int host, uint64_t client_id) const;
};

class CallExecutes {
 public:
  // `shared`: the Execute fields every host has (no tasks; no ticket or
  // start tag: Stamp sets those), encoded now; room for `hosts` hosts.
  explicit CallExecutes(const proto::Execute& shared, int hosts = 0);

  // Adds a host: worker `worker_id` runs `tasks` (in this order), encoded
  // now. Each worker is added once.
  void AddHost(int64_t worker_id,
               absl::Span<const proto::ShardTask* const> tasks);
  // Adds hosts whose tasks read only OwnShardInputs: `hosts` lists each
  // worker, once, with its count of tasks, and `tasks` their tasks, host
  // after host (task k runs shard `tasks[k].shard` on device
  // `tasks[k].device`), each reading `inputs` in order as that shard's own
  // piece. The bytes are the ones AddHost writes for those tasks (a
  // proto::ShardTask with one InputBinding per input, one Piece each),
  // written directly: what is the same for every task, once, and of the
  // tasks whose device and shard are each 0 or below 128 (every host's
  // below 128 hosts), one per class written field by field and the rest
  // copied from it with their two values put in.
  void AddOwnShardsHosts(absl::Span<const std::pair<int64_t, int>> hosts,
                         absl::Span<const DeviceShard> tasks,
                         absl::Span<const OwnShardInput> inputs);
  // The same call as AddOwnShardsHosts with `layout`'s tasks, but every
  // host gets the same bytes: the layout's id and one template task (the
  // task of device 0 and shard 0, as AddOwnShardsHosts writes it) that each
  // worker expands with its own devices and shards (proto::Execute's
  // layout_id and own_task; common/shard_layouts.h). Nothing is encoded
  // or listed per host: the hosts are the layout's workers, in its order.
  void AddOwnShardsLayout(std::shared_ptr<const ShardLayoutMap> layout,
                          absl::Span<const OwnShardInput> inputs);
  // Admission's ticket and start tag, the same on every host; before any
  // OutOp of it is made.
  void Stamp(uint64_t ticket, double start_tag);
  // Once stamped, the WorkerOp every host gets where they all get the same
  // (a layout's call); empty (a null data()) otherwise.
  absl::string_view SameOpBytes() const {
    return op_bytes_.empty() ? absl::string_view() : op_bytes_;
  }

  int hosts() const {
    return static_cast<int>(layout_ != nullptr ? layout_->workers.size()
                                               : hosts_.size());
  }
  int64_t worker(int host) const {
    return layout_ != nullptr ? layout_->workers[host] : hosts_[host].worker;
  }
  uint64_t call_id() const { return call_id_; }
  uint64_t program_id() const { return program_id_; }
  absl::Span<const uint64_t> output_ids() const { return output_ids_; }
  bool relay() const { return relay_; }  // Execute.relay
  uint64_t ticket() const { return ticket_; }

  // Host `host`'s op (a WorkerOp holding its Execute), in wire form: its
  // size, and its bytes written at `target` (that many bytes of room),
  // returning their end.
  size_t WorkerOpSize(int host) const;
  uint8_t* WriteWorkerOp(int host, uint8_t* target) const;
  // Host `host`'s Execute, parsed back from its bytes (tests, taken work,
  // anything off the hot path); one named by a layout comes with its tasks
  // listed (as AddOwnShardsHosts's), the layout left out.
  proto::Execute Execute(int host) const;

 private:
  size_t ExecuteSize(int host) const;
  // Host `host`'s field `tasks`, encoded (none with a layout).
  absl::string_view TaskBytes(int host) const;

  struct Host {
    int64_t worker;
    uint32_t begin;  // its tasks' bytes in tasks_
    uint32_t end;
  };
  uint64_t call_id_ = 0;
  uint64_t program_id_ = 0;
  absl::InlinedVector<uint64_t, 2> output_ids_;
  bool relay_ = false;
  std::string shared_;  // the shared fields of Execute, encoded
  std::string tasks_;   // every host's field `tasks`, encoded, host by host
  std::vector<Host> hosts_;  // (empty with layout_: its workers are hosts)
  // Set by AddOwnShardsLayout: the hosts and their tasks (for Execute).
  std::shared_ptr<const ShardLayoutMap> layout_;
  // With layout_, once stamped: the WorkerOp every host gets, whole (its
  // writers copy it; nothing is sized or assembled per host).
  std::string op_bytes_;
  uint64_t ticket_ = 0;
  double start_tag_ = 0;
  size_t stamp_bytes_ = 0;  // the ticket's and start tag's fields
};

// One WorkerOp encoded once for several workers (the releases of values on
// a slice over several hosts: SliceRelease): each of `workers` gets the
// same bytes, each worker's writer copies them.
struct EncodedOp {
  std::string bytes;  // a proto::WorkerOp, serialized
  std::vector<int64_t> workers;
};

// One op in a worker's out queue: a proto op, one host's Execute of a
// call's CallExecutes (shared with the call's other hosts), or an op
// encoded once for several workers.
// Small and cheap to move (it is moved from the gang scheduler's staging
// to a worker's queue to its writer's batch, per host of every call): a
// proto op is held by pointer, a shared one by a plain pointer that
// `keep` keeps alive.
//
// `keep` is this op's own reference to what `call` or `encoded` points
// to, or (GangScheduler) one reference for every op pushed into a queue
// with it: an op whose `keep` is null is kept alive by an earlier op of
// the same push. A queue's ops are only ever taken whole (a writer swaps
// them all out), so those ops are written, and dropped, together. This
// way a call over H hosts costs no shared count per host: each host's
// increment and its writer's decrement, on another CPU, moved the count's
// cache line for every host of every call (issue 28).
struct OutOp {
  OutOp() = default;
  // Implicit: a queue takes proto ops as they are.
  OutOp(proto::WorkerOp proto_op)  // NOLINT
      : op(std::make_unique<proto::WorkerOp>(std::move(proto_op))) {}
  // One host's Execute of `executes`, which this op keeps alive.
  OutOp(std::shared_ptr<const CallExecutes> executes, int host_index)
      : OutOp(executes.get(), host_index) {
    keep = std::move(executes);
  }
  // One host's Execute of `executes` (stamped: CallExecutes::Stamp), which
  // another op of its push keeps alive (`keep`, above).
  OutOp(const CallExecutes* executes, int host_index)
      : call(executes), host(host_index) {
    const absl::string_view same = executes->SameOpBytes();
    bytes = same.data();
    size = static_cast<uint32_t>(same.size());
  }
  explicit OutOp(std::shared_ptr<const EncodedOp> shared)
      : bytes(shared->bytes.data()),
        size(static_cast<uint32_t>(shared->bytes.size())),
        keep(std::move(shared)) {}

  std::unique_ptr<proto::WorkerOp> op;  // set when `call` and `bytes` are
                                        // null
  const CallExecutes* call = nullptr;
  int host = 0;
  // The op's encoded WorkerOp where it is ready to copy (an op encoded for
  // several workers; a call every host of which gets the same bytes), so
  // a writer reads nothing else of it: null otherwise.
  uint32_t size = 0;
  const char* bytes = nullptr;
  std::shared_ptr<const void> keep;
};

// `ops`, in order, as elements of ServerToWorker's field `ops`: bytes that
// parse as a ServerToWorker holding them (after whatever other fields come
// before). OpsSize is their size (and caches proto ops' sizes); WriteOps
// writes them at `target`, which has OpsSize(ops) bytes of room, right
// after OpsSize, and returns their end; AppendOps does both onto `out`.
size_t OpsSize(const std::vector<OutOp>& ops);
uint8_t* WriteOps(const std::vector<OutOp>& ops, uint8_t* target);
void AppendOps(const std::vector<OutOp>& ops, std::string* out);

}  // namespace plexus
