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
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

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
#include "plexus/server/local_workers.h"
#include "plexus/server/server.h"
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

// Starts the local workers, serves until shutdown, stops them. Returns the
// exit code: 0, 1 when the workers did not come up, 3 when a worker did not
// exit cleanly (each such worker is also a line on `ready_fd`).
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
  if (stopped.ok()) return 0;
  if (ready_fd >= 0) WriteAll(ready_fd, absl::StrCat(stopped.message(), "\n"));
  return 3;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"plexus-server: resource manager and central scheduler"};
  plexus::ServerOptions options;
  plexus::LocalWorkersOptions local;
  bool die_with_parent = false;
  int heartbeat_timeout_ms = 1000;
  int spare_wait_ms = 10000;
  std::string log_level = "info";
  std::string secret_file;
  app.add_option("--listen", options.listen_address,
                 "host:port to listen on (port 0 picks a free port)");
  app.add_option("--advertise-address", options.advertise_address,
                 "HOST or HOST:PORT that clients are told and status shows "
                 "(default: the --listen address; without a port, the port "
                 "it listens on), e.g. a Service name for a server that "
                 "listens on 0.0.0.0");
  int ready_fd = -1;
  app.add_option("--ready-fd", ready_fd,
                 "once listening and every local worker has registered, "
                 "write the address and a newline to this inherited file "
                 "descriptor (a parent waits by reading it); at exit, write "
                 "one line for each local worker that did not exit cleanly, "
                 "then close it");
  app.add_option("--local-workers", local.hosts,
                 "start this many worker processes (hosts) on this machine")
      ->check(CLI::Range(0, 256));
  app.add_option("--spare-workers", local.spares,
                 "start this many more local workers as spares: kept for "
                 "remapping the slices of a host that is lost; with spares, "
                 "a local worker that exits is replaced by a new spare")
      ->check(CLI::Range(0, 256));
  app.add_option("--max-restarts-per-minute", local.restarts_per_window,
                 "crash-loop guard of --spare-workers: at most this many "
                 "exited local workers are replaced in any sliding minute; "
                 "one more is replaced when the minute allows")
      ->check(CLI::Range(1, 100000));
  app.add_option("--devices-per-host", local.devices_per_host,
                 "devices of each local worker")
      ->check(CLI::Range(1, 1024));
  app.add_option("--device-memory-mib", local.device_memory_mib,
                 "memory budget of each local device, MiB");
  app.add_flag(
      "--no-shm", [&](int64_t) { local.shared_memory = false; },
      "local workers move buffers over TCP, as between hosts");
  app.add_option("--heartbeat-timeout-ms", heartbeat_timeout_ms,
                 "failure deadline: a worker that hangs is declared down "
                 "within this long of its last heartbeat (workers heartbeat "
                 "every tenth of it); one whose stream breaks at once")
      ->check(CLI::Range(10, 3600 * 1000));
  app.add_option("--spare-wait-ms", spare_wait_ms,
                 "in a cluster given spares: how long a slice that lost a "
                 "host waits for another to take its place when no spare is "
                 "free at once (its clients' work waits meanwhile); 0: it "
                 "breaks at once")
      ->check(CLI::Range(0, 3600 * 1000));
  app.add_flag("--die-with-parent", die_with_parent,
               "exit when the parent process dies");
  std::string scheduler = "gang";
  app.add_option("--scheduler", scheduler,
                 "gang (default), or none: TEST ONLY, islands order calls on "
                 "their own and collectives can deadlock")
      ->check(CLI::IsMember({"gang", "none"}));
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  size_t timeline_events = plexus::TimelineEventsFromEnv();
  app.add_option("--timeline-events", timeline_events,
                 "events the timeline ring keeps (what `plexus trace` "
                 "collects; about 88 bytes each); 0: no recording. Default: "
                 "$PLEXUS_TIMELINE_EVENTS, else 65536");
  app.add_option("--secret-file", secret_file,
                 "file holding the cluster secret (64 hex digits; "
                 "$PLEXUS_CLUSTER_SECRET wins). Created, mode 0600, with a "
                 "new secret if it does not exist");
  app.add_option("--tls-cert", options.tls_cert_file,
                 "PEM certificate: serve gRPC over TLS (with --tls-key). "
                 "Workers, clients and `plexus` then trust its CA through "
                 "$PLEXUS_TLS_CA or --tls-ca; local workers get this file "
                 "as their CA unless $PLEXUS_TLS_CA is set");
  app.add_option("--tls-key", options.tls_key_file,
                 "PEM private key of --tls-cert");
  app.add_flag(
      "--require-tenant", [&](int64_t) { options.anonymous_clients = false; },
      "refuse client sessions without a tenant credential on loopback too "
      "(off loopback they always are)");
  std::string tenants_file;
  app.add_option("--tenants", tenants_file,
                 "JSON file of each tenant's weight (share of device time) "
                 "and quotas (max_devices, max_bytes, max_calls_in_flight); "
                 "see src/plexus/server/tenants.h. Default: equal weights");
  app.add_option("--admission-window-us", options.admission.window_micros,
                 "device time per device admitted to a worker and not yet "
                 "reported done, above which its next call waits at the "
                 "server (fair order is decided there); larger keeps devices "
                 "busier across report round trips, smaller shortens the "
                 "queue in front of a newcomer")
      ->check(CLI::Range(int64_t{1}, int64_t{10'000'000}));
  std::string web_listen = "auto";
  app.add_option("--web-listen", web_listen,
                 "HOST:PORT of the live page and Prometheus /metrics (port 0 "
                 "picks a free one; `plexus status --web` finds it); \"auto\": "
                 "the --listen host and a free port; \"off\": none");
  CLI11_PARSE(app, argc, argv);
  options.consistent_order = scheduler == "gang";
  options.web_listen = web_listen == "off" ? "" : web_listen;

  if (die_with_parent) prctl(PR_SET_PDEATHSIG, SIGKILL);
  // Held until exit; the workers must not inherit it (the parent reads to
  // end-of-file when this process is gone).
  if (ready_fd >= 0) fcntl(ready_fd, F_SETFD, FD_CLOEXEC);
  plexus::RaiseOpenFileLimit();
  plexus::UseLockOrderChecksOfThisBuild();
  plexus::InitLogging("server", log_level);
  options.heartbeat_timeout = absl::Milliseconds(heartbeat_timeout_ms);
  options.timeline = timeline_events > 0;
  if (timeline_events > 0) options.timeline_capacity = timeline_events;
  options.timeline_skew = plexus::TestSkewFromEnv("server");
  options.spare_wait = absl::Milliseconds(spare_wait_ms);
  plexus::BlockTerminationSignals();

  bool secret_created = false;
  absl::StatusOr<plexus::ClusterSecret> secret = FindSecret(
      secret_file, local.hosts, options.listen_address, &secret_created);
  if (!secret.ok()) {
    SPDLOG_ERROR("cannot start: {}", std::string(secret.status().message()));
    return 1;
  }
  if (secret_created) {
    SPDLOG_INFO("wrote a new cluster secret to {} (mode 0600)", secret_file);
  }
  options.secret = *secret;
  local.secret = *secret;
  if (!options.tls_cert_file.empty() && local.hosts > 0 &&
      std::getenv(plexus::kTlsCaEnv) == nullptr) {
    // Local workers dial this server over TLS: trust its certificate (a
    // self-signed one is its own CA).
    setenv(plexus::kTlsCaEnv, options.tls_cert_file.c_str(), 1);
  }
  if (!tenants_file.empty()) {
    absl::StatusOr<plexus::TenantTable> tenants =
        plexus::TenantTable::Load(tenants_file);
    if (!tenants.ok()) {
      SPDLOG_ERROR("cannot start: {}", std::string(tenants.status().message()));
      return 1;
    }
    options.tenants = *std::move(tenants);
    SPDLOG_INFO("tenants from {}: {} named, the rest share \"default\"",
                tenants_file, options.tenants.tenants().size());
  }

  if (!options.consistent_order) {
    SPDLOG_WARN(
        "--scheduler=none: no consistent order across islands; "
        "collectives may deadlock (test only)");
  }
  auto server = plexus::Server::Start(options);
  if (!server.ok()) {
    SPDLOG_ERROR("cannot start: {}", server.status().ToString());
    return 1;
  }
  int code = 0;
  {
    // Joined at the end of this block, before the server goes.
    plexus::TerminationSignalWatcher on_signal([&](int sig) {
      SPDLOG_INFO("signal {}: shutting down", sig);
      (*server)->Shutdown();
    });
    code = Serve(**server, local, ready_fd);
  }
  server->reset();
  if (ready_fd >= 0) close(ready_fd);
  SPDLOG_INFO("stopped");
  return code;
}