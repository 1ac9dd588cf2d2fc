// The Plexus worker: one per host. Registers its devices with the server,
// executes the shard tasks it is sent on its devices in the order the
// server decided, owns the object store of its devices' buffers and moves
// shards directly to and from peer workers over the data plane.
//
// Threads: the control-stream reader (applies server ops in order), the
// control-stream writer (calls done, failed transfers), the heartbeat
// thread (nothing else's lock delays it), one thread per device, the
// compiler (XLA programs ahead of their calls, at a lower priority), one
// sender thread per peer, and the data-plane server's threads.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "plexus/common/backoff.h"
#include "plexus/common/clock.h"
#include "plexus/common/credentials.h"

namespace plexus {

struct WorkerOptions {
  std::string server_address;  // host:port of plexus-server
  // The CA the server's TLS certificate is checked against (PEM file,
  // common/tls.h); empty: $PLEXUS_TLS_CA, else plain text.
  std::string tls_ca;
  std::string host_name;  // defaults to gethostname()
  int num_devices = 1;
  int64_t device_memory = int64_t{1} << 30;  // budget per device, bytes
  // Use the shared-memory data plane with peers on this machine. Off: every
  // transfer goes over TCP, as between hosts.
  bool shared_memory = true;
  // A spare host (--spare): the server keeps it for remapping a lost
  // host's slices, and places no new slice on it.
  bool spare = false;
  std::string data_host = "127.0.0.1";  // the TCP data plane binds here
  // The host peers and clients are told to reach the TCP data plane at
  // (--advertise-host), with the bound port. Empty: the bound host, or,
  // when it binds every interface (0.0.0.0, ::), the local address this
  // host reaches the server from.
  std::string advertise_host;
  // Zero: the period the server asks for at registration (a tenth of its
  // failure deadline).
  absl::Duration heartbeat_interval = absl::ZeroDuration();
  // The object store's deadlines (a reservation waiting for memory, a key
  // not yet declared); not owned. Tests inject one.
  Clock* clock = Clock::Real();
  // How long a registration waits for the server to answer the connection.
  absl::Duration connect_timeout = absl::Seconds(10);
  // Set when a host rejoins: the registration it had (the server says
  // whether it was declared down). WorkerHost sets it.
  int64_t previous_worker_id = 0;
  uint64_t previous_generation = 0;
  // The PJRT C API plugin that runs XLA programs, loaded on the first XLA
  // call (e.g. the xla_cpu_pjrt.so of the xla-cpu-pjrt wheel).
  std::string pjrt_plugin;
  // GPU plugins: the host's GPUs this worker uses (the plugin's
  // visible_devices), so several workers can share a host's GPUs; empty:
  // the plugin's choice (all).
  std::vector<int64_t> gpus;
  // The worker's devices are the plugin's (one per GPU on an NVIDIA host),
  // each with the kind the plugin gives and, as its budget, the memory the
  // plugin's allocator may take on it, capped by `device_memory` where
  // `device_memory_given`; the plugin is loaded as the worker starts, and
  // a plugin that does not load ends the start. Else `num_devices`
  // devices of `device_memory` each, and the plugin is loaded on the
  // first XLA call.
  bool devices_from_plugin = false;
  bool device_memory_given = false;
  // Device values move to and from workers of this host by CUDA IPC where
  // both can (the plugin's devices are CUDA GPUs: worker/cuda_ipc.h); off
  // (--no-cuda-ipc): through host memory, as between hosts.
  bool cuda_ipc = true;
  // Tests without a GPU: the worker registers as running NCCL and trades
  // all_reduce offers, saying no value is on a GPU, so each all_reduce
  // takes the host path after them (OffersWithoutGpu,
  // worker/nccl_collective.h). Ignored where NCCL itself runs.
  bool nccl_offers_without_gpu = false;
  // The cluster secret (common/credentials.h): the worker proves itself to
  // the server and its peers with it, and checks every data-plane request
  // against it. Start() refuses to run without one.
  std::optional<ClusterSecret> secret;
  // The timeline (timeline/timeline.h): whether the worker records its
  // tasks, transfers, compiles and client requests, the events its ring
  // keeps, and, TEST ONLY, a skew added to its timeline clock.
  bool timeline = true;
  size_t timeline_capacity = size_t{1} << 16;
  absl::Duration timeline_skew;
  // TEST ONLY ($PLEXUS_TEST_STALL_FIRST_EXECUTE_MS): the first message of
  // ops with an EXECUTE is applied this much later, as if its applier
  // waited on a lock (a stalled ops thread, for the tests of what the
  // worker's connection to the server does meanwhile).
  absl::Duration stall_first_execute;
};

class Worker {
 public:
  // Checks that every catalogued built-in kernel has a body (and every body
  // a signature: KernelRegistry::Builtin), starts the data plane, connects
  // to the server and registers.
  static absl::StatusOr<std::unique_ptr<Worker>> Start(
      const WorkerOptions& options);
  virtual ~Worker() = default;
  // Blocks until the server closes the session or Shutdown() is called.
  // Returns why the session ended.
  virtual absl::Status Wait() = 0;
  virtual void Shutdown() = 0;
  virtual int64_t worker_id() const = 0;
  // This registration's generation (its pushes carry it).
  virtual uint64_t generation() const = 0;
  // After its session ended because the server went away (Wait returned
  // UNAVAILABLE): fails the work that cannot finish now (shards still
  // pending: the next server routes again what it needs), waits up to
  // `drain` for the devices to finish what they run, keeps the ready
  // shards and its programs, and registers again as the host it was, with
  // them (RegisterWorker.kept_state, inventory). True: the server took it
  // back. False: the server took it as a fresh host (under a new id), and
  // what it kept is dropped. Either way Wait serves the new session. An
  // error: no server answered (the state is kept; try again).
  virtual absl::StatusOr<bool> Resume(absl::Duration drain) = 0;
};

// What a worker process does when its server session ends.
struct WorkerHostOptions {
  // Standalone (plexus-worker started on its own): when the server went
  // away (it crashed or restarted, the network broke), it keeps its state
  // and registers again as the host it was (Worker::Resume), retrying with
  // `backoff`; a server that does not take it back (one without a journal
  // that knows it) gets a fresh host. When the server ended the session
  // (it declared this host down, or shut down) it drops its state and
  // registers again as a fresh host. It gives up when the back-off does.
  // Embedded (started by its server,
  // --die-with-parent): it rejoins only a server that still answers (it was
  // declared down) and otherwise exits, as its server is gone.
  bool standalone = true;
  BackoffOptions backoff;
  // How long a session's teardown may take before the host stops waiting
  // for it. A device that runs a kernel cannot be interrupted (a program
  // may run for minutes), and the teardown joins its thread: past this
  // grace a host that is ending leaves it to the process's exit
  // (TeardownPending()), an embedded host ends instead of rejoining late,
  // and a standalone host says what it waits for and waits.
  absl::Duration teardown_grace = absl::Seconds(2);
};

// A host's worker over successive sessions: one Worker per registration,
// each a fresh host (no buffer, program or peer of the last one survives;
// the server gives it a new id and generation). Thread-safe: Shutdown()
// may come from any thread.
class WorkerHost {
 public:
  WorkerHost(WorkerOptions worker, WorkerHostOptions host);
  ~WorkerHost();
  // Registers and serves until Shutdown() (Cancelled) or until the host
  // gives up: a registration refused for good (another protocol version, a
  // wrong credential) or a server that cannot be reached in time
  // (Unavailable). `on_registered` runs after each registration.
  absl::Status Run(const std::function<void(const Worker&)>& on_registered);
  void Shutdown();
  // After Run: whether the last session's teardown still runs (a device
  // is still in a kernel after teardown_grace). The process should then
  // exit without destroying the host, whose destructor would wait for it.
  bool TeardownPending() const;

 private:
  // Waits `delay` or until Shutdown(); false once shut down.
  bool Pause(absl::Duration delay);
  // After its server went away: Worker::Resume, retried with `backoff`
  // while no server answers.
  enum class Kept { kResumed, kGaveUp, kStopped };
  Kept KeepAcross(Worker& worker, Backoff& backoff);
  // Destroys `worker` on a thread of its own; true if that finished within
  // teardown_grace (else it goes on, and WaitTeardown() waits for it).
  bool Retire(std::unique_ptr<Worker> worker);
  void WaitTeardown();

  WorkerOptions options_;
  const WorkerHostOptions host_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Worker* current_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The teardown still running (Retire), on Run's thread only.
  std::thread teardown_;
  std::shared_ptr<absl::Notification> teardown_done_;
};

// What to do after a registration attempt failed or a session ended with
// `status` (`session_ended`: how a session ended; else how a registration
// attempt failed): true to register again, false to stop.
// Pure (tested directly).
bool ShouldRejoin(const absl::Status& status, bool standalone,
                  bool session_ended);

}  // namespace plexus
