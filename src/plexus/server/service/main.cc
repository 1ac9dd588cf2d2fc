// plexus-server: the resource manager and scheduler. With --local-workers
// it is also the embedded cluster: it starts that many worker processes on
// this machine and stops them when it exits.
//
// The cluster secret (common/credentials.h) comes from $PLEXUS_CLUSTER_SECRET,
// else from --secret-file. Without either:
//   - with --local-workers, the server draws one and hands it to its
//     workers in their environment (the embedded cluster needs no set-up);
//   - with --secret-file PATH that does not exist yet, it draws one and
//     writes it there (mode 0600, created exclusively) for workers started
//     separately to read (plexus-worker --secret-file PATH);
//   - otherwise it refuses to start: no worker could ever register.
// Listening off loopback (--listen 0.0.0.0:PORT, an interface's address),
// it also refuses to start unless the secret was given explicitly ($ or
// --secret-file): everyone who may reach it must be told the same secret,
// and no client session opens without a tenant credential there.
// --tls-cert and --tls-key put the control plane on TLS (common/tls.h).
// The secret is never logged or shown in status.
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "plexus/common/address.h"
#include "plexus/common/credentials.h"
#include "plexus/common/logging.h"
#include "plexus/common/process.h"
#include "plexus/common/tls.h"
#include "plexus/server/server.h"
#include "plexus/server/service/local_workers.h"
#include "plexus/server/standby/follower.h"
#include "plexus/timeline/timeline.h"

namespace {

// Writes all of `text` to `fd`; false if it could not.
bool WriteAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// Writes a new secret to `path`, which must not exist: readable by this
// user only.
absl::Status WriteNewSecret(const std::string& path,
                            const plexus::ClusterSecret& secret) {
  const int fd =
      open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat(
        "cannot create the cluster secret file ", path, ": ", strerror(errno)));
  }
  const bool written = WriteAll(fd, secret.ToHex() + "\n");
  const bool closed = close(fd) == 0;
  if (!written || !closed) {
    unlink(path.c_str());
    return absl::InternalError(
        absl::StrCat("cannot write the cluster secret file ", path));
  }
  return absl::OkStatus();
}

// The cluster secret, as the comment at the top says. `created` is set when
// it was drawn and written to `file`.
absl::StatusOr<plexus::ClusterSecret> FindSecret(const std::string& file,
                                                 int local_hosts,
                                                 const std::string& listen,
                                                 bool* created) {
  *created = false;
  absl::StatusOr<plexus::ClusterSecret> loaded =
      plexus::ClusterSecret::Load(file);
  // NotFound: no environment variable, and no readable file.
  if (loaded.ok() || !absl::IsNotFound(loaded.status())) return loaded;
  if (!file.empty() && access(file.c_str(), F_OK) == 0) return loaded;
  if (file.empty() && !plexus::IsLoopbackHost(plexus::HostOfAddress(listen))) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no cluster secret given, and --listen ", listen,
        " is not a loopback address: off loopback the secret must be given "
        "explicitly. Set $",
        plexus::kClusterSecretEnv,
        " (64 hex digits) or give --secret-file PATH (a new secret is "
        "written there if PATH does not exist); hand the same secret to "
        "every worker, and tenant tokens (`plexus token --tenant NAME`) to "
        "clients"));
  }
  if (file.empty() && local_hosts == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no cluster secret: set $", plexus::kClusterSecretEnv,
        " (64 hex digits) or give --secret-file PATH (a new secret is "
        "written there if PATH does not exist); workers started separately "
        "need the same secret to register"));
  }
  absl::StatusOr<plexus::ClusterSecret> drawn =
      plexus::ClusterSecret::Generate();
  if (!drawn.ok() || file.empty()) return drawn;
  if (absl::Status s = WriteNewSecret(file, *drawn); !s.ok()) return s;
  *created = true;
  return drawn;
}

// Why the server cannot start, in its log and, as "cannot start: CODE:
// message", on `ready_fd` (where the address would have been: plexus.local
// raises it as the exception of its code). Returns the exit code, 1.
int CannotStart(int ready_fd, const absl::Status& why) {
  SPDLOG_ERROR("cannot start: {}", why.ToString());
  if (ready_fd >= 0) {
    WriteAll(ready_fd, absl::StrCat("cannot start: ",
                                    absl::StatusCodeToString(why.code()), ": ",
                                    why.message(), "\n"));
  }
  return 1;
}

// The exit code of a server that stepped down: the other server of its
// pair serves (ServerOptions::peer_address).
constexpr int kSteppedDown = 5;

// Starts the local workers, serves until shutdown, stops them. Returns the
// exit code: 0, 1 when the workers did not come up, 3 when a worker did not
// exit cleanly (each such worker is also a line on `ready_fd`), 5 when it
// stepped down (kSteppedDown).
int Serve(plexus::Server& server, plexus::LocalWorkersOptions local,
          int ready_fd) {
  local.server_address = server.address();
  local.worker_binary = plexus::SiblingBinary("plexus-worker");
  plexus::LocalWorkers workers(local);
  if (local.hosts + local.spares > 0) {
    absl::Status s = workers.Start();
    if (!s.ok()) {
      SPDLOG_ERROR("cannot start local workers: {}", s.ToString());
      return 1;
    }
    s = server.WaitForWorkers(local.hosts + local.spares, absl::Seconds(60));
    if (!s.ok()) {
      SPDLOG_ERROR("local workers did not come up: {}", s.ToString());
      return 1;
    }
  }
  if (ready_fd >= 0 &&
      !WriteAll(ready_fd, server.advertised_address() + "\n")) {
    SPDLOG_WARN("could not write the address to --ready-fd {}", ready_fd);
  }
  server.Wait();
  absl::Status stopped = workers.Stop();
  if (server.stepped_down()) return kSteppedDown;
  if (stopped.ok()) return 0;
  if (ready_fd >= 0) WriteAll(ready_fd, absl::StrCat(stopped.message(), "\n"));
  return 3;
}

// Every flag's value, as parsed (Add...Flags) and then applied to the
// server's and the local workers' options (ApplyFlags).
struct Flags {
  plexus::ServerOptions options;
  plexus::LocalWorkersOptions local;
  int ready_fd = -1;
  bool die_with_parent = false;
  int heartbeat_timeout_ms = 1000;
  int spare_wait_ms = 10000;
  int resume_wait_s = 60;
  std::string scheduler = "gang";
  std::string log_level = "info";
  size_t timeline_events = plexus::TimelineEventsFromEnv();
  std::string secret_file;
  std::string tenants_file;
  std::string web_listen = "auto";
  std::string standby_of;
  int standby_lease_ms = 3000;
  int serve_if_alone_ms = -1;  // with --standby-of: wait for ever
};

// The flags, in the order --help lists them: where the server listens,
// its local workers, its deadlines and logging, then access and policy.
void AddListenFlags(CLI::App& app, Flags* f) {
  app.add_option("--listen", f->options.listen_address,
                 "host:port to listen on (port 0 picks a free port)");
  app.add_option("--advertise-address", f->options.advertise_address,
                 "HOST or HOST:PORT that clients are told and status shows "
                 "(default: the --listen address; without a port, the port "
                 "it listens on), e.g. a Service name for a server that "
                 "listens on 0.0.0.0");
  app.add_option("--ready-fd", f->ready_fd,
                 "once listening and every local worker has registered, "
                 "write the address and a newline to this inherited file "
                 "descriptor (a parent waits by reading it); at exit, write "
                 "one line for each local worker that did not exit cleanly, "
                 "then close it");
}

void AddLocalWorkerFlags(CLI::App& app, Flags* f) {
  app.add_option("--local-workers", f->local.hosts,
                 "start this many worker processes (hosts) on this machine")
      ->check(CLI::Range(0, 256));
  app.add_option("--spare-workers", f->local.spares,
                 "start this many more local workers as spares: kept for "
                 "remapping the slices of a host that is lost; with spares, "
                 "a local worker that exits is replaced by a new spare")
      ->check(CLI::Range(0, 256));
  app.add_option("--max-restarts-per-minute", f->local.restarts_per_window,
                 "crash-loop guard of --spare-workers: at most this many "
                 "exited local workers are replaced in any sliding minute; "
                 "one more is replaced when the minute allows")
      ->check(CLI::Range(1, 100000));
  app.add_option("--devices-per-host", f->local.devices_per_host,
                 "devices of each local worker")
      ->check(CLI::Range(1, 1024));
  app.add_option("--device-memory-mib", f->local.device_memory_mib,
                 "memory budget of each local device, MiB");
  app.add_flag(
      "--no-shm", [f](int64_t) { f->local.shared_memory = false; },
      "local workers move buffers over TCP, as between hosts");
}

void AddRuntimeFlags(CLI::App& app, Flags* f) {
  app.add_option("--heartbeat-timeout-ms", f->heartbeat_timeout_ms,
                 "failure deadline: a worker that hangs is declared down "
                 "within this long of its last heartbeat (workers heartbeat "
                 "every tenth of it); one whose stream breaks at once")
      ->check(CLI::Range(10, 3600 * 1000));
  app.add_option("--spare-wait-ms", f->spare_wait_ms,
                 "in a cluster given spares: how long a slice that lost a "
                 "host waits for another to take its place when no spare is "
                 "free at once (its clients' work waits meanwhile); 0: it "
                 "breaks at once")
      ->check(CLI::Range(0, 3600 * 1000));
  app.add_option("--journal", f->options.journal_path,
                 "the server's journal (a file, created if absent): workers, "
                 "client sessions, slices and programs are written to it as "
                 "they change, and a server started again on it resumes the "
                 "workers and sessions that come back with what they hold "
                 "(docs/RELIABILITY.md); none: a restart ends every session");
  app.add_option("--standby-of", f->standby_of,
                 "start as the standby of the server at this address: follow "
                 "its journal into this one's --journal, synced change by "
                 "change, and take over (serve on --listen, resuming its "
                 "workers and sessions) once it has been silent for its "
                 "lease; give workers and clients both addresses "
                 "(\"PRIMARY,STANDBY\"). An operator's shutdown of the "
                 "primary stops the standby too (docs/RELIABILITY.md)");
  app.add_option("--serve-if-alone-ms", f->serve_if_alone_ms,
                 "with --standby-of, for the first server of a pair: if the "
                 "other cannot be followed within this long of the start, "
                 "serve this server's --journal instead (the other has no "
                 "such flag and waits). Longer than the other's lease plus "
                 "a second, so a restarted primary finds its standby "
                 "serving and follows it (docs/DEPLOY.md)")
      ->check(CLI::Range(0, 3600 * 1000));
  app.add_option("--standby-lease-ms", f->standby_lease_ms,
                 "as a primary: how long this server may be silent before "
                 "its standby takes over (it sends a keepalive every quarter "
                 "of it)")
      ->check(CLI::Range(100, 3600 * 1000));
  app.add_option("--resume-wait-s", f->resume_wait_s,
                 "after a restart on --journal: how long the last run's "
                 "workers and sessions may take to come back (a worker not "
                 "back is lost, a session not back is ended)")
      ->check(CLI::Range(1, 24 * 3600));
  app.add_option("--park-dir", f->options.park_dir,
                 "where a slice suspended to files "
                 "(slice.suspend(to_files=True)) writes its values: a "
                 "directory every worker reaches by this path (a shared file "
                 "system); none: suspends keep values in the workers' memory")
      ->check(CLI::ExistingDirectory)
      ->check(
          [](const std::string& dir) -> std::string {
            // A park that cannot write loses the value it parks: refused
            // here rather than at the first suspend.
            const std::string probe =
                absl::StrCat(dir, "/.plexus-park-probe-", getpid());
            const int fd = open(probe.c_str(),
                                O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
            if (fd < 0) {
              return absl::StrCat("--park-dir ", dir,
                                  " is not writable: ", std::strerror(errno));
            }
            close(fd);
            unlink(probe.c_str());
            return "";
          },
          "writable");
  app.add_flag("--die-with-parent", f->die_with_parent,
               "exit when the parent process dies");
  app.add_option("--scheduler", f->scheduler,
                 "gang (default), or none: TEST ONLY, islands order calls on "
                 "their own and collectives can deadlock")
      ->check(CLI::IsMember({"gang", "none"}));
  app.add_option("--log-level", f->log_level, "trace|debug|info|warn|error");
  app.add_option("--timeline-events", f->timeline_events,
                 "events the timeline ring keeps (what `plexus trace` "
                 "collects; about 88 bytes each); 0: no recording. Default: "
                 "$PLEXUS_TIMELINE_EVENTS, else 65536");
}

void AddAccessFlags(CLI::App& app, Flags* f) {
  app.add_option("--secret-file", f->secret_file,
                 "file holding the cluster secret (64 hex digits; "
                 "$PLEXUS_CLUSTER_SECRET wins). Created, mode 0600, with a "
                 "new secret if it does not exist");
  app.add_option("--tls-cert", f->options.tls_cert_file,
                 "PEM certificate: serve gRPC over TLS (with --tls-key). "
                 "Workers, clients and `plexus` then trust its CA through "
                 "$PLEXUS_TLS_CA or --tls-ca; local workers get this file "
                 "as their CA unless $PLEXUS_TLS_CA is set");
  app.add_option("--tls-key", f->options.tls_key_file,
                 "PEM private key of --tls-cert");
  app.add_flag(
      "--require-tenant",
      [f](int64_t) { f->options.anonymous_clients = false; },
      "refuse client sessions without a tenant credential on loopback too "
      "(off loopback they always are)");
  app.add_option("--tenants", f->tenants_file,
                 "JSON file of each tenant's weight (share of device time) "
                 "and quotas (max_devices, max_bytes, max_calls_in_flight); "
                 "see src/plexus/server/model/tenants.h. Default: equal "
                 "weights");
  app.add_flag(
      "--worker-ops-on-grpc",
      [f](int64_t) { f->options.worker_ops_on_data_plane = false; },
      "keep each worker's ops on its gRPC stream instead of moving them to "
      "a connection to its data plane (framed, one read per write; the "
      "default unless --tls-cert)");
  app.add_flag(
      "--client-ops-on-grpc",
      [f](int64_t) { f->options.client_ops_on_frames = false; },
      "keep each client session's ops on its gRPC stream instead of taking "
      "them as frames on the server's ops listener (a free TCP port on the "
      "listen address's host and a unix socket; the default unless "
      "--tls-cert)");
  app.add_option("--ops-listen", f->options.client_ops_listen,
                 "HOST or HOST:PORT where client sessions send their ops as "
                 "frames (default: the --listen host, a free port); "
                 "clients reach the port on the host they reached the "
                 "server at");
  app.add_option("--admission-window-us", f->options.admission.window_micros,
                 "device time per device admitted to a worker and not yet "
                 "reported done, above which its next call waits at the "
                 "server (fair order is decided there); larger keeps devices "
                 "busier across report round trips, smaller shortens the "
                 "queue in front of a newcomer")
      ->check(CLI::Range(int64_t{1}, int64_t{10'000'000}));
  app.add_option("--web-listen", f->web_listen,
                 "HOST:PORT of the live page and Prometheus /metrics (port 0 "
                 "picks a free one; `plexus status --web` finds it); \"auto\": "
                 "the --listen host and a free port; \"off\": none");
}

// This process's set-up, before anything else runs.
void SetUpProcess(const Flags& f) {
  if (f.die_with_parent) prctl(PR_SET_PDEATHSIG, SIGKILL);
  // Held until exit; the workers must not inherit it (the parent reads to
  // end-of-file when this process is gone).
  if (f.ready_fd >= 0) fcntl(f.ready_fd, F_SETFD, FD_CLOEXEC);
  plexus::RaiseOpenFileLimit();
  plexus::UseLockOrderChecksOfThisBuild();
  plexus::InitLogging("server", f.log_level);
}

// The parsed flags into the server's options.
void ApplyFlags(Flags* f) {
  plexus::ServerOptions& options = f->options;
  options.consistent_order = f->scheduler == "gang";
  options.web_listen = f->web_listen == "off" ? "" : f->web_listen;
  options.heartbeat_timeout = absl::Milliseconds(f->heartbeat_timeout_ms);
  options.timeline = f->timeline_events > 0;
  if (f->timeline_events > 0) options.timeline_capacity = f->timeline_events;
  options.timeline_skew = plexus::TestSkewFromEnv("server");
  options.spare_wait = absl::Milliseconds(f->spare_wait_ms);
  options.resume_wait = absl::Seconds(f->resume_wait_s);
  options.standby_lease = absl::Milliseconds(f->standby_lease_ms);
}

// A standby's --listen address, held until it takes over: bound and not
// listening, so no other process takes the port meanwhile and a connection
// to it is refused (a worker or client tries the next server of its list
// at once). Port 0 picks one. The address, with its port, is written on
// --ready-fd once the standby follows its primary.
class ReservedAddress {
 public:
  ~ReservedAddress() { Release(); }
  absl::Status Reserve(const std::string& address) {
    const std::string host = plexus::HostOfAddress(address);
    const std::string port = address.substr(address.rfind(':') + 1);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* found = nullptr;
    if (getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints,
                    &found) != 0 ||
        found == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--listen ", address, ": not a host:port"));
    }
    fd_ = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    const bool bound =
        fd_ >= 0 &&
        setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
        bind(fd_, found->ai_addr, found->ai_addrlen) == 0;
    const int err = errno;
    freeaddrinfo(found);
    sockaddr_storage at{};
    socklen_t len = sizeof(at);
    if (!bound || getsockname(fd_, reinterpret_cast<sockaddr*>(&at), &len)) {
      return absl::UnavailableError(absl::StrCat(
          "cannot hold --listen ", address, ": ", std::strerror(err)));
    }
    const int bound_port =
        ntohs(at.ss_family == AF_INET6
                  ? reinterpret_cast<sockaddr_in6*>(&at)->sin6_port
                  : reinterpret_cast<sockaddr_in*>(&at)->sin_port);
    address_ =
        absl::StrCat(address.substr(0, address.rfind(':')), ":", bound_port);
    return absl::OkStatus();
  }
  const std::string& address() const { return address_; }
  void Release() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  std::string address_;
};

// --standby-of: follows the primary until this server should take over.
// True: serve (the journal is the primary's), on the address it held;
// false: exit (`code`).
bool FollowAsStandby(Flags& f, int* code) {
  if (f.standby_of.empty() && f.serve_if_alone_ms >= 0) {
    *code = CannotStart(f.ready_fd,
                        absl::InvalidArgumentError(
                            "--serve-if-alone-ms is for the first server of "
                            "a pair: give it with --standby-of OTHER"));
    return false;
  }
  if (f.options.journal_path.empty() || f.local.hosts + f.local.spares > 0) {
    *code = CannotStart(
        f.ready_fd,
        absl::InvalidArgumentError(
            f.options.journal_path.empty()
                ? "--standby-of needs --journal (this standby's own copy)"
                : "--standby-of starts no local workers (the primary's "
                  "workers follow it at the takeover)"));
    return false;
  }
  ReservedAddress held;
  if (absl::Status s = held.Reserve(f.options.listen_address); !s.ok()) {
    *code = CannotStart(f.ready_fd, s);
    return false;
  }
  std::atomic<bool> stop{false};
  plexus::FollowerOptions options;
  options.on_first_follow = [&] {
    if (f.ready_fd >= 0) WriteAll(f.ready_fd, held.address() + "\n");
  };
  options.primary = f.standby_of;
  if (f.serve_if_alone_ms >= 0) {
    options.serve_alone_after = absl::Milliseconds(f.serve_if_alone_ms);
  }
  options.journal_path = f.options.journal_path;
  options.secret = *f.options.secret;  // LoadSecretAndTenants set it
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  options.name =
      absl::StrCat(host, " pid ", getpid(), " (", held.address(), ")");
  absl::StatusOr<plexus::FollowEnd> end;
  {
    plexus::TerminationSignalWatcher on_signal([&](int sig) {
      SPDLOG_INFO("signal {}: the standby stops", sig);
      stop = true;
    });
    end = plexus::FollowUntilTakeover(options, &stop);
  }
  if (!end.ok()) {
    *code = CannotStart(f.ready_fd, end.status());
    return false;
  }
  *code = 0;
  if (*end != plexus::FollowEnd::kTakeOver &&
      *end != plexus::FollowEnd::kServeAlone) {
    return false;
  }
  f.options.listen_address = held.address();
  // Serving now: the other server may take over from this one in turn.
  f.options.peer_address = f.standby_of;
  held.Release();  // gRPC binds it next
  return true;
}

// The cluster secret (FindSecret), the local workers' trust in a TLS
// server, and the tenant table, into the options; an error says why the
// server cannot start.
absl::Status LoadSecretAndTenants(Flags* f) {
  plexus::ServerOptions& options = f->options;
  plexus::LocalWorkersOptions& local = f->local;
  bool secret_created = false;
  absl::StatusOr<plexus::ClusterSecret> secret = FindSecret(
      f->secret_file, local.hosts, options.listen_address, &secret_created);
  if (!secret.ok()) return secret.status();
  if (secret_created) {
    SPDLOG_INFO("wrote a new cluster secret to {} (mode 0600)", f->secret_file);
  }
  options.secret = *secret;
  local.secret = *secret;
  if (!options.tls_cert_file.empty() && local.hosts > 0 &&
      std::getenv(plexus::kTlsCaEnv) == nullptr) {
    // Local workers dial this server over TLS: trust its certificate (a
    // self-signed one is its own CA).
    setenv(plexus::kTlsCaEnv, options.tls_cert_file.c_str(), 1);
  }
  if (!f->tenants_file.empty()) {
    absl::StatusOr<plexus::TenantTable> tenants =
        plexus::TenantTable::Load(f->tenants_file);
    if (!tenants.ok()) return tenants.status();
    options.tenants = *std::move(tenants);
    SPDLOG_INFO("tenants from {}: {} named, the rest share \"default\"",
                f->tenants_file, options.tenants.tenants().size());
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"plexus-server: resource manager and central scheduler"};
  Flags flags;
  AddListenFlags(app, &flags);
  AddLocalWorkerFlags(app, &flags);
  AddRuntimeFlags(app, &flags);
  AddAccessFlags(app, &flags);
  CLI11_PARSE(app, argc, argv);
  SetUpProcess(flags);
  ApplyFlags(&flags);
  plexus::BlockTerminationSignals();
  if (absl::Status s = LoadSecretAndTenants(&flags); !s.ok()) {
    return CannotStart(flags.ready_fd, s);
  }
  const plexus::ServerOptions& options = flags.options;
  const int ready_fd = flags.ready_fd;
  if (!flags.standby_of.empty() || flags.serve_if_alone_ms >= 0) {
    int code = 0;
    if (!FollowAsStandby(flags, &code)) {
      if (ready_fd >= 0) close(ready_fd);
      return code;
    }
  }
  if (!options.consistent_order) {
    SPDLOG_WARN(
        "--scheduler=none: no consistent order across islands; "
        "collectives may deadlock (test only)");
  }
  auto server = plexus::Server::Start(options);
  if (!server.ok()) return CannotStart(ready_fd, server.status());
  int code = 0;
  {
    // Joined at the end of this block, before the server goes.
    plexus::TerminationSignalWatcher on_signal([&](int sig) {
      SPDLOG_INFO("signal {}: shutting down", sig);
      (*server)->Shutdown();
    });
    code = Serve(**server, flags.local, ready_fd);
  }
  server->reset();
  if (ready_fd >= 0) close(ready_fd);
  SPDLOG_INFO("stopped");
  return code;
}
