"""Two builds of the workers side by side, under the same load: a chain of
XLA calls on one device, timed on a cluster of this build's binaries and on
one of another build's (--other-bin-dir), alternating round by round so
that the noise of a shared machine falls on both alike.

The client library is this build's for both clusters (the programs, the
client and the server are the same; what differs is what the other build's
server and workers do). Per round and per build: `--calls` chained calls of
`x * 1.0001 + 1` on a --mib MiB float32 value (a program whose output would
cost as much to copy as the call), then one wait; time / calls. Reports each
build's median per call, and the median over rounds of the per-round ratio.

    PYTHONPATH=python PLEXUS_BIN_DIR=build/bin python3 bench/worker_ab.py \\
        --other-bin-dir /path/to/other/build/bin [--mib 64] [--rounds 15]
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
import plexus  # noqa: E402


def start(bin_dir, mib):
    """A 1-host, 1-device embedded cluster of the binaries in `bin_dir`,
    a client, and the chained program on a value of `mib` MiB."""
    os.environ["PLEXUS_BIN_DIR"] = str(bin_dir)
    cluster = plexus.local(hosts=1, devices_per_host=1,
                           device_memory_mib=max(1024, int(8 * mib)))
    cluster.__enter__()
    client = cluster.connect(name="worker-ab")
    s = client.slice(1)
    n = max(1, int(round((mib * 2**20 / 4) ** 0.5)))
    x = s.put(np.ones((n, n), np.float32))
    step = plexus.jit(lambda a: a * 1.0001 + 1.0, s, name="big")
    step(x).block_until_ready()  # compiled
    return cluster, client, step, x


def per_call(client, step, x, calls):
    t0 = time.perf_counter()
    with client.graph():
        y = x
        for _ in range(calls):
            y = step(y)
    y.block_until_ready()
    return (time.perf_counter() - t0) / calls


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--other-bin-dir", required=True)
    ap.add_argument("--mib", type=float, default=64,
                    help="the value's size (0.000244 is 8x8 floats)")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    this_dir = Path(os.environ.get("PLEXUS_BIN_DIR") or
                    Path(__file__).resolve().parent.parent / "build" / "bin")
    builds = {"this": this_dir, "other": Path(args.other_bin_dir)}
    clusters = {name: start(d, args.mib) for name, d in builds.items()}
    times = {name: [] for name in builds}
    try:
        for r in range(args.rounds):
            order = list(builds) if r % 2 == 0 else list(reversed(builds))
            for name in order:
                _, client, step, x = clusters[name]
                times[name].append(per_call(client, step, x, args.calls))
            print(f"round {r + 1}/{args.rounds}: " + "  ".join(
                f"{n} {times[n][-1] * 1e3:.2f} ms/call" for n in builds),
                flush=True)
    finally:
        for cluster, *_ in clusters.values():
            cluster.__exit__(None, None, None)
    ratios = [o / t for t, o in zip(times["this"], times["other"])]
    result = {
        "mib": args.mib, "calls": args.calls, "rounds": args.rounds,
        "bin_dirs": {n: str(d) for n, d in builds.items()},
        "median_ms_per_call": {n: statistics.median(v) * 1e3
                               for n, v in times.items()},
        "median_round_ratio_other_over_this": statistics.median(ratios),
    }
    print(f"median per call: this {result['median_ms_per_call']['this']:.2f} ms,"
          f" other {result['median_ms_per_call']['other']:.2f} ms; median of "
          f"per-round ratios other/this {result['median_round_ratio_other_over_this']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
