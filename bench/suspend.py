"""bench/suspend: slice.suspend and slice.resume of a slice holding --gib
GiB of split values on 2 of 4 hosts, resumed on the other two (another
client took its own), beside a plain transfer of the same bytes, measured
in the same run.

Four embedded workers of one device each; a 2-device slice on host0 and
host1 holds --values float32 vectors split over it (--gib GiB in all).
Reported, medians of --rounds:

  - suspend: slice.suspend() (the values stay in place);
  - resume, own devices free: slice.resume() (nothing moves);
  - resume elsewhere: after another client took host0 and host1,
    slice.resume(), then plexus.wait on the values (the moves done), and
    the bytes it reports; every value checked bit for bit;
  - yardstick: the same bytes moved by plain calls, an identity program
    on a slice of host2 and host3 reading each value of a slice of host0
    and host1 (what a user without resume would write);
  - the ratio of the resume elsewhere to the yardstick;
  - suspend to files: slice.suspend(to_files=True) (every block written
    to the park directory and synced), then, after another client took the
    slice's hosts, slice.resume() and plexus.wait (every block read back
    on other hosts); beside a disk yardstick: the same bytes written to a
    file of the same directory, synced and read back by one process.

    PYTHONPATH=python PLEXUS_BIN_DIR=$PWD/build/bin python3 bench/suspend.py \\
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

OWN, OTHERS = ["host0", "host1"], ["host2", "host3"]


def one_round(cluster, client, n, values, say):
    """(suspend s, resume-in-place s, resume-elsewhere s, its bytes,
    yardstick s) of one round, each value n float32s."""
    s = client.slice(2, hosts=OWN, placement="spread")
    futures = [s.put(np.full(n, k, np.float32), plexus.split(0))
               for k in range(values)]
    plexus.wait(futures)

    t0 = time.perf_counter()
    s.suspend()
    suspend = time.perf_counter() - t0
    t0 = time.perf_counter()
    in_place = s.resume()
    plexus.wait(futures)
    resume_own = time.perf_counter() - t0
    assert in_place["values_moved"] == 0, in_place

    s.suspend()
    other = cluster.connect(name="taker")
    taker = other.slice(2, hosts=OWN, placement="spread")
    t0 = time.perf_counter()
    moved = s.resume()
    plexus.wait(futures)
    resume_away = time.perf_counter() - t0
    assert {d["host"] for d in s.devices} == set(OTHERS), s.devices
    say(f"suspend {suspend * 1e3:.1f} ms; resume in place "
        f"{resume_own * 1e3:.1f} ms; resume on {OTHERS} {resume_away:.3f} s, "
        f"{moved['values_moved']} values, "
        f"{moved['bytes_moved'] / 2**20:.0f} MiB")
    for k in (0, values - 1):
        np.testing.assert_array_equal(np.asarray(futures[k]),
                                      np.full(n, k, np.float32))
    taker.close()
    other.close()

    # To files: parked (written and synced), then read back on host2 and
    # host3 after another client took host0 and host1.
    t0 = time.perf_counter()
    parked = s.suspend(to_files=True)
    to_files = time.perf_counter() - t0
    other = cluster.connect(name="taker")
    taker = other.slice(2, hosts=sorted({d["host"] for d in s.devices}),
                        placement="spread")
    t0 = time.perf_counter()
    s.resume()
    plexus.wait(futures)
    from_files = time.perf_counter() - t0
    for k in (0, values - 1):
        np.testing.assert_array_equal(np.asarray(futures[k]),
                                      np.full(n, k, np.float32))
    say(f"suspend to files {to_files:.3f} s ({parked['values_parked']} "
        f"values, {parked['bytes_parked'] / 2**20:.0f} MiB); resume from "
        f"files on {sorted({d['host'] for d in s.devices})} "
        f"{from_files:.3f} s")
    taker.close()
    other.close()
    # Its yardstick: the same bytes written to a file of the same directory
    # (synced) and read back, by this process alone.
    disk = disk_yardstick(cluster.park_dir, parked["bytes_parked"])
    say(f"yardstick (write, fsync, read back {parked['bytes_parked'] / 2**20:.0f}"
        f" MiB in this process): {disk:.3f} s")

    # Yardstick: the same bytes, host0/host1 -> host2/host3, by calls.
    src = client.slice(2, hosts=OWN, placement="spread")
    dst = client.slice(2, hosts=OTHERS, placement="spread")
    sources = [src.put(np.full(n, k, np.float32), plexus.split(0))
               for k in range(values)]
    plexus.wait(sources)
    copy = dst.program("identity", plexus.Spec((n,), "float32",
                                                plexus.split(0)))
    t0 = time.perf_counter()
    copies = [copy(v) for v in sources]
    plexus.wait(copies)
    yardstick = time.perf_counter() - t0
    say(f"yardstick (identity calls across hosts): {yardstick:.3f} s")
    del futures, sources, copies
    for sl in (s, src, dst):
        sl.close()
    return (suspend, resume_own, resume_away, moved["bytes_moved"], yardstick,
            to_files, from_files, parked["bytes_parked"], disk)


def disk_yardstick(directory, nbytes):
    """Seconds to write `nbytes` to a file of `directory`, fsync it, and
    read it back, in 4 MiB blocks (the read, like the resume's, finds the
    bytes in the page cache)."""
    path = os.path.join(directory, "yardstick")
    block = np.ones(4 << 20, np.uint8).tobytes()
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    left = nbytes
    while left > 0:
        left -= os.write(fd, block[:min(left, len(block))])
    os.fsync(fd)
    os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    while os.read(fd, 4 << 20):
        pass
    os.close(fd)
    took = time.perf_counter() - t0
    os.unlink(path)
    return took


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--values", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    n = int(args.gib * 2**30 / 4 / args.values) // 2 * 2
    rows = []

    def say(line):
        print(f"  {line}", flush=True)

    with plexus.local(hosts=4) as cluster:
        client = cluster.connect(name="suspend-bench")
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}: {args.values} values of "
                  f"{n * 4 / 2**20:.0f} MiB", flush=True)
            rows.append(one_round(cluster, client, n, args.values, say))
    med = [statistics.median(col) for col in zip(*rows)]
    result = {
        "gib": args.gib, "values": args.values, "rounds": args.rounds,
        "suspend_ms": med[0] * 1e3, "resume_in_place_ms": med[1] * 1e3,
        "resume_elsewhere_s": med[2], "resume_bytes": med[3],
        "yardstick_s": med[4], "resume_over_yardstick": med[2] / med[4],
        "suspend_to_files_s": med[5], "resume_from_files_s": med[6],
        "parked_bytes": med[7], "disk_yardstick_s": med[8],
        "files_round_trip_over_disk_yardstick": (med[5] + med[6]) / med[8],
        "machine": f"{platform.node()} ({os.cpu_count()} cores)",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
