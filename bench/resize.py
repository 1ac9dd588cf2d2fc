"""bench/resize: slice.resize of a slice holding --gib GiB of split values
across 4 hosts, shrunk to 2 and grown back to 4, beside a plain transfer of
the bytes that cross hosts, measured in the same run.

Four embedded workers of one device each; a slice over the four holds
--values float32 vectors split over it (--gib GiB in all). Reported,
medians of --rounds:

  - shrink 4 -> 2: slice.resize(2), then plexus.wait on the values (the
    moves done): seconds, and the bytes the resize reports (each value's
    bytes on the new map) and those that cross hosts (the halves on the
    two hosts the slice leaves);
  - grow 2 -> 4: the same back;
  - yardstick 1, the same re-split by hand: an identity program on a
    second slice of 2 devices (the hosts the shrink keeps) reading each
    value of a 4-device slice (what a user without resize would write);
  - yardstick 2, the bytes that cross hosts in the shrink moved by plain
    calls: an identity program on a 1-device slice of host0 reading values
    of a 1-device slice of host2 (transfers of the same sizes as the
    shrink's);
  - the ratios of the shrink to each.

    PYTHONPATH=python PLEXUS_BIN_DIR=$PWD/build/bin python3 bench/resize.py \\
        --gib 1 --rounds 3
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
import plexus  # noqa: E402


def one_round(client, n, values, say):
    """(shrink s, grow s, transfers s, resize's reported bytes, re-split
    by a call s) of one round, each value n float32s."""
    s = client.slice(4, placement="spread")
    futures = [s.put(np.full(n, k, np.float32), plexus.split(0))
               for k in range(values)]
    plexus.wait(futures)
    t0 = time.perf_counter()
    moved = s.resize(2)
    plexus.wait(futures)
    shrink = time.perf_counter() - t0
    say(f"shrink 4 -> 2: {shrink:.3f} s, {moved['values_moved']} values, "
        f"{moved['bytes_moved'] / 2**20:.0f} MiB on the new map")
    t0 = time.perf_counter()
    grown = s.resize(4)
    plexus.wait(futures)
    grow = time.perf_counter() - t0
    say(f"grow 2 -> 4: {grow:.3f} s, {grown['values_moved']} values")
    for k in (0, values - 1):
        got = np.asarray(futures[k])
        assert got.shape == (n,) and got[0] == k and got[-1] == k, k
    del futures
    s.close()
    # Yardstick 1: the same re-split, by a call of the user's.
    four = client.slice(4, placement="spread")
    keep = four.devices[:2]
    two = client.slice(2, hosts=sorted({d["host"] for d in keep}))
    resplit = two.program("identity", plexus.Spec((n,), "float32",
                                                  plexus.split(0)))
    values_4 = [four.put(np.full(n, k, np.float32), plexus.split(0))
                for k in range(values)]
    plexus.wait(values_4)
    t0 = time.perf_counter()
    plexus.wait([resplit(v) for v in values_4])
    by_hand = time.perf_counter() - t0
    say(f"the same re-split by a call: {by_hand:.3f} s")
    del values_4
    four.close()
    two.close()
    # The yardstick: the bytes the shrink moved across hosts (a quarter of
    # each value from each of the two hosts it left), as plain transfers of
    # the same sizes between two hosts.
    src = client.slice(1, hosts=["host2"])
    dst = client.slice(1, hosts=["host0"])
    quarter = n // 4
    copy = dst.program("identity", plexus.Spec((quarter,), "float32"))
    parts = [src.put(np.full(quarter, k, np.float32))
             for k in range(2 * values)]
    plexus.wait(parts)
    t0 = time.perf_counter()
    plexus.wait([copy(p) for p in parts])
    yardstick = time.perf_counter() - t0
    say(f"yardstick ({2 * values} transfers of {quarter * 4 / 2**20:.0f} MiB "
        f"host2 -> host0): {yardstick:.3f} s")
    src.close()
    dst.close()
    return shrink, grow, yardstick, moved["bytes_moved"], by_hand


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--values", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    total = int(args.gib * 2**30)
    n = total // args.values // 4 // 16 * 16  # float32s, divisible by 4
    say = lambda m: print(f"[resize] {m}", flush=True)  # noqa: E731
    say(f"{args.values} values of {n * 4 / 2**20:.0f} MiB split over 4 "
        f"hosts ({args.values * n * 4 / 2**30:.2f} GiB), {args.rounds} rounds")
    rows = []
    with plexus.local(hosts=4, device_memory_mib=max(
            2048, int(3 * args.gib * 1024))) as cluster:
        client = cluster.connect(name="bench-resize")
        for r in range(args.rounds):
            say(f"round {r + 1} of {args.rounds}")
            rows.append(one_round(client, n, args.values, say))
    shrink = statistics.median(r[0] for r in rows)
    grow = statistics.median(r[1] for r in rows)
    yard = statistics.median(r[2] for r in rows)
    by_hand = statistics.median(r[4] for r in rows)
    crossing = args.values * n * 4 // 2  # the halves on the hosts it left
    result = {
        "machine": f"{platform.node()} ({os.cpu_count()} cores)",
        "gib": args.values * n * 4 / 2**30, "values": args.values,
        "rounds": args.rounds, "shrink_s": shrink, "grow_s": grow,
        "resplit_by_a_call_s": by_hand,
        "shrink_over_resplit_by_a_call": shrink / by_hand,
        "transfers_s": yard, "shrink_over_transfers": shrink / yard,
        "bytes_reported": rows[0][3], "bytes_crossing_hosts": crossing,
        "shrink_gb_per_s_crossing": crossing / shrink / 1e9,
        "transfers_gb_per_s": crossing / yard / 1e9,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
