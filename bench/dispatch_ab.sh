#!/usr/bin/env bash
# bench/dispatch_ab.sh: chained dispatch of two builds, in paired rounds.
#
#   bench/dispatch_ab.sh BEFORE_BIN AFTER_BIN ROUNDS [bench flags...]
#
# Runs plexus-bench-dispatch from each bin folder (each with its own server
# and workers: the embedded cluster takes the binaries next to the
# benchmark) in ABBA order — before, after, after, before, ... — ROUNDS
# times each, with the given flags (default: --hosts-list 1,2,4,8 --repeats
# 5 --calls 8192 --skip-busy). Prints, per host count, the chained calls/s
# and the server's CPU time per call of every run, the medians of each
# build, the median of the rounds' ratios (after/before within a round),
# and each round's server-CPU ratio: the table of docs/PERFORMANCE.md
# ("Cost of the job records"). Raw output stays in $AB_DIR (default a
# fresh temporary folder). The load average is printed before and after.
set -euo pipefail
# shellcheck source=bench/abba.sh
source "$(dirname "$(realpath "$0")")/abba.sh"
ab_usage 3 14 "$@"
before=$1
after=$2
rounds=$3
shift 3
flags=("$@")
if [[ ${#flags[@]} -eq 0 ]]; then
  flags=(--hosts-list 1,2,4,8 --repeats 5 --calls 8192 --skip-busy)
fi
for bin in "$before" "$after"; do
  ab_need "$bin" plexus-bench-dispatch plexus-server plexus-worker
done
ab_dir dispatch_ab
echo "[ab] flags: ${flags[*]}"
run() {  # which round
  local which=$1 round=$2 bin
  bin=$([[ $which == before ]] && echo "$before" || echo "$after")
  ab_run "$which" "$round" "$bin/plexus-bench-dispatch" "${flags[@]}"
}
abba "$rounds" before after
python3 - "$dir" "$rounds" <<'EOF'
import re, statistics, sys
folder, rounds = sys.argv[1], int(sys.argv[2])
cps = re.compile(r"^\[dispatch\] chained, (\d+) hosts?: ([\d,]+) calls/s")
cpu = re.compile(r"^\[dispatch\] server CPU, chained, (\d+) hosts?: ([\d.]+) us per call")
def read(which, r):
    out = {}
    for line in open(f"{folder}/{which}.{r}.txt"):
        if m := cps.match(line):
            out.setdefault(int(m[1]), {})["cps"] = float(m[2].replace(",", ""))
        elif m := cpu.match(line):
            out.setdefault(int(m[1]), {})["cpu"] = float(m[2])
    return out
runs = {w: [read(w, r) for r in range(rounds)] for w in ("before", "after")}
med = statistics.median
print("\n| hosts | before: calls/s, server us/call (per host) | after: calls/s, "
      "server us/call (per host) | calls/s after/before | server CPU "
      "after/before | per-round server CPU ratios |")
print("|---|---|---|---|---|---|")
for h in sorted(runs["before"][0]):
    b = runs["before"]; a = runs["after"]
    bc, ac = med(x[h]["cps"] for x in b), med(x[h]["cps"] for x in a)
    bu, au = med(x[h]["cpu"] for x in b), med(x[h]["cpu"] for x in a)
    rc = [a[r][h]["cps"] / b[r][h]["cps"] for r in range(rounds)]
    ru = [a[r][h]["cpu"] / b[r][h]["cpu"] for r in range(rounds)]
    print(f"| {h} | {bc:,.0f}, {bu:.2f} ({bu / h:.2f}) | {ac:,.0f}, {au:.2f} "
          f"({au / h:.2f}) | {ac / bc:.2f} (rounds' median {med(rc):.2f}) | "
          f"{au / bu:.2f} (rounds' median {med(ru):.2f}) | "
          + " ".join(f"{x:.2f}" for x in ru) + " |")
print("\nper-round calls/s ratios:")
for h in sorted(runs["before"][0]):
    print(f"  {h}: " + " ".join(
        f"{runs['after'][r][h]['cps'] / runs['before'][r][h]['cps']:.2f}"
        for r in range(rounds)))
EOF
