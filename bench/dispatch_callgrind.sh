#!/usr/bin/env bash
# bench/dispatch_callgrind.sh: the server's instructions per chained call.
#
#   bench/dispatch_callgrind.sh BIN [HOSTS] [CALLS]
#
# Runs BIN's plexus-bench-dispatch (--hosts-list HOSTS, default 1;
# --repeats 1 --calls CALLS, default 4096; --skip-busy) on an embedded
# cluster whose server runs under callgrind (valgrind --tool=callgrind
# --instr-atstart=no), instrumented from the end of the op-by-op phase to
# the bench's "server CPU" line (the chained graphs), and prints the
# instructions it ran in that window divided by the calls it routed
# (ClusterState::RouteCall). Threads run one at a time under valgrind, so
# batches are larger than in a real run: compare builds with it, not with
# a real run's CPU time. The server's heartbeat deadline is a minute (it
# runs tens of times slower than it would: with many hosts it would
# otherwise declare them lost). The raw callgrind output stays in a fresh
# temporary folder (printed).
set -euo pipefail
if [[ $# -lt 1 ]]; then
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
bin=$(cd "$1" && pwd)
hosts=${2:-1}
calls=${3:-4096}
command -v valgrind >/dev/null && command -v callgrind_control >/dev/null ||
  { echo "needs valgrind (callgrind_control)" >&2; exit 2; }
dir=$(mktemp -d /tmp/dispatch_callgrind.XXXXXX)
cp "$bin/plexus-bench-dispatch" "$bin/plexus-worker" "$dir/"
cp "$bin/plexus-server" "$dir/plexus-server.real"
cat >"$dir/plexus-server" <<EOF
#!/bin/sh
exec valgrind --tool=callgrind --callgrind-out-file=$dir/callgrind.out.%p \
  --dump-instr=no --instr-atstart=no "$dir/plexus-server.real" \
  --heartbeat-timeout-ms 60000 "\$@"
EOF
chmod +x "$dir/plexus-server"
out=$dir/bench.txt
"$dir/plexus-bench-dispatch" --hosts-list "$hosts" --repeats 1 \
  --calls "$calls" --skip-busy >"$out" 2>&1 &
bench=$!
wait_for() { until grep -q "$1" "$out" 2>/dev/null; do
  kill -0 "$bench" 2>/dev/null || { tail -5 "$out" >&2; exit 1; }
  sleep 0.2; done; }
wait_for "op-by-op, "
sleep 0.5  # the chained graphs begin
server=$(pgrep -f "$dir/plexus-server.real" | head -1)
callgrind_control -i on "$server" >/dev/null
wait_for "server CPU"
callgrind_control -d "$server" >/dev/null
callgrind_control -i off "$server" >/dev/null
wait "$bench"
dump=$(ls -S "$dir"/callgrind.out.*.1 | head -1)
# --tree=calling: each function's callees, with how often it called them.
callgrind_annotate --inclusive=yes --tree=calling "$dump" \
  >"$dir/annotated.txt" 2>/dev/null
total=$(awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}' "$dir/annotated.txt")
# The call count of RouteCall, read where its caller calls it.
routed=$(awk '/ > .*ClusterState::RouteCall\(unsigned long, plexus::proto::Call const&/ {
  if (match($0, /\([0-9,]+x\)/)) { n = substr($0, RSTART + 1, RLENGTH - 3);
  gsub(",", "", n); print n; exit } }' "$dir/annotated.txt")
echo "[callgrind] $bin, $hosts host(s): $total instructions, $routed calls" \
  "routed, $((total / routed)) per call (raw output in $dir)"
