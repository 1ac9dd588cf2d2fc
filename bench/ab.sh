#!/usr/bin/env bash
# bench/ab.sh: dispatch, pipeline and transfer of two source trees, in
# paired rounds — how a change that must not cost anything is checked.
#
#   bench/ab.sh BEFORE_TREE AFTER_TREE [ROUNDS]
#
# Each tree is a built checkout (TREE/build/bin with the server, the worker
# and the benchmarks; TREE/python with its plexus._core). Each round runs,
# for the two trees in ABBA order (before, after; then after, before; ...):
#   dispatch  TREE/build/bin/plexus-bench-dispatch --hosts-list 1,4
#             --repeats 3 --calls 8192 --skip-busy: chained calls/s;
#   pipeline  bench/pipeline.py (of each tree) --schedules 1f1b
#             --microbatches 8 --chain 4 --repeats 1: the step time;
#   transfer  TREE/build/bin/plexus-bench-transfer --max-mib 64
#             --repeats 5 --modes shm tcp: worker-to-worker MB/s at 64 MiB.
# ROUNDS defaults to 8. Prints each figure per round, the medians of each
# tree and the median of the rounds' after/before ratios (higher is better
# for all three: the pipeline's ratio is before's step time over after's).
# Raw output stays in $AB_DIR (default a fresh temporary folder).
set -euo pipefail
# shellcheck source=bench/abba.sh
source "$(dirname "$(realpath "$0")")/abba.sh"
ab_usage 2 19 "$@"
before=$(cd "$1" && pwd)
after=$(cd "$2" && pwd)
rounds=${3:-8}
for tree in "$before" "$after"; do
  ab_need "$tree/build/bin" plexus-bench-dispatch plexus-bench-transfer \
    plexus-server plexus-worker
done
dir=${AB_DIR:-$(mktemp -d /tmp/ab.XXXXXX)}
mkdir -p "$dir"
echo "[ab] $(date -u '+%F %T') UTC; $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "[ab] before: $before ($(git -C "$before" rev-parse --short HEAD)); after: $after ($(git -C "$after" rev-parse --short HEAD)); raw output in $dir"
run() {  # which round
  local which=$1 round=$2 tree out
  tree=$([[ $which == before ]] && echo "$before" || echo "$after")
  out="$dir/$which.$round"
  "$tree/build/bin/plexus-bench-dispatch" --hosts-list 1,4 --repeats 3 \
    --calls 8192 --skip-busy >"$out.dispatch.txt" 2>&1 ||
    { echo "[ab] dispatch, $which round $round failed:" >&2; tail -5 "$out.dispatch.txt" >&2; exit 1; }
  PYTHONPATH="$tree/python" PLEXUS_BIN_DIR="$tree/build/bin" python3 \
    "$tree/bench/pipeline.py" --schedules 1f1b --microbatches 8 --chain 4 \
    --repeats 1 --json "$out.pipeline.json" >"$out.pipeline.txt" 2>&1 ||
    { echo "[ab] pipeline, $which round $round failed:" >&2; tail -5 "$out.pipeline.txt" >&2; exit 1; }
  "$tree/build/bin/plexus-bench-transfer" --max-mib 64 --repeats 5 \
    --modes shm tcp --json "$out.transfer.json" >"$out.transfer.txt" 2>&1 ||
    { echo "[ab] transfer, $which round $round failed:" >&2; tail -5 "$out.transfer.txt" >&2; exit 1; }
  echo "[ab] round $round $which done; load $(cut -d' ' -f1 /proc/loadavg)"
}
abba "$rounds" before after
python3 - "$dir" "$rounds" <<'PY'
import json, re, statistics, sys
folder, rounds = sys.argv[1], int(sys.argv[2])
cps = re.compile(r"^\[dispatch\] chained, (\d+) hosts?: ([\d,]+) calls/s")
def figures(which, r):
    out = {}
    base = f"{folder}/{which}.{r}"
    for line in open(f"{base}.dispatch.txt"):
        m = cps.match(line)
        if m:
            out[f"dispatch, {m.group(1)} host(s), calls/s"] = float(m.group(2).replace(",", ""))
    p = json.load(open(f"{base}.pipeline.json"))
    out["pipeline 1f1b, steps/s"] = 1.0 / p["results"][0]["step_s"]
    t = json.load(open(f"{base}.transfer.json"))
    size = max(t["sizes"], key=lambda s: s["bytes"])
    for mode in ("shm", "tcp"):
        out[f"transfer {mode} {size['bytes'] >> 20} MiB, MB/s"] = size[mode]["mb_per_second"]
    return out
runs = {w: [figures(w, r) for r in range(rounds)] for w in ("before", "after")}
print(f"| figure | before (median) | after (median) | after/before (median of {rounds} rounds) |")
print("|---|---|---|---|")
for key in runs["before"][0]:
    b = [x[key] for x in runs["before"]]
    a = [x[key] for x in runs["after"]]
    ratios = [y / x for x, y in zip(b, a)]
    print(f"| {key} | {statistics.median(b):,.1f} | {statistics.median(a):,.1f} | "
          f"{statistics.median(ratios):.3f} |")
    print(f"[ab] {key}: before {[round(x, 1) for x in b]}", file=sys.stderr)
    print(f"[ab] {key}: after  {[round(x, 1) for x in a]}", file=sys.stderr)
PY
