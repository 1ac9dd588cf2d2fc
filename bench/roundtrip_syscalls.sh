#!/usr/bin/env bash
# bench/roundtrip_syscalls.sh: the system calls and context switches each
# process makes per blocking round trip, counted by the kernel.
#
#   bench/roundtrip_syscalls.sh [TREE] [ITERS]
#
# Starts TREE's embedded cluster (1 host, 1 device; TREE/python and
# TREE/build/bin, default this tree), warms up, then runs ITERS (default
# 10000) Python round trips `np.asarray(prog(x))` of the built-in `scale`
# on f32[4] while `perf stat -e raw_syscalls:sys_enter,context-switches`
# counts the client, the server and the worker. Prints each per round trip,
# and the round trip's mean (slower than bench/roundtrip.py's: perf's
# counting costs a little per system call). Deterministic where timing on
# a shared VM is not: compare two trees' counts, not their times. Needs
# `perf` (linux-perf) and the rights to count (root, or
# kernel.perf_event_paranoid <= 1).
set -euo pipefail
here=$(dirname "$(realpath "$0")")
tree=$(realpath "${1:-$here/..}")
iters=${2:-10000}
command -v perf >/dev/null || { echo "needs perf (apt-get install linux-perf)" >&2; exit 2; }
work=$(mktemp -d /tmp/roundtrip_syscalls.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
PYTHONPATH="$tree/python" PLEXUS_BIN_DIR="$tree/build/bin" python3 - "$work" "$iters" <<'PY' &
import os, sys, time
import numpy as np
import plexus
work, iters = sys.argv[1], int(sys.argv[2])
with plexus.local(hosts=1, devices_per_host=1) as cluster:
    s = cluster.connect(name="roundtrip-syscalls").slice(1)
    x = s.put(np.ones(4, np.float32))
    prog = s.program("scale", x, factor=1.0)
    for _ in range(500):
        np.asarray(prog(x))
    with open(f"{work}/pids", "w") as f:
        f.write(f"{os.getpid()} {cluster.process.pid} {cluster.worker_pids()[0]}\n")
    while not os.path.exists(f"{work}/counting"):
        time.sleep(0.05)
    time.sleep(0.5)  # perf attached to every thread
    t0 = time.perf_counter()
    for _ in range(iters):
        np.asarray(prog(x))
    with open(f"{work}/done", "w") as f:
        f.write(f"{(time.perf_counter() - t0) / iters * 1e6:.1f}\n")
PY
for _ in $(seq 1200); do [[ -s $work/pids ]] && break; sleep 0.1; done
declare -A pid
read -r "pid[client]" "pid[server]" "pid[worker]" <"$work/pids"
for role in client server worker; do
  perf stat -e raw_syscalls:sys_enter,context-switches -x, \
    -o "$work/$role.perf" -p "${pid[$role]}" 2>/dev/null &
done
touch "$work/counting"
for _ in $(seq 6000); do [[ -s $work/done ]] && break; sleep 0.1; done
pkill -INT -f "perf stat -e raw_syscalls:sys_enter,context-switches" || true
wait 2>/dev/null || true
echo "tree $tree: $iters round trips, $(cat "$work/done") µs each (under perf)"
for role in client server worker; do
  awk -F, -v role="$role" -v n="$iters" \
    '$3 ~ /sys_enter|context-switches/ {
       v[$3] = $1 / n }
     END { printf "  %-6s system calls %5.2f, context switches %5.2f per round trip\n",
           role, v["raw_syscalls:sys_enter"], v["context-switches"] }' \
    "$work/$role.perf"
done
rm -rf "$work"
