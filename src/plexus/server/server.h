// plexus-server: the resource manager and central scheduler. Long-lived;
// serves many clients at once. Workers register over a bidirectional
// stream and heartbeat on it; clients send batches of ops (slice requests,
// programs, calls, puts, releases) over theirs. The server puts every call
// into one order and forwards it, batched, to the workers involved; it never
// carries buffer bytes.
//
// Threads: gRPC's (one per open stream, reading), one writer per stream
// (OutQueue), and the liveness monitor.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/common/clock.h"
#include "plexus/common/credentials.h"
#include "plexus/server/model/tenants.h"
#include "plexus/server/scheduling/admission.h"

namespace plexus {

struct ServerOptions {
  std::string listen_address = "127.0.0.1:0";  // port 0: pick a free one
  // The address clients and status are told (--advertise-address), for a
  // server that listens on 0.0.0.0 or sits behind a load balancer: HOST or
  // HOST:PORT (without a port, the one it listens on). Empty: the address
  // it listens on.
  std::string advertise_address;
  // The failure deadline. A worker whose stream breaks is declared down at
  // once; one that hangs (SIGSTOP, a wedged host) within this long of its
  // last heartbeat. Workers heartbeat every tenth of it (the server tells
  // them at registration), and the server checks every
  // liveness_check_period (zero: a tenth of it too).
  absl::Duration heartbeat_timeout = absl::Seconds(1);
  absl::Duration liveness_check_period = absl::ZeroDuration();
  // In a cluster given spares, how long a slice that lost a host waits for
  // one to take its place when no spare is free at once (a replacement
  // still starting, a host rejoining): its client's work waits at the
  // server meanwhile, and resumes on the new map. Zero: it breaks at once.
  absl::Duration spare_wait = absl::Seconds(10);
  // The journal (journal/journal.h; a file, created if absent): what a
  // restart cannot get back from workers and clients (workers, clients,
  // slices, programs) is written to it as it changes, and a server started
  // on a journal that holds records rebuilds them and resumes the workers
  // and client sessions that come back (server/model/model_journal.h).
  // Empty: none (a restart loses every session).
  std::string journal_path;
  // After a restart on a journal: how long a worker or client session of
  // the last run may take to come back. A worker not back by then is lost
  // (its slices go to a spare, or break); a session not back is ended.
  absl::Duration resume_wait = absl::Seconds(60);
  // Where a slice suspended to files (slice.suspend(to_files=True)) writes
  // its values: one directory every worker reaches by this path (a shared
  // file system; on one machine, any directory). Empty: a suspend to files
  // is refused, saying so.
  std::string park_dir;
  // The journal is compacted into one snapshot once this many records were
  // written since the last compaction (and at every start).
  int64_t journal_compact_every = 10000;
  // A standby (plexus-server --standby-of this one) takes over once this
  // server has been silent for this long (FollowUpdate.lease_ms); the
  // server sends it a keepalive every quarter of it, and waits up to
  // standby_sync_timeout for it to sync each change before it cuts it off
  // (then a takeover would lose that change: logged).
  absl::Duration standby_lease = absl::Seconds(3);
  absl::Duration standby_sync_timeout = absl::Seconds(5);
  // The other server of a pair (this one took over from it, or serves as
  // the first of two: plexus-server --standby-of). When its standby
  // stops following, or it finds itself stalled for the lease, it asks
  // the other whether it serves, and if so steps down (stepped_down():
  // it shuts down rather than serve beside it; server/standby/peer_watch.h).
  // Empty: none.
  std::string peer_address;
  // Not owned. Every time the server reads, and every deadline it waits
  // for, goes through it, except what must be real time whatever it is
  // (a deadline handed to gRPC, the server's own stall detection, the
  // seed of registration generations): those read Clock::Real(), with the
  // reason beside them.
  Clock* clock = Clock::Real();
  // TEST ONLY: false bypasses the gang scheduler's consistent order (see
  // GangScheduler::Options). Collectives can deadlock without it.
  bool consistent_order = true;
  // The cluster secret (common/credentials.h). The server refuses a worker
  // registration without the worker credential and a Shutdown RPC without
  // the admin credential, and issues each client session its credential.
  // None: Start() draws one, which secret() hands to in-process workers.
  std::optional<ClusterSecret> secret;
  // The operator's per-tenant weights and quotas (--tenants FILE).
  TenantTable tenants;
  // Whether a client session may open without a tenant credential (as
  // tenant "default"). Honoured on a loopback listen address only: off
  // loopback every session authenticates as a tenant.
  bool anonymous_clients = true;
  // TLS for every gRPC connection (common/tls.h): PEM files, both or
  // neither.
  std::string tls_cert_file;
  std::string tls_key_file;
  // A worker that offers it (RegisterWorker.ops_on_data_plane) takes its
  // ops on a data-plane connection the server opens to it, as frames, once
  // registered; false (`--worker-ops-on-grpc`): on its gRPC stream. Never
  // under TLS: the data plane does not encrypt (docs/security.md).
  bool worker_ops_on_data_plane = true;
  // Client sessions send their ops as frames to the server's ops listener
  // (TCP on the listen address's host, a free port, and an abstract unix
  // socket; ServerToClient.ops_*), where gRPC's threads took them off the
  // session's stream; false (`--client-ops-on-grpc`): on the stream. Never
  // under TLS, as above. A client that cannot connect keeps the stream.
  bool client_ops_on_frames = true;
  // Where the ops listener's TCP side listens (`--ops-listen`): HOST or
  // HOST:PORT. Empty: the listen address's host, a free port. Clients
  // connect to the port on the host their gRPC stream reached, so a
  // firewall or load balancer in front of the server passes it too (or
  // its clients' ops stay on gRPC, after a connect that waits at most 2 s).
  std::string client_ops_listen;
  // Admission windows (server/scheduling/admission.h).
  Admission::Options admission;
  // The live page and /metrics (web/web_server.h): HOST:PORT to serve them
  // on (port 0: a free one), "auto" for the listen address's host and a
  // free port, empty for none (in-process servers; `plexus-server` serves
  // them unless given --web-listen off).
  std::string web_listen;
  // The timeline (timeline/timeline.h): whether the server records, the
  // events its ring keeps, and, TEST ONLY, a skew added to its timeline
  // clock.
  bool timeline = true;
  size_t timeline_capacity = size_t{1} << 16;
  absl::Duration timeline_skew;
};

// The heartbeat period a server with `options` asks of its workers, and
// how often it checks them.
inline absl::Duration HeartbeatInterval(const ServerOptions& options) {
  return options.heartbeat_timeout / 10;
}
inline absl::Duration LivenessCheckPeriod(const ServerOptions& options) {
  return options.liveness_check_period > absl::ZeroDuration()
             ? options.liveness_check_period
             : options.heartbeat_timeout / 10;
}
// Whether the server itself stalled: its liveness check, due every
// LivenessCheckPeriod, ran `waited` (monotonic time) after the one before,
// late by more than half the heartbeat deadline. A stopped or starved
// server process, or a machine its hypervisor paused, reads nothing for
// that long, so the workers' messages of that time wait unread in its
// sockets: their silence is the server's, and it does not count
// (ServerImpl::LivenessLoop gives every worker a whole deadline from then).
inline bool ServerStalled(absl::Duration waited, const ServerOptions& options) {
  return waited - LivenessCheckPeriod(options) > options.heartbeat_timeout / 2;
}

// `advertise` (HOST or HOST:PORT; empty: `bound`) completed with the port
// of `bound` ("HOST:PORT") where it names none.
std::string AdvertisedAddress(const std::string& advertise,
                              const std::string& bound);

class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Start(
      const ServerOptions& options);
  virtual ~Server() = default;
  virtual std::string address() const = 0;  // "127.0.0.1:PORT"
  // What clients are told (ServerOptions::advertise_address); address()
  // when none was given.
  virtual std::string advertised_address() const = 0;
  // "HOST:PORT" of its live page and /metrics (the advertised host), or
  // empty when it serves none (ServerOptions::web_listen).
  virtual std::string web_address() const = 0;
  // The cluster secret it checks credentials against. Never log it.
  virtual const ClusterSecret& secret() const = 0;
  // Blocks until Shutdown() (locally or through the Shutdown RPC).
  virtual void Wait() = 0;
  // Whether it shut down because the other server of its pair serves
  // (ServerOptions::peer_address): it had been taken over.
  virtual bool stepped_down() const = 0;
  virtual void Shutdown() = 0;
  // Re-checks heartbeats now (tests with a FakeClock call it after Advance).
  virtual void CheckLiveness() = 0;
  // Waits until `n` workers are alive; DeadlineExceeded after `timeout`.
  virtual absl::Status WaitForWorkers(int n, absl::Duration timeout) = 0;
};

}  // namespace plexus
