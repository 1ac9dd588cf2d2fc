#include "plexus/server/why/why.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "plexus/common/ids.h"

namespace plexus {
namespace {

// A chain longer than this is cut (records form no cycle, but a bound
// keeps one status request cheap whatever the job).
constexpr int kMaxChain = 256;

std::string ProgramName(const ClusterState& state, const CallRecord& call) {
  const ClientRecord* client = state.FindClient(call.client_id);
  if (client != nullptr) {
    auto it = client->programs.find(call.program_id);
    if (it != client->programs.end()) return it->second.def.name();
  }
  return absl::StrCat("program ", call.program_id);
}

// Where the client issued `call` (Call.site: "train.py:58 in step"), or
// null when it did not say.
const std::string* SiteOf(const ClusterState& state, const CallRecord& call) {
  if (call.site == 0) return nullptr;
  const ClientRecord* client = state.FindClient(call.client_id);
  if (client == nullptr) return nullptr;
  auto it = client->call_sites.find(call.site);
  return it == client->call_sites.end() ? nullptr : &it->second;
}

// "call 12 ('consumer' issued at train.py:58 in step)".
std::string CallName(const ClusterState& state, const CallRecord& call) {
  const std::string* site = SiteOf(state, call);
  return absl::StrCat("call ", call.call_id, " ('", ProgramName(state, call),
                      "'", site ? absl::StrCat(" issued at ", *site) : "", ")");
}

// "buffer 7 (the output of call 11 ('scale' issued at train.py:40 in
// step))", or "buffer 7 (a put)": the value, by the line that made it.
std::string ValueName(const ClusterState& state, uint64_t buffer_id) {
  const BufferRecord* b = state.records().FindBuffer(buffer_id);
  std::string made;
  if (b != nullptr && b->producer != 0) {
    if (const CallRecord* p = state.records().calls().Find(b->producer)) {
      made = absl::StrCat(" (the output of ", CallName(state, *p), ")");
    }
  } else if (b != nullptr && b->put) {
    made = " (a put)";
  }
  return absl::StrCat("buffer ", buffer_id, made);
}

// "client 3 (holder, tenant default, weight 1)".
std::string ClientShare(const ClusterState& state, uint64_t client_id,
                        double weight) {
  const ClientRecord* c = state.FindClient(client_id);
  return absl::StrCat(
      "client ", client_id, " (",
      c != nullptr && !c->name.empty() ? absl::StrCat(c->name, ", ") : "",
      "tenant ", c != nullptr ? c->tenant : "?", ", weight ",
      absl::StrFormat("%g", weight), ")");
}

std::string Seconds(absl::Duration d) {
  return absl::StrCat(absl::ToInt64Milliseconds(d) / 100 / 10.0, " s");
}

struct Root {
  std::string reason;
  std::string blame_host;
};

std::string MiB(int64_t bytes) {
  return absl::StrCat(absl::StrFormat("%.1f", bytes / 1048576.0), " MiB");
}

// Device `d` of `worker` is full and something waits on it for room: how
// full, and whose values hold it (from the records: every live buffer of a
// slice mapped onto it, its shard's bytes, by client), the most first.
std::string FullDevice(const ClusterState& state, const WorkerRecord& worker,
                       int32_t d, int64_t waiting) {
  struct Held {
    int64_t bytes = 0;
    int64_t values = 0;
  };
  std::map<uint64_t, Held> by_client;
  for (const auto& [id, b] : state.records().buffers()) {
    if (b.released) continue;
    auto slice = state.slices().find(b.slice_id);
    if (slice == state.slices().end()) continue;
    const std::vector<DeviceRef>& devices = slice->second.devices;
    int64_t shards_here = 0;
    for (const DeviceRef& ref : devices) {
      if (ref.worker_id == worker.id && ref.device == d) ++shards_here;
    }
    if (shards_here == 0) continue;
    absl::StatusOr<TensorSpec> local =
        b.spec().Local(static_cast<int>(devices.size()));
    const int64_t shard =
        local.ok() ? local->byte_size() : b.spec().global.byte_size();
    Held& h = by_client[ClientOfBuffer(id)];
    h.bytes += shard * shards_here;
    ++h.values;
  }
  std::vector<std::pair<uint64_t, Held>> holders(by_client.begin(),
                                                 by_client.end());
  std::sort(holders.begin(), holders.end(), [](const auto& a, const auto& b) {
    return a.second.bytes > b.second.bytes;
  });
  std::vector<std::string> named;
  for (size_t i = 0; i < holders.size() && i < 3; ++i) {
    const auto& [client_id, held] = holders[i];
    const ClientRecord* c = state.FindClient(client_id);
    named.push_back(absl::StrCat("client ", client_id,
                                 c != nullptr && !c->name.empty()
                                     ? absl::StrCat(" (", c->name, ")")
                                     : "",
                                 " ", MiB(held.bytes), " in ", held.values,
                                 held.values == 1 ? " value" : " values"));
  }
  if (holders.size() > 3) {
    absl::StrAppend(&named.back(), ", and ", holders.size() - 3,
                    " more client(s)");
  }
  const int64_t used = d < worker.stats.device_live_bytes_size()
                           ? worker.stats.device_live_bytes(d)
                           : 0;
  int64_t budget = 0;
  for (const proto::DeviceInfo& info : worker.info.devices()) {
    if (info.index() == d) budget = info.memory_bytes();
  }
  return absl::StrCat(
      "device ", d, " of host ", worker.info.host_name(), " is full (",
      MiB(used), " of ", MiB(budget), " in use; ", MiB(waiting),
      " wait for room)",
      named.empty() ? ""
                    : absl::StrCat(", held by ", absl::StrJoin(named, "; ")),
      ": release values no longer needed (or donate them), or give the "
      "workers more memory (--device-memory-mib)");
}

// How long `worker` has been compiling an island of `program_id`, by its
// last report (the time it gave then, plus the time since), or zero if it
// said it is not.
absl::Duration Compiling(const WorkerRecord& worker, uint64_t program_id,
                         absl::Time now) {
  absl::Duration longest = absl::ZeroDuration();
  for (const proto::CompileInProgress& c : worker.stats.compiling()) {
    if (c.program_id() != program_id) continue;
    longest = std::max(longest, absl::Milliseconds(c.elapsed_ms()) +
                                    std::max(absl::ZeroDuration(),
                                             now - worker.last_heartbeat));
  }
  return longest;
}

// The first call not done in each device's queue: of the calls routed to
// a device (its slice's) and admitted (not in `at_admission`, seq ->
// client), the one routed first (lowest seq). A device runs
// its calls in that order, so a later call waits behind it.
using Heads = absl::flat_hash_map<std::pair<int64_t, int32_t>,
                                  std::pair<uint64_t, const CallRecord*>>;

Heads QueueHeads(const ClusterState& state,
                 const absl::flat_hash_map<uint64_t, uint64_t>& at_admission) {
  Heads heads;
  for (const auto& [seq, call] : state.records().calls()) {
    if (call.done || call.routed == absl::InfinitePast()) continue;
    if (at_admission.count(seq)) continue;  // in no device's queue yet
    auto slice = state.slices().find(call.slice_id);
    if (slice == state.slices().end()) continue;
    for (const DeviceRef& d : slice->second.devices) {
      auto [it, fresh] = heads.try_emplace({d.worker_id, d.device}, seq, &call);
      if (!fresh && seq < it->second.first) it->second = {seq, &call};
    }
  }
  return heads;
}

// What keeps `worker` from working, if anything: lost, or silent for
// longer than options.silent_after (a stopped or hung process).
std::optional<std::string> HostTrouble(const WorkerRecord& worker,
                                       const WhyOptions& options) {
  const std::string& host = worker.info.host_name();
  if (!worker.alive) {
    return absl::StrCat("host ", host, " (worker ", worker.id,
                        ") was lost: ", worker.down_reason);
  }
  const absl::Duration silent = options.now - worker.last_heartbeat;
  if (silent > options.silent_after) {
    return absl::StrCat("host ", host, " (worker ", worker.id, ", pid ",
                        worker.info.pid(), ") has sent no heartbeat for ",
                        absl::ToInt64Milliseconds(silent),
                        " ms: its process is stopped (SIGSTOP) or hung, and "
                        "is declared lost once the heartbeat timeout passes");
  }
  return std::nullopt;
}

// Of `seq`'s workers, those that have not reported it done (null:
// unknown, so none counts as finished).
const absl::InlinedVector<int64_t, 4>* NotDone(uint64_t seq,
                                               const WhyOptions& options) {
  if (options.not_done == nullptr) return nullptr;
  auto it = options.not_done->find(seq);
  return it == options.not_done->end() ? nullptr : &it->second;
}

// The calls at admission and those in flight, by client (from
// WhyOptions::admission and not_done).
struct AdmissionState {
  absl::flat_hash_map<uint64_t, uint64_t> at_admission;  // seq -> client
  std::map<uint64_t, int64_t> in_flight;                 // client -> calls
  std::map<uint64_t, uint64_t> oldest_in_flight;         // client -> seq
};

AdmissionState SurveyAdmission(const ClusterState& state,
                               const WhyOptions& options) {
  AdmissionState a;
  if (options.admission != nullptr) {
    for (const auto& [client, queue] : *options.admission) {
      for (uint64_t seq : queue.seqs) a.at_admission[seq] = client;
    }
  }
  if (options.not_done != nullptr) {
    for (const auto& [seq, workers] : *options.not_done) {
      const CallRecord* call = state.records().calls().Find(seq);
      if (call == nullptr) continue;
      ++a.in_flight[call->client_id];
      auto [it, fresh] = a.oldest_in_flight.try_emplace(call->client_id, seq);
      if (!fresh) it->second = std::min(it->second, seq);
    }
  }
  return a;
}

// Why the call, at admission, waits there: its client's share (tenant and
// weight), and whose calls are in flight, with the oldest of the others'
// (blamed: its first host).
Root AdmissionRoot(const ClusterState& state, uint64_t client_id,
                   const AdmissionState& a, const WhyOptions& options) {
  auto weight = [&](uint64_t c) {
    auto it = options.admission->find(c);
    return it == options.admission->end() ? 1.0 : it->second.weight;
  };
  const ClientRecord* me = state.FindClient(client_id);
  const size_t queued = options.admission->at(client_id).seqs.size();
  std::string reason = absl::StrCat(
      "it waits at admission for its client's share (tenant ",
      me != nullptr ? me->tenant : "?", ", weight ",
      absl::StrFormat("%g", weight(client_id)), ")",
      queued > 1 ? absl::StrCat(", with ", queued - 1, " more of its calls")
                 : "",
      "; calls in flight: its own ",
      a.in_flight.count(client_id) ? a.in_flight.at(client_id) : 0);
  uint64_t oldest = 0;
  for (const auto& [c, n] : a.in_flight) {
    if (c == client_id) continue;
    absl::StrAppend(&reason, ", ", ClientShare(state, c, weight(c)), " ", n);
    const uint64_t seq = a.oldest_in_flight.at(c);
    if (oldest == 0 || seq < oldest) oldest = seq;
  }
  const CallRecord* first =
      oldest == 0 ? nullptr : state.records().calls().Find(oldest);
  if (first == nullptr) return {reason, ""};
  absl::StrAppend(&reason, "; the oldest of theirs is ",
                  CallName(state, *first), " of client ", first->client_id,
                  ", routed ", Seconds(options.now - first->routed), " ago");
  std::string host;
  auto slice = state.slices().find(first->slice_id);
  if (slice != state.slices().end() && !slice->second.devices.empty()) {
    auto w = state.workers().find(slice->second.devices.front().worker_id);
    if (w != state.workers().end()) host = w->second.info.host_name();
  }
  return {reason, host};
}

// A slice's state that keeps every call on it from finishing: released,
// broken, or waiting for a host.
std::optional<Root> SliceTrouble(const ClusterState& state,
                                 const CallRecord& call,
                                 const WhyOptions& options) {
  auto slice = state.slices().find(call.slice_id);
  if (slice == state.slices().end()) {
    return Root{absl::StrCat("its slice ", call.slice_id,
                             " was released (the calls on it still run)"),
                ""};
  }
  const SliceRecord& s = slice->second;
  if (!s.broken.empty()) {
    return Root{
        absl::StrCat("its slice ", call.slice_id, " is broken: ", s.broken),
        ""};
  }
  if (!s.awaiting.empty()) {
    return Root{absl::StrCat("its slice ", call.slice_id,
                             " waits for a host to take a lost one's place (",
                             s.awaiting, "), ",
                             Seconds(s.awaiting_until - options.now), " left"),
                ""};
  }
  return std::nullopt;
}

// The hosts of a call's slice that have not finished their part, as
// RootOnHosts surveys them.
struct CallHosts {
  std::set<std::string> hosts;
  // Hosts where an earlier call holds one of its devices, and that call.
  std::map<std::string, const CallRecord*> behind;
  // Hosts compiling its program, and for how long.
  std::map<std::string, absl::Duration> compiling;
  // Each host's worker, and its first rank (index in the slice's devices).
  std::map<std::string, const WorkerRecord*> workers;
  std::map<std::string, int> rank;
  int ranks = 0;  // the slice's devices
};

// Surveys the hosts of `call`'s slice `s` into `out` (`finished` gets
// those done with their part); a host in trouble (HostTrouble) is the
// answer at once.
std::optional<Root> SurveyHosts(const ClusterState& state, uint64_t seq,
                                const CallRecord& call, const SliceRecord& s,
                                const Heads& heads, const WhyOptions& options,
                                std::set<std::string>* finished,
                                CallHosts* out) {
  const absl::InlinedVector<int64_t, 4>* not_done = NotDone(seq, options);
  out->ranks = static_cast<int>(s.devices.size());
  for (int r = 0; r < out->ranks; ++r) {
    const DeviceRef& d = s.devices[r];
    auto w = state.workers().find(d.worker_id);
    if (w == state.workers().end()) continue;
    const WorkerRecord& worker = w->second;
    const std::string& host = worker.info.host_name();
    out->workers[host] = &worker;
    out->rank.try_emplace(host, r);
    if (not_done != nullptr && std::find(not_done->begin(), not_done->end(),
                                         d.worker_id) == not_done->end()) {
      finished->insert(host);  // its part is done: nothing there holds it
      continue;
    }
    auto head = heads.find({d.worker_id, d.device});
    if (head != heads.end() && head->second.second != &call &&
        !out->behind.count(host)) {
      out->behind[host] = head->second.second;
    }
    if (absl::Duration c = Compiling(worker, call.program_id, options.now);
        c > absl::ZeroDuration()) {
      out->compiling[host] = c;
    }
    if (std::optional<std::string> trouble = HostTrouble(worker, options)) {
      return Root{*trouble, host};
    }
    out->hosts.insert(host);
  }
  return std::nullopt;
}

// An input of `call` made on another slice's hosts, whose source host is
// lost or silent (the transfer waits for it).
std::optional<Root> InputSourceTrouble(const ClusterState& state,
                                       const CallRecord& call,
                                       const CallHosts& on,
                                       const WhyOptions& options) {
  // An input made on other hosts (its slice's) comes by a transfer from
  // there, sent once its call is done: a source host lost, or silent, has
  // not sent it.
  for (const CallInput& in : call.inputs) {
    if (in.slice_id == call.slice_id) continue;
    auto from = state.slices().find(in.slice_id);
    if (from == state.slices().end()) continue;
    for (const DeviceRef& d : from->second.devices) {
      auto w = state.workers().find(d.worker_id);
      if (w == state.workers().end() ||
          on.workers.count(w->second.info.host_name())) {
        continue;  // gone from the records, or a host of the call's own
      }
      if (std::optional<std::string> trouble =
              HostTrouble(w->second, options)) {
        return Root{absl::StrCat("its input ", ValueName(state, in.buffer_id),
                                 " is sent from another host, and ", *trouble,
                                 " (the transfer waits for it)"),
                    w->second.info.host_name()};
      }
    }
  }
  return std::nullopt;
}

// An input of `call` made on other hosts, by a call done there, whose
// hosts answer, where `call`'s hosts have not reported since it was routed
// (so their heartbeats cannot say whether its tasks wait for the input):
// the transfer from there may not have arrived, or the call runs. The
// first such input and its source host.
std::optional<Root> InputInTransit(const ClusterState& state,
                                   const CallRecord& call, const CallHosts& on,
                                   const WhyOptions& options) {
  for (const CallInput& in : call.inputs) {
    if (in.slice_id == call.slice_id) continue;
    const BufferRecord* b = state.records().FindBuffer(in.buffer_id);
    if (b == nullptr || b->producer == 0) continue;  // a put: the client's
    auto from = state.slices().find(in.slice_id);
    if (from == state.slices().end()) continue;
    for (const DeviceRef& d : from->second.devices) {
      auto w = state.workers().find(d.worker_id);
      if (w == state.workers().end()) continue;
      const std::string& peer = w->second.info.host_name();
      if (on.workers.count(peer)) continue;
      return Root{
          absl::StrCat(
              "it is first in line on ",
              on.hosts.size() == 1 ? "host " : "hosts ",
              absl::StrJoin(on.hosts, ", "), " and waits for its input ",
              ValueName(state, in.buffer_id), ", done on host ", peer,
              ", which answers (heartbeat ",
              absl::ToInt64Milliseconds(options.now - w->second.last_heartbeat),
              " ms ago) and has not sent it yet, or it runs (routed ",
              Seconds(options.now - call.routed), " ago)"),
          peer};
    }
  }
  return std::nullopt;
}

// An input of `call` that its task on `worker` waits for now, sent by a
// peer, by the worker's last heartbeat (WorkerStats.awaiting_inputs).
struct AwaitedTransfer {
  uint64_t buffer_id = 0;
  const WorkerRecord* peer = nullptr;  // null: not in the records
  int64_t peer_id = -1;
  absl::Duration waited;  // by now: the report's, plus the time since
};

// The input of `call` that the shard `awaited` from peer `peer` carries:
// the input itself, or, for a transfer's temporary (an id of the server's
// own: the records keep no map of them), the input made on the peer's
// slice (the first, if several are; one of another slice before one of the
// call's own, which moves between the slice's hosts only to change its
// layout). 0: none.
uint64_t InputCarried(const ClusterState& state, const CallRecord& call,
                      uint64_t awaited, int64_t peer) {
  for (const CallInput& in : call.inputs) {
    if (in.buffer_id == awaited) return awaited;
  }
  if (ClientOfBuffer(awaited) != kServerClientId) return 0;
  for (const bool own_slice : {false, true}) {
    for (const CallInput& in : call.inputs) {
      if ((in.slice_id == call.slice_id) != own_slice) continue;
      auto from = state.slices().find(in.slice_id);
      if (from == state.slices().end()) continue;
      for (const DeviceRef& d : from->second.devices) {
        if (d.worker_id == peer) return in.buffer_id;
      }
    }
  }
  return 0;
}

std::optional<AwaitedTransfer> AwaitedInputOf(const ClusterState& state,
                                              const CallRecord& call,
                                              const WorkerRecord& worker,
                                              absl::Time now) {
  for (const proto::InputAwaited& a : worker.stats.awaiting_inputs()) {
    if (a.source_worker() < 0) continue;  // made there: not a transfer
    const uint64_t input =
        InputCarried(state, call, a.buffer_id(), a.source_worker());
    if (input == 0) continue;
    auto w = state.workers().find(a.source_worker());
    return AwaitedTransfer{
        input, w == state.workers().end() ? nullptr : &w->second,
        a.source_worker(),
        absl::Milliseconds(a.elapsed_ms()) +
            std::max(absl::ZeroDuration(), now - worker.last_heartbeat)};
  }
  return std::nullopt;
}

// "its input buffer 7 (the output of call 3 (...)) from host host0
// (worker 1), which is alive (last heartbeat 40 ms ago) and has not
// delivered it: host host1 has awaited the transfer for 2.3 s", or the
// peer's trouble where it has some.
std::string TransferSentence(const ClusterState& state,
                             const AwaitedTransfer& t,
                             const std::string& receiver,
                             const WhyOptions& options) {
  std::string reason =
      absl::StrCat("its input ", ValueName(state, t.buffer_id), " from ");
  if (t.peer == nullptr) {
    absl::StrAppend(&reason, "worker ", t.peer_id,
                    " (gone from the records), ");
  } else if (std::optional<std::string> trouble =
                 HostTrouble(*t.peer, options)) {
    absl::StrAppend(&reason, "another host, and ", *trouble, "; ");
  } else {
    absl::StrAppend(
        &reason, "host ", t.peer->info.host_name(), " (worker ", t.peer->id,
        "), which is alive (last heartbeat ",
        absl::ToInt64Milliseconds(options.now - t.peer->last_heartbeat),
        " ms ago) and has not delivered it: ");
  }
  absl::StrAppend(&reason, "host ", receiver, " has awaited the transfer for ",
                  Seconds(t.waited),
                  " (the data plane between the two hosts stalls, or the "
                  "link is slow)");
  return reason;
}

// `call`, first in line on all its hosts, waits on one of them for an
// input from a peer (by that host's heartbeat): that transfer.
std::optional<Root> TransferAwaited(const ClusterState& state,
                                    const CallRecord& call, const CallHosts& on,
                                    const WhyOptions& options) {
  for (const std::string& host : on.hosts) {
    std::optional<AwaitedTransfer> t =
        AwaitedInputOf(state, call, *on.workers.at(host), options.now);
    if (!t.has_value()) continue;
    return Root{
        absl::StrCat("it is first in line on host ", host, " and waits for ",
                     TransferSentence(state, *t, host, options)),
        t->peer != nullptr ? t->peer->info.host_name() : ""};
  }
  return std::nullopt;
}

// Whether every host of `call` reported after it was routed: their
// heartbeats then say whether its tasks wait for inputs.
bool HostsReportedSince(const CallRecord& call, const CallHosts& on) {
  for (const std::string& host : on.hosts) {
    if (on.workers.at(host)->last_heartbeat <= call.routed) return false;
  }
  return true;
}

// A device of slice `s` whose memory is full, on a host not finished.
std::optional<Root> FullDeviceOf(const ClusterState& state,
                                 const SliceRecord& s,
                                 const std::set<std::string>& finished) {
  // A device of the slice whose memory is full, with something waiting on
  // it for room (the root call's output, or the call it is queued behind).
  for (const DeviceRef& d : s.devices) {
    auto w = state.workers().find(d.worker_id);
    if (w == state.workers().end()) continue;
    const WorkerRecord& worker = w->second;
    if (finished.count(worker.info.host_name())) continue;
    const int64_t waiting = d.device < worker.stats.device_waiting_bytes_size()
                                ? worker.stats.device_waiting_bytes(d.device)
                                : 0;
    if (waiting > 0) {
      return Root{FullDevice(state, worker, d.device, waiting),
                  worker.info.host_name()};
    }
  }
  return std::nullopt;
}

// `call` is queued behind another on some host (`on.behind` not empty).
Root QueuedBehind(const ClusterState& state, const CallRecord& call,
                  const CallHosts& on, const WhyOptions& options) {
  // The first such host: what holds it, and where this call is first in
  // line (a collective there waits for the ranks still queued).
  const auto& [host, first] = *on.behind.begin();
  std::string blame = host;
  std::vector<std::string> ready;
  for (const std::string& h : on.hosts) {
    if (on.behind.count(h)) continue;
    ready.push_back(
        on.ranks > 1 ? absl::StrCat(h, " (rank ", on.rank.at(h), ")") : h);
  }
  // Over several devices, the rank (index in the slice) that has not
  // joined: the one queued.
  const std::string rank =
      on.ranks > 1
          ? absl::StrCat("its rank ", on.rank.at(host), " (of ", on.ranks, ") ")
          : "it ";
  std::string reason = absl::StrCat(
      rank, "is queued on host ", host, " behind ", CallName(state, *first),
      first->client_id == call.client_id
          ? ""
          : absl::StrCat(" of client ", first->client_id),
      ", routed ", Seconds(options.now - first->routed), " ago");
  // That call may itself wait for its program's compile there.
  if (absl::Duration c =
          Compiling(*on.workers.at(host), first->program_id, options.now);
      c > absl::ZeroDuration()) {
    absl::StrAppend(&reason, ", whose program '", ProgramName(state, *first),
                    "' is compiling there (", Seconds(c), " so far)");
  } else if (std::optional<AwaitedTransfer> t = AwaitedInputOf(
                 state, *first, *on.workers.at(host), options.now)) {
    // ... or for a transfer from a peer: the cause is that peer's.
    absl::StrAppend(&reason, ", which waits for ",
                    TransferSentence(state, *t, host, options));
    if (t->peer != nullptr) blame = t->peer->info.host_name();
  }
  if (on.behind.size() > 1) {
    absl::StrAppend(&reason, " (and on ", on.behind.size() - 1,
                    " more host(s))");
  }
  if (!ready.empty()) {
    absl::StrAppend(&reason, "; on ", ready.size() == 1 ? "host " : "hosts ",
                    absl::StrJoin(ready, ", "),
                    " it is first in line (a collective there waits for ",
                    on.ranks > 1 ? absl::StrCat("rank ", on.rank.at(host))
                                 : "the ranks still queued",
                    ")");
  }
  return {reason, blame};
}

// Why `call` (record `seq`), whose inputs are all made (or lost), has not
// finished, on the hosts that have not finished their part (`finished`
// gets the others). The first answer that holds, in this order: its
// slice, a host in trouble, an input's source host, a full device, a call
// ahead of it, a compile, an input transfer a host awaits, else it runs.
Root RootOnHosts(const ClusterState& state, uint64_t seq,
                 const CallRecord& call, const Heads& heads,
                 const AdmissionState& admission, const WhyOptions& options,
                 std::set<std::string>* finished) {
  if (std::optional<Root> r = SliceTrouble(state, call, options)) return *r;
  if (admission.at_admission.count(seq)) {
    return AdmissionRoot(state, call.client_id, admission, options);
  }
  const SliceRecord& s = state.slices().at(call.slice_id);
  CallHosts on;
  if (std::optional<Root> r =
          SurveyHosts(state, seq, call, s, heads, options, finished, &on)) {
    return *r;
  }
  if (std::optional<Root> r = InputSourceTrouble(state, call, on, options)) {
    return *r;
  }
  if (std::optional<Root> r = FullDeviceOf(state, s, *finished)) return *r;
  if (!on.behind.empty()) return QueuedBehind(state, call, on, options);
  const std::set<std::string>& hosts = on.hosts;
  const std::map<std::string, absl::Duration>& compiling = on.compiling;
  if (!compiling.empty()) {
    // XLA compiles the program on its hosts (ahead of the first call, or
    // as the call runs): the call runs once that ends.
    absl::Duration longest = absl::ZeroDuration();
    std::vector<std::string> where;
    for (const auto& [host, c] : compiling) {
      longest = std::max(longest, c);
      where.push_back(host);
    }
    return {absl::StrCat(
                "its program '", ProgramName(state, call), "' is compiling on ",
                where.size() == 1 ? "host " : "hosts ",
                absl::StrJoin(where, ", "), " (", Seconds(longest), " so far)"),
            where.front()};
  }
  if (hosts.empty() && !finished->empty()) {
    return {"every host reported its part done; the records hear of it next",
            ""};
  }
  // The workers say which inputs their tasks wait for; where they
  // reported after the call was routed and none waits, it runs.
  if (std::optional<Root> r = TransferAwaited(state, call, on, options)) {
    return *r;
  }
  const bool reported = HostsReportedSince(call, on);
  if (!reported) {
    if (std::optional<Root> r = InputInTransit(state, call, on, options)) {
      return *r;
    }
  }
  const std::string where = absl::StrJoin(hosts, ", ");
  return {
      absl::StrCat("it is running on ", hosts.size() == 1 ? "host " : "hosts ",
                   where, ", first in line there, which answer",
                   reported ? " and say it waits for none of its inputs" : "",
                   " (routed ", Seconds(options.now - call.routed), " ago)"),
      hosts.empty() ? "" : *hosts.begin()};
}

// Why the root call `seq` has not finished, and which of its hosts
// already finished their part.
Root RootCause(const ClusterState& state, uint64_t seq, const CallRecord& call,
               const Heads& heads, const AdmissionState& admission,
               const WhyOptions& options) {
  std::set<std::string> finished;
  Root root =
      RootOnHosts(state, seq, call, heads, admission, options, &finished);
  if (!finished.empty()) {
    absl::StrAppend(&root.reason, "; ",
                    finished.size() == 1 ? "host " : "hosts ",
                    absl::StrJoin(finished, ", "),
                    finished.size() == 1 ? " has finished its part"
                                         : " have finished their parts");
  }
  return root;
}

// The entry of call `seq`, which has waited `waited`: the chain of calls
// whose outputs it waits for, followed to the root and its cause.
proto::WhyEntry ExplainCall(const ClusterState& state, uint64_t seq,
                            const CallRecord& call, absl::Duration waited,
                            const Heads& heads, const AdmissionState& admission,
                            const WhyOptions& options) {
  const JobRecords& records = state.records();
  proto::WhyEntry e;
  e.set_client_id(call.client_id);
  e.set_call_id(call.call_id);
  e.set_slice_id(call.slice_id);
  for (uint64_t out : call.output_ids) e.add_output_ids(out);
  e.set_program(ProgramName(state, call));
  if (const std::string* site = SiteOf(state, call)) e.set_site(*site);
  e.set_waited_ms(absl::ToInt64Milliseconds(waited));
  // Follow the first input not yet made to the call that makes it.
  const CallRecord* at = &call;
  uint64_t at_seq = seq;
  std::string chain;
  std::string lost;
  for (int depth = 0; depth < kMaxChain && lost.empty(); ++depth) {
    const CallRecord* next = nullptr;
    for (const CallInput& in : at->inputs) {
      if (const absl::Status* why = state.LostStatus(in.buffer_id)) {
        lost = absl::StrCat("its input ", ValueName(state, in.buffer_id),
                            " was lost: ", why->message());
        break;
      }
      const BufferRecord* b = records.FindBuffer(in.buffer_id);
      if (b == nullptr || b->producer == 0) continue;
      const CallRecord* producer = records.calls().Find(b->producer);
      if (producer != nullptr && !producer->done) {
        next = producer;
        at_seq = b->producer;
        break;
      }
    }
    if (next == nullptr) break;
    absl::StrAppend(&chain, chain.empty() ? "" : ", which waits for ",
                    CallName(state, *next));
    at = next;
  }
  Root root = lost.empty()
                  ? RootCause(state, at_seq, *at, heads, admission, options)
                  : Root{lost, ""};
  e.set_root_call_id(at->call_id);
  e.set_blame_host(root.blame_host);
  e.set_root_reason(absl::StrCat(CallName(state, *at), ": ", root.reason));
  e.set_cause(root.reason);
  e.set_reason(chain.empty()
                   ? absl::StrCat(CallName(state, call), " has waited ",
                                  Seconds(waited), ": ", root.reason)
                   : absl::StrCat(CallName(state, call), " has waited ",
                                  Seconds(waited), " for its input from ",
                                  chain, "; ", root.reason));
  return e;
}

// A client's outputs an admission entry lists at most (a flood's queue
// may hold many calls).
constexpr int kMaxAdmissionOutputs = 1024;

// One entry per client whose oldest call at admission has waited longer
// than options.after: that call's, with the outputs of all of them.
void AdmissionEntries(const ClusterState& state, const Heads& heads,
                      const AdmissionState& admission,
                      const WhyOptions& options,
                      std::vector<proto::WhyEntry>* entries) {
  if (options.admission == nullptr) return;
  for (const auto& [client, queue] : *options.admission) {
    if (queue.seqs.empty()) continue;
    const CallRecord* first = state.records().calls().Find(queue.seqs.front());
    if (first == nullptr || first->routed == absl::InfinitePast()) continue;
    const absl::Duration waited = options.now - first->routed;
    if (waited < options.after) continue;
    proto::WhyEntry e = ExplainCall(state, queue.seqs.front(), *first, waited,
                                    heads, admission, options);
    for (size_t i = 1;
         i < queue.seqs.size() && e.output_ids_size() < kMaxAdmissionOutputs;
         ++i) {
      const CallRecord* call = state.records().calls().Find(queue.seqs[i]);
      if (call == nullptr) continue;
      for (uint64_t out : call->output_ids) e.add_output_ids(out);
    }
    entries->push_back(std::move(e));
  }
}

// One entry per slice waiting for a host, or suspended by the server for
// a higher priority, longer than options.after.
void SliceEntries(const ClusterState& state, const WhyOptions& options,
                  std::vector<proto::WhyEntry>* entries) {
  auto add = [&](uint64_t id, const SliceRecord& s, absl::Duration waited,
                 const std::string& reason) {
    proto::WhyEntry e;
    e.set_client_id(s.client_id);
    e.set_slice_id(id);
    e.set_waited_ms(absl::ToInt64Milliseconds(waited));
    e.set_reason(reason);
    e.set_root_reason(reason);
    e.set_cause(reason);
    entries->push_back(std::move(e));
  };
  for (const auto& [id, s] : state.slices()) {
    if (!s.preempted.empty()) {
      const absl::Duration waited = options.now - s.preempted_since;
      if (waited < options.after) continue;
      add(id, s, waited,
          absl::StrCat("slice ", id, " has been ", s.preempted, " (",
                       Seconds(waited), " so far)"));
      continue;
    }
    if (s.awaiting.empty()) continue;
    const absl::Duration waited = options.now - s.awaiting_since;
    if (waited < options.after) continue;
    add(id, s, waited,
        absl::StrCat(
            "slice ", id, " has waited ", Seconds(waited),
            " for a host to take a lost one's place (", s.awaiting, "), ",
            Seconds(s.awaiting_until - options.now),
            " left: its calls wait for it (a spare that frees up, or a "
            "worker that joins, takes it; else the slice breaks then)"));
  }
}

}  // namespace

std::vector<proto::WhyEntry> ExplainWaits(const ClusterState& state,
                                          const WhyOptions& options) {
  const AdmissionState admission = SurveyAdmission(state, options);
  const Heads heads = QueueHeads(state, admission.at_admission);
  std::vector<proto::WhyEntry> entries;
  for (const auto& [seq, call] : state.records().calls()) {
    if (call.done || call.routed == absl::InfinitePast()) continue;
    // A call at admission is in its client's admission entry.
    if (admission.at_admission.count(seq)) continue;
    const absl::Duration waited = options.now - call.routed;
    if (waited < options.after) continue;
    entries.push_back(
        ExplainCall(state, seq, call, waited, heads, admission, options));
  }
  AdmissionEntries(state, heads, admission, options, &entries);
  SliceEntries(state, options, &entries);
  std::sort(entries.begin(), entries.end(),
            [](const proto::WhyEntry& a, const proto::WhyEntry& b) {
              return a.waited_ms() > b.waited_ms();
            });
  if (static_cast<int>(entries.size()) > options.max_entries) {
    entries.resize(options.max_entries);
  }
  return entries;
}

}  // namespace plexus
