#!/usr/bin/env bash
# bench/timeline_ab.sh: what the timeline's recording costs dispatch.
#
#   [AB_FLAG=--journal] bench/timeline_ab.sh BIN ROUNDS [bench flags...]
#
# Runs BIN/plexus-bench-dispatch with --timeline off and on (every server
# and worker recording, as by default) in ABBA order — off, on, on, off,
# ... — ROUNDS times each, with the given flags (default: --hosts-list 1,2
# --repeats 3 --calls 8192 --skip-busy). Prints each run's chained calls/s
# per host count, the medians of off and on, and the median of the rounds'
# on/off ratios: the table of docs/PERFORMANCE.md ("The timeline's cost").
# AB_FLAG names another on/off flag of the bench to compare the same way
# (--journal: the server's journal, "The journal's cost").
# Raw output stays in $AB_DIR (default a fresh temporary folder).
set -euo pipefail
# shellcheck source=bench/abba.sh
source "$(dirname "$(realpath "$0")")/abba.sh"
ab_usage 2 14 "$@"
bin=$1
rounds=$2
shift 2
flags=("$@")
if [[ ${#flags[@]} -eq 0 ]]; then
  flags=(--hosts-list 1,2 --repeats 3 --calls 8192 --skip-busy)
fi
ab_dir timeline_ab
echo "[ab] flags: ${flags[*]}"
run() {  # off|on round
  ab_run "$1" "$2" "$bin/plexus-bench-dispatch" "${AB_FLAG:---timeline}" "$1" \
    "${flags[@]}"
}
abba "$rounds" off on
python3 - "$dir" "$rounds" <<'PY'
import re, statistics, sys
folder, rounds = sys.argv[1], int(sys.argv[2])
cps = re.compile(r"^\[dispatch\] chained, (\d+) hosts?: ([\d,]+) calls/s")
def read(which, r):
    out = {}
    for line in open(f"{folder}/{which}.{r}.txt"):
        m = cps.match(line)
        if m:
            out[int(m.group(1))] = float(m.group(2).replace(",", ""))
    return out
runs = {w: [read(w, r) for r in range(rounds)] for w in ("off", "on")}
for hosts in sorted(runs["off"][0]):
    off = [x[hosts] for x in runs["off"]]
    on = [x[hosts] for x in runs["on"]]
    ratios = [b / a for a, b in zip(off, on)]
    print(f"[ab] chained, {hosts} host(s): off {[round(x) for x in off]}")
    print(f"[ab] chained, {hosts} host(s): on  {[round(x) for x in on]}")
    print(f"[ab] chained, {hosts} host(s): median off {statistics.median(off):,.0f}"
          f" calls/s, on {statistics.median(on):,.0f} calls/s; median on/off "
          f"{statistics.median(ratios):.3f} over {rounds} rounds")
PY
