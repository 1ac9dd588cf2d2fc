"""What naming each call by its source line costs the Python caller
(python/plexus/_trace.py, call_site): the time of recording a call into a
graph, with call sites on and off ($PLEXUS_CALL_SITES=0), in alternating
subprocesses, ROUNDS each; medians of the per-call time.

    python bench/call_sites.py [--rounds 8] [--calls 20000]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

CHILD = r"""
import sys, time
import numpy as np
import plexus
calls = int(sys.argv[1])
with plexus.local(hosts=1, devices_per_host=1) as cluster:
    client = cluster.connect()
    s = client.slice(1)
    f = s.program("scale", plexus.Spec((4,), np.float32), factor=1.0)
    x = s.put(np.ones(4, np.float32))
    best = None
    for _ in range(3):
        with client.graph():  # recorded only: the caller's cost alone
            y = x
            t = time.perf_counter()
            for _ in range(calls):
                y = f(y)
            dt = time.perf_counter() - t
        np.asarray(y)
        best = dt if best is None else min(best, dt)
    print(best / calls * 1e6)
"""


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--calls", type=int, default=20000)
    args = p.parse_args()
    times = {"off": [], "on": []}
    for r in range(args.rounds):
        order = ("off", "on") if r % 2 == 0 else ("on", "off")
        for which in order:
            env = dict(os.environ,
                       PLEXUS_CALL_SITES="0" if which == "off" else "1")
            out = subprocess.run([sys.executable, "-c", CHILD,
                                  str(args.calls)], env=env, check=True,
                                 capture_output=True, text=True).stdout
            times[which].append(float(out.strip().splitlines()[-1]))
    for which in ("off", "on"):
        print(f"[call_sites] {which}: {[round(t, 2) for t in times[which]]} "
              f"us per call")
    off, on = (statistics.median(times[w]) for w in ("off", "on"))
    print(f"[call_sites] median off {off:.2f} us, on {on:.2f} us per call: "
          f"+{on - off:.2f} us over {args.rounds} rounds")


if __name__ == "__main__":
    main()
