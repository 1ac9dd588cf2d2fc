// ClusterState::RouteCall: one call into the ops of the workers involved.
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "plexus/common/argument_count.h"
#include "plexus/common/ids.h"
#include "plexus/server/model/cluster_state.h"
#include "plexus/store/object_store.h"

namespace plexus {
namespace {

// A source shard as the executing worker will find it: in its own store
// (same worker) or under a transfer temporary.
struct TransferKey {
  uint64_t buffer_id;
  int32_t shard;
  int64_t dst_worker;
  bool operator<(const TransferKey& o) const {
    return std::tie(buffer_id, shard, dst_worker) <
           std::tie(o.buffer_id, o.shard, o.dst_worker);
  }
};

// The pieces of destination block `j` (of `want` over `n` devices) from
// the blocks of `from` over the source slice's `m` devices: one box per
// distinct source block that meets it, from the replica on the same device,
// else on the same worker, else one picked by `j` (spreading the reads).
template <typename SourceKey>
absl::Status AddBoxPieces(const ArgSpec& from, int m, const ArgSpec& want,
                          int n, int j, const SliceRecord& src,
                          const DeviceRef& dst, SourceKey source_key,
                          proto::InputBinding* binding) {
  auto dst_box = want.BlockOf(n, j);
  if (!dst_box.ok()) return dst_box.status();
  const size_t rank = dst_box->start.size();
  // Source devices grouped by the block they hold, in first-seen order.
  std::map<Shape, std::vector<int>> holders;
  std::vector<std::pair<Shape, Box>> blocks;
  for (int k = 0; k < m; ++k) {
    auto box = from.BlockOf(m, k);
    if (!box.ok()) return box.status();
    auto [it, fresh] = holders.try_emplace(box->start);
    if (fresh) blocks.emplace_back(box->start, *box);
    it->second.push_back(k);
  }
  for (const auto& [start, box] : blocks) {
    Box cut{Shape(rank), Shape(rank)};
    bool meets = true;
    for (size_t d = 0; d < rank; ++d) {
      const int64_t lo = std::max(box.start[d], dst_box->start[d]);
      const int64_t hi = std::min(box.start[d] + box.extent[d],
                                  dst_box->start[d] + dst_box->extent[d]);
      if (hi <= lo) meets = false;
      cut.start[d] = lo;
      cut.extent[d] = std::max<int64_t>(hi - lo, 0);
    }
    if (!meets) continue;  // (an empty array has no pieces to gather)
    const std::vector<int>& ks = holders[start];
    int k = ks[j % ks.size()];
    for (int c : ks) {
      if (src.devices[c] == dst) {
        k = c;
        break;
      }
      if (src.devices[c].worker_id == dst.worker_id) k = c;
    }
    auto [id, shard] = source_key(k);
    proto::Piece* p = binding->add_pieces();
    p->set_buffer_id(id);
    p->set_shard(shard);
    for (size_t d = 0; d < rank; ++d) {
      p->add_src_shape(box.extent[d]);
      p->add_src_start(cut.start[d] - box.start[d]);
      p->add_dst_start(cut.start[d] - dst_box->start[d]);
      p->add_extent(cut.extent[d]);
    }
  }
  return absl::OkStatus();
}

// Whether two layouts are written alike, so that they parse alike: every
// field of ArgDef, TensorSpec and Sharding (a field added there is compared
// here too; LayoutProtoTest.ALayoutIsComparedByEveryFieldItHas counts them).
bool SameArgDef(const proto::ArgDef& a, const proto::ArgDef& b) {
  auto same = [](const auto& x, const auto& y) {
    return x.size() == y.size() && std::equal(x.begin(), x.end(), y.begin());
  };
  const proto::Sharding& sa = a.sharding();
  const proto::Sharding& sb = b.sharding();
  if (a.global().dtype() != b.global().dtype() ||
      !same(a.global().shape(), b.global().shape()) || sa.kind() != sb.kind() ||
      sa.axis() != sb.axis() || !same(sa.mesh(), sb.mesh()) ||
      !same(sa.mesh_axis_names(), sb.mesh_axis_names()) ||
      sa.dim_axes_size() != sb.dim_axes_size()) {
    return false;
  }
  for (int d = 0; d < sa.dim_axes_size(); ++d) {
    if (!same(sa.dim_axes(d).values(), sb.dim_axes(d).values())) return false;
  }
  return true;
}

// Input `i` of `prog` as each device of a slice of `n` holds it, kept
// with the program for the last slice size it was called on.
const LocalInput& LocalInputOf(ProgramRecord& prog, int i, int n) {
  if (prog.local_inputs_shards != n ||
      prog.local_inputs.size() != prog.inputs.size()) {
    prog.local_inputs.clear();
    for (const ArgSpec& in : prog.inputs) {
      LocalInput& local = prog.local_inputs.emplace_back();
      local.spec = in.Local(n);
      if (local.spec.ok()) {
        local.proto = ToProto(*local.spec);
        local.bytes = local.proto.SerializeAsString();
      }
    }
    prog.local_inputs_shards = n;
  }
  return prog.local_inputs[i];
}

// The slice's workers in slice order, each once with its count of
// shards, each shard's index among them, and each host's devices and
// shards under a new layout id (from `next_layout_id`): its RouteCache,
// made again only when the map changed.
SliceRecord::RouteCache& HostsOf(const SliceRecord& slice,
                                 uint64_t* next_layout_id) {
  SliceRecord::RouteCache& cache = slice.route_cache;
  if (cache.for_devices == slice.devices) return cache;
  cache.for_devices = slice.devices;
  cache.hosts.clear();
  cache.host_of.assign(slice.devices.size(), 0);
  cache.loaded_everywhere.clear();
  absl::flat_hash_map<int64_t, int> index;
  for (size_t j = 0; j < slice.devices.size(); ++j) {
    const int64_t w = slice.devices[j].worker_id;
    auto [it, fresh] =
        index.try_emplace(w, static_cast<int>(cache.hosts.size()));
    if (fresh) cache.hosts.emplace_back(w, 0);
    cache.hosts[it->second].second++;
    cache.host_of[j] = it->second;
  }
  // Each host's tasks, in slice order: a counting sort by host.
  auto layout = std::make_shared<ShardLayoutMap>();
  layout->layout_id = (*next_layout_id)++;
  for (const auto& [w, shards] : cache.hosts) layout->workers.push_back(w);
  layout->begin.assign(cache.hosts.size() + 1, 0);
  for (int h : cache.host_of) layout->begin[h + 1]++;
  for (size_t h = 1; h < layout->begin.size(); ++h) {
    layout->begin[h] += layout->begin[h - 1];
  }
  layout->tasks.resize(slice.devices.size());
  std::vector<uint32_t> next(layout->begin.begin(), layout->begin.end() - 1);
  for (size_t j = 0; j < slice.devices.size(); ++j) {
    layout->tasks[next[cache.host_of[j]]++] = {slice.devices[j].device,
                                               static_cast<int32_t>(j)};
  }
  cache.layout = std::move(layout);
  cache.layout_told = false;
  return cache;
}

// Input `in`'s binding for shard `j` as a proto (`local`: in.local,
// parsed): what CallExecutes::AddOwnShardsHosts encodes for it.
void AddOwnShard(const OwnShardInput& in, const proto::TensorSpec& local, int j,
                 proto::InputBinding* binding) {
  *binding->mutable_local() = local;
  if (in.donate) binding->set_donate(true);
  binding->set_axis(in.axis);
  proto::Piece* p = binding->add_pieces();
  p->set_buffer_id(in.buffer_id);
  p->set_shard(j);
  p->set_length(in.length);
}

}  // namespace

uint64_t ClusterState::NextTemporary() {
  const uint64_t temp = ClientMadeId(kServerClientId, next_transfer_);
  // A temporary lives only until the call that reads it is done, so the
  // count starts again at 1 after the layout's last (kMaxIdCount): an id
  // 2^39 transfers old is long released. Never past it (that would spill
  // into the server-made half, or another client's ids).
  next_transfer_ = next_transfer_ >= kMaxIdCount ? 1 : next_transfer_ + 1;
  ReserveTransfers();
  return temp;
}

absl::Status ClusterState::RouteCall(uint64_t client_id,
                                     const proto::Call& call, WorkerOps* ops,
                                     uint64_t* seq) {
  std::shared_ptr<CallExecutes> executes;
  absl::Status s = RouteCall(client_id, call, ops, seq, &executes);
  if (!s.ok()) return s;
  for (int h = 0; h < executes->hosts(); ++h) {
    proto::WorkerOp op;
    *op.mutable_execute() = executes->Execute(h);
    (*ops)[executes->worker(h)].push_back(std::move(op));
  }
  return s;
}

absl::Status ClusterState::RouteCall(uint64_t client_id,
                                     const proto::Call& call_as_sent,
                                     WorkerOps* ops, uint64_t* seq,
                                     std::shared_ptr<CallExecutes>* executes) {
  // Inputs that recovery gave new ids are read under those.
  std::optional<proto::Call> translated;
  const proto::Call* t = Translated(call_as_sent, &translated);
  const proto::Call& call = t != nullptr ? *t : call_as_sent;
  ClientRecord* client = FindClient(client_id);
  if (client == nullptr) return absl::NotFoundError("unknown client");
  if (ClientOfBuffer(call.program_id()) != client_id) {
    return absl::PermissionDeniedError(absl::StrCat(
        "program ", call.program_id(), " belongs to another client"));
  }
  auto pit = client->programs.find(call.program_id());
  if (pit == client->programs.end()) {
    return absl::NotFoundError(
        absl::StrCat("program ", call.program_id(), " was never registered"));
  }
  const ProgramRecord& prog = pit->second;
  // Error context, built only when an error needs it (this is the hot path).
  auto what = [&] { return absl::StrCat("program '", prog.def.name(), "'"); };
  auto slice_or = UsableSlice(client_id, call.slice_id(), what);
  if (!slice_or.ok()) return slice_or.status();
  const SliceRecord& slice = **slice_or;
  if (!prog.stale.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(what(), " ", prog.stale));
  }
  const int n = static_cast<int>(slice.devices.size());
  if (absl::Status s = CheckArgumentCount(prog.def.name(), prog.inputs.size(),
                                          call.inputs_size());
      !s.ok()) {
    return s;
  }
  if (call.output_ids_size() != static_cast<int>(prog.outputs.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(what(), " has ", prog.outputs.size(), " outputs, got ",
                     call.output_ids_size(), " output ids"));
  }
  for (uint64_t id : call.output_ids()) {
    if (ClientOfBuffer(id) != client_id) {
      return absl::PermissionDeniedError(absl::StrCat(
          what(), ": output id ", id, " belongs to another client"));
    }
  }

  // Each shard's task. While every input is read by each shard from its
  // own shard of the value (the usual call: OwnShardInput), the inputs are
  // listed in `own` and each host's tasks are encoded from them directly
  // below. The first input that is not makes them protos, built in
  // routing's scratch (its messages kept from call to call) with the
  // inputs before it, and encoded from those.
  std::vector<std::unique_ptr<proto::ShardTask>>& tasks = route_tasks_;
  std::vector<OwnShardInput>& own = route_own_;
  std::vector<const proto::TensorSpec*>& own_local = route_own_local_;
  own.clear();
  own_local.clear();
  bool as_protos = false;
  auto make_protos = [&] {
    while (tasks.size() < static_cast<size_t>(n)) {
      tasks.push_back(std::make_unique<proto::ShardTask>());
    }
    for (int j = 0; j < n; ++j) {
      tasks[j]->Clear();
      tasks[j]->set_device(slice.devices[j].device);
      tasks[j]->set_shard(j);
      for (size_t k = 0; k < own.size(); ++k) {
        AddOwnShard(own[k], *own_local[k], j, tasks[j]->add_inputs());
      }
    }
    as_protos = true;
  };
  std::map<TransferKey, uint64_t> transfers;
  WorkerOps staged;  // transfers and expects: only kept if the call routes
  // Its record (kept if it routes), with the layouts parsed here.
  CallRecord call_record;
  call_record.client_id = client_id;
  call_record.call_id = call.call_id();
  call_record.slice_id = call.slice_id();
  call_record.program_id = call.program_id();
  call_record.one_host = OnOneHost(slice);
  call_record.routed = now_;
  call_record.site = call.site();
  call_record.graph_id = call.graph_id();
  call_record.inputs.reserve(call.inputs_size());
  call_record.output_ids.assign(call.output_ids().begin(),
                                call.output_ids().end());

  for (int i = 0; i < call.inputs_size(); ++i) {
    const proto::InputRef& ref = call.inputs(i);
    auto arg_what = [&] { return absl::StrCat(what(), " argument ", i); };
    // An id is not a permission: only the client's own buffers go in (the
    // workers would otherwise hand this call another client's shards).
    if (ClientOfBuffer(ref.buffer_id()) != client_id) {
      return absl::PermissionDeniedError(
          absl::StrCat(arg_what(), ": buffer id ", ref.buffer_id(),
                       " belongs to another client"));
    }
    if (!lost_.empty()) {
      auto lost = lost_.find(ref.buffer_id());
      if (lost != lost_.end()) {
        // Its outputs can never be made either: a call that reads one is
        // refused in turn, for the same reason (not left to wait for them).
        const absl::Status cause = lost->second;
        for (uint64_t o : call.output_ids()) lost_[o] = cause;
        return absl::DataLossError(
            absl::StrCat(arg_what(), ": ", cause.message()));
      }
    }
    // The value moves from its own layout (`arg`, on its slice) to the
    // one the program was compiled for (`want`, on the call's slice). Most
    // calls name none (the program's: proto InputRef.arg), or the layout
    // as the program was registered with: that one is not parsed again.
    const ArgSpec& want = prog.inputs[i];
    absl::StatusOr<ArgSpec> parsed;
    const bool as_registered =
        !ref.has_arg() || SameArgDef(ref.arg(), prog.def.inputs(i));
    if (!as_registered) {
      parsed = FromProto(ref.arg());
      if (!parsed.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(arg_what(), ": ", parsed.status().message()));
      }
    }
    const ArgSpec* arg = as_registered ? &want : &*parsed;
    if (!CanRelayout(*arg, want)) {
      return absl::InvalidArgumentError(
          absl::StrCat(arg_what(), " is ", arg->ToString(),
                       " but the program was compiled for ", want.ToString()));
    }
    auto src_or = UsableSlice(client_id, ref.slice_id(), arg_what);
    if (!src_or.ok()) return src_or.status();
    const SliceRecord& src = **src_or;
    const int m = static_cast<int>(src.devices.size());
    // What each device of the call's slice holds of it (computed once per
    // program and slice size); the same of the value's own layout when it
    // is the program's, over as many devices.
    const LocalInput& local = LocalInputOf(pit->second, i, n);
    const absl::StatusOr<TensorSpec>& local_c = local.spec;
    const bool program_layout =
        as_registered ||
        (*arg == want && arg->sharding.axis_names == want.sharding.axis_names);
    std::optional<absl::StatusOr<TensorSpec>> own_local_p;
    if (!program_layout || m != n) own_local_p = arg->Local(m);
    const absl::StatusOr<TensorSpec>& local_p =
        own_local_p.has_value() ? *own_local_p : local_c;
    if (!local_c.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(arg_what(), ": ", local_c.status().message()));
    }
    if (!local_p.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(arg_what(), ": ", local_p.status().message()));
    }
    const bool same_layout =
        src.devices == slice.devices && arg->sharding == want.sharding;
    // Layouts other than one split or replicated on both sides (a mesh
    // PartitionSpec, or a change of layout) move N-D boxes.
    const bool boxes = !same_layout && (arg->sharding != want.sharding ||
                                        arg->sharding.is_mesh());
    if (arg->sharding.is_partial() && !same_layout) {
      return absl::InvalidArgumentError(absl::StrCat(
          arg_what(), " is partial (a sum not yet reduced) on slice ", src.id,
          "; all_reduce it before using it on slice ", slice.id));
    }

    // The key under which consumer `dst` finds source shard `k`.
    auto source_key = [&](int k,
                          const DeviceRef& dst) -> std::pair<uint64_t, int> {
      const DeviceRef& s = src.devices[k];
      if (s.worker_id == dst.worker_id) return {ref.buffer_id(), k};
      TransferKey tk{ref.buffer_id(), k, dst.worker_id};
      auto it = transfers.find(tk);
      if (it != transfers.end()) return {it->second, 0};
      const uint64_t temp = NextTemporary();
      transfers[tk] = temp;
      proto::WorkerOp t;
      auto* tr = t.mutable_transfer();
      tr->set_buffer_id(ref.buffer_id());
      tr->set_shard(k);
      tr->set_dst_worker_id(dst.worker_id);
      tr->set_dst_buffer_id(temp);
      tr->set_dst_device(dst.device);
      tr->set_call_id(call.call_id());
      TellPeer(s.worker_id, dst.worker_id);
      staged[s.worker_id].push_back(std::move(t));
      proto::WorkerOp e;
      auto* ex = e.mutable_expect();
      ex->set_buffer_id(temp);
      ex->set_src_worker_id(s.worker_id);
      ex->set_device(dst.device);
      *ex->mutable_spec() = ToProto(*local_p);
      staged[dst.worker_id].push_back(std::move(e));
      return {temp, 0};
    };

    const bool donate =
        !prog.donated.empty() && MayDonate(prog, call, i, same_layout);
    const int64_t rows =
        arg->sharding.is_split() ? arg->global.shape[arg->sharding.axis] : 1;
    const int32_t axis = arg->sharding.is_split() ? arg->sharding.axis : 0;
    if (same_layout && !as_protos) {
      // Each shard reads its own: one piece, the whole shard.
      own.push_back({ref.buffer_id(), rows / n, axis, donate, &local.bytes});
      own_local.push_back(&local.proto);
    } else if (!as_protos) {
      make_protos();
    }
    for (int j = 0; as_protos && j < n; ++j) {
      const DeviceRef& dst = slice.devices[j];
      proto::InputBinding* binding = tasks[j]->add_inputs();
      if (same_layout) {
        AddOwnShard({ref.buffer_id(), rows / n, axis, donate, &local.bytes},
                    local.proto, j, binding);
        continue;
      }
      *binding->mutable_local() = local.proto;
      if (donate) binding->set_donate(true);
      binding->set_axis(axis);
      auto add_piece = [&](int k, int64_t src_off, int64_t dst_off,
                           int64_t len) {
        auto [id, shard] = source_key(k, dst);
        proto::Piece* p = binding->add_pieces();
        p->set_buffer_id(id);
        p->set_shard(shard);
        p->set_src_offset(src_off);
        p->set_dst_offset(dst_off);
        p->set_length(len);
      };
      if (boxes) {
        absl::Status s = AddBoxPieces(
            *arg, m, want, n, j, src, dst,
            [&](int k) { return source_key(k, dst); }, binding);
        if (!s.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat(arg_what(), ": ", s.message()));
        }
      } else if (!arg->sharding.is_split()) {
        // Replicated: any source copy will do; prefer one on this worker.
        int k = j % m;
        for (int c = 0; c < m; ++c) {
          if (src.devices[c] == dst) {
            k = c;
            break;
          }
          if (src.devices[c].worker_id == dst.worker_id) k = c;
        }
        add_piece(k, 0, 0, rows);
      } else {
        const int64_t lc = rows / n, lp = rows / m;
        const int64_t start = j * lc, end = start + lc;
        // An empty array (lc == lp == 0) has no rows to gather.
        for (int64_t k = lp > 0 ? start / lp : 0; lp > 0 && k * lp < end; ++k) {
          const int64_t ps = k * lp;
          const int64_t s = std::max(start, ps), e = std::min(end, ps + lp);
          add_piece(static_cast<int>(k), s - ps, s - start, e - s);
        }
      }
    }
    // Most calls name the layout their program takes: the record points
    // at the program's (no copy, nothing allocated per call).
    if (program_layout) {
      call_record.inputs.emplace_back(ref.buffer_id(), ref.slice_id(), &want);
    } else {
      call_record.inputs.emplace_back(ref.buffer_id(), ref.slice_id(),
                                      *std::move(parsed));
    }
  }

  // The outputs' bytes count against the tenant's max_bytes.
  ProgramRecord& record = pit->second;
  if (record.output_bytes_shards != n) {
    record.output_bytes.clear();
    record.output_bytes_total = 0;
    for (const ArgSpec& out : record.outputs) {
      auto local = out.Local(n);
      if (!local.ok()) return local.status();
      record.output_bytes.push_back(static_cast<int64_t>(local->byte_size()) *
                                    n);
      record.output_bytes_total += record.output_bytes.back();
    }
    record.output_bytes_shards = n;
  }
  if (absl::Status quota =
          CheckBytesQuota(*client, record.output_bytes_total, what);
      !quota.ok()) {
    return quota;
  }
  for (int o = 0; o < call.output_ids_size(); ++o) {
    RecordBuffer(*client, call.output_ids(o), record.output_bytes[o]);
  }

  // Everything validated: commit the ops.
  for (auto& [w, list] : staged) {
    auto& out = (*ops)[w];
    for (auto& op : list) out.push_back(std::move(op));
  }
  // Workers in slice order, each once, with their shards of the call.
  SliceRecord::RouteCache& hosts = HostsOf(slice, &next_layout_id_);
  // The Execute fields every host shares, encoded once.
  route_shared_.Clear();
  route_shared_.set_call_id(call.call_id());
  route_shared_.set_program_id(call.program_id());
  route_shared_.set_num_shards(n);
  route_shared_.set_client_id(client_id);
  route_shared_.set_relay(call.relay());
  route_shared_.set_relay_first_shard(call.relay() && call.relay_first_shard());
  *route_shared_.mutable_output_ids() = call.output_ids();
  if (prog.collective) {
    // New each time the call is routed: a run after a restart or a loss
    // never meets an earlier run's partials.
    route_shared_.set_exchange_id(NextTemporary());
    // Its ranks send to each other: each host is told of the others once
    // per map of the slice.
    if (slice.peers_told_for != slice.devices) {
      for (const auto& [w, shards] : hosts.hosts) {
        for (const auto& [p, other] : hosts.hosts) TellPeer(w, p);
      }
      slice.peers_told_for = slice.devices;
    }
    for (const auto& [p, shards] : hosts.hosts) {
      auto* peer = route_shared_.add_peers();
      peer->set_worker_id(p);
      peer->set_local_shards(shards);
      peer->set_nccl(workers_[p].info.nccl());
    }
  }
  auto made = std::make_shared<CallExecutes>(
      route_shared_, static_cast<int>(hosts.hosts.size()));
  const ShardLayoutMap& layout = *hosts.layout;  // each host's tasks
  // The program goes to each host that lacks it, found host by host only
  // until every host of the map has it.
  if (hosts.programs_epoch != programs_unloaded_) {
    hosts.loaded_everywhere.clear();
    hosts.programs_epoch = programs_unloaded_;
  }
  if (!hosts.loaded_everywhere.contains(call.program_id())) {
    for (const auto& [w, shards] : hosts.hosts) {
      if (workers_[w].loaded_programs.insert(call.program_id()).second) {
        proto::WorkerOp load;
        load.mutable_load()->set_program_id(call.program_id());
        *load.mutable_load()->mutable_program() = prog.def;
        (*ops)[w].push_back(std::move(load));
      }
    }
    hosts.loaded_everywhere.insert(call.program_id());
  }
  if (as_protos) {
    int from = 0;
    absl::InlinedVector<const proto::ShardTask*, 8> host_tasks;
    for (const auto& [w, shards] : hosts.hosts) {
      host_tasks.clear();
      for (int k = from; k < from + shards; ++k) {
        host_tasks.push_back(tasks[layout.tasks[k].shard].get());
      }
      made->AddHost(w, host_tasks);
      from += shards;
    }
  } else if (hosts.hosts.size() == 1) {
    // One host: its tasks are written once either way, and listed they
    // cost its worker no expansion.
    made->AddOwnShardsHosts(hosts.hosts, layout.tasks, own);
  } else {
    // Every host gets the same Execute, naming the map's layout: each is
    // told its part once, as a peer is (TakePeerOps: ahead of every unit
    // not yet admitted, never held or dropped with one), so it knows the
    // layout before any call that names it.
    if (!hosts.layout_told) {
      for (size_t h = 0; h < hosts.hosts.size(); ++h) {
        proto::WorkerOp tell;
        *tell.mutable_shard_layout() =
            layout.OpFor(static_cast<int>(h), client_id);
        peer_ops_[hosts.hosts[h].first].push_back(std::move(tell));
      }
      hosts.layout_told = true;
    }
    made->AddOwnShardsLayout(hosts.layout, own);
  }
  *executes = std::move(made);
  calls_routed_++;
  transfers_routed_ += static_cast<int64_t>(transfers.size());
  const uint64_t routed = next_seq_++;
  records_.AddCall(routed, std::move(call_record), record.outputs);
  if (seq != nullptr) *seq = routed;
  return absl::OkStatus();
}

bool ClusterState::MayDonate(const ProgramRecord& prog, const proto::Call& call,
                             int i, bool same_layout) const {
  if (!same_layout || records_.keep_lineage() ||
      std::find(prog.donated.begin(), prog.donated.end(), i) ==
          prog.donated.end()) {
    return false;
  }
  const uint64_t id = call.inputs(i).buffer_id();
  for (int k = 0; k < call.inputs_size(); ++k) {
    if (k != i && call.inputs(k).buffer_id() == id) return false;
  }
  if (snapshots_.contains(id)) return false;
  const BufferRecord* record = records_.FindBuffer(id);
  return record != nullptr && record->readers == 0 && !record->released;
}

}  // namespace plexus
