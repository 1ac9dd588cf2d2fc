// A simulated cluster: many light hosts in one process, each registered
// with a real plexus-server over a real gRPC WorkerSession stream and
// speaking the real worker protocol (proto/plexus.proto), so that one
// machine can stand for thousands of hosts (bench/scale.py, issue 28).
//
// A simulated host has devices that only report completion. For every
// Execute the server admitted (ticket != 0) it reports the call done after
// a fixed delay (SimOptions::delay), in the same batched CallsDone reports
// the real worker sends (worker/report_queue.h: a batch goes once
// kReportBatch calls gathered or kReportDelay after its first, queued
// behind a write in flight); an Expect that asks for a report is reported
// arrived after the same delay. Its outputs then answer WAIT on the shared
// data plane (sim_data_plane.h). It never carries data, and ignores the ops
// that only move or hold data (LoadProgram, Transfer, Declare, PeerInfo,
// PeerDown, ClientGone, ClockEcho); Release forgets the keys. It heartbeats
// every interval the server asks for (or SimOptions::heartbeat_interval),
// with a WorkerStats holding its calls and device time, and answers
// CollectTimeline with an empty ring.
//
// As a real worker does (SimOptions::ops_on_frames, the default), each
// host registers asking for its ops on the data plane: the server then
// opens a connection per host to the shared data plane and sends that
// host's ops as OPS frames on it, and everything the host sends from then
// on (CallsDone, heartbeats, timeline answers) goes back on the same
// connection as REPORTS frames, read by the server's reports poller; the
// gRPC stream carries the registration and the session's end. With
// ops_on_frames off, everything goes on the stream (the server's path for
// workers that cannot take frames, measured beside).
//
// Threads: gRPC's callback API runs every stream's reads and writes on its
// own small pool, and one timer thread (this class's) sends every host's
// heartbeats, delayed completions and report batches, sleeping until the
// next is due. One epoll thread (transport::FramePoller, "plexus-sim-ops")
// reads and applies every host's OPS frames once the data plane handed
// over its connection after the first frame (SimDataPlane::OpsSink::take),
// as a host on a machine of its own would wake on its own CPU: a thread
// per host connection made the server pay a thread wake-up per host in
// each write. The data plane's server holds a thread per connection a
// client opens (a client waiting on a future spanning H hosts opens H).
//
// A host never rejoins: once its stream ends (the server ended it, or
// DropHost cancelled it) it stays gone.
//
//   Start ──▶ registering ──(every host's first message)──▶ serving
//                                  ──Shutdown (or destruction)──▶ stopped
//
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "plexus/common/credentials.h"
#include "plexus/proto/plexus.grpc.pb.h"
#include "plexus/sim/sim_data_plane.h"
#include "plexus/transport/data_plane.h"
#include "plexus/transport/frame_poller.h"

namespace plexus::sim {

class SimHost;

struct SimOptions {
  std::string server_address;
  ClusterSecret secret;
  int hosts = 16;            // registered as "<prefix><i>", i = 0..hosts-1
  int spares = 0;            // then these, spare (RegisterWorker.spare)
  int devices_per_host = 1;  // each a "cpu" device of memory_bytes
  int64_t memory_bytes = int64_t{1} << 30;
  std::string host_prefix = "sim";
  // How long after an Execute arrives its call is reported done.
  absl::Duration delay = absl::ZeroDuration();
  // Zero: what the server asks (ServerToWorker.heartbeat_interval_ms).
  absl::Duration heartbeat_interval = absl::ZeroDuration();
  // Hosts whose streams share one channel (one HTTP/2 connection).
  int hosts_per_channel = 32;
  // Registrations started at once (each waits for its first message).
  int registering_at_once = 64;
  // The server's ops as OPS frames and calls done as REPORTS frames on a
  // data-plane connection per host, as a real worker's; false: on the
  // gRPC stream.
  bool ops_on_frames = true;
};

// What the hosts did so far, summed over all of them.
struct SimCounters {
  int64_t registered = 0;  // hosts that got their first message
  int64_t ended = 0;       // hosts whose stream ended
  int64_t executes = 0;    // Execute ops applied
  int64_t calls_reported = 0;
  int64_t reports = 0;         // CallsDone messages sent
  int64_t reports_framed = 0;  // of them, as REPORTS frames
  int64_t ops_framed = 0;      // ops read from OPS frames
  // Ops connections whose first frame was applied, and of them those the
  // data plane handed to the one ops thread.
  int64_t ops_connections = 0;
  int64_t ops_connections_polled = 0;
  int64_t heartbeats = 0;
  int64_t ops = 0;        // every op read
  int64_t keys_held = 0;  // the data plane's ready keys now
};

class SimCluster {
 public:
  // Starts the data plane and the timer, then registers every host (at
  // most registering_at_once waiting for the server at a time). Returns
  // once every registration has started; AwaitRegistered waits for them.
  static absl::StatusOr<std::unique_ptr<SimCluster>> Start(SimOptions options);
  ~SimCluster();  // Shutdown()
  SimCluster(const SimCluster&) = delete;
  SimCluster& operator=(const SimCluster&) = delete;

  // Blocks until every host has registered (OK), one was refused or ended
  // before all did (its status), or `timeout` passed (DeadlineExceeded).
  absl::Status AwaitRegistered(absl::Duration timeout);
  // Ends the stream of the first host (in index order) that is serving and
  // not a spare, as a host whose process died: the server sees the stream
  // break. Its name and worker id, or NotFound when none is left.
  absl::StatusOr<std::pair<std::string, int64_t>> DropHost();
  // Cancels every stream and waits (at most `grace`) for them to end.
  void Shutdown(absl::Duration grace = absl::Seconds(10));

  SimCounters counters() const;
  // From Start to the last host's first message (once all registered).
  absl::Duration registration_time() const;

 private:
  friend class SimHost;
  explicit SimCluster(SimOptions options);
  absl::Status StartHosts();
  // Begins the registrations the wave has room for.
  void StartMore();
  proto::WorkerToServer Registration(const SimHost& host) const;

  // --- the timer thread: one heap of what is due, for every host.
  enum class Due { kHeartbeat, kComplete, kFlush };
  struct Timed {
    absl::Time at;
    Due what;
    SimHost* host;
    bool operator>(const Timed& o) const { return at > o.at; }
  };
  void Schedule(Timed t);
  void TimerLoop();

  // SimHost reports (under no host lock).
  void HostRegistered();
  void HostEnded(const absl::Status& why, bool registered);

  // --- the server's ops on the data plane (SimOptions::ops_on_frames)
  SimDataPlane::OpsSink OpsSink();
  // A host's first message told it its registration generation.
  void NoteGeneration(uint64_t generation, SimHost* host);
  // The host of `generation`: its ops connection may open before its first
  // message is read, so this waits for it (at most kGenerationWait; null
  // then, or once stopping).
  SimHost* HostOf(uint64_t generation);
  static constexpr absl::Duration kGenerationWait = absl::Seconds(30);

  const SimOptions options_;
  const std::string machine_id_;  // LocalMachineId(): clients use the unix
                                  // socket
  std::unique_ptr<SimDataPlane> data_plane_;
  transport::DataPlaneCounters data_counters_;
  std::unique_ptr<transport::DataPlaneServer> data_server_;
  // Every host's ops connection after its first frame (ops_on_frames).
  std::unique_ptr<transport::FramePoller> ops_poller_;
  std::atomic<int64_t> ops_connections_{0};
  std::atomic<int64_t> ops_connections_polled_{0};
  // One stub (one channel) per hosts_per_channel hosts.
  std::vector<std::unique_ptr<proto::Controller::Stub>> stubs_;
  std::vector<std::unique_ptr<SimHost>> hosts_;  // fixed once started
  std::thread timer_;

  mutable absl::Mutex mu_;
  int64_t registered_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t ended_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t registering_ ABSL_GUARDED_BY(mu_) = 0;  // started, no answer yet
  int next_to_start_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time started_at_ ABSL_GUARDED_BY(mu_);
  absl::Time all_registered_at_ ABSL_GUARDED_BY(mu_);
  absl::Status first_refusal_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Timed> heap_ ABSL_GUARDED_BY(mu_);  // a min-heap on `at`
  absl::flat_hash_map<uint64_t, SimHost*> by_generation_ ABSL_GUARDED_BY(mu_);
  absl::CondVar timer_wake_;
};

}  // namespace plexus::sim
