"""Parallel versus sequential dispatch over 1 to 8 stages (Pathways Fig. 7).

A chain of calls visits S stages round robin; each stage is a 1-device
slice of its own (spread over 2 hosts) and each call is a `device_sleep` of
--micros µs (device time that uses no CPU core: the host-side cost of
dispatch is what is measured). Every call takes the previous call's output,
so consecutive calls run on different devices and the value moves worker to
worker between them.

- parallel (default): the whole chain is submitted at once; shapes are
  static, so workers arrange every input before it exists;
- sequential: each call is sent only when its input is computed
  (`connect(sequential_dispatch=True)`).

    PYTHONPATH=python PLEXUS_BIN_DIR=build/bin python3 bench/stages.py
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
import plexus  # noqa: E402


def chain_rate(client, stages, micros, calls):
    """Calls per second for one chain of `calls` calls over `stages`."""
    slices = [client.slice(1, placement="one_host") for _ in range(stages)]
    x = slices[0].put(np.zeros(16, np.float32))
    progs = [s.program("device_sleep", plexus.Spec((16,)), micros=micros)
             for s in slices]
    y = x
    for p in progs:  # warm-up: load every program, open every connection
        y = p(y)
    y.block_until_ready()
    t0 = time.perf_counter()
    with client.graph():
        y = x
        for i in range(calls):
            y = progs[i % stages](y)
    y.block_until_ready()
    rate = calls / (time.perf_counter() - t0)
    for s in slices:
        s.close()
    return rate


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--stages", default="1,2,4,8")
    ap.add_argument("--micros", type=int, default=100)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    stage_counts = [int(s) for s in args.stages.split(",")]
    rows = []
    with plexus.local(hosts=2, devices_per_host=4) as cluster:
        par = cluster.connect(name="parallel")
        seq = cluster.connect(name="sequential", sequential_dispatch=True)
        for s in stage_counts:
            rates = {}
            for mode, client in (("parallel", par), ("sequential", seq)):
                runs = [chain_rate(client, s, args.micros, args.calls)
                        for _ in range(args.repeats)]
                rates[mode] = statistics.median(runs)
                print(f"[stages] {s} stage(s), {mode}: {rates[mode]:,.0f} calls/s "
                      f"(median of {args.repeats})", flush=True)
            rows.append({"stages": s, **rates,
                         "ratio": rates["parallel"] / rates["sequential"]})
    print(f"\nParallel vs sequential dispatch, chain of {args.calls} x "
          f"{args.micros} us device_sleep calls over S stages (2 hosts x 4 "
          f"devices; median of {args.repeats})")
    print(f"{'stages':>6} {'parallel/s':>11} {'sequential/s':>13} {'ratio':>6}")
    for r in rows:
        print(f"{r['stages']:>6} {r['parallel']:>11,.0f} {r['sequential']:>13,.0f} "
              f"{r['ratio']:>6.2f}")
    ideal = 1e6 / args.micros
    print(f"(device-time bound: {ideal:,.0f} calls/s)")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"benchmark": "stages", "micros": args.micros, "calls": args.calls,
             "repeats": args.repeats, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
