// Admission: when each client's routed work enters the workers' queues,
// and how much of it is there at once. The fair-share and quota half of
// the central scheduler (the gang scheduler keeps the order consistent).
//
// Routing turns a client's ops into units (the ops of one call, one put,
// or a run of releases) under the server's state lock. Admission then
// decides, under a lock of its own and before anything reaches a worker,
// which unit goes next:
//
//  - One client's units go in the order it sent them.
//  - Across clients, in weighted fair order (start-time fair queuing over
//    device time): each client has a pass; a call's start tag is its
//    client's pass, and admitting it adds its estimated device time divided
//    by the client's weight; among the clients whose next unit may go, the
//    lowest pass goes first. A client that was idle starts at the virtual
//    time — the lowest start tag of the calls in flight, i.e. about the
//    one running — so idleness earns no credit, and a client that floods
//    gets what the others leave, never their share.
//  - Each call carries its start tag to the workers (Execute.start_tag): a
//    device runs a client's independent task before other clients' queued
//    tasks with higher tags (worker/task_queue.h), so a client under its
//    share waits behind the call running, not behind a flood's window.
//  - A call may go when every worker it runs on has room for it, and its
//    client has fewer calls in flight than its quota. Room is counted in
//    device time admitted to a worker and not yet reported done, per
//    device: the call's client may have up to `window_micros` there (or
//    fewer than `min_window_calls` calls), and all clients together twice
//    that. The window keeps each device busy across the round trip of a
//    completion report; the backlog waits here, where the fair order is
//    decided; and a client that floods fills only its own window, leaving
//    room for the others' calls, which then pass its queued ones on the
//    device (start tags, below).
//  - A call blocked by a full window reserves the workers it needs: calls
//    after it in fair order that need any of them wait behind it (a wide
//    call is never starved by narrow ones); calls on other workers go on,
//    so one client's stalled or slow island does not stall the others.
//    A call blocked by its own client's quota reserves nothing.
//
// A call's device time is estimated per program from what the workers
// report (CallsDone: device time per call per worker), as a moving
// average; until a program has run, `default_cost_micros`.
//
// Each admitted call gets a ticket (Execute.ticket) that the workers' reports
// name; a call is in flight until every worker it runs on has reported it,
// or has been removed. Units that touch no worker window (puts, releases)
// go as soon as they reach the head of their client's queue.
//
// Pure: no threads, no clock, no I/O; the server holds it under its
// admission lock; tests drive it directly. Not thread-safe by itself.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "plexus/proto/plexus.pb.h"
#include "plexus/server/model/cluster_state.h"
#include "plexus/server/scheduling/ticket_table.h"
#include "plexus/server/scheduling/worker_lists.h"

namespace plexus {

// One unit of routed work: the ops of one call (or put, or releases) for
// every worker involved.
struct AdmissionUnit {
  WorkerOps ops;
  // A call's Executes in wire form (ClusterState::RouteCall), one per
  // worker that runs its shards, each after that worker's ops in `ops`.
  // Null where a call's Executes are proto ops in `ops` (work recovery
  // routes again) or the unit is no call's.
  std::shared_ptr<CallExecutes> executes;
  // Set for a call: its program and the workers that run its shards (each
  // has one Execute, in `executes` or in `ops`).
  uint64_t program_id = 0;
  absl::InlinedVector<int64_t, 4> exec_workers;  // (no allocation per call)
  // The call's record (ClusterState::RouteCall's seq), reported back by
  // TakeDoneCalls once every worker has reported it done.
  uint64_t call_seq = 0;
  // When it was routed, on the server's timeline clock (0: not recorded).
  int64_t routed_ns = 0;
  // Set by Admission::Next for a call: the device time it was charged, the
  // estimate of its program times the workers it runs on (its client's
  // pass grows by this over its weight). Shown on the admission timeline.
  int64_t charged_micros = 0;
  bool is_call() const { return !exec_workers.empty(); }
};

// The unit for routed `ops`: a call's if they hold an Execute, or if
// `executes` (its Executes in wire form) is given.
AdmissionUnit MakeAdmissionUnit(
    WorkerOps ops, uint64_t call_seq = 0,
    std::shared_ptr<CallExecutes> executes = nullptr);

class Admission {
 public:
  struct Options {
    // Device time admitted per device and not yet reported done, above
    // which a worker takes no new call.
    int64_t window_micros = 5000;
    // Calls per device that may always be there, whatever their estimate
    // (a long call, or an unknown program, still goes to an idle device).
    int min_window_calls = 4;
    // Estimate for a program that has not run yet.
    int64_t default_cost_micros = 100;
  };

  // What admission knows of one client, for status and tests.
  struct ClientView {
    double weight = 1;
    int32_t max_calls_in_flight = 0;
    int64_t pending_units = 0;
    int64_t pending_calls = 0;  // waiting here
    int64_t held_units = 0;     // held while a loss is settled (Hold)
    int64_t in_flight = 0;      // admitted, not reported done
    int64_t admitted = 0;       // calls admitted so far
    int64_t device_micros = 0;  // reported device time of its calls
  };

  explicit Admission(Options options);
  Admission() : Admission(Options{}) {}

  void AddClient(uint64_t client, double weight, int32_t max_calls_in_flight);
  // Drops the client's waiting units and forgets its calls in flight (the
  // workers drop them on ClientGone). Returns the units dropped.
  int64_t RemoveClient(uint64_t client);
  void AddWorker(int64_t worker, int devices);
  // Its calls in flight end there (the server has failed them).
  void RemoveWorker(int64_t worker);
  // Calls still waiting here that run on `worker` (lost) will never run:
  // each becomes a unit that fails its outputs with `status` on the other
  // workers it touched, and goes as soon as it reaches the head of its
  // client's queue (no window). So whoever waits on such an output hears
  // at once, not after the calls in front of it have run. Returns how many.
  int64_t FailCallsOn(int64_t worker, const absl::Status& status);

  void Enqueue(uint64_t client, AdmissionUnit unit);
  // The next unit that may go, in fair order, with its Execute ops
  // stamped with their ticket. False when none may go now (call again after
  // Enqueue, Completed, RemoveWorker or RemoveClient).
  bool Next(uint64_t* client, AdmissionUnit* unit);
  // Worker `worker` reports calls done. Unknown tickets (a client or worker
  // removed since) are ignored.
  void Completed(int64_t worker, const proto::CallsDone& done);
  // The call_seq of every call all of whose workers reported it done since
  // the last call (not of calls that ended because a worker or client
  // went), and whether a task of it failed.
  std::vector<std::pair<uint64_t, bool>> TakeDoneCalls() {
    return std::move(done_calls_);
  }
  bool has_done_calls() const { return !done_calls_.empty(); }
  // The same into `out` (cleared first), whose room the next take reuses.
  void TakeDoneCalls(std::vector<std::pair<uint64_t, bool>>* out) {
    out->clear();
    out->swap(done_calls_);
  }
  // A host the client's slice uses was lost: its units still waiting here
  // are held apart, in order, after any held before (they were routed on
  // the old map; recovery routes them again on the new one once the loss
  // is settled, TakeHeld). They do not go, are not failed by FailCallsOn,
  // and count in ClientView::held_units.
  void Hold(uint64_t client);
  // The units held for the client, in order, now no longer held.
  std::vector<AdmissionUnit> TakeHeld(uint64_t client);

  const ClientView* Find(uint64_t client) const;
  // The window of `worker` now: calls and estimated device time in flight.
  std::pair<int64_t, int64_t> WorkerLoad(int64_t worker) const;
  // For each call in flight (by its record's seq, ClusterState::RouteCall),
  // the workers that have not yet reported it done: the others finished
  // their part (`plexus why`). Calls still waiting here are not in it.
  absl::flat_hash_map<uint64_t, absl::InlinedVector<int64_t, 4>>
  WorkersNotDone() const;
  // The record seqs (ClusterState::RouteCall's) of `client`'s calls still
  // waiting here, in the order they go (`plexus why`: calls at admission).
  std::vector<uint64_t> PendingCallSeqs(uint64_t client) const;
  // The current estimate of one execute of `program_id`.
  int64_t CostOf(uint64_t client, uint64_t program_id) const;

 private:
  struct Client {
    ClientView view;
    double pass = 0;
    uint64_t arrival = 0;  // tie-break: first backlogged first
    std::deque<AdmissionUnit> pending;
    std::vector<AdmissionUnit> held;  // Hold
    // Moving average of one execute's device time, per program.
    absl::flat_hash_map<uint64_t, double> cost;
  };
  struct Load {
    int64_t calls = 0;
    double micros = 0;
  };
  struct Window {
    int devices = 1;
    Load total;
    // Only clients with calls here: a few at most, so a short list (no
    // hashing per host per call). Own finds one's entry, else end().
    using ClientLoads = absl::InlinedVector<std::pair<uint64_t, Load>, 2>;
    ClientLoads clients;
    ClientLoads::iterator Own(uint64_t client) {
      // (A plain loop: once per host per call, most often over one entry,
      // where std::find_if's unrolled search costs more than the find.)
      for (auto it = clients.begin(); it != clients.end(); ++it) {
        if (it->first == client) return it;
      }
      return clients.end();
    }
    ClientLoads::const_iterator Own(uint64_t client) const {
      return const_cast<Window*>(this)->Own(client);
    }
    // Where this worker was among the workers of the last call it ended:
    // the calls of one slice list theirs alike, so EndOn tries it before a
    // binary search (O(1) per host per call on a wide slice).
    size_t last_index = 0;
  };
  enum class Room { kYes, kClientFull, kWorkerFull };
  struct InFlight {
    uint64_t client = 0;
    uint64_t program_id = 0;
    double start_tag = 0;
    double cost = 0;  // estimate charged on each of `workers`
    // Its workers, sorted (shared by the calls over the same hosts:
    // WorkerLists), and which have reported it done (or gone), a bit per
    // worker (one word inline up to 64): a report finds its worker by
    // binary search, not by a scan of them all, in a list in cache.
    WorkerLists::List workers;
    absl::InlinedVector<uint64_t, 1> ended;
    bool Ended(size_t i) const { return (ended[i / 64] >> (i % 64)) & 1; }
    int remaining = 0;  // workers not ended
    uint64_t call_seq = 0;
    bool cut_short = false;  // a worker or the client went
    bool failed = false;     // a worker reported a task of it failed
  };

  double Estimate(const Client& c, uint64_t program_id) const;
  // Whether `window` (a worker's; null: gone) has room for a call of
  // `client` estimated at `cost`.
  Room RoomFor(const Window* window, uint64_t client, double cost) const;
  void Backlog(uint64_t id, Client& c);
  void Unbacklog(uint64_t id, Client& c);
  // One execute of `ticket` (its record `f`) on `worker` is over (done or
  // worker gone); nothing if `worker` is not one of its workers, or ended
  // already. The last one erases the record.
  void EndOn(uint64_t ticket, InFlight& f, int64_t worker);
  // The same, with `worker`'s window found (null: it is gone).
  void EndOn(uint64_t ticket, InFlight& f, int64_t worker, Window* window);
  void EndEverywhere(uint64_t ticket);

  const Options options_;
  std::map<uint64_t, Client> clients_;
  // Clients with waiting units, in fair order: (pass, arrival, id).
  std::set<std::tuple<double, uint64_t, uint64_t>> order_;
  // By worker id, which the server counts from 1 (ClusterState): a call's
  // windows are found by index, not hashed, for each of its hosts. Null:
  // no such worker (never added, or removed).
  std::vector<std::unique_ptr<Window>> windows_;
  // Windows holding more than half a window of estimated device time
  // (window_micros / 2, whatever their devices). While there are none,
  // every window has room for a call estimated at up to a quarter window
  // (its total and its client's share stay under one window, with room
  // for rounding): Next then skips looking at each of a wide unit's
  // windows before admitting it. Kept exact as the loads change (Next's
  // charge, EndOn, RemoveWorker).
  int64_t windows_past_half_ = 0;
  bool PastHalf(const Window& w) const {
    return w.total.micros > half_window_micros_;
  }
  const double half_window_micros_ =
      static_cast<double>(options_.window_micros) / 2;
  Window* FindWindow(int64_t worker) const {
    return worker >= 0 && static_cast<size_t>(worker) < windows_.size()
               ? windows_[static_cast<size_t>(worker)].get()
               : nullptr;
  }
  // By ticket: a call is found once per host that reports it done, so by
  // index, not by hash (TicketTable).
  TicketTable<InFlight> in_flight_;
  // The virtual time: the lowest start tag in flight, else the last
  // admitted.
  double VirtualTime() const;
  double virtual_pass_ = 0;
  // (A B-tree: no allocation per call, as std::multiset's node was.)
  absl::btree_multiset<double> in_flight_tags_;
  // Next's scratch: the windows of the unit it looks at, found once for
  // its room and its admission (null: that worker is gone).
  std::vector<Window*> unit_windows_;
  std::vector<int64_t> unit_workers_;  // (scratch of Next: no allocation)
  WorkerLists worker_lists_;
  uint64_t next_ticket_ = 1;
  uint64_t next_arrival_ = 1;
  std::vector<std::pair<uint64_t, bool>> done_calls_;
};

}  // namespace plexus
