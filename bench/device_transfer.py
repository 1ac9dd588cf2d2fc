"""bench/device_transfer: a value in device memory moved between two
workers of one host, by each path, beside the hardware's own copies.

Two embedded workers share one machine (on a GPU machine, one GPU: both
are started with plexus.local(gpus=[0])). A program on worker A makes a
--mib MiB float32 value, which stays in A's device memory; a program on
worker B reads it, so the runtime moves it A -> B by the fastest path it
has: CUDA IPC where both workers can (GPU memory; B maps A's allocation
and copies it), else staged through host memory. The same is measured
twice, in two clusters: with CUDA IPC allowed (the default) and with it
turned off (plexus.local(cuda_ipc=False)), so the host-staged path is
measured on the same machine; the path counters (WorkerStats.transfers_*)
say which ran. On CPU both runs are host-staged and the report says CUDA
IPC is unavailable. Reported, medians of --repeats:

  - transfer: B's call on A's value, less the same call on a value already
    on B (so the compute is not counted), as seconds and GB/s, per path;
  - the path counters' growth over the measured transfers;
  - the hardware's own copies of the same bytes, in this process through
    JAX on the same platform: host to device (jax.device_put), device to
    host (np.asarray) and device to device (an on-device copy).

    PYTHONPATH=python PLEXUS_BIN_DIR=build/bin python3 bench/device_transfer.py
    ... --platform cuda --plugin /path/to/xla_cuda_plugin.so --mib 1024
"""
import argparse
import json
import platform as platform_mod
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
import plexus  # noqa: E402

PATHS = ("transfers_alias", "transfers_device_to_device",
         "transfers_host_staged", "transfers_ipc", "transfers_nccl")


def paths(cluster):
    total = dict.fromkeys(PATHS, 0)
    for w in cluster.status(fresh=True)["workers"]:
        for k in PATHS:
            total[k] += int(w["stats"].get(k, 0))
    return total


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def hardware_copies(jax, jnp, n, repeats):
    """In-process JAX copies of n float32s: host->device, device->host,
    device->device (medians, seconds)."""
    host = np.ones(n, np.float32)
    dev = jax.device_put(host)
    dev.block_until_ready()
    copy = jax.jit(lambda x: x + 0.0)
    copy(dev).block_until_ready()
    h2d = statistics.median(
        timed(lambda: jax.device_put(host).block_until_ready())
        for _ in range(repeats))
    d2h = statistics.median(timed(lambda: np.asarray(copy(dev)))
                            for _ in range(repeats)) - statistics.median(
        timed(lambda: copy(dev).block_until_ready()) for _ in range(repeats))
    d2d = statistics.median(timed(lambda: copy(dev).block_until_ready())
                            for _ in range(repeats))
    return {"host_to_device_s": h2d, "device_to_host_s": max(d2h, 1e-9),
            # x + 0 reads and writes every byte: two passes of the value
            "device_to_device_s": d2d}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--platform", default="cpu")
    ap.add_argument("--plugin", default=None,
                    help="PJRT plugin for the workers (default: the CPU one)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import jax
    import jax.numpy as jnp

    n = args.mib * 2 ** 20 // 4
    nbytes = n * 4
    results = {"machine": f"{platform_mod.node()} ({platform_mod.machine()}, "
                          f"{__import__('os').cpu_count()} cores)",
               "platform": args.platform, "mib": args.mib,
               "repeats": args.repeats}
    # The fastest path the runtime has (CUDA IPC where it can), then the
    # host-staged path alone.
    results["transfer"] = measure(args, n, nbytes, cuda_ipc=True)
    results["transfer_host_staged"] = measure(args, n, nbytes, cuda_ipc=False)
    ipc_ran = results["transfer"]["paths"]["transfers_ipc"] > 0
    results["ipc_available"] = ipc_ran
    hw = hardware_copies(jax, jnp, n, args.repeats)
    results["hardware"] = {k: {"s": v, "gb_per_s": nbytes / v / 1e9}
                           for k, v in hw.items()}
    for name, tr in (("fastest path", results["transfer"]),
                     ("host-staged", results["transfer_host_staged"])):
        print(f"transfer A -> B, {name}: {tr['s'] * 1e3:.1f} ms, "
              f"{tr['gb_per_s']:.2f} GB/s; paths {tr['paths']}")
    if not ipc_ran:
        print(f"CUDA IPC: unavailable here ({args.platform}: the value is not "
              "in a CUDA GPU's memory, or a worker could not open CUDA IPC); "
              "both runs were host-staged")
    for k, v in results["hardware"].items():
        print(f"hardware {k[:-2].replace('_', ' ')}: {v['s'] * 1e3:.1f} ms, "
              f"{v['gb_per_s']:.2f} GB/s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.json}")


def measure(args, n, nbytes, cuda_ipc):
    """One cluster of two workers; the median transfer A -> B and the
    paths it took."""
    gpus = [0] if args.platform == "cuda" else None
    print(f"[transfer] {args.mib} MiB between two workers "
          f"({args.platform}{', sharing GPU 0' if gpus else ''}; CUDA IPC "
          f"{'allowed' if cuda_ipc else 'off'})", flush=True)
    with plexus.local(hosts=2, devices_per_host=1, pjrt_plugin=args.plugin,
                      gpus=gpus, device_memory_mib=max(1024, 6 * args.mib),
                      cuda_ipc=cuda_ipc) as cluster:
        client = cluster.connect(name="bench-device-transfer")
        a = client.slice(1, hosts=["host0"])
        b = client.slice(1, hosts=["host1"])
        make = plexus.jit(lambda x: x + 1.0, a, name="make",
                          platform=args.platform)
        make_b = plexus.jit(lambda x: x + 1.0, b, name="make_b",
                            platform=args.platform)
        read = plexus.jit(lambda x: x[:8] * 2.0, b, name="read",
                          platform=args.platform)
        seed_a = a.put(np.zeros(n, np.float32))
        seed_b = b.put(np.zeros(n, np.float32))
        # Compiled, and a first transfer made, before anything is timed.
        read(make(seed_a)).block_until_ready()
        read(make_b(seed_b)).block_until_ready()
        local, moved = [], []
        before = paths(cluster)
        for r in range(args.repeats):
            on_b = make_b(seed_b)
            on_b.block_until_ready()
            local.append(timed(lambda: read(on_b).block_until_ready()))
            on_a = make(seed_a)
            on_a.block_until_ready()
            moved.append(timed(lambda: read(on_a).block_until_ready()))
            del on_a, on_b
            print(f"[transfer] round {r + 1}/{args.repeats}: "
                  f"{moved[-1] * 1e3:.1f} ms (read on B alone "
                  f"{local[-1] * 1e3:.1f} ms)", flush=True)
        grown = {k: v - before[k] for k, v in paths(cluster).items()}
        t = max(statistics.median(moved) - statistics.median(local), 1e-9)
        return {"cuda_ipc_allowed": cuda_ipc,
                "s": t, "gb_per_s": nbytes / t / 1e9,
                "call_with_transfer_s": statistics.median(moved),
                "call_without_s": statistics.median(local),
                "paths": grown}


if __name__ == "__main__":
    main()
