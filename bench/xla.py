"""The cost of running an XLA program through Plexus instead of calling the
same jitted function in this process with JAX.

Three programs, each f32[n, n] -> f32[n, n] so calls can chain:
  - tiny:  x + 1 on f32[8, 8] (nothing but overhead), called with a second
    argument it does not read (each call passes two arrays, as the others
    do), and again as "tiny1" with one (the second argument None): what
    one more array per call costs;
  - heavy: r rounds of tanh(x @ w), sized so that one in-process call takes
    about --heavy-ms milliseconds here;
  - big:   x * 1.0001 + 1 on a --big-mib MiB value (f32[n, n]; default 64:
    memory traffic, where a copy of each output would cost as much as the
    call).

For each, per call (medians of --repeats runs):
  - round trip: call, then wait for the result to be ready (one at a time);
  - chained: --calls calls each taking the previous output, submitted at
    once, then one wait; time / calls.
Where the chained time goes (Linux): the CPU time per call of each process
over the chained runs (Plexus: the client, the server and the worker, each
from its process's CPU clock, and the worker by thread, from
/proc/<pid>/task/*/schedstat, which lags a running thread by up to a tick:
bench/proc_cpu.py; "plugin pools" are the PJRT CPU plugin's own threads,
"tf_XLAEigen" and "pjrt-*"; JAX: this process).
The same two measures for a built-in kernel (scale) give the runtime's own
floor, without XLA.
JAX runs in this process on its own CPU client; Plexus runs on a 1-host,
1-device embedded cluster whose worker compiles the same StableHLO through
the xla-cpu-pjrt plugin. Both share this machine's cores.

    PYTHONPATH=python PLEXUS_BIN_DIR=build/bin python3 bench/xla.py

On a GPU machine: --platform cuda --plugin /path/to/xla_cuda_plugin.so
(JAX in-process is then skipped unless it has a GPU backend too) and
--matmul N adds chained N x N matmuls (each on the last result), beside
JAX's where JAX has the platform too.
"""
import argparse
import json
import os
import platform as platform_mod
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
import plexus  # noqa: E402
from proc_cpu import thread_cpu_ns, total_ns  # noqa: E402


def per_call(run, calls, repeats):
    """Median seconds per call of `run(calls)` over `repeats` runs."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run(calls)
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


# The PJRT plugin's own threads: its intra-op Eigen pool names itself
# "tf_XLAEigen"; the worker names the rest (pjrt_support.h,
# ScopedThreadName).
PLUGIN_THREADS = ("tf_", "pjrt-")


class CpuPerCall:
    """CPU µs per call of each process in `pids` ({role: pid}) between
    start() and stop(calls); the worker's also by thread name."""

    def __init__(self, pids):
        self.pids = pids

    def start(self):
        self.before = {r: thread_cpu_ns(p) for r, p in self.pids.items()}
        self.total = {r: total_ns(p, self.before[r])
                      for r, p in self.pids.items()}

    def stop(self, calls):
        out = {}
        for role, pid in self.pids.items():
            by_name = {}
            threads = thread_cpu_ns(pid)
            for key, ns in threads.items():
                used = ns - self.before[role].get(key, 0)
                by_name[key[1]] = by_name.get(key[1], 0) + used
            # The total from the process's clock (exact); the threads'
            # shares approximate (proc_cpu's docstring).
            out[role] = (total_ns(pid, threads) - self.total[role]) / calls / 1e3
            if role == "worker":
                out["worker_threads"] = {
                    k: round(v / calls / 1e3, 2)
                    for k, v in sorted(by_name.items(), key=lambda x: -x[1])
                    if v / calls >= 100}
                out["plugin_pools"] = sum(
                    v for k, v in by_name.items()
                    if k.startswith(PLUGIN_THREADS)) / calls / 1e3
        return out


def jax_timings(jax, f, x, w, calls, repeats):
    jf = jax.jit(f)
    xd = jax.device_put(x)
    wd = jax.device_put(w)
    jf(xd, wd).block_until_ready()  # compile

    def round_trip(n):
        for _ in range(n):
            jf(xd, wd).block_until_ready()

    def chained(n):
        y = xd
        for _ in range(n):
            y = jf(y, wd)
        y.block_until_ready()

    rt = per_call(round_trip, calls, repeats)
    cpu = CpuPerCall({"process": os.getpid()})
    cpu.start()
    ch = per_call(chained, calls, repeats)
    return {"round_trip_s": rt, "chained_s": ch,
            "chained_cpu_us": cpu.stop(calls * repeats)}


def plexus_timings(client, prog, s, x, w, calls, repeats, pids):
    xf = s.put(x)
    wf = None if w is None else s.put(w)
    prog(xf, wf).block_until_ready()  # compile on the worker

    def round_trip(n):
        for _ in range(n):
            prog(xf, wf).block_until_ready()

    def chained(n):
        with client.graph():
            y = xf
            for _ in range(n):
                y = prog(y, wf)
        y.block_until_ready()

    rt = per_call(round_trip, calls, repeats)
    cpu = CpuPerCall(pids)
    cpu.start()
    ch = per_call(chained, calls, repeats)
    return {"round_trip_s": rt, "chained_s": ch,
            "chained_cpu_us": cpu.stop(calls * repeats)}


def leaves_timings(jax, client, s, n, calls, repeats, pids):
    """Chained calls of f(params) = {k: v + 1} over a dict of `n` f32[8]
    leaves, in Plexus and in-process JAX: time and CPU per call."""
    def step(params):
        return {k: v + 1.0 for k, v in params.items()}
    host = {f"p{i:04d}": np.full(8, i, np.float32) for i in range(n)}
    prog = plexus.jit(step, s, name=f"leaves{n}")
    params = {k: s.put(v) for k, v in host.items()}
    jax.tree_util.tree_map(lambda f: f.block_until_ready(),
                           prog(params))  # compile

    def chained(k):
        with client.graph():
            p = params
            for _ in range(k):
                p = prog(p)
        plexus.wait(list(p.values()))

    cpu = CpuPerCall(pids)
    cpu.start()
    t = per_call(chained, calls, repeats)
    row = {"leaves": n, "plexus": {"chained_s": t,
                                   "chained_cpu_us": cpu.stop(calls * repeats)}}
    jf = jax.jit(step)
    jp = jax.device_put(host)
    jax.block_until_ready(jf(jp))

    def jax_chained(k):
        p = jp
        for _ in range(k):
            p = jf(p)
        jax.block_until_ready(p)

    row["jax"] = {"chained_s": per_call(jax_chained, calls, repeats)}
    c = row["plexus"]["chained_cpu_us"]
    print(f"leaves {n}: plexus chained {t * 1e6:.1f} µs/call, jax "
          f"{row['jax']['chained_s'] * 1e6:.1f} µs/call; CPU µs/call: client "
          f"{c['client']:.1f}, server {c['server']:.1f}, worker "
          f"{c['worker']:.1f}", flush=True)
    return row


def cpu_line(name, row):
    """Where a chained call's time went: CPU µs per call by process."""
    p = row["plexus"]["chained_cpu_us"]
    line = (f"{'':6s} chained CPU µs/call: client {p['client']:.1f}, "
            f"server {p['server']:.1f}, worker {p['worker']:.1f} "
            f"(plugin pools {p['plugin_pools']:.1f}; "
            + ", ".join(f"{k} {v}" for k, v in p["worker_threads"].items())
            + ")")
    if "jax" in row:
        line += f" | jax {row['jax']['chained_cpu_us']['process']:.1f}"
    return line


def make_heavy(jnp, rounds):
    def heavy(x, w):
        for _ in range(rounds):
            x = jnp.tanh(x @ w)
        return x
    return heavy


def calibrate(jax, jnp, n, target_ms):
    """Rounds of tanh(x @ w) on f32[n, n] that take ~target_ms in-process."""
    def make(rounds):
        return make_heavy(jnp, rounds)
    x = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    w = (x / n).astype(np.float32)
    # On the device first: a NumPy argument is copied in by every call,
    # which on a GPU costs more than the program (16 MiB at n=2048).
    x, w = jax.device_put(x), jax.device_put(w)
    jf = jax.jit(make(1))
    jf(x, w).block_until_ready()

    def chained(k):
        # The program's own time: calls back to back, one wait at the end
        # (a wait per call would add the launch and sync latency, which on
        # a GPU is longer than one round).
        y = x
        for _ in range(k):
            y = jf(y, w)
        y.block_until_ready()
    t = per_call(chained, 50, 3)
    rounds = max(1, round(target_ms / 1000 / t))
    return make(rounds), rounds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--heavy-n", type=int, default=256)
    ap.add_argument("--heavy-ms", type=float, default=10.0)
    ap.add_argument("--heavy-rounds", type=int, default=0,
                    help="fixed rounds instead of calibrating in-process")
    ap.add_argument("--big-mib", type=int, default=64,
                    help="size of the big case's value (0: skip it)")
    ap.add_argument("--platform", default="cpu")
    ap.add_argument("--plugin", default=None,
                    help="PJRT plugin for the workers (default: the CPU one)")
    ap.add_argument("--matmul", type=int, default=0,
                    help="also measure an N x N matmul's throughput")
    ap.add_argument("--leaves", type=int, default=0,
                    help="also chained calls of a function of a dict of "
                         "this many f32[8] leaves (a model's parameters), "
                         "each returning all of them plus 1: the cost of "
                         "a call per argument")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp
    jax_here = args.platform == "cpu" or any(
        d.platform == "gpu" for d in jax.devices())

    def tiny(x, w):
        return x + 1.0

    if args.heavy_rounds > 0 or not jax_here:
        heavy, rounds = make_heavy(jnp, args.heavy_rounds or 10), (
            args.heavy_rounds or 10)
    else:
        heavy, rounds = calibrate(jax, jnp, args.heavy_n, args.heavy_ms)
    def big(x, w):
        return x * 1.0001 + 1.0

    # (name, function, n, whether it gets the second array)
    cases = [("tiny", tiny, 8, True), ("tiny1", tiny, 8, False),
             ("heavy", heavy, args.heavy_n, True)]
    if args.big_mib > 0:
        cases.append(("big", big, int((args.big_mib * 2**20 / 4) ** 0.5),
                      True))
    results = {"machine": f"{platform_mod.node()} ({platform_mod.machine()}, "
                          f"{__import__('os').cpu_count()} cores)",
               "platform": args.platform, "calls": args.calls,
               "repeats": args.repeats, "heavy_rounds": rounds,
               "heavy_n": args.heavy_n, "cases": {}}
    # On a GPU the worker's device is the GPU itself (gpus=[0]): values stay
    # in its memory between calls, with a budget that holds the matmul's
    # operands and the outputs queued behind them.
    gpus = [0] if args.platform == "cuda" else None
    budget_mib = (max(1024, 8 * args.big_mib) if gpus is None
                  else max(16384, 12 * (args.matmul ** 2 * 4 >> 20)))
    with plexus.local(hosts=1, devices_per_host=1, pjrt_plugin=args.plugin,
                      gpus=gpus, device_memory_mib=budget_mib) as cluster:
        client = cluster.connect(name="bench-xla")
        s = client.slice(1)
        pids = {"client": os.getpid(), "server": cluster.process.pid,
                "worker": cluster.worker_pids()[0]}
        for name, f, n, with_w in cases:
            rng = np.random.default_rng(1)
            x = rng.standard_normal((n, n)).astype(np.float32)
            w = (rng.standard_normal((n, n)) / n).astype(np.float32)
            if not with_w:
                w = None
            prog = plexus.jit(f, s, name=name, platform=args.platform)
            calls = {"tiny": args.calls, "tiny1": args.calls,
                     "heavy": max(10, args.calls // 10),
                     "big": max(5, args.calls // 20)}[name]
            row = {"plexus": plexus_timings(client, prog, s, x, w, calls,
                                            args.repeats, pids)}
            if jax_here:
                row["jax"] = jax_timings(jax, f, x, w, calls, args.repeats)
                for k in ("round_trip_s", "chained_s"):
                    row[f"overhead_{k}"] = row["plexus"][k] - row["jax"][k]
                    row[f"ratio_{k}"] = row["plexus"][k] / row["jax"][k]
            results["cases"][name] = row
            p = row["plexus"]
            j = row.get("jax", {})
            print(f"{name:6s} plexus round trip {p['round_trip_s'] * 1e6:9.1f} µs"
                  f"  chained {p['chained_s'] * 1e6:9.1f} µs/call", end="")
            if j:
                print(f" | jax {j['round_trip_s'] * 1e6:9.1f} / "
                      f"{j['chained_s'] * 1e6:9.1f} µs"
                      f" | overhead {row['overhead_round_trip_s'] * 1e6:8.1f} / "
                      f"{row['overhead_chained_s'] * 1e6:8.1f} µs", end="")
            if j:
                print(f" (plexus/jax chained {row['ratio_chained_s']:.2f}x)",
                      end="")
            print(flush=True)
            print(cpu_line(name, row), flush=True)
        # The runtime's own floor: the same calls of a built-in kernel.
        xf = s.put(np.zeros((8, 8), np.float32))
        scale = s.program("scale", xf, factor=1.0)
        builtin = plexus_timings(client, lambda y, w: scale(y), s,
                                 np.zeros((8, 8), np.float32), None,
                                 args.calls, args.repeats, pids)
        results["builtin_scale_8x8"] = builtin
        print(f"builtin plexus round trip {builtin['round_trip_s'] * 1e6:7.1f} µs"
              f"  chained {builtin['chained_s'] * 1e6:9.1f} µs/call "
              "(the runtime without XLA)", flush=True)
        print(cpu_line("scale", {"plexus": builtin}), flush=True)
        if args.leaves:
            results["leaves"] = leaves_timings(
                jax, client, s, args.leaves, max(10, args.calls // 10),
                args.repeats, pids)
        if args.matmul:
            # Back to back, each on the last result (a @ b, then that @ b):
            # what a training step's matmuls do.
            n = args.matmul
            rng = np.random.default_rng(2)
            a_host = (rng.standard_normal((n, n)) / n ** 0.5).astype(np.float32)
            b_host = (np.eye(n) + rng.standard_normal((n, n)) / n).astype(
                np.float32)

            def matmul(x, w):
                return x @ w

            mm = plexus.jit(matmul, s, name="matmul", platform=args.platform)
            row = {"n": n, "plexus": plexus_timings(
                client, mm, s, a_host, b_host, 20, args.repeats, pids)}
            t = row["plexus"]["chained_s"]
            row["plexus"]["tflops"] = 2 * n ** 3 / t / 1e12
            line = (f"matmul {n}x{n} chained: plexus {t * 1e3:.3f} ms/call "
                    f"({row['plexus']['tflops']:.1f} TFLOP/s)")
            if jax_here:
                row["jax"] = jax_timings(jax, matmul, a_host, b_host, 20,
                                         args.repeats)
                tj = row["jax"]["chained_s"]
                row["jax"]["tflops"] = 2 * n ** 3 / tj / 1e12
                row["ratio_chained_s"] = t / tj
                line += (f" | jax {tj * 1e3:.3f} ms/call "
                         f"({row['jax']['tflops']:.1f} TFLOP/s) | "
                         f"plexus/jax {t / tj:.3f}")
            results["matmul"] = row
            print(line, flush=True)
        st = cluster.status(fresh=True)["workers"][0]["stats"]
        results["worker_xla"] = {k: st.get(k) for k in (
            "xla_platform", "xla_compiles", "xla_cache_hits",
            "bytes_host_to_device", "bytes_device_to_host",
            "transfers_alias", "transfers_device_to_device",
            "transfers_host_staged")}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
