#!/usr/bin/env bash
# bench/xla_ab.sh: plexus.jit calls of two trees, in paired rounds.
#
#   bench/xla_ab.sh BEFORE_TREE AFTER_TREE ROUNDS [XLA.PY ARGS...]
#
# Runs each tree's own bench/xla.py (it puts the tree's python/ first on
# sys.path; its binaries are TREE/build/bin) in ABBA order, ROUNDS times
# each, by default with `--calls 400 --repeats 5 --big-mib 0 --heavy-rounds
# 1 --heavy-n 64 --leaves 100`. Prints each side's medians and the median of
# the rounds' after/before ratios: the tiny chained call and round trip, the
# 100-leaf chained call, in-process JAX's of each (it drifts with the
# machine: a ratio within its own drift is noise), and each process's CPU
# per call. Raw JSON stays in $AB_DIR (default a fresh temporary folder).
set -euo pipefail
# shellcheck source=bench/abba.sh
source "$(dirname "$(realpath "$0")")/abba.sh"
ab_usage 3 13 "$@"
ab_trees "$@"
shift 3
args=("$@")
if [[ ${#args[@]} -eq 0 ]]; then
  args=(--calls 400 --repeats 5 --big-mib 0 --heavy-rounds 1 --heavy-n 64
        --leaves 100)
fi
for tree in "$before" "$after"; do
  ab_need "$tree" bench/xla.py build/bin/plexus-server build/bin/plexus-worker
done
ab_dir xla_ab
run() {  # which round
  local which=$1 round=$2 tree
  tree=$([[ $which == before ]] && echo "$before" || echo "$after")
  ab_run "$which" "$round" env PLEXUS_BIN_DIR="$tree/build/bin" python3 \
    "$tree/bench/xla.py" "${args[@]}" --json "$dir/$which.$round.json"
}
abba "$rounds" before after
python3 - "$dir" "$rounds" <<'PY'
import json, statistics, sys
folder, rounds = sys.argv[1], int(sys.argv[2])
def measures(run):
    tiny = run["cases"]["tiny"]
    m = {"tiny chained µs": tiny["plexus"]["chained_s"] * 1e6,
         "tiny round trip µs": tiny["plexus"]["round_trip_s"] * 1e6}
    if "jax" in tiny:
        m["tiny chained, in-process JAX µs"] = tiny["jax"]["chained_s"] * 1e6
    for role, us in tiny["plexus"]["chained_cpu_us"].items():
        if isinstance(us, (int, float)):
            m[f"tiny: {role} CPU µs"] = us
    one = run["cases"].get("tiny1")  # trees before it have no such case
    if one:
        m["tiny, one argument, chained µs"] = one["plexus"]["chained_s"] * 1e6
        if "jax" in one:
            m["tiny, one argument, in-process JAX µs"] = (
                one["jax"]["chained_s"] * 1e6)
    leaves = run.get("leaves")
    if leaves:
        n = leaves["leaves"]
        m[f"{n} leaves chained µs"] = leaves["plexus"]["chained_s"] * 1e6
        m[f"{n} leaves, in-process JAX µs"] = leaves["jax"]["chained_s"] * 1e6
        for role, us in leaves["plexus"]["chained_cpu_us"].items():
            if isinstance(us, (int, float)):
                m[f"{n} leaves: {role} CPU µs"] = us
    return m
got = {w: [measures(json.load(open(f"{folder}/{w}.{r}.json")))
           for r in range(rounds)] for w in ("before", "after")}
print("\n| measure | before (median) | after (median) | after/before (median of rounds) |")
print("|---|---|---|---|")
for k in got["before"][0]:
    if not all(k in m for m in got["after"]):
        continue  # a measure one tree has not
    b = [m[k] for m in got["before"]]
    a = [m[k] for m in got["after"]]
    ratios = [x / y for x, y in zip(a, b) if y]
    ratio = f"{statistics.median(ratios):.3f}" if ratios else "-"
    print(f"| {k} | {statistics.median(b):.1f} | {statistics.median(a):.1f} | {ratio} |")
PY
