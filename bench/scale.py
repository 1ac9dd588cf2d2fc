"""bench/scale.py: the single controller against a simulated cluster of up to
2,048 hosts on one machine (issue 28, item 2).

At each size H (--hosts 16,128,512,2048) it starts a real plexus-server, one
plexus-sim-workers process registering H simulated hosts (and one spare)
over real worker sessions (each host's ops and calls done on a data-plane
connection of its own, as a real worker's; --ops-on-grpc: on its gRPC
stream), and a Python client that takes a slice of H
devices, one per host, and issues chained `scale` calls spanning all of them
(each call's input is the previous call's output: one Execute per host per
call, no transfers). The simulated devices report each call done after
--delay-us (default 0) and never carry data (src/plexus/sim/sim_cluster.h).
It measures:

  register_s     from starting the simulated hosts until all H+1 were
                 registered (the sim process's clock: the last host's first
                 message from the server)
  calls_per_s    chained calls spanning all H hosts, issued back to back,
                 the last one waited on
  server_cpu_us  the server process's CPU time (user + system, every
                 thread; /proc/PID/stat as bench/dispatch.cc reads it) per
                 call, over the measured calls
  thread_cpu_us  the busiest server thread's CPU time per call
                 (/proc/PID/task/TID/stat): the controller's serial part
  rss_mib        the server's resident memory after registration and after
                 the calls (what its records of H hosts and the calls cost)
  detect_ms      from asking the sim to drop one host's stream (SIGUSR1: as
                 a host whose process died) until the server's status shows
                 it down, naming it (status reads are polled: status_ms is
                 one read's time); detect_logged_ms until the server logged
                 the loss (its own clock, ms resolution)
  recover_ms     from the drop until the slice is remapped onto the spare
                 (its generation moves), and recover_call_ms until a chain
                 of --lineage calls (default 16) live at the drop, whose
                 values the server recomputes on the new map, resolves
                 again (calls_recomputed: the calls it ran again)
  step90_us      the shortest step time at which the controller keeps all
                 H hosts at least 90% busy (Pathways, Fig. 6's measure):

    A step is one call spanning the H hosts whose devices compute for T.
    The client issues steps ahead (asynchronous dispatch), so the
    controller's work for step n+1 overlaps the devices' work for step n,
    and in steady state a step takes max(T, C), where C is the
    controller's time per step. The devices are then busy T / max(T, C)
    of the time, which is at least 0.9 exactly when T >= 0.9 * C. C is
    the controller's serial cost per call: the CPU time per call of its
    busiest thread, or the process's CPU per call spread over the cores
    it has (--cores, default 2), whichever is larger:

        step90 = 0.9 * max(thread_cpu_us, server_cpu_us / cores)

    It is computed from CPU time, not from wall time, because the
    simulated hosts share this machine's cores with the server (their
    completions would otherwise count against the controller).

Figures from one machine that other work shares are noisy; the table says
how many cores the machine has and its load average at the start. Prints a
table, writes JSON (--json), and a plot of the costs against the hosts
beside Pathways' parity steps (--plot FILE.svg; bench/svg_plot.py, no
plotting package needed).

Each size measures --repeats chains (default 3) and shows each figure's
median; the JSON keeps every chain's (`repeats`), with the server's CPU
and context switches per call by thread name (`server_threads`, of the
median chain).

  python3 bench/scale.py [--hosts 16,128,512,2048] [--calls 0]
      [--repeats 3] [--delay-us 0] [--json FILE] [--plot FILE]
"""
import argparse
import datetime
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if "PLEXUS_BIN_DIR" not in os.environ:
    os.environ["PLEXUS_BIN_DIR"] = str(ROOT / "build" / "bin")
try:
    import plexus
except ImportError:
    sys.path.insert(0, str(ROOT / "python"))
    import plexus
sys.path.insert(0, str(Path(__file__).resolve().parent))
from proc_cpu import ProcessCost  # noqa: E402
from plexus import _core
from plexus._status import cluster_status

TICKS = os.sysconf("SC_CLK_TCK")


def bin_dir():
    """plexus-server and plexus-sim-workers: $PLEXUS_BIN_DIR, else build/bin
    (no plexus-worker needed)."""
    return Path(os.environ.get("PLEXUS_BIN_DIR", ROOT / "build" / "bin"))


def heartbeat_timeout_ms(hosts):
    """The server's failure deadline for H hosts: workers beat every tenth
    of it, so at most ~700 heartbeats a second reach the server whatever H
    (1 s, the default, up to 66 hosts; 30.7 s at 2,049). Registering 2,048
    hosts stalls the server for seconds at a time (its peer broadcast is
    O(H^2)): at 10 s, hosts were declared down for missed heartbeats while
    the rest registered."""
    return max(1000, 15 * hosts)


def _ready_line(read_end, timeout):
    ready, _, _ = select.select([read_end], [], [], timeout)
    line = os.read(read_end, 256).decode().strip() if ready else ""
    os.close(read_end)
    return line


def _spawn(args, log, env):
    read_end, write_end = os.pipe()
    args = [a.replace("{READY_FD}", str(write_end)) for a in args]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=out,
                                pass_fds=(write_end,), env=env)
    os.close(write_end)
    return proc, read_end


def cpu_seconds(pid):
    """CPU time (user + system) of process `pid`, every thread."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def thread_cpu_seconds(pid):
    """{(tid, name): CPU seconds} of each live thread of `pid`."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                text = f.read()
        except OSError:
            continue  # ended meanwhile
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        out[(tid, name)] = (int(fields[11]) + int(fields[12])) / TICKS
    return out


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class SimRun:
    """A plexus-server and a plexus-sim-workers process of `hosts` hosts
    (+ `spares`), on loopback, with a secret of their own; a context
    manager that stops both. Every wait is bounded by `timeout` seconds."""

    def __init__(self, hosts, spares=1, delay_us=0, log_dir=".", timeout=300,
                 heartbeat_ms=None, ops_on_grpc=False):
        self.hosts, self.spares, self.timeout = hosts, spares, timeout
        self.secret = _core.new_cluster_secret()
        env = dict(os.environ, PLEXUS_CLUSTER_SECRET=self.secret)
        log_dir = Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.server_log = log_dir / f"server-{hosts}.log"
        self.sim_log = log_dir / f"sim-{hosts}.log"
        self.server = self.sim = None
        hb = heartbeat_ms or heartbeat_timeout_ms(hosts + spares)
        self.server, ready = _spawn(
            [str(bin_dir() / "plexus-server"), "--listen", "127.0.0.1:0",
             "--ready-fd", "{READY_FD}", "--log-level", "warn",
             "--heartbeat-timeout-ms", str(hb), "--web-listen", "off",
             "--die-with-parent"], self.server_log, env)
        self.address = _ready_line(ready, timeout)
        if not self.address:
            self.close()
            raise RuntimeError(f"the server did not start; see {self.server_log}")
        self.started = time.monotonic()
        self.sim, ready = _spawn(
            [str(bin_dir() / "plexus-sim-workers"), "--server", self.address,
             "--hosts", str(hosts), "--spares", str(spares),
             "--delay-us", str(delay_us), "--ready-fd", "{READY_FD}",
             "--register-timeout-s", str(timeout), "--die-with-parent"]
            + (["--ops-on-grpc"] if ops_on_grpc else []),
            self.sim_log, env)
        line = _ready_line(ready, timeout)
        self.registered_wall_s = time.monotonic() - self.started
        if not line:
            self.close()
            raise RuntimeError(
                f"the simulated hosts did not register within {timeout} s; "
                f"see {self.sim_log}")
        count, ms = line.split()
        assert int(count) == hosts + spares, line
        self.register_s = int(ms) / 1000

    def status(self, fresh=False):
        return cluster_status(self.address, fresh)

    def connect(self, name="scale"):
        return plexus.connect(self.address, name=name, reconnect_timeout=0)

    def _sim_line(self):
        """The sim's next line on stdout, within the timeout."""
        ready, _, _ = select.select([self.sim.stdout], [], [], self.timeout)
        if not ready:
            raise TimeoutError(f"no answer from the sim within {self.timeout} s")
        return self.sim.stdout.readline().decode().strip()

    def drop_host(self):
        """Asks the sim to drop its first serving non-spare host; returns
        (host name, worker id)."""
        self.sim.send_signal(signal.SIGUSR1)
        line = self._sim_line()
        word, name, worker = line.split()
        assert word == "dropped", line
        return name, int(worker)

    def sim_counters(self):
        self.sim.send_signal(signal.SIGUSR2)
        return json.loads(self._sim_line())

    def wait_status(self, predicate, what, fresh=True):
        """The first status for which `predicate` holds, re-read after each
        round of heartbeats (fresh=False: at once, as a measurement does);
        TimeoutError naming `what` after the timeout."""
        deadline = time.monotonic() + self.timeout
        st = self.status()
        while not predicate(st):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {self.timeout} s")
            st = self.status(fresh=fresh)
        return st

    def close(self):
        for proc in (self.sim, self.server):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (self.sim, self.server):
            if proc is None:
                continue
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def chain(prog, x, n):
    """n chained calls of `prog` from x; the last output."""
    for _ in range(n):
        x = prog(x)
    return x


def measure_calls(run, s, prog, x, calls):
    """Chained calls spanning the slice: (calls/s, process CPU us per call,
    busiest thread's CPU us per call and its name, the server's cost per
    call by thread name (proc_cpu.ProcessCost), the last output)."""
    pid = run.server.pid
    cost = ProcessCost({"server": pid})
    cost.start()
    cpu0, threads0 = cpu_seconds(pid), thread_cpu_seconds(pid)
    t0 = time.perf_counter()
    x = chain(prog, x, calls)
    plexus.wait(x, timeout=run.timeout)
    wall = time.perf_counter() - t0
    cpu1, threads1 = cpu_seconds(pid), thread_cpu_seconds(pid)
    per_call = cost.stop(calls)["server"]
    busiest, busiest_s = "", 0.0
    for key, secs in threads1.items():
        d = secs - threads0.get(key, 0.0)
        if d > busiest_s:
            busiest, busiest_s = key[1], d
    return (calls / wall, (cpu1 - cpu0) / calls * 1e6,
            busiest_s / calls * 1e6, busiest, per_call, x)


def _clock_s(when):
    """Seconds since midnight of a datetime or of a log line's HH:MM:SS.mmm."""
    if isinstance(when, str):
        h, m, sec = when.split(":")
        return int(h) * 3600 + int(m) * 60 + float(sec)
    return when.hour * 3600 + when.minute * 60 + when.second + \
        when.microsecond / 1e6


def logged_after(path, needle, since):
    """Seconds from `since` (a datetime) to the first line of the log at
    `path`, stamped at or after it (HH:MM:SS.mmm: to the ms), that holds
    `needle`; or None."""
    start = _clock_s(since)
    for line in Path(path).read_text(errors="replace").splitlines():
        if needle in line:
            at = _clock_s(line.split()[0])
            if at >= start - 0.001:
                return at - start
    return None


def slice_generation(st, slice_id):
    return next(int(sl.get("generation", 0)) for sl in st["slices"]
                if int(sl["slice_id"]) == slice_id)


def measure_recovery(run, s, fill, prog, lineage):
    """Drops one host while a chain of `lineage` calls from `fill` is live
    (its split values hold their lineage: recovery runs them again on the
    spare's map). Returns ms to see the loss in the status, ms until the
    slice is remapped onto the spare, ms until the chain's last future
    resolves again, the calls the server recomputed, the host's name, one
    status read's ms (the resolution of the first two), and ms until the
    server logged the loss (its own detection, at ms resolution)."""
    y = chain(prog, fill(), lineage)
    plexus.wait(y, timeout=run.timeout)
    st = run.status()
    generation = slice_generation(st, s.id)
    recomputed = st["recovery"].get("calls_recomputed", 0)
    status_t0 = time.perf_counter()
    run.status()
    status_ms = (time.perf_counter() - status_t0) * 1e3
    dropped_at = datetime.datetime.now()
    t0 = time.perf_counter()
    name, worker = run.drop_host()
    st = run.wait_status(
        lambda st: any(w["worker_id"] == worker and not w["alive"]
                       for w in st["workers"]),
        f"worker {worker} ({name}) declared down", fresh=False)
    detect = (time.perf_counter() - t0) * 1e3
    down = next(w for w in st["workers"] if w["worker_id"] == worker)
    assert down["host_name"] == name and down.get("down_reason"), down
    st = run.wait_status(lambda st: slice_generation(st, s.id) > generation,
                         "the slice remapped onto the spare", fresh=False)
    recover = (time.perf_counter() - t0) * 1e3
    plexus.wait(y, timeout=run.timeout)
    recover_call = (time.perf_counter() - t0) * 1e3
    recomputed = run.status()["recovery"].get("calls_recomputed", 0) - recomputed
    logged = logged_after(run.server_log,
                          f"worker {worker} lost its connection", dropped_at)
    return {"detect_ms": detect, "recover_ms": recover,
            "recover_call_ms": recover_call, "calls_recomputed": recomputed,
            "dropped": name, "status_ms": status_ms,
            "detect_logged_ms": None if logged is None else logged * 1e3}


def run_size(hosts, args):
    row = {"hosts": hosts}
    with SimRun(hosts, spares=1, delay_us=args.delay_us,
                log_dir=args.log_dir, timeout=args.timeout,
                ops_on_grpc=args.ops_on_grpc) as run:
        row["register_s"] = run.register_s
        row["register_wall_s"] = run.registered_wall_s
        row["rss_registered_mib"] = rss_mib(run.server.pid)
        st = run.status()
        alive = sum(w["alive"] for w in st["workers"])
        assert alive == hosts + 1, (
            f"{alive} of {hosts + 1} hosts alive after registering: "
            + "; ".join(w.get("down_reason", "") for w in st["workers"]
                        if not w["alive"])[:2000])
        client = run.connect()
        try:
            s = client.slice(hosts, placement="spread", timeout=args.timeout)
            assert s.num_hosts == hosts, (s.num_hosts, hosts)
            fill = s.program("fill", shape=[hosts], split_axis=0, value=1.0)
            x = fill()
            prog = s.program("scale", x, factor=1.0)
            plexus.wait(chain(prog, x, 8), timeout=args.timeout)  # warm-up
            calls = args.calls or max(64, min(4096, 400_000 // hosts))
            # --repeats chains, each measured alone: the row holds the
            # median of each figure (this VM's speed varies 2x from one
            # second to the next), `repeats` every chain's figures.
            runs = []
            for _ in range(args.repeats):
                rate, cpu, thread_cpu, thread, per_call, x = measure_calls(
                    run, s, prog, x, calls)
                runs.append(dict(calls_per_s=rate, server_cpu_us=cpu,
                                 thread_cpu_us=thread_cpu,
                                 busiest_thread=thread,
                                 server_switches=per_call["switches"],
                                 server_threads=per_call["threads"]))
            mid = sorted(runs, key=lambda r: r["server_cpu_us"])[len(runs) // 2]
            median = {k: statistics.median(r[k] for r in runs)
                      for k in ("calls_per_s", "server_cpu_us",
                                "thread_cpu_us", "server_switches")}
            rate, cpu, thread_cpu = (median["calls_per_s"],
                                     median["server_cpu_us"],
                                     median["thread_cpu_us"])
            row.update(calls=calls, calls_per_s=rate, server_cpu_us=cpu,
                       thread_cpu_us=thread_cpu,
                       busiest_thread=mid["busiest_thread"],
                       server_switches=median["server_switches"],
                       server_threads=mid["server_threads"], repeats=runs,
                       server_cpu_us_per_host=cpu / hosts,
                       rss_after_calls_mib=rss_mib(run.server.pid))
            row["step90_us"] = 0.9 * max(thread_cpu, cpu / args.cores)
            del x  # its chain's records go: recovery replays only `lineage`
            row.update(measure_recovery(run, s, fill, prog, args.lineage))
            row["sim"] = run.sim_counters()
            row["sim_cpu_s"] = cpu_seconds(run.sim.pid)
        finally:
            client.close()
    return row


COLUMNS = [("hosts", "{:>6}"), ("register_s", "{:>9.2f}"),
           ("rss_registered_mib", "{:>8.1f}"),
           ("calls_per_s", "{:>9.1f}"), ("server_cpu_us", "{:>10.0f}"),
           ("server_cpu_us_per_host", "{:>9.2f}"),
           ("server_switches", "{:>9.0f}"), ("thread_cpu_us", "{:>10.0f}"),
           ("step90_us", "{:>9.0f}"),
           ("rss_after_calls_mib", "{:>8.1f}"),
           ("detect_logged_ms", "{:>9.1f}"), ("detect_ms", "{:>9.1f}"),
           ("recover_ms", "{:>10.1f}"), ("recover_call_ms", "{:>9.1f}")]
HEADERS = ["hosts", "reg s", "rss MiB", "calls/s", "srv us/call", "us/host",
           "switches", "thr us/call", "step90 us", "rss2 MiB", "logged ms", "detect ms",
           "recover ms", "+call ms"]


def print_table(rows):
    widths = [len(f.format(0)) for _, f in COLUMNS]
    print(" ".join(h.rjust(w) for h, w in zip(HEADERS, widths)))
    for r in rows:
        print(" ".join(f.format(r[k]) if r.get(k) is not None else
                       "-".rjust(w) for (k, f), w in zip(COLUMNS, widths)))
    # Where the server's CPU per call goes, by thread name: [us, switches].
    for r in rows:
        if r.get("server_threads"):
            print(f"  {r['hosts']} hosts, server threads per call "
                  f"[CPU us, switches]: {r['server_threads']}")


# Pathways' Fig. 6 (MLSys 2022): the step time at which the single
# controller reaches parity with multi-controller JAX, at 16 and 512 hosts.
PATHWAYS_PARITY_US = [(16, 2300.0), (512, 35000.0)]


def plot(rows, path):
    """The costs against the hosts, log-log, as SVG (bench/svg_plot.py:
    no plotting package needed), beside Pathways' parity steps."""
    from svg_plot import log_log_svg
    series = {}
    for key, label in (("server_cpu_us", "server CPU per call (us)"),
                       ("thread_cpu_us", "busiest server thread per call (us)"),
                       ("step90_us", "shortest 90%-busy step (us)")):
        series[label] = [(r["hosts"], r[key]) for r in rows
                         if r.get(key) is not None]
    series["Pathways: parity step, Fig. 6 (us)"] = PATHWAYS_PARITY_US
    Path(path).write_text(log_log_svg(
        series, xlabel="hosts a call spans (simulated)",
        ylabel="microseconds",
        title="The controller's cost per call against the hosts"))
    print(f"plot: {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", default="16,128,512,2048",
                   help="comma-separated cluster sizes")
    p.add_argument("--calls", type=int, default=0,
                   help="chained calls per size (0: 400,000 / H, 64 to 4096)")
    p.add_argument("--delay-us", type=int, default=0,
                   help="simulated device time per call")
    p.add_argument("--repeats", type=int, default=3,
                   help="chains measured at each size; the table shows "
                        "each figure's median (default 3)")
    p.add_argument("--lineage", type=int, default=16,
                   help="chained calls live when the host is lost (their "
                   "split values are recomputed on the spare's map)")
    p.add_argument("--cores", type=int, default=os.cpu_count(),
                   help="cores the server may use (step90's process bound)")
    p.add_argument("--timeout", type=float, default=600,
                   help="bound of every wait, seconds")
    p.add_argument("--ops-on-grpc", action="store_true",
                   help="the simulated hosts take their ops and send their "
                   "calls done on their gRPC streams (default: as a real "
                   "worker, on a data-plane connection per host)")
    p.add_argument("--log-dir", default="/tmp/plexus-scale")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--plot", help="write an SVG plot of the costs here")
    args = p.parse_args()
    load = os.getloadavg()[0]
    print(f"# {os.cpu_count()} cores, load average {load:.2f} at the start; "
          f"simulated devices complete after {args.delay_us} us; their ops "
          f"on {'gRPC streams' if args.ops_on_grpc else 'data-plane frames'}")
    rows = []
    for h in [int(v) for v in args.hosts.split(",")]:
        rows.append(run_size(h, args))
        print_table(rows[-1:] if len(rows) > 1 else rows)
    print()
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"cores": os.cpu_count(), "load_average": load,
             "delay_us": args.delay_us,
             "ops_on": "grpc" if args.ops_on_grpc else "frames",
             "rows": rows}, indent=1))
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
