// plexus-bench-transfer: bandwidth of a buffer moving from one worker to
// another, over shared memory (the default between workers on one machine)
// and over TCP (--no-shm, as between hosts), beside a plain memcpy measured
// in the same run.
//
// A buffer is put once on a one-device slice A; an `identity` program
// compiled for a one-device slice B on another host is then called on it
// again and again. Each call moves the bytes A -> B worker to worker (the
// runtime sets up a transfer per call) and copies them once more into the
// output on B; the time from call to the output being ready is the time of
// one transfer. The client's own byte counters show that nothing went
// through it, and the workers' counters (GetClusterStatus) that the bytes
// went from worker A to worker B.
//
//   plexus-bench-transfer [--max-mib 256] [--repeats 5] [--json FILE]
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "measure.h"
#include "nlohmann/json.hpp"
#include "plexus/client/client.h"
#include "plexus/client/embedded_cluster.h"

namespace plexus::bench {
namespace {

struct Flags {
  int64_t max_mib = 256;
  int repeats = 5;
  int64_t device_memory_mib = 2048;
  std::string json_path;
  std::string log_level = "warn";
  std::vector<std::string> modes = {"shm", "tcp"};
  int stuck_seconds = 60;  // no transfer finished for this long: give up
};

constexpr double kMB = 1e6;  // MB/s are decimal megabytes per second

void Progress(const std::string& line) {
  std::printf("[transfer] %s\n", line.c_str());
  std::fflush(stdout);
}

std::vector<int64_t> Sizes(const Flags& flags) {
  std::vector<int64_t> sizes;
  for (int64_t s : {int64_t{4} << 10, int64_t{64} << 10, int64_t{1} << 20,
                    int64_t{16} << 20, int64_t{64} << 20, int64_t{256} << 20}) {
    if (s <= (flags.max_mib << 20)) sizes.push_back(s);
  }
  return sizes;
}

// Small transfers are over in microseconds: repeat them more, so their
// median is not one scheduler hiccup on a busy machine.
int RepeatsFor(int64_t bytes, const Flags& flags) {
  const int64_t extra = std::min<int64_t>(100, (int64_t{16} << 20) / bytes);
  return static_cast<int>(std::max<int64_t>(flags.repeats, extra));
}

// What one cluster mode measured.
struct ModeResult {
  std::map<int64_t, Summary> seconds;   // per transfer, by size
  int64_t bytes_moved = 0;              // sum of size x transfers
  ClientCounters client_delta;          // counters' growth during transfers
  int64_t sender_bytes_sent = 0;        // worker A, data plane, after the run
  int64_t receiver_bytes_received = 0;  // worker B
  bool workers_account_for_bytes = false;
};

// Ends the process when no transfer finishes for `limit`: a call stuck in
// the runtime must fail the benchmark, not hang it (Client::Wait has no
// deadline). The embedded cluster dies with this process. Thread-safe.
class Watchdog {
 public:
  explicit Watchdog(absl::Duration limit)
      : limit_(limit), last_(absl::Now()), thread_([this] { Loop(); }) {}
  ~Watchdog() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  void Progress(const std::string& doing) {
    absl::MutexLock lock(&mu_);
    last_ = absl::Now();
    doing_ = doing;
  }

 private:
  void Loop() {
    absl::MutexLock lock(&mu_);
    while (!stop_) {
      mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Seconds(1));
      if (!stop_ && absl::Now() - last_ > limit_) {
        std::fprintf(stderr,
                     "[transfer] nothing finished for %s after %s: a call is "
                     "stuck in the runtime; giving up\n",
                     absl::FormatDuration(limit_).c_str(), doing_.c_str());
        std::fflush(stdout);
        _exit(3);
      }
    }
  }

  const absl::Duration limit_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_ ABSL_GUARDED_BY(mu_);
  std::string doing_ ABSL_GUARDED_BY(mu_) = "starting";
  std::thread thread_;
};

const proto::WorkerStatus* FindWorker(const proto::ClusterStatus& status,
                                      int64_t worker_id) {
  for (const auto& w : status.workers()) {
    if (w.worker_id() == worker_id) return &w;
  }
  return nullptr;
}

absl::StatusOr<ModeResult> RunMode(bool shared_memory, const Flags& flags,
                                   Watchdog& watchdog) {
  const char* mode = shared_memory ? "shm" : "tcp";
  EmbeddedClusterOptions options;
  options.hosts = 2;
  options.devices_per_host = 1;
  options.device_memory_mib = flags.device_memory_mib;
  options.shared_memory = shared_memory;
  options.log_level = flags.log_level;
  watchdog.Progress(absl::StrCat("starting the ", mode, " cluster"));
  auto cluster = EmbeddedCluster::Start(options);
  if (!cluster.ok()) return cluster.status();
  ClientOptions client_options;
  client_options.name = absl::StrCat("bench-transfer-", mode);
  client_options.shared_memory = shared_memory;
  auto client_or = Client::Connect((*cluster)->address(), client_options);
  if (!client_or.ok()) return client_or.status();
  Client& client = **client_or;

  // One device per host: two one-host slices land on different hosts.
  SliceOptions one;
  one.num_devices = 1;
  one.placement = Placement::kOneHost;
  auto a = client.CreateSlice(one);
  if (!a.ok()) return a.status();
  auto b = client.CreateSlice(one);
  if (!b.ok()) return b.status();
  const int64_t worker_a = (*a)->info().devices(0).worker_id();
  const int64_t worker_b = (*b)->info().devices(0).worker_id();
  if (worker_a == worker_b) {
    return absl::InternalError(
        absl::StrCat("slices A and B are both on worker ", worker_a,
                     "; the benchmark needs them on different hosts"));
  }

  // No transfer has happened yet, so these are exact baselines.
  auto before = (*cluster)->Status();
  if (!before.ok()) return before.status();
  const proto::WorkerStatus* wa0 = FindWorker(*before, worker_a);
  const proto::WorkerStatus* wb0 = FindWorker(*before, worker_b);
  if (wa0 == nullptr || wb0 == nullptr) {
    return absl::InternalError("the slices' workers are not in the status");
  }
  const int64_t sent0 = wa0->stats().bytes_sent();
  const int64_t received0 = wb0->stats().bytes_received();

  ModeResult result;
  for (int64_t bytes : Sizes(flags)) {
    const int64_t n = bytes / static_cast<int64_t>(sizeof(float));
    const ArgSpec arg{{DType::kF32, {n}}, Sharding::Replicated()};
    Future source;
    {
      std::vector<float> data(n);
      for (int64_t i = 0; i < n; ++i) data[i] = static_cast<float>(i % 1000);
      auto put = client.Put(*a, data.data(), arg);
      if (!put.ok()) return put.status();
      source = *put;
    }
    if (absl::Status s = client.Wait(source); !s.ok()) return s;
    watchdog.Progress(absl::StrCat(mode, " put of ", SizeName(bytes)));
    auto identity = client.Compile(*b, absl::StrCat("identity_", bytes),
                                   "identity", {}, {arg});
    if (!identity.ok()) return identity.status();

    const int repeats = RepeatsFor(bytes, flags);
    const ClientCounters c0 = client.counters();
    Summary seconds;
    for (int r = -1; r < repeats; ++r) {  // r == -1: warm-up
      const double start = NowSeconds();
      auto out = client.Call(**identity, {source});
      if (!out.ok()) return out.status();
      if (absl::Status s = client.Wait((*out)[0]); !s.ok()) return s;
      const double took = NowSeconds() - start;
      watchdog.Progress(absl::StrFormat("%s transfer %d of %s", mode, r + 2,
                                        SizeName(bytes)));
      if (r >= 0) seconds.samples.push_back(took);
      result.bytes_moved += bytes;
    }  // each output is dropped at once: B holds one copy at a time
    const ClientCounters c1 = client.counters();
    result.client_delta.bytes_put += c1.bytes_put - c0.bytes_put;
    result.client_delta.bytes_fetched += c1.bytes_fetched - c0.bytes_fetched;
    result.client_delta.calls += c1.calls - c0.calls;

    if (bytes == Sizes(flags).front()) {
      // Once, outside the measured loop: the moved bytes arrive intact.
      auto out = client.Call(**identity, {source});
      if (!out.ok()) return out.status();
      std::vector<float> got(n);
      if (absl::Status s = client.Fetch((*out)[0], got.data()); !s.ok()) {
        return s;
      }
      for (int64_t i = 0; i < n; ++i) {
        if (got[i] != static_cast<float>(i % 1000)) {
          return absl::DataLossError(absl::StrCat(
              mode, ": element ", i, " of a moved ", SizeName(bytes),
              " buffer is ", got[i], ", expected ", i % 1000));
        }
      }
      result.bytes_moved += bytes;
    }
    const double median = seconds.median();
    Progress(absl::StrFormat(
        "%s, %s: %s MB/s, %.1f us per transfer (median of %d)", mode,
        SizeName(bytes), Grouped(bytes / median / kMB), median * 1e6, repeats));
    result.seconds[bytes] = seconds;
  }

  // Worker stats arrive with heartbeats (every 500 ms): wait, with a
  // deadline, until they show every moved byte.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (true) {
    auto now = (*cluster)->Status();
    if (!now.ok()) return now.status();
    const proto::WorkerStatus* wa = FindWorker(*now, worker_a);
    const proto::WorkerStatus* wb = FindWorker(*now, worker_b);
    if (wa != nullptr && wb != nullptr) {
      result.sender_bytes_sent = wa->stats().bytes_sent() - sent0;
      result.receiver_bytes_received = wb->stats().bytes_received() - received0;
    }
    result.workers_account_for_bytes =
        result.sender_bytes_sent >= result.bytes_moved &&
        result.receiver_bytes_received >= result.bytes_moved;
    if (result.workers_account_for_bytes || absl::Now() > deadline) break;
    absl::SleepFor(absl::Milliseconds(50));  // the next heartbeat
  }
  Progress(absl::StrFormat(
      "%s: moved %s B; worker A sent %s B, worker B received %s B (data "
      "plane); client put %s B, fetched %s B during the transfers",
      mode, Grouped(result.bytes_moved), Grouped(result.sender_bytes_sent),
      Grouped(result.receiver_bytes_received),
      Grouped(result.client_delta.bytes_put),
      Grouped(result.client_delta.bytes_fetched)));
  return result;
}

// Median seconds of one memcpy of `bytes` between two touched buffers.
// Small copies are timed in batches so one sample is not below the clock's
// resolution.
Summary Memcpy(int64_t bytes, int repeats) {
  // One allocation, the destination 2 KiB off the source's page offset:
  // equal offsets would measure 4K-aliasing stalls, not memcpy.
  std::vector<char> buffer(2 * bytes + 4096, 1);
  char* const src_data = buffer.data();
  char* const dst_data = buffer.data() + bytes + 2048;
  const int64_t batch = std::max<int64_t>(1, (int64_t{64} << 20) / bytes);
  Summary seconds;
  for (int r = -1; r < repeats; ++r) {
    const double start = NowSeconds();
    for (int64_t i = 0; i < batch; ++i) {
      std::memcpy(dst_data, src_data, bytes);
      asm volatile("" : : "r"(dst_data) : "memory");  // keep every copy
    }
    const double took = (NowSeconds() - start) / batch;
    if (r >= 0) seconds.samples.push_back(took);
  }
  return seconds;
}

nlohmann::json Figures(int64_t bytes, const Summary& seconds) {
  return {{"seconds", seconds.ToJson()},
          {"mb_per_second", bytes / seconds.median() / kMB},
          {"mb_per_second_min", bytes / seconds.max() / kMB},
          {"mb_per_second_max", bytes / seconds.min() / kMB}};
}

int Main(int argc, char** argv) {
  Flags flags;
  CLI::App app{"plexus-bench-transfer: worker-to-worker bandwidth"};
  app.add_option("--max-mib", flags.max_mib, "largest buffer, MiB")
      ->check(CLI::Range(1, 256));
  app.add_option("--repeats", flags.repeats,
                 "measured repeats (median); small sizes repeat more")
      ->check(CLI::Range(1, 1000));
  app.add_option("--device-memory-mib", flags.device_memory_mib,
                 "memory budget of each device");
  app.add_option("--json", flags.json_path, "also write the figures here");
  app.add_option("--log-level", flags.log_level, "log level of the cluster");
  app.add_option("--modes", flags.modes,
                 "worker-to-worker paths to measure: shm, tcp")
      ->delimiter(',')
      ->check(CLI::IsMember({"shm", "tcp"}));
  app.add_option("--stuck-seconds", flags.stuck_seconds,
                 "fail when no transfer finishes for this long")
      ->check(CLI::Range(1, 3600));
  CLI11_PARSE(app, argc, argv);
  signal(SIGPIPE, SIG_IGN);
  const double started = NowSeconds();

  std::map<int64_t, Summary> memcpy_seconds;
  for (int64_t bytes : Sizes(flags)) {
    memcpy_seconds[bytes] = Memcpy(bytes, RepeatsFor(bytes, flags));
    Progress(
        absl::StrFormat("memcpy, %s: %s MB/s (median of %d)", SizeName(bytes),
                        Grouped(bytes / memcpy_seconds[bytes].median() / kMB),
                        RepeatsFor(bytes, flags)));
  }
  std::map<std::string, ModeResult> modes;
  Watchdog watchdog(absl::Seconds(flags.stuck_seconds));
  for (const std::string& mode : flags.modes) {
    const bool shm = mode == "shm";
    auto r = RunMode(shm, flags, watchdog);
    if (!r.ok()) {
      std::fprintf(stderr, "%s: %s\n", shm ? "shm" : "tcp",
                   r.status().ToString().c_str());
      return 1;
    }
    modes[shm ? "shm" : "tcp"] = std::move(*r);
  }

  std::printf(
      "\nPlexus worker-to-worker transfer (2 hosts x 1 device, %ld CPUs; "
      "MB = 1e6 bytes; median)\n",
      sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("%8s %12s %12s %12s %10s %10s %10s\n", "size", "shm MB/s",
              "tcp MB/s", "memcpy MB/s", "shm/memcpy", "shm us", "tcp us");
  nlohmann::json json;
  json["benchmark"] = "transfer";
  json["repeats"] = flags.repeats;
  json["cpus"] = sysconf(_SC_NPROCESSORS_ONLN);
  json["device_memory_mib"] = flags.device_memory_mib;
  // MB/s of one mode at one size, or nothing when the mode was not run.
  auto bandwidth = [&](const std::string& mode,
                       int64_t bytes) -> std::optional<double> {
    auto it = modes.find(mode);
    if (it == modes.end()) return std::nullopt;
    return bytes / it->second.seconds[bytes].median() / kMB;
  };
  auto cell = [](std::optional<double> v) {
    return v ? Grouped(*v) : std::string("-");
  };
  for (int64_t bytes : Sizes(flags)) {
    const Summary& mc = memcpy_seconds[bytes];
    const double mc_bw = bytes / mc.median() / kMB;
    const auto shm_bw = bandwidth("shm", bytes);
    const auto tcp_bw = bandwidth("tcp", bytes);
    std::printf(
        "%8s %12s %12s %12s %10s %10s %10s\n", SizeName(bytes).c_str(),
        cell(shm_bw).c_str(), cell(tcp_bw).c_str(), Grouped(mc_bw).c_str(),
        shm_bw ? absl::StrFormat("%.3f", *shm_bw / mc_bw).c_str() : "-",
        shm_bw ? absl::StrFormat("%.1f", bytes / *shm_bw / kMB * 1e6).c_str()
               : "-",
        tcp_bw ? absl::StrFormat("%.1f", bytes / *tcp_bw / kMB * 1e6).c_str()
               : "-");
    nlohmann::json row = {{"bytes", bytes},
                          {"repeats", RepeatsFor(bytes, flags)},
                          {"memcpy", Figures(bytes, mc)}};
    for (const auto& [mode, r] : modes) {
      row[mode] = Figures(bytes, r.seconds.at(bytes));
    }
    if (shm_bw) row["shm_over_memcpy"] = *shm_bw / mc_bw;
    json["sizes"].push_back(row);
  }
  std::printf("\n");
  bool accounted = true;
  for (const auto& [mode, r] : modes) {
    std::printf(
        "%s: moved %s B worker to worker: worker A sent %s B, worker B "
        "received %s B; the client put %s B and fetched %s B meanwhile%s\n",
        mode.c_str(), Grouped(r.bytes_moved).c_str(),
        Grouped(r.sender_bytes_sent).c_str(),
        Grouped(r.receiver_bytes_received).c_str(),
        Grouped(r.client_delta.bytes_put).c_str(),
        Grouped(r.client_delta.bytes_fetched).c_str(),
        r.workers_account_for_bytes ? "" : "  (WORKER COUNTERS FALL SHORT)");
    accounted = accounted && r.workers_account_for_bytes &&
                r.client_delta.bytes_put == 0 &&
                r.client_delta.bytes_fetched == 0;
    json["accounting"][mode] = {
        {"bytes_moved", r.bytes_moved},
        {"worker_a_bytes_sent", r.sender_bytes_sent},
        {"worker_b_bytes_received", r.receiver_bytes_received},
        {"client_bytes_put_during_transfers", r.client_delta.bytes_put},
        {"client_bytes_fetched_during_transfers", r.client_delta.bytes_fetched},
        {"workers_account_for_bytes", r.workers_account_for_bytes}};
  }
  const double elapsed = NowSeconds() - started;
  std::printf("(total %.1f s)\n", elapsed);
  json["seconds"] = elapsed;
  if (!WriteJson(flags.json_path, json)) return 1;
  return accounted ? 0 : 2;
}

}  // namespace
}  // namespace plexus::bench

int main(int argc, char** argv) { return plexus::bench::Main(argc, argv); }
