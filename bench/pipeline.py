"""bench/pipeline: device utilization and live activations of GPipe and 1F1B
through plexus.pipeline, on the embedded default (2 hosts x 2 devices, one
stage per device, so every stage-to-stage hop crosses hosts).

Each stage's forward and backward is a `device_sleep` of fixed length: it
holds the stage's device (one FIFO thread per device) without using a CPU
core, standing in for accelerator time on this 2-core machine.

Utilization. Activations are tiny (1 KiB), so transfers cost only their
latency. K steps are submitted back to back, as a training loop would (one
program graph per step; steps do not overlap, because stage 0's device runs
the last backward of step k before the first forward of step k+1), and the
step time is the median interval between consecutive step completions.
Utilization = (sum of device-busy time) / (S x step time). Busy time per
stage per step is counted two ways: nominal, M x (F + B) from the sleep
lengths; and measured, the time each device takes to run the same 2M calls
when it never waits for another stage (all S devices at once, same
cadence), which adds the sleep's own overshoot on this VM and the runtime's
per-call cost on the device thread. GPipe and 1F1B have the same ideal,
M/(M+S-1), for any F and B. A model (plexus.pipeline.simulate) with the
measured kernel length and the measured cross-host hop latency shows where
the rest goes.

Memory. Each stage keeps a 1 MiB float32 activation per micro-batch for its
backward (stashed by a matmul in the forward and read by one in the
backward); boundary activations and their gradients stay tiny. A fresh
cluster per schedule, so each device's peak (the object store's
device_peak_bytes, reported by heartbeat) belongs to that schedule alone;
peak / 1 MiB = micro-batches of activations alive at once on that stage.

    PYTHONPATH=python PLEXUS_BIN_DIR=build/bin python3 bench/pipeline.py
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

import plexus  # noqa: E402
from plexus.pipeline import (Pipeline, Stage, peak_in_flight,  # noqa: E402
                             schedule_actions, simulate)

MIB = 1 << 20


class Kernels:
    """Built-in kernels on one slice, compiled once per signature."""

    def __init__(self, slice_):
        self.slice = slice_
        self.programs = {}

    def __call__(self, kernel, *args, **attrs):
        key = (kernel, tuple(sorted(attrs.items())),
               tuple((a.shape, str(a.dtype), a.sharding) for a in args))
        if key not in self.programs:
            self.programs[key] = self.slice.program(kernel, *args, **attrs)
        return self.programs[key](*args)


def bench_stage(slice_, fwd_us, bwd_us, stash):
    """A stage whose forward and backward hold the device for fwd_us and
    bwd_us. With stash, the forward also keeps a big activation
    (x @ w: [rows, cols]) for the backward, which reads it (saved @ w^T)."""
    k = Kernels(slice_)

    def forward(w, x, target=None):
        y = k("device_sleep", x, micros=fwd_us)
        saved = k("matmul", x, w) if stash else y
        return y, saved

    def backward(w, saved, dy):
        if stash:
            t = k("matmul", saved, w, transpose_b=1)
            src = t if dy is None else k("add", t, dy)
        else:  # the last stage reads its own output; the others, dy
            src = saved if dy is None else dy
        return k("device_sleep", src, micros=bwd_us), None

    return Stage(slice_, forward, backward)


def make_pipeline(client, S, schedule, fwd_us, bwd_us, rows, cols, stash):
    slices = [client.slice(1, placement="one_host") for _ in range(S)]
    devices = [(s.devices[0]["worker"], s.devices[0]["device"])
               for s in slices]
    if len(set(devices)) != S:
        raise RuntimeError(f"stages share devices: {devices}")
    w = np.ones((1, cols), np.float32)
    stages = [bench_stage(s, fwd_us, bwd_us, stash) for s in slices]
    return Pipeline(stages, params=[s.put(w) for s in slices],
                    schedule=schedule), slices, devices


def micro_batches(slice_, M, rows):
    return [slice_.put(np.full((rows, 1), m, np.float32)) for m in range(M)]


def step_intervals(submit, K, skip=2):
    """Submits K steps back to back (submit() records one step's graph and
    returns something with block_until_ready), then waits for each in turn.
    Returns the intervals between consecutive completions after the first
    `skip` (the first steps overlap the recording of the later ones, and a
    late wake-up of the client on step 1 shortens interval 1), and the mean
    seconds per step counted from the first submit."""
    t0 = time.perf_counter()
    outs = [submit() for _ in range(K)]
    done = []
    for o in outs:
        o.block_until_ready()
        done.append(time.perf_counter())
    return ([b - a for a, b in zip(done, done[1:])][skip:],
            (done[-1] - t0) / K)


class _Chains:
    def __init__(self, ys):
        self.ys = ys

    def block_until_ready(self):
        for y in self.ys:
            y.block_until_ready()


def busy_reference(client, slices, M, fwd_us, bwd_us, rows):
    """submit() for the device-busy reference: every stage's device runs
    its M forward and M backward device_sleep calls as an independent chain
    (no waiting on other stages), all S devices at once, one graph per
    step."""
    xs = [s.put(np.zeros((rows, 1), np.float32)) for s in slices]
    kf = [s.program("device_sleep", x, micros=fwd_us)
          for s, x in zip(slices, xs)]
    kb = [s.program("device_sleep", x, micros=bwd_us)
          for s, x in zip(slices, xs)]

    def submit():
        ys = []
        with client.graph():
            for x, f, b in zip(xs, kf, kb):
                y = x
                for _ in range(M):
                    y = f(y)
                for _ in range(M):
                    y = b(y)
                ys.append(y)
        return _Chains(ys)

    submit().block_until_ready()
    return submit


def hop_latency(client, a, b, rows, calls=100, repeats=5):
    """Extra seconds per call when a chain of device_sleep(0) calls
    alternates between slices a and b (every call waits for a transfer of
    its float32[rows, 1] input from the other stage's host) over the same
    chain on slice a alone. (Zero-length sleeps keep the timer's own noise
    out of the difference.)"""
    micros = 0
    x = a.put(np.zeros((rows, 1), np.float32))
    pa = a.program("device_sleep", x, micros=micros)
    pb = b.program("device_sleep", x, micros=micros)

    def per_call(progs):
        def submit():
            with client.graph():
                y = x
                for i in range(calls):
                    y = progs[i % len(progs)](y)
            return y
        submit().block_until_ready()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            submit().block_until_ready()
            times.append((time.perf_counter() - t0) / calls)
        return statistics.median(times)

    return per_call([pa, pb]) - per_call([pa])


def sleep_overshoot(fwd_us, bwd_us, n=80, threads=4):
    """Samples of how much longer than asked a sleep of fwd_us / bwd_us
    takes on this machine (seconds), from `threads` threads sleeping at
    once like the stages' device threads (the kernel's timer, as
    device_sleep's std::this_thread::sleep_for uses)."""
    import threading
    samples = {"F": [], "B": []}

    def sampler():
        for i in range(n):
            kind, us = ("F", fwd_us) if i % 2 == 0 else ("B", bwd_us)
            t0 = time.perf_counter()
            time.sleep(us * 1e-6)
            samples[kind].append(time.perf_counter() - t0 - us * 1e-6)

    ts = [threading.Thread(target=sampler) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return samples


def model_step(acts, fwd_s, bwd_s, hop_s, over=None, runs=200, seed=0):
    """Median step time of the schedule on model devices: kernels of fwd_s /
    bwd_s plus (when `over` is given) a random overshoot drawn from the
    samples minus their mean, so the mean kernel length stays fwd_s /
    bwd_s; values cross stages in hop_s."""
    import random
    if over is None:
        return simulate(acts, fwd_s, bwd_s, hop_s)[0]
    rng = random.Random(seed)
    mf = statistics.mean(over["F"])
    mb = statistics.mean(over["B"])
    fwd = lambda s, m: fwd_s + rng.choice(over["F"]) - mf  # noqa: E731
    bwd = lambda s, m: bwd_s + rng.choice(over["B"]) - mb  # noqa: E731
    return statistics.median(simulate(acts, fwd, bwd, hop_s)[0]
                             for _ in range(runs))


def wait_for_stats(cluster, client, deadline_s=10.0):
    """Waits until a heartbeat taken after every call issued so far has run
    reached the server; returns the status."""
    issued = client.counters()["calls"]
    return cluster.wait_until(
        lambda st: sum(w["stats"].get("calls_executed", 0)
                       for w in st["workers"]) >= issued,
        timeout=deadline_s, what=f"a heartbeat with {issued} calls executed")


def device_peaks(status, devices):
    by_worker = {w["worker_id"]: w["stats"] for w in status["workers"]}
    return [by_worker[wk].get("device_peak_bytes", [0] * (d + 1))[d]
            for wk, d in devices]


def run_schedule(args, schedule):
    S, M = args.stages, args.microbatches
    res = {"schedule": schedule}
    with plexus.local(hosts=2, devices_per_host=2,
                      log_file=args.log_file) as cluster:
        client = cluster.connect(name=f"bench-pipeline-{schedule}")
        # Memory first, on a fresh cluster: peaks since the workers started.
        pipe, slices, devices = make_pipeline(
            client, S, schedule, args.fwd_us, args.bwd_us,
            args.mem_rows, args.mem_cols, stash=True)
        xs = micro_batches(slices[0], M, args.mem_rows)
        for _ in range(2):
            pipe.step(xs).block_until_ready()
        st = wait_for_stats(cluster, client)
        act = args.mem_rows * args.mem_cols * 4
        res["activation_bytes"] = act
        res["peak_bytes"] = device_peaks(st, devices)
        res["peak_activations"] = [p / act for p in res["peak_bytes"]]
        res["schedule_in_flight"] = [peak_in_flight(a) for a in
                                     schedule_actions(schedule, S, M)]
        del pipe, xs
        for s in slices:
            s.close()

        # Utilization: tiny activations, K chained steps, R repeats.
        pipe, slices, devices = make_pipeline(
            client, S, schedule, args.fwd_us, args.bwd_us, args.rows, 1,
            stash=False)
        xs = micro_batches(slices[0], M, args.rows)
        res["devices"] = devices
        for _ in range(args.warmup):
            pipe.step(xs).block_until_ready()
        reference = busy_reference(client, slices, M, args.fwd_us,
                                   args.bwd_us, args.rows)
        # Pipeline and reference runs alternate, so both see the same
        # drift in this VM's noise.
        steps, busy, from_submit = [], [], []
        for _ in range(args.repeats):
            i, first = step_intervals(lambda: pipe.step(xs), args.chain)
            steps += i
            from_submit.append(first)
            busy += step_intervals(reference, args.chain)[0]
        res["step_s"] = statistics.median(steps)
        res["busy_s"] = statistics.median(busy)
        res["step_s_from_submit"] = statistics.median(from_submit)
        res["step_intervals_s"] = steps
        res["busy_intervals_s"] = busy
        res["hop_s"] = hop_latency(client, slices[0], slices[1], args.rows)
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=16)
    p.add_argument("--fwd-us", type=int, default=4000)
    p.add_argument("--bwd-us", type=int, default=8000)
    p.add_argument("--rows", type=int, default=256,
                   help="boundary activation rows (float32[rows, 1])")
    p.add_argument("--mem-rows", type=int, default=256)
    p.add_argument("--mem-cols", type=int, default=1024,
                   help="stashed activation float32[mem-rows, mem-cols]")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--chain", type=int, default=12,
                   help="steps submitted back to back per timing run")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b"])
    p.add_argument("--json", help="write the results here")
    p.add_argument("--log-file")
    args = p.parse_args(argv)
    if args.stages != 4:
        print("note: the cluster has 4 devices; --stages > 4 shares devices")

    t_start = time.perf_counter()
    S, M, F, B = args.stages, args.microbatches, args.fwd_us, args.bwd_us
    ideal = M / (M + S - 1)
    results = [run_schedule(args, sch) for sch in args.schedules]

    print(f"\nS={S} stages on 2 hosts x 2 devices, M={M} micro-batches, "
          f"forward {F} us, backward {B} us (device_sleep); ideal "
          f"utilization M/(M+S-1) = {ideal:.2%}")
    print(f"{args.repeats} runs of {args.chain} steps submitted back to back; "
          f"step time = median interval between step completions (from the "
          f"3rd on)\n")
    print("| schedule | step ms | busy ms per stage (nominal / measured) "
          "| util. nominal | util. measured | ideal | measured vs ideal "
          "| step ms incl. first submit |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        t, busy = r["step_s"], r["busy_s"]
        nominal = M * (F + B) * 1e-6
        r.update(util_nominal=nominal / t, util_measured=busy / t, ideal=ideal)
        gap = r["util_measured"] - ideal
        print(f"| {r['schedule']} | {t * 1e3:.1f} | {nominal * 1e3:.1f} / "
              f"{busy * 1e3:.1f} | {nominal / t:.2%} | {busy / t:.2%} | "
              f"{ideal:.2%} | {gap * 100:+.2f} pt ({gap / ideal:+.1%}) | "
              f"{r['step_s_from_submit'] * 1e3:.1f} |")

    over = sleep_overshoot(F, B)
    print("\nWhere the time goes: the same schedule on model devices "
          "(plexus.pipeline.simulate) whose kernels take the measured mean "
          "length (busy / 2M each, split F:B as nominal), + the cross-host "
          "hop latency measured in the same run, + each kernel's own "
          "variation: sleep overshoots sampled here (4 threads sleeping at "
          f"once; median {statistics.median(over['F']) * 1e6:.0f} us, p90 "
          f"{sorted(over['F'])[int(0.9 * len(over['F']))] * 1e6:.0f} us, max "
          f"{max(over['F'] + over['B']) * 1e6:.0f} us), median of 200 runs "
          "(as the measured step is a median):\n")
    print("| schedule | hop latency us | model ms | + hops | + kernel "
          "variation | measured step ms | unexplained ms |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        extra = (r["busy_s"] / M - (F + B) * 1e-6) / 2  # per call, seconds
        fp, bp = F * 1e-6 + extra, B * 1e-6 + extra
        acts = schedule_actions(r["schedule"], S, M)
        hop = max(r["hop_s"], 0.0)
        t0 = model_step(acts, fp, bp, 0.0)
        t1 = model_step(acts, fp, bp, hop)
        t2 = model_step(acts, fp, bp, hop, over)
        r.update(model_step_s=t0, model_step_hops_s=t1,
                 model_step_jitter_s=t2)
        print(f"| {r['schedule']} | {r['hop_s'] * 1e6:.0f} | {t0 * 1e3:.1f} "
              f"| {t1 * 1e3:.1f} | {t2 * 1e3:.1f} | {r['step_s'] * 1e3:.1f} "
              f"| {(r['step_s'] - t2) * 1e3:+.1f} |")
    if args.json:
        results[0]["sleep_overshoot_s"] = over

    act = results[0]["activation_bytes"]
    print(f"\nLive activations per stage: device_peak_bytes / "
          f"{act / MIB:.0f} MiB stashed activation (fresh cluster per "
          "schedule)\n")
    print("| schedule | " + " | ".join(f"stage {s}" for s in range(S)) +
          " | max | schedule's own bound |")
    print("|---|" + "---|" * S + "---|---|")
    for r in results:
        peaks = r["peak_activations"]
        print(f"| {r['schedule']} | " + " | ".join(f"{p:.2f}" for p in peaks)
              + f" | {max(peaks):.2f} | {max(r['schedule_in_flight'])} "
              f"({', '.join(map(str, r['schedule_in_flight']))}) |")
    total = time.perf_counter() - t_start
    print(f"\ntotal {total:.0f} s")
    print("command: PYTHONPATH=python PLEXUS_BIN_DIR=build/bin python3 "
          "bench/pipeline.py" + (" " + " ".join(argv if argv is not None
                                               else sys.argv[1:])).rstrip())
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"S": S, "M": M, "fwd_us": F, "bwd_us": B, "ideal": ideal,
             "results": results, "total_s": total}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
