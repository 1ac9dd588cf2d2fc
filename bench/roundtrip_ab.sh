#!/usr/bin/env bash
# bench/roundtrip_ab.sh: the blocking round trip of two trees, in paired
# rounds.
#
#   bench/roundtrip_ab.sh BEFORE_TREE AFTER_TREE ROUNDS [ITERS]
#
# Runs this tree's bench/roundtrip.py (--no-ray, one round of ITERS round
# trips, default 2000) against each tree's Python client and binaries
# (TREE/python, TREE/build/bin) in ABBA order — before, after, after,
# before, ... — ROUNDS times each. Prints each build's medians (Python and
# C++ round trips, the unix ping-pong of the same run) and the median of the
# rounds' after/before ratios, with the CPU and context switches each
# process spent per Python round trip. Raw JSON stays in $AB_DIR (default a
# fresh temporary folder). $BEFORE_ENV and $AFTER_ENV, if set, are
# environment assignments for that side's runs (one tree against itself
# with a switch: BEFORE_ENV=PLEXUS_RELAY_ANSWERS=0). $ROUNDTRIP_ARGS, if
# set, goes to every run of roundtrip.py (ROUNDTRIP_ARGS="--hosts 2
# --no-cpp": the replicated round trip over two hosts).
set -euo pipefail
# shellcheck source=bench/abba.sh
source "$(dirname "$(realpath "$0")")/abba.sh"
ab_usage 3 14 "$@"
ab_trees "$@"
iters=${4:-2000}
here=$(dirname "$(realpath "$0")")
for tree in "$before" "$after"; do
  ab_need "$tree/build/bin" plexus-bench-dispatch plexus-server plexus-worker
done
ab_dir roundtrip_ab
run() {  # which round
  local which=$1 round=$2 tree
  tree=$([[ $which == before ]] && echo "$before" || echo "$after")
  local -a extra
  read -r -a extra <<<"$([[ $which == before ]] && echo "${BEFORE_ENV:-}" ||
    echo "${AFTER_ENV:-}")"
  local -a args
  read -r -a args <<<"${ROUNDTRIP_ARGS:-}"
  ab_run "$which" "$round" env "${extra[@]}" PYTHONPATH="$tree/python" \
    PLEXUS_BIN_DIR="$tree/build/bin" python3 "$here/roundtrip.py" --no-ray \
    "${args[@]}" \
    --rounds 1 --iters "$iters" --json "$dir/$which.$round.json"
}
abba "$rounds" before after
python3 - "$dir" "$rounds" <<'PY'
import json, statistics, sys
folder, rounds = sys.argv[1], int(sys.argv[2])
runs = {w: [json.load(open(f"{folder}/{w}.{r}.json")) for r in range(rounds)]
        for w in ("before", "after")}
def micros(w, r, m):
    return runs[w][r]["measures"][m]["median_micros"]
print("\n| measure | before: median us | after: median us | after/before (median of rounds) |")
print("|---|---|---|---|")
for m in ("pingpong-unix", "ring-unix", "plexus-python", "plexus-jit",
          "plexus-wait", "plexus-cpp"):
    if any(m not in run["measures"] for w in runs for run in runs[w]):
        continue  # a tree whose bench did not measure it
    b = [micros("before", r, m) for r in range(rounds)]
    a = [micros("after", r, m) for r in range(rounds)]
    ratio = statistics.median(x / y for x, y in zip(a, b))
    print(f"| {m} | {statistics.median(b):.1f} | {statistics.median(a):.1f} | {ratio:.2f} |")
print("\n| per Python round trip | before: CPU us, switches | after: CPU us, switches |")
print("|---|---|---|")
for role in ("client", "server", "worker"):
    cells = []
    for w in ("before", "after"):
        c = [run["plexus_python_cost"][0][role] for run in runs[w]]
        cells.append(f"{statistics.median(x['cpu_us'] for x in c):.1f}, "
                     f"{statistics.median(x['switches'] for x in c):.2f}")
    print(f"| {role} | {cells[0]} | {cells[1]} |")
PY
