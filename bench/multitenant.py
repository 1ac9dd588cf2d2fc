#!/usr/bin/env python3
"""Many clients on one cluster: device utilisation, proportional shares and
isolation from a flood (server/scheduling/admission.h).

    python3 bench/multitenant.py [--seconds 10] [--micros 330]
                                 [--json bench/results/multitenant.json]

One embedded cluster of 2 hosts x 1 device; every client takes a slice of
both devices and calls `device_sleep` (each shard holds its device for
--micros without computing: a stand-in for a 0.33 ms program). Each client
is a process of its own, authenticated as its own tenant. Three runs:

  shares  4 clients of tenants weighted 1:2:4:8 flood the cluster. Over
          --seconds: device utilisation (the workers' busy time over wall
          time) and each client's share of device time, read from the
          workers' per-client busy time (`plexus status`), next to its
          weight's share.
  steady  4 clients each ask for a fixed 15% of device time: a call every
          hold / 0.15, where hold is the device time a call really takes
          (its device's busy time per task, read from the workers in a
          calibration run of the same 4 clients first; --no-calibrate:
          micros, the nominal time). Calls/s and call latency.
  flood   the same 4, plus a fifth client (weight 1, like theirs) that
          floods: each steady client's calls/s and p99 latency against
          `steady`.

Prints progress to stderr and one table per run; --json writes the figures.
"""
import argparse
import collections
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))
os.environ.setdefault("PLEXUS_BIN_DIR", str(ROOT / "build" / "bin"))

import numpy as np  # noqa: E402

import plexus  # noqa: E402

WEIGHTS = {"w1": 1, "w2": 2, "w4": 4, "w8": 8}
STEADY_SHARE = 0.15


def log(msg):
    print(f"[multitenant] {msg}", file=sys.stderr, flush=True)


def _connect(address, tenant):
    return plexus.connect(address, name=tenant, tenant=tenant)


def _slice_and_program(client, micros):
    s = client.slice(2, placement="spread")
    x = s.put(np.zeros(2, np.float32), plexus.split(0))
    return x, s.program("device_sleep", x, micros=micros)


def flood_client(address, tenant, micros, ready, start, stop_at, depth=256):
    """Keeps `depth` calls outstanding until `stop_at` (monotonic)."""
    client = _connect(address, tenant)
    x, nap = _slice_and_program(client, micros)
    nap(x).block_until_ready()
    ready.put(tenant)
    start.wait()
    window = collections.deque()
    while time.monotonic() < stop_at.value:
        window.append(nap(x))
        if len(window) >= depth:
            window.popleft().block_until_ready()
    for f in window:
        f.block_until_ready()
    client.close()


def steady_client(address, tenant, micros, ready, start, stop_at, results,
                  window, period):
    """Asks for a fixed share of device time: one call every `period`
    seconds, issued on time whether or not the last has finished (open
    loop). A second thread waits for each in order; a call's
    latency is from its issue to its result being ready."""
    import threading
    client = _connect(address, tenant)
    x, nap = _slice_and_program(client, micros)
    for _ in range(3):
        nap(x).block_until_ready()
    ready.put(tenant)
    start.wait()
    issued = collections.deque()
    cv = threading.Condition()
    done_issuing = []
    latencies = []

    def waiter():
        # Waits for everything issued so far at once (one round trip per
        # worker, plexus.wait): a call's latency is read when the wait that
        # covers it returns, so it is overstated by at most one round trip,
        # alike with and without the flood.
        while True:
            with cv:
                while not issued and not done_issuing:
                    cv.wait()
                if not issued:
                    return
                batch = list(issued)
                issued.clear()
            plexus.wait([f for _, f in batch])
            now = time.monotonic()
            latencies.extend((began, now - began) for began, _ in batch)

    t = threading.Thread(target=waiter)
    t.start()
    t0 = time.monotonic()
    next_at = t0
    calls = 0
    while next_at < stop_at.value:
        now = time.monotonic()
        if now < next_at:
            time.sleep(next_at - now)
        f = nap(x)
        with cv:
            issued.append((next_at, f))
            cv.notify()
        calls += 1
        next_at += period
    with cv:
        done_issuing.append(True)
        cv.notify()
    t.join()
    # Only the calls issued inside the parent's measured window count.
    lo, hi = window[0], window[1]
    measured = [lat for began, lat in latencies if lo <= began < hi]
    results.put((tenant, len(measured) / (hi - lo), measured))
    client.close()


def usage(cluster, field="busy_micros"):
    """(per-client `field` of the workers' usage, summed over workers, by
    client name; total device busy µs; time of the sample)."""
    st = cluster.status(fresh=True)
    names = {int(c["client_id"]): c["name"] for c in st["clients"]}
    per_client = collections.Counter()
    device = 0
    for w in st["workers"]:
        stats = w.get("stats", {})
        device += sum(int(b) for b in stats.get("device_busy_micros", []))
        for u in stats.get("clients", []):
            name = names.get(int(u["client_id"]))
            if name is not None:
                name = (name, int(u["client_id"]), int(w["worker_id"]))
                if isinstance(field, tuple):
                    per_client[name] += complex(int(u.get(field[0], 0)),
                                                int(u.get(field[1], 0)))
                else:
                    per_client[name] += int(u.get(field, 0))
    return per_client, device, time.monotonic()


def delta(c0, c1, name):
    """c1 - c0 for client `name`, summed over workers; a counter that went
    back (a worker that restarted, a client id seen twice) is an error."""
    total = 0
    for key, v1 in c1.items():
        if key[0] != name:
            continue
        d = v1 - c0.get(key, 0)
        if (d.real if isinstance(d, complex) else d) < 0:
            raise RuntimeError(f"counter of {key} went back: {c0.get(key)} "
                               f"-> {v1}")
        total += d
    return total


def start_clients(ctx, specs, address, micros, seconds, warmup,
                  period=None):
    """Starts one process per (kind, tenant); returns them once all are
    ready, with the shared start event, and the results queue."""
    ready, results = ctx.Queue(), ctx.Queue()
    start = ctx.Event()
    # Clients run until the parent sets stop_at, after its last sample; the
    # measured window (monotonic time, shared by every process here) is set
    # by the parent too.
    stop_at = ctx.Value("d", 1e18)
    window = ctx.Array("d", [0.0, 0.0])
    procs = []
    for kind, tenant in specs:
        if kind == "flood":
            args = (address, tenant, micros, ready, start, stop_at)
            target = flood_client
        else:
            args = (address, tenant, micros, ready, start, stop_at, results,
                    window, period)
            target = steady_client
        p = ctx.Process(target=target, args=args, name=tenant, daemon=True)
        p.start()
        procs.append(p)
    for _ in specs:
        ready.get(timeout=120)
    start.set()
    return procs, results, stop_at, window


def join(procs):
    for p in procs:
        p.join(120)
        if p.exitcode != 0:
            raise RuntimeError(f"client {p.name} exited with {p.exitcode}")


def run_shares(cluster, ctx, args):
    log(f"shares: 4 clients weighted 1:2:4:8 flood for {args.seconds} s")
    procs, _, stop_at, _ = start_clients(
        ctx, [("flood", t) for t in WEIGHTS], cluster.address, args.micros,
        args.seconds, args.warmup)
    time.sleep(args.warmup)
    c0, d0, t0 = usage(cluster)
    time.sleep(args.seconds)
    c1, d1, t1 = usage(cluster)
    stop_at.value = time.monotonic()
    join(procs)
    wall = (t1 - t0) * 1e6
    total = sum(delta(c0, c1, t) for t in WEIGHTS)
    weight_sum = sum(WEIGHTS.values())
    rows = []
    for t, w in WEIGHTS.items():
        share = delta(c0, c1, t) / total
        rows.append({"tenant": t, "weight": w, "share": share,
                     "weight_share": w / weight_sum,
                     "error_pp": 100 * (share - w / weight_sum)})
    return {"utilisation": (d1 - d0) / (2 * wall), "clients": rows,
            "window_s": (t1 - t0)}


def run_steady(cluster, ctx, args, flood, period, seconds=None, what=None):
    seconds = args.seconds if seconds is None else seconds
    specs = [("steady", f"s{i}") for i in range(4)]
    if flood:
        specs.append(("flood", "flood"))
    log(f"{what or ('flood' if flood else 'steady')}: 4 clients, a call "
        f"every {period * 1e3:.3f} ms each"
        f"{' + one flooding' if flood else ''}, {seconds} s")
    procs, results, stop_at, window = start_clients(
        ctx, specs, cluster.address, args.micros, seconds, args.warmup,
        period)
    time.sleep(args.warmup)
    # Per client: (device-queue wait µs, tasks) and (busy µs, tasks) as
    # complex pairs.
    c0, d0, t0 = usage(cluster, ("queued_micros", "tasks"))
    b0, _, _ = usage(cluster, ("busy_micros", "tasks"))
    window[0] = time.monotonic()
    time.sleep(seconds)
    window[1] = time.monotonic()
    c1, d1, t1 = usage(cluster, ("queued_micros", "tasks"))
    b1, _, _ = usage(cluster, ("busy_micros", "tasks"))
    stop_at.value = time.monotonic()
    out = {}
    for _ in range(4):
        tenant, rate, lat = results.get(timeout=120)
        lat.sort()
        q = delta(c0, c1, tenant)
        b = delta(b0, b1, tenant)
        out[tenant] = {"calls_per_s": rate,
                       # Device time a task of it held its device, and its
                       # share of the devices' time.
                       "hold_us": b.real / max(1.0, b.imag),
                       "device_share": b.real / (2 * (t1 - t0) * 1e6),
                       "p50_ms": 1e3 * statistics.median(lat),
                       "p99_ms": 1e3 * lat[int(0.99 * (len(lat) - 1))],
                       "calls": len(lat),
                       # Mean time a task waited in its device's queue.
                       "device_wait_us": q.real / max(1.0, q.imag)}
    join(procs)
    return {"clients": out,
            "utilisation": (d1 - d0) / (2 * (t1 - t0) * 1e6)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--micros", type=int, default=330)
    ap.add_argument("--window-us", type=int, default=None,
                    help="the server's --admission-window-us")
    ap.add_argument("--steady-share", type=float, default=STEADY_SHARE,
                    help="share of device time each steady client asks for")
    ap.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                    help="steady clients call every micros / share, the "
                    "nominal time, instead of the device time a call takes")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    tenants = {"tenants": {t: {"weight": w} for t, w in WEIGHTS.items()}}
    ctx = mp.get_context("spawn")
    with plexus.local(hosts=2, devices_per_host=1, tenants=tenants,
                      admission_window_us=args.window_us) as cluster:
        # Client processes authenticate with the cluster's secret.
        os.environ["PLEXUS_CLUSTER_SECRET"] = cluster._secret
        shares = run_shares(cluster, ctx, args)
        # On a machine with fewer cores than processes here, a device's
        # thread wakes late from its sleep, so a call holds its device
        # longer than `micros`: asking for a share of device time means a
        # period from what a call really holds, measured with the same 4
        # clients asking for it at the nominal time.
        period = args.micros * 1e-6 / args.steady_share
        calibration = None
        if args.calibrate:
            calibration = run_steady(cluster, ctx, args, False, period,
                                     seconds=min(args.seconds, 4.0),
                                     what="calibration")
            holds = [c["hold_us"] for c in calibration["clients"].values()]
            hold = statistics.median(holds)
            log(f"a {args.micros} µs call holds its device {hold:.0f} µs "
                f"(median over the 4 clients)")
            period = hold * 1e-6 / args.steady_share
        steady = run_steady(cluster, ctx, args, False, period)
        flooded = run_steady(cluster, ctx, args, True, period)

    print(f"\nshares ({shares['window_s']:.1f} s, {args.micros} µs calls, "
          f"2 hosts x 1 device): utilisation {shares['utilisation']:.1%}")
    print(f"{'tenant':8} {'weight':>6} {'share':>8} {'weight share':>13} "
          f"{'error':>8}")
    for r in shares["clients"]:
        print(f"{r['tenant']:8} {r['weight']:>6} {r['share']:>8.2%} "
              f"{r['weight_share']:>13.2%} {r['error_pp']:>+7.2f}pp")
    held = (f"a call holds its device "
            f"{statistics.median(c['hold_us'] for c in calibration['clients'].values()):.0f} µs"
            if calibration else f"nominal {args.micros} µs calls")
    print(f"\nsteady clients asking {args.steady_share:.0%} each ({held}: a "
          f"call every {period * 1e3:.3f} ms), without and with a flooding "
          f"fifth (utilisation {steady['utilisation']:.1%} -> "
          f"{flooded['utilisation']:.1%})")
    print(f"{'client':8} {'calls/s':>9} {'with':>9} {'ratio':>6} "
          f"{'p50 ms':>8} {'with':>8} {'p99 ms':>8} {'with':>8} {'ratio':>6} "
          f"{'queue us':>9} {'with':>8} {'share':>6} {'with':>6}")
    ratios = []
    for t in sorted(steady["clients"]):
        a, b = steady["clients"][t], flooded["clients"][t]
        r_rate = b["calls_per_s"] / a["calls_per_s"]
        r_p99 = b["p99_ms"] / a["p99_ms"]
        ratios.append({"client": t, "rate_ratio": r_rate, "p99_ratio": r_p99})
        print(f"{t:8} {a['calls_per_s']:>9.1f} {b['calls_per_s']:>9.1f} "
              f"{r_rate:>6.2f} {a['p50_ms']:>8.2f} {b['p50_ms']:>8.2f} "
              f"{a['p99_ms']:>8.2f} {b['p99_ms']:>8.2f} {r_p99:>6.2f} "
              f"{a['device_wait_us']:>9.0f} {b['device_wait_us']:>8.0f} "
              f"{a['device_share']:>6.1%} {b['device_share']:>6.1%}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "command": "python3 bench/multitenant.py " + " ".join(sys.argv[1:]),
            "machine": f"{platform.node()} ({os.cpu_count()} cores)",
            "micros": args.micros, "seconds": args.seconds,
            "window_us": args.window_us,
            "steady_share": args.steady_share, "period_s": period,
            "calibration": calibration,
            "shares": shares, "steady": steady, "flood": flooded,
            "ratios": ratios}, indent=1) + "\n")
        log(f"wrote {args.json}")


if __name__ == "__main__":
    main()
