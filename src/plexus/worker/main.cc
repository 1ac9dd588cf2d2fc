// plexus-worker: one per host. See worker.h.
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdlib>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "plexus/common/address.h"
#include "plexus/common/credentials.h"
#include "plexus/common/logging.h"
#include "plexus/common/process.h"
#include "plexus/timeline/timeline.h"
#include "plexus/worker/worker.h"

namespace {

// What the command line (and the environment) say.
struct Flags {
  plexus::WorkerOptions options;
  double memory_mib = 1024;
  CLI::Option* memory_option = nullptr;  // whether --device-memory-mib came
  bool die_with_parent = false;
  bool no_shm = false;
  bool no_cuda_ipc = false;
  std::string log_level = "info";
  double reconnect_timeout_s = 300;
  int ready_fd = -1;
  std::string secret_file;
  size_t timeline_events = 0;
};

// The defaults the environment gives (flags win); false, saying why, for
// one that does not parse.
bool DefaultsFromEnvironment(Flags& f) {
  // Off by default where the environment says PLEXUS_CUDA_IPC=0 (how an
  // embedded cluster passes it to its workers).
  if (const char* env = std::getenv("PLEXUS_CUDA_IPC"); env && *env) {
    f.no_cuda_ipc = std::string(env) == "0";
  }
  if (const char* env = std::getenv("PLEXUS_PJRT_PLUGIN")) {
    f.options.pjrt_plugin = env;
  }
  if (const char* env = std::getenv("PLEXUS_GPUS"); env && *env) {
    for (absl::string_view g : absl::StrSplit(env, ',')) {
      int64_t gpu = 0;
      if (!absl::SimpleAtoi(g, &gpu) || gpu < 0) {
        std::fprintf(stderr, "PLEXUS_GPUS: '%s' is not a GPU index\n",
                     std::string(g).c_str());
        return false;
      }
      f.options.gpus.push_back(gpu);
    }
  }
  if (const char* env = std::getenv("PLEXUS_NCCL_OFFERS_WITHOUT_GPU")) {
    f.options.nccl_offers_without_gpu = std::string(env) == "1";
  }
  f.timeline_events = plexus::TimelineEventsFromEnv();
  return true;
}

void AddFlags(CLI::App& app, Flags& f) {
  plexus::WorkerOptions& options = f.options;
  app.add_option("--server", options.server_address,
                 "address of plexus-server (host:port)")
      ->required();
  app.add_option("--devices", options.num_devices, "number of CPU devices")
      ->check(CLI::Range(1, 1024));
  f.memory_option =
      app.add_option("--device-memory-mib", f.memory_mib,
                     "memory budget per device, MiB (with the plugin's "
                     "devices: at most this, default the plugin's limit)")
          ->check(CLI::PositiveNumber);
  app.add_option("--host-name", options.host_name,
                 "name this host reports (default: the machine's)");
  app.add_option("--data-host", options.data_host,
                 "address the TCP data plane binds: HOST (a free port) or "
                 "HOST:PORT (a fixed one, e.g. 0.0.0.0:7071)");
  app.add_option("--advertise-host", options.advertise_host,
                 "host (name or address) peers and clients are told to "
                 "reach the TCP data plane at, with its bound port (default: "
                 "the --data-host address; when that binds every interface, "
                 "the local address this host reaches the server from)");
  app.add_flag("--no-shm", f.no_shm,
               "move every buffer over TCP, even to workers on this machine");
  app.add_flag("--no-cuda-ipc", f.no_cuda_ipc,
               "move device values to workers on this host through host "
               "memory, never by CUDA IPC (default: $PLEXUS_CUDA_IPC=0)");
  app.add_flag("--spare", options.spare,
               "join as a spare: the server places no new slice here and "
               "keeps this host to take the place of one that is lost");
  app.add_flag("--die-with-parent", f.die_with_parent,
               "exit when the parent process dies (embedded clusters); "
               "such a worker also exits when its server goes, where a "
               "standalone one registers again");
  app.add_option("--reconnect-timeout-s", f.reconnect_timeout_s,
                 "standalone worker: give up (exit 2) when the server cannot "
                 "be reached for this long; attempts back off from 0.1 s to "
                 "5 s apart (0: never give up)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--ready-fd", f.ready_fd,
                 "once registered with the server, write the worker id and a "
                 "newline to this inherited file descriptor and close it (a "
                 "parent waits by reading it)");
  app.add_option("--pjrt-plugin", options.pjrt_plugin,
                 "PJRT C API plugin (.so) for XLA programs, loaded on the "
                 "first XLA call (default: $PLEXUS_PJRT_PLUGIN)");
  app.add_option("--gpus", options.gpus,
                 "GPU plugins: the host's GPUs this worker uses, e.g. 0,1 "
                 "(default: $PLEXUS_GPUS); workers sharing a host split "
                 "them, or share one. Implies --devices-from-plugin")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--nccl-offers-without-gpu", options.nccl_offers_without_gpu,
               "tests without a GPU: register as running NCCL and trade "
               "all_reduce offers, which always choose the host path "
               "(default: $PLEXUS_NCCL_OFFERS_WITHOUT_GPU=1)");
  app.add_flag("--devices-from-plugin", options.devices_from_plugin,
               "this worker's devices are the PJRT plugin's (one per GPU), "
               "with their kinds and memory; the plugin loads at start");
  app.add_option("--secret-file", f.secret_file,
                 "file holding the cluster secret, hex (default: "
                 "$PLEXUS_CLUSTER_SECRET, which wins when set); required: "
                 "loopback or not, a worker holds the cluster's secret");
  app.add_option("--tls-ca", options.tls_ca,
                 "PEM file of the CA that signed the server's TLS "
                 "certificate (default: $PLEXUS_TLS_CA; neither: plain "
                 "text)");
  app.add_option("--log-level", f.log_level, "trace|debug|info|warn|error");
  app.add_option("--timeline-events", f.timeline_events,
                 "events the timeline ring keeps (what `plexus trace` "
                 "collects; about 88 bytes each); 0: no recording. Default: "
                 "$PLEXUS_TIMELINE_EVENTS, else 65536");
}

// The worker's options from the parsed flags.
void FinishOptions(Flags& f) {
  plexus::WorkerOptions& options = f.options;
  options.timeline = f.timeline_events > 0;
  options.timeline_skew = plexus::TestSkewFromEnv(options.host_name);
  if (const char* stall = std::getenv("PLEXUS_TEST_STALL_FIRST_EXECUTE_MS")) {
    options.stall_first_execute = absl::Milliseconds(std::atoi(stall));
  }
  if (f.timeline_events > 0) options.timeline_capacity = f.timeline_events;
  options.device_memory = static_cast<int64_t>(f.memory_mib * (1 << 20));
  options.device_memory_given = f.memory_option->count() > 0;
  if (!options.gpus.empty()) options.devices_from_plugin = true;
  options.shared_memory = !f.no_shm;
  options.cuda_ipc = !f.no_cuda_ipc;
}

// The process around the worker: its parent's death, the plugin's log,
// open files, logging, and termination signals (blocked in every thread;
// one thread waits for them).
void SetUpProcess(const Flags& f) {
  if (f.die_with_parent) prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The PJRT plugin's own log (XLA/TSL) goes to stderr: quiet unless we
  // debug. Its errors reach us as statuses, which we log. The environment
  // wins when set.
  setenv("TF_CPP_MIN_LOG_LEVEL",
         f.log_level == "debug" || f.log_level == "trace" ? "0" : "3",
         /*overwrite=*/0);
  plexus::RaiseOpenFileLimit();
  plexus::UseLockOrderChecksOfThisBuild();
  plexus::InitLogging(
      f.options.host_name.empty() ? "worker" : "worker " + f.options.host_name,
      f.log_level);
  plexus::BlockTerminationSignals();
}

// Runs the worker host until a signal or until it gives up; the exit code.
int Serve(const Flags& f) {
  plexus::WorkerHostOptions host_options;
  host_options.standalone = !f.die_with_parent;
  host_options.backoff.give_up_after = absl::Seconds(f.reconnect_timeout_s);
  host_options.backoff.cap =
      plexus::RetryCapFor(f.options.server_address, host_options.backoff.cap);
  plexus::WorkerHost host(f.options, host_options);
  bool registered = false;
  absl::Status end;
  {
    // Joined at the end of this block, before the host goes: a signal
    // that comes later finds no handler (it stays blocked) rather than a
    // destroyed host.
    plexus::TerminationSignalWatcher on_signal([&](int sig) {
      SPDLOG_INFO("signal {}: shutting down", sig);
      host.Shutdown();
    });
    end = host.Run([&](const plexus::Worker& worker) {
      const bool first = !registered;
      registered = true;
      if (!first || f.ready_fd < 0) return;  // the first registration only
      const std::string line = absl::StrCat(worker.worker_id(), "\n");
      if (write(f.ready_fd, line.data(), line.size()) !=
          static_cast<ssize_t>(line.size())) {
        SPDLOG_WARN("could not write to --ready-fd {}", f.ready_fd);
      }
      close(f.ready_fd);
    });
  }
  if (!registered && !absl::IsCancelled(end)) {
    SPDLOG_ERROR("cannot start: {}", end.ToString());
    return 1;
  }
  SPDLOG_INFO("stopped: {}", end.ToString());
  // Cancelled: stopped by a signal, or (embedded) the server ended the
  // session on purpose (it is shutting down). Anything else (the server
  // vanished, or could not be reached again in time) is an error.
  const int code = absl::IsCancelled(end) ? 0 : 2;
  if (host.TeardownPending()) {
    // A device is still in a kernel that cannot be interrupted: the
    // process ends without it (destroying the host would wait for it).
    SPDLOG_INFO("exiting with a kernel still running");
    spdlog::shutdown();
    std::_Exit(code);
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"plexus-worker: executes programs on this host's devices"};
  Flags flags;
  if (!DefaultsFromEnvironment(flags)) return 2;
  AddFlags(app, flags);
  CLI11_PARSE(app, argc, argv);
  FinishOptions(flags);
  SetUpProcess(flags);

  absl::StatusOr<plexus::ClusterSecret> secret =
      plexus::ClusterSecret::Load(flags.secret_file);
  if (!secret.ok()) {
    SPDLOG_ERROR("cannot start: {}", secret.status().ToString());
    return 1;
  }
  flags.options.secret = *secret;
  // Children (none today) need not see it.
  unsetenv(plexus::kClusterSecretEnv);
  return Serve(flags);
}
