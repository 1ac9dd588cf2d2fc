// plexus-sim-workers: many simulated hosts in one process, registered with
// a real plexus-server (sim_cluster.h says what a simulated host does).
//
//   plexus-sim-workers --server HOST:PORT --hosts 2048 [--spares 1]
//       [--delay-us 0] [--heartbeat-interval-ms 0] [--ready-fd FD]
//
// The cluster secret comes from $PLEXUS_CLUSTER_SECRET or --secret-file,
// as for plexus-worker. Once every host has registered it writes
// "<hosts> <milliseconds it took>\n" to --ready-fd. Signals:
//   SIGUSR1  drops one host (the first serving one that is not a spare):
//            its stream is cancelled, as if its process died; prints
//            "dropped <name> <worker id>" on stdout
//   SIGUSR2  prints the counters as one JSON line on stdout
//   SIGTERM, SIGINT  stop (exit 0)
// It exits 1 if the hosts cannot all register (refused, or not within
// --register-timeout-s).
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "plexus/common/credentials.h"
#include "plexus/common/logging.h"
#include "plexus/common/process.h"
#include "plexus/sim/sim_cluster.h"

namespace {

struct Flags {
  plexus::sim::SimOptions options;
  int64_t delay_us = 0;
  int64_t heartbeat_interval_ms = 0;
  double register_timeout_s = 300;
  int ready_fd = -1;
  std::string secret_file;
  std::string log_level = "warn";
  bool die_with_parent = false;
};

void AddFlags(CLI::App& app, Flags& f) {
  plexus::sim::SimOptions& o = f.options;
  app.add_option("--server", o.server_address,
                 "address of plexus-server (host:port)")
      ->required();
  app.add_option("--hosts", o.hosts, "simulated hosts")
      ->check(CLI::Range(1, 100000));
  app.add_option("--spares", o.spares, "spare hosts, registered after them")
      ->check(CLI::Range(0, 100000));
  app.add_option("--devices-per-host", o.devices_per_host)
      ->check(CLI::Range(1, 1024));
  app.add_option("--host-prefix", o.host_prefix,
                 "host names are PREFIX0, PREFIX1, ...");
  app.add_option("--delay-us", f.delay_us,
                 "a call is reported done this long after it arrives")
      ->check(CLI::Range(int64_t{0}, int64_t{3600} * 1000 * 1000));
  app.add_option("--heartbeat-interval-ms", f.heartbeat_interval_ms,
                 "heartbeat period (0: the one the server asks for)")
      ->check(CLI::Range(int64_t{0}, int64_t{3600} * 1000));
  app.add_option("--hosts-per-channel", o.hosts_per_channel,
                 "hosts whose streams share one gRPC channel")
      ->check(CLI::Range(1, 100000));
  app.add_option("--register-timeout-s", f.register_timeout_s)
      ->check(CLI::PositiveNumber);
  app.add_option("--ready-fd", f.ready_fd,
                 "write '<hosts> <ms>' here once all registered");
  app.add_option("--secret-file", f.secret_file,
                 "the cluster secret, hex (default: $PLEXUS_CLUSTER_SECRET)");
  app.add_option("--log-level", f.log_level, "trace|debug|info|warn|error");
  app.add_flag("--die-with-parent", f.die_with_parent,
               "exit when the parent process dies");
  app.add_flag_callback(
      "--ops-on-grpc", [&o] { o.ops_on_frames = false; },
      "take the server's ops and send calls done on each host's gRPC stream "
      "(default: as a real worker, on a data-plane connection per host)");
}

void PrintCounters(const plexus::sim::SimCluster& cluster) {
  const plexus::sim::SimCounters c = cluster.counters();
  std::printf(
      "{\"registered\": %ld, \"ended\": %ld, \"executes\": %ld, "
      "\"calls_reported\": %ld, \"reports\": %ld, \"heartbeats\": %ld, "
      "\"ops\": %ld, \"keys_held\": %ld, \"ops_framed\": %ld, "
      "\"reports_framed\": %ld, \"ops_connections\": %ld, "
      "\"ops_connections_polled\": %ld}\n",
      c.registered, c.ended, c.executes, c.calls_reported, c.reports,
      c.heartbeats, c.ops, c.keys_held, c.ops_framed, c.reports_framed,
      c.ops_connections, c.ops_connections_polled);
  std::fflush(stdout);
}

// Serves signals until one says stop.
void ServeSignals(plexus::sim::SimCluster& cluster, const sigset_t& set) {
  while (true) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    if (sig == SIGUSR1) {
      auto dropped = cluster.DropHost();
      if (dropped.ok()) {
        std::printf("dropped %s %ld\n", dropped->first.c_str(),
                    dropped->second);
      } else {
        std::printf("dropped none: %s\n",
                    std::string(dropped.status().message()).c_str());
      }
      std::fflush(stdout);
    } else if (sig == SIGUSR2) {
      PrintCounters(cluster);
    } else {
      return;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "plexus-sim-workers: many simulated hosts, whose devices only report "
      "completion, in one process"};
  Flags f;
  AddFlags(app, f);
  CLI11_PARSE(app, argc, argv);
  if (f.die_with_parent) prctl(PR_SET_PDEATHSIG, SIGKILL);
  plexus::RaiseOpenFileLimit();
  plexus::InitLogging("sim-workers", f.log_level);
  // Every thread started from here on inherits the mask: the signals are
  // taken by sigwait alone.
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGUSR1, SIGUSR2, SIGTERM, SIGINT}) sigaddset(&set, sig);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  absl::StatusOr<plexus::ClusterSecret> secret =
      plexus::ClusterSecret::Load(f.secret_file);
  if (!secret.ok()) {
    SPDLOG_ERROR("cannot start: {}", secret.status().ToString());
    return 1;
  }
  f.options.secret = *secret;
  f.options.delay = absl::Microseconds(f.delay_us);
  f.options.heartbeat_interval = absl::Milliseconds(f.heartbeat_interval_ms);
  absl::StatusOr<std::unique_ptr<plexus::sim::SimCluster>> cluster =
      plexus::sim::SimCluster::Start(f.options);
  if (!cluster.ok()) {
    SPDLOG_ERROR("cannot start: {}", cluster.status().ToString());
    return 1;
  }
  if (absl::Status s =
          (*cluster)->AwaitRegistered(absl::Seconds(f.register_timeout_s));
      !s.ok()) {
    SPDLOG_ERROR("the simulated hosts did not all register: {}", s.ToString());
    (*cluster)->Shutdown();
    return 1;
  }
  const int64_t ms = absl::ToInt64Milliseconds((*cluster)->registration_time());
  SPDLOG_WARN("{} simulated hosts registered in {} ms",
              f.options.hosts + f.options.spares, ms);
  if (f.ready_fd >= 0) {
    const std::string line =
        absl::StrCat(f.options.hosts + f.options.spares, " ", ms, "\n");
    if (write(f.ready_fd, line.data(), line.size()) !=
        static_cast<ssize_t>(line.size())) {
      SPDLOG_WARN("could not write to --ready-fd {}", f.ready_fd);
    }
    close(f.ready_fd);
  }
  ServeSignals(**cluster, set);
  (*cluster)->Shutdown();
  PrintCounters(**cluster);
  return 0;
}
