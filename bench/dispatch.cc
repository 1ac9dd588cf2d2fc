// plexus-bench-dispatch: how many calls per second the runtime dispatches,
// after the micro-benchmarks of the Pathways paper (section 5.1), on an
// embedded cluster of 1 and 2 hosts with one device each. The kernel is
// trivial (`scale` by 1 of a tiny float32 array), so the figures measure the
// runtime, not the computation:
//
//   op-by-op     each call is issued, then waited on before the next;
//   chained      graphs of 128 calls, each taking the previous output,
//                submitted back to back, the last output waited on;
//   independent  graphs of 128 calls that all take the same input;
//   chained-wait chained, but each graph's result waited on before the
//                next graph is built (one round trip per 128 calls);
//   fused        the 128 ops of a chained graph as one program (`scale` with
//                repeat=128): ops per second, one call per 128 ops.
//
// For chained graphs it also reads the server process's CPU time over >= 2 s
// of them: the server's cost per call (what its records and admission cost
// on the hot path), printed per cluster size (`--hosts-list 1,2,4,8,16,32`).
//
// Beside them, in the same run: the round trip of 64 bytes between two
// processes over TCP loopback (the cost this machine puts on one process
// hop), and the utilisation of a 2-host slice running chained busy_wait
// calls of decreasing length (how short a kernel the runtime keeps the
// devices busy with).
//
//   plexus-bench-dispatch [--hosts-list 1,2] [--repeats 5] [--calls 2048]
//                         [--json FILE] [--timeline on|off]
//                         [--modes chained,op-by-op,...]
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "measure.h"
#include "nlohmann/json.hpp"
#include "plexus/client/client.h"
#include "plexus/client/embedded_cluster.h"

namespace plexus::bench {
namespace {

struct Flags {
  std::vector<int> hosts_list = {1, 2};
  int repeats = 5;
  int calls = 2048;  // per measurement; graphs take whole multiples of 128
  int graph_size = 128;
  std::string json_path;
  std::string log_level = "warn";
  // The modes to measure (--modes); empty: every one.
  std::vector<std::string> modes;
  // --journal on: the server writes its journal (a fresh file per cluster,
  // in a temporary folder), to measure what journaling costs
  // (bench/timeline_ab.sh with AB_FLAG=--journal).
  bool journal = false;
};

// A dispatch figure: one mode on one cluster size.
struct DispatchResult {
  std::string mode;  // "op-by-op", "chained", "independent"
  int hosts = 0;
  int calls = 0;             // per repeat
  Summary calls_per_second;  // one sample per repeat
  // Chained only: the server process's CPU time (user + system) per call,
  // over at least 2 s of chained graphs; < 0 when not measured.
  double server_cpu_micros_per_call = -1;
};

// CPU time (user + system, every thread, live or exited) of process `pid`.
absl::StatusOr<double> ProcessCpuSeconds(pid_t pid) {
  FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/stat").c_str(), "r");
  if (f == nullptr)
    return absl::NotFoundError(absl::StrCat("no process ", pid));
  char buf[4096];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  // Fields after the command (which may hold spaces) start past its ')'.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return absl::InternalError("unreadable /proc/pid/stat");
  unsigned long long utime = 0, stime = 0;
  // state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
  // utime stime
  if (std::sscanf(p + 2,
                  "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
                  &utime, &stime) != 2) {
    return absl::InternalError("unreadable /proc/pid/stat");
  }
  return static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
}

struct BusyResult {
  int64_t micros = 0;
  int calls = 0;        // per repeat
  Summary utilisation;  // (calls * micros) / wall time, per repeat
};

void Progress(const std::string& line) {
  std::printf("[dispatch] %s\n", line.c_str());
  std::fflush(stdout);
}

// Runs `once` (which returns seconds taken) once as a warm-up, then
// `repeats` times, and summarises `work / seconds` per repeat.
template <typename Fn>
absl::StatusOr<Summary> Measure(int repeats, double work, Fn once) {
  Summary summary;
  for (int r = -1; r < repeats; ++r) {
    absl::StatusOr<double> seconds = once();
    if (!seconds.ok()) return seconds.status();
    if (r >= 0) summary.samples.push_back(work / *seconds);
  }
  return summary;
}

// ------------------------------------------------------------ ping-pong

bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// Round trips per second of 64 bytes between this process and a forked
// child over a TCP loopback connection (TCP_NODELAY).
absl::StatusOr<Summary> PingPong(int repeats, int round_trips) {
  constexpr size_t kMessage = 64;
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) return absl::InternalError("socket failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(listener);
    return absl::InternalError(absl::StrCat("bind/listen: ", strerror(errno)));
  }
  const pid_t parent = getpid();
  const pid_t child = fork();
  if (child < 0) {
    close(listener);
    return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    close(listener);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      _exit(2);
    }
    char buf[kMessage];
    while (ReadAll(fd, buf, kMessage) && WriteAll(fd, buf, kMessage)) {
    }
    _exit(0);
  }
  int fd = accept(listener, nullptr, nullptr);
  close(listener);
  absl::StatusOr<Summary> result;
  if (fd < 0) {
    result = absl::InternalError(absl::StrCat("accept: ", strerror(errno)));
  } else {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char buf[kMessage];
    std::memset(buf, 7, sizeof(buf));
    result = Measure(repeats, round_trips, [&]() -> absl::StatusOr<double> {
      const double start = NowSeconds();
      for (int i = 0; i < round_trips; ++i) {
        if (!WriteAll(fd, buf, kMessage) || !ReadAll(fd, buf, kMessage)) {
          return absl::InternalError("ping-pong peer went away");
        }
      }
      return NowSeconds() - start;
    });
    close(fd);  // the child sees EOF and exits
  }
  waitpid(child, nullptr, 0);
  return result;
}

// ------------------------------------------------------------ dispatch

// A client on a fresh embedded cluster of `hosts` hosts, one device each,
// holding a slice of one device per host, a tiny float32 array split over
// it and programs compiled for it.
struct Setup {
  std::unique_ptr<EmbeddedCluster> cluster;
  std::unique_ptr<Client> client;
  std::shared_ptr<Slice> slice;
  Future input;
  std::shared_ptr<Program> scale;
  std::shared_ptr<Program> fused;  // graph_size scales in one program
};

absl::StatusOr<Setup> MakeSetup(int hosts, const Flags& flags) {
  Setup s;
  EmbeddedClusterOptions options;
  options.hosts = hosts;
  options.devices_per_host = 1;
  options.log_level = flags.log_level;
  if (flags.journal) {
    char dir[] = "/tmp/plexus-bench-journal.XXXXXX";
    if (mkdtemp(dir) == nullptr) {
      return absl::InternalError("mkdtemp failed for the journal's folder");
    }
    options.journal_path = absl::StrCat(dir, "/journal.db");
  }
  auto cluster = EmbeddedCluster::Start(options);
  if (!cluster.ok()) return cluster.status();
  s.cluster = std::move(*cluster);
  ClientOptions client_options;
  client_options.name = "bench-dispatch";
  auto client = Client::Connect(s.cluster->address(), client_options);
  if (!client.ok()) return client.status();
  s.client = std::move(*client);
  SliceOptions slice_options;
  slice_options.num_devices = hosts;
  slice_options.placement = hosts > 1 ? Placement::kSpread : Placement::kAny;
  auto slice = s.client->CreateSlice(slice_options);
  if (!slice.ok()) return slice.status();
  s.slice = std::move(*slice);
  if (s.slice->num_hosts() != hosts) {
    return absl::InternalError(absl::StrCat("asked for a slice over ", hosts,
                                            " hosts, got one over ",
                                            s.slice->num_hosts()));
  }
  const ArgSpec arg{{DType::kF32, {4 * hosts}}, Sharding::Split(0)};
  std::vector<float> data(4 * hosts, 1.0f);
  auto input = s.client->Put(s.slice, data.data(), arg);
  if (!input.ok()) return input.status();
  s.input = *input;
  if (absl::Status st = s.client->Wait(s.input); !st.ok()) return st;
  auto scale = s.client->Compile(s.slice, "scale_by_one", "scale",
                                 {{"factor", 1.0}}, {arg});
  if (!scale.ok()) return scale.status();
  s.scale = std::move(*scale);
  auto fused = s.client->Compile(
      s.slice, "scale_by_one_fused", "scale",
      {{"factor", 1.0}, {"repeat", int64_t{flags.graph_size}}}, {arg});
  if (!fused.ok()) return fused.status();
  s.fused = std::move(*fused);
  return s;
}

// Fused: each call is one program that performs `graph_size` scales (the
// chain fused into a single computation); counts graph_size ops per call.
absl::StatusOr<double> FusedOnce(Setup& s, int graphs) {
  const double start = NowSeconds();
  Future last = s.input;
  for (int g = 0; g < graphs; ++g) {
    auto out = s.client->Call(*s.fused, {last});
    if (!out.ok()) return out.status();
    last = (*out)[0];
  }
  if (absl::Status st = s.client->Wait(last); !st.ok()) return st;
  return NowSeconds() - start;
}

absl::StatusOr<double> OpByOpOnce(Setup& s, int calls) {
  const double start = NowSeconds();
  for (int i = 0; i < calls; ++i) {
    auto out = s.client->Call(*s.scale, {s.input});
    if (!out.ok()) return out.status();
    if (absl::Status st = s.client->Wait((*out)[0]); !st.ok()) return st;
  }
  return NowSeconds() - start;
}

// Graphs of `graph_size` calls, submitted back to back (each chained graph
// continues from the previous one's last output), the last output waited on
// at the end; with `wait_each`, every graph's last output is waited on
// before the next graph is built. For independent calls, waiting on the last
// is enough: a device runs its calls in the order they were enqueued
// (worker/device.h), and every call of the graph has a shard on every
// device of the slice.
absl::StatusOr<double> GraphsOnce(Setup& s, int graphs, int graph_size,
                                  bool chained, bool wait_each) {
  const double start = NowSeconds();
  Future last = s.input;
  for (int g = 0; g < graphs; ++g) {
    Graph graph = s.client->NewGraph();
    for (int i = 0; i < graph_size; ++i) {
      auto out = graph.Call(*s.scale, {chained ? last : s.input});
      if (!out.ok()) return out.status();
      last = (*out)[0];
    }
    if (absl::Status st = graph.Submit(); !st.ok()) return st;
    if (wait_each) {
      if (absl::Status st = s.client->Wait(last); !st.ok()) return st;
    }
  }
  if (absl::Status st = s.client->Wait(last); !st.ok()) return st;
  return NowSeconds() - start;
}

// Whether `flags` asks for `mode` (every mode when --modes is not given).
bool Wanted(const Flags& flags, const std::string& mode) {
  return flags.modes.empty() ||
         std::find(flags.modes.begin(), flags.modes.end(), mode) !=
             flags.modes.end();
}

// Measures the modes `flags` asks for on a cluster of `hosts`.
absl::StatusOr<std::vector<DispatchResult>> RunDispatch(int hosts,
                                                        const Flags& flags) {
  auto setup = MakeSetup(hosts, flags);
  if (!setup.ok()) return setup.status();
  Setup& s = *setup;
  std::vector<DispatchResult> results;
  const std::string where =
      absl::StrCat(hosts, hosts == 1 ? " host" : " hosts");
  auto report = [&](const DispatchResult& r) {
    Progress(absl::StrFormat("%s, %s: %s calls/s (median of %d)", r.mode, where,
                             Grouped(r.calls_per_second.median()),
                             flags.repeats));
    results.push_back(r);
  };

  // Op-by-op pays a full round trip per call; a quarter of the calls keeps
  // its time near that of the batched modes.
  const int op_calls = std::max(16, flags.calls / 4);
  if (Wanted(flags, "op-by-op")) {
    auto op = Measure(flags.repeats, op_calls,
                      [&] { return OpByOpOnce(s, op_calls); });
    if (!op.ok()) return op.status();
    report({"op-by-op", hosts, op_calls, *op});
  }

  const int graphs = std::max(1, flags.calls / flags.graph_size);
  const int graph_calls = graphs * flags.graph_size;
  struct Mode {
    const char* name;
    bool chained;
    bool wait_each;
  };
  for (const Mode& mode :
       {Mode{"chained", true, false}, Mode{"independent", false, false},
        Mode{"chained-wait", true, true}}) {
    if (!Wanted(flags, mode.name)) continue;
    auto m = Measure(flags.repeats, graph_calls, [&] {
      return GraphsOnce(s, graphs, flags.graph_size, mode.chained,
                        mode.wait_each);
    });
    if (!m.ok()) return m.status();
    DispatchResult r{mode.name, hosts, graph_calls, *m};
    if (mode.chained && !mode.wait_each) {
      // The server's own cost per call: its CPU time over >= 2 s of
      // chained graphs (clock ticks are 10 ms; 2 s keeps that under 1%).
      const pid_t pid = s.cluster->server_pid();
      auto cpu0 = ProcessCpuSeconds(pid);
      const double t0 = NowSeconds();
      int64_t calls = 0;
      while (NowSeconds() - t0 < 2.0) {
        auto once = GraphsOnce(s, graphs, flags.graph_size, true, false);
        if (!once.ok()) return once.status();
        calls += graph_calls;
      }
      auto cpu1 = ProcessCpuSeconds(pid);
      if (cpu0.ok() && cpu1.ok()) {
        r.server_cpu_micros_per_call = (*cpu1 - *cpu0) * 1e6 / calls;
        Progress(absl::StrFormat(
            "server CPU, chained, %s: %.2f us per call (%.2f per host)", where,
            r.server_cpu_micros_per_call,
            r.server_cpu_micros_per_call / hosts));
      }
    }
    report(r);
  }
  if (Wanted(flags, "fused")) {
    auto fused = Measure(flags.repeats, graph_calls,
                         [&] { return FusedOnce(s, graphs); });
    if (!fused.ok()) return fused.status();
    report({"fused", hosts, graph_calls, *fused});
  }
  return results;
}

// Chained busy_wait calls of `micros` each on a 2-host slice: the fraction
// of the wall time the devices spent in the kernel.
absl::StatusOr<std::vector<BusyResult>> RunBusy(const Flags& flags) {
  auto setup = MakeSetup(2, flags);
  if (!setup.ok()) return setup.status();
  Setup& s = *setup;
  std::vector<BusyResult> results;
  for (int64_t micros : {1000, 500, 200, 100, 50, 20, 10}) {
    auto busy =
        s.client->Compile(s.slice, absl::StrCat("busy_", micros), "busy_wait",
                          {{"micros", micros}}, s.scale->inputs());
    if (!busy.ok()) return busy.status();
    // About 100 ms of kernel time per repeat, at least 100 calls.
    const int calls =
        static_cast<int>(std::clamp<int64_t>(100000 / micros, 100, 10000));
    auto m = Measure(flags.repeats, static_cast<double>(calls) * micros * 1e-6,
                     [&]() -> absl::StatusOr<double> {
                       const double start = NowSeconds();
                       Future last = s.input;
                       for (int i = 0; i < calls; ++i) {
                         auto out = s.client->Call(**busy, {last});
                         if (!out.ok()) return out.status();
                         last = (*out)[0];
                       }
                       if (absl::Status st = s.client->Wait(last); !st.ok()) {
                         return st;
                       }
                       return NowSeconds() - start;
                     });
    if (!m.ok()) return m.status();
    Progress(absl::StrFormat(
        "busy_wait %d us x %d chained calls, 2 hosts: utilisation %.1f%% "
        "(median of %d)",
        micros, calls, 100 * m->median(), flags.repeats));
    results.push_back({micros, calls, *m});
  }
  return results;
}

int Main(int argc, char** argv) {
  Flags flags;
  CLI::App app{"plexus-bench-dispatch: calls per second of the Plexus runtime"};
  app.add_option("--hosts-list", flags.hosts_list,
                 "cluster sizes to measure (hosts, 1 device each)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  app.add_option("--repeats", flags.repeats, "measured repeats (median)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--calls", flags.calls,
                 "calls per measurement (op-by-op: a quarter of them)")
      ->check(CLI::Range(16, 10000000));
  app.add_option("--json", flags.json_path, "also write the figures here");
  app.add_option("--log-level", flags.log_level, "log level of the cluster");
  bool skip_busy = false;
  app.add_flag("--skip-busy", skip_busy,
               "skip the busy-kernel saturation runs");
  bool op_by_op_only = false;
  app.add_flag("--op-by-op-only", op_by_op_only,
               "measure op-by-op calls only (and a short ping-pong): the "
               "C++ client's blocking round trip, for bench/roundtrip.py");
  app.add_option("--modes", flags.modes,
                 "measure only these modes (default: all), e.g. chained to "
                 "profile the server's cost per chained call alone")
      ->delimiter(',')
      ->check(CLI::IsMember(
          {"op-by-op", "chained", "independent", "chained-wait", "fused"}));
  std::string timeline = "on";
  app.add_option("--timeline", timeline,
                 "on (the default of every server and worker): the timeline "
                 "records; off: the cluster it starts records nothing "
                 "($PLEXUS_TIMELINE_EVENTS=0), to measure what recording "
                 "costs (bench/timeline_ab.sh)")
      ->check(CLI::IsMember({"on", "off"}));
  std::string journal = "off";
  app.add_option("--journal", journal,
                 "on: the server writes its journal (plexus-server --journal, "
                 "a fresh file per cluster in /tmp), to measure what it costs "
                 "(bench/timeline_ab.sh with AB_FLAG=--journal); off: none")
      ->check(CLI::IsMember({"on", "off"}));
  CLI11_PARSE(app, argc, argv);
  flags.journal = journal == "on";
  if (op_by_op_only) flags.modes = {"op-by-op"};
  signal(SIGPIPE, SIG_IGN);
  // The server and its workers read it as they start.
  if (timeline == "off") setenv("PLEXUS_TIMELINE_EVENTS", "0", 1);

  const double started = NowSeconds();
  nlohmann::json json;
  json["benchmark"] = "dispatch";
  json["repeats"] = flags.repeats;
  json["calls"] = flags.calls;
  json["graph_size"] = flags.graph_size;
  json["timeline"] = timeline;
  json["journal"] = journal;
  json["cpus"] = sysconf(_SC_NPROCESSORS_ONLN);

  const int kRoundTrips = op_by_op_only ? 2000 : 20000;
  auto ping = PingPong(flags.repeats, kRoundTrips);
  if (!ping.ok()) {
    std::fprintf(stderr, "ping-pong: %s\n", ping.status().ToString().c_str());
    return 1;
  }
  Progress(absl::StrFormat(
      "tcp ping-pong, 64 B, 2 processes: %s round trips/s, %.1f us each "
      "(median of %d)",
      Grouped(ping->median()), 1e6 / ping->median(), flags.repeats));
  json["ping_pong"] = {{"bytes", 64},
                       {"round_trips", kRoundTrips},
                       {"round_trips_per_second", ping->ToJson()},
                       {"micros_per_round_trip", 1e6 / ping->median()}};

  std::vector<DispatchResult> dispatch;
  for (int hosts : flags.hosts_list) {
    auto r = RunDispatch(hosts, flags);
    if (!r.ok()) {
      std::fprintf(stderr, "dispatch, %d hosts: %s\n", hosts,
                   r.status().ToString().c_str());
      return 1;
    }
    dispatch.insert(dispatch.end(), r->begin(), r->end());
  }
  auto busy =
      skip_busy || op_by_op_only
          ? absl::StatusOr<std::vector<BusyResult>>(std::vector<BusyResult>{})
          : RunBusy(flags);
  if (!busy.ok()) {
    std::fprintf(stderr, "busy_wait: %s\n", busy.status().ToString().c_str());
    return 1;
  }

  // The final table.
  std::printf("\nPlexus dispatch (%ld CPUs; median of %d, [min, max])\n",
              sysconf(_SC_NPROCESSORS_ONLN), flags.repeats);
  // server us: the server's CPU time per chained call; per host: that
  // over the hosts the call runs on (issue 10's figure).
  std::printf("%-12s %5s %8s %12s %25s %9s %11s %9s\n", "mode", "hosts",
              "calls", "calls/s", "[min, max]", "us/call", "server us",
              "per host");
  for (const auto& r : dispatch) {
    const Summary& c = r.calls_per_second;
    const bool cpu = r.server_cpu_micros_per_call >= 0;
    std::printf(
        "%-12s %5d %8d %12s %25s %9.1f %11s %9s\n", r.mode.c_str(), r.hosts,
        r.calls, Grouped(c.median()).c_str(),
        absl::StrCat("[", Grouped(c.min()), ", ", Grouped(c.max()), "]")
            .c_str(),
        1e6 / c.median(),
        cpu ? absl::StrFormat("%.2f", r.server_cpu_micros_per_call).c_str()
            : "",
        cpu ? absl::StrFormat("%.2f", r.server_cpu_micros_per_call / r.hosts)
                  .c_str()
            : "");
  }
  std::printf(
      "%-12s %5s %8d %12s %25s %9.1f   (round trips)\n", "tcp-pingpong", "-",
      kRoundTrips, Grouped(ping->median()).c_str(),
      absl::StrCat("[", Grouped(ping->min()), ", ", Grouped(ping->max()), "]")
          .c_str(),
      1e6 / ping->median());
  std::printf(
      "\nbusy_wait, chained, 2-host slice: utilisation = calls x micros / "
      "wall\n");
  std::printf("%8s %8s %10s %20s\n", "micros", "calls", "util", "[min, max]");
  std::optional<int64_t> shortest;
  for (const auto& b : *busy) {
    std::printf("%8ld %8d %9.1f%% %20s\n", static_cast<long>(b.micros), b.calls,
                100 * b.utilisation.median(),
                absl::StrFormat("[%.1f%%, %.1f%%]", 100 * b.utilisation.min(),
                                100 * b.utilisation.max())
                    .c_str());
    if (b.utilisation.median() > 0.9) shortest = b.micros;
  }
  if (shortest) {
    std::printf("shortest kernel with utilisation > 90%%: %ld us\n",
                static_cast<long>(*shortest));
  } else {
    std::printf("shortest kernel with utilisation > 90%%: none measured\n");
  }
  const double elapsed = NowSeconds() - started;
  std::printf("(total %.1f s)\n", elapsed);

  for (const auto& r : dispatch) {
    json["dispatch"].push_back(
        {{"mode", r.mode},
         {"hosts", r.hosts},
         {"calls", r.calls},
         {"calls_per_second", r.calls_per_second.ToJson()}});
    if (r.server_cpu_micros_per_call >= 0) {
      json["dispatch"].back()["server_cpu_micros_per_call"] =
          r.server_cpu_micros_per_call;
      json["dispatch"].back()["server_cpu_micros_per_call_per_host"] =
          r.server_cpu_micros_per_call / r.hosts;
    }
  }
  for (const auto& b : *busy) {
    json["busy_wait"].push_back({{"micros", b.micros},
                                 {"calls", b.calls},
                                 {"hosts", 2},
                                 {"utilisation", b.utilisation.ToJson()}});
  }
  json["busy_wait_shortest_micros_over_90_percent"] =
      shortest ? nlohmann::json(*shortest) : nlohmann::json(nullptr);
  json["seconds"] = elapsed;
  if (!WriteJson(flags.json_path, json)) return 1;
  return 0;
}

}  // namespace
}  // namespace plexus::bench

int main(int argc, char** argv) { return plexus::bench::Main(argc, argv); }
