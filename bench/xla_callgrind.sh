#!/usr/bin/env bash
# bench/xla_callgrind.sh: the worker's instructions per tiny plexus.jit call.
#
#   bench/xla_callgrind.sh [TREE] [CALLS]
#
# Starts TREE's embedded cluster (1 host, 1 device; TREE/python and
# TREE/build/bin, default this tree) with its worker under callgrind
# (valgrind --tool=callgrind --instr-atstart=no), compiles and warms up
# `x + 1.0` on f32[8, 8] (bench/xla.py's tiny program), then instruments
# the worker over one graph of CALLS (default 400) chained calls and its
# wait, and prints the instructions all the worker's threads ran divided
# by CALLS, with the functions that allocate most (operator new). Counted
# instructions do not move with this VM's load: compare two trees with
# it, not with a real run's CPU time (threads run one at a time under
# valgrind). The server gets a two-minute heartbeat deadline (the worker
# runs tens of times slower). The raw output stays in a fresh temporary
# folder (printed). Needs valgrind and a C compiler (the launcher it puts
# in place of plexus-worker must be an executable file, not a script:
# plexus._binaries takes only those).
set -euo pipefail
here=$(dirname "$(realpath "$0")")
tree=$(realpath "${1:-$here/..}")
calls=${2:-400}
command -v valgrind >/dev/null && command -v callgrind_control >/dev/null ||
  { echo "needs valgrind (callgrind_control)" >&2; exit 2; }
dir=$(mktemp -d /tmp/xla_callgrind.XXXXXX)
for f in "$tree"/build/bin/*; do ln -s "$f" "$dir/$(basename "$f")"; done
# The server starts the workers found beside its own executable: a copy.
rm "$dir/plexus-worker" "$dir/plexus-server"
cp "$tree/build/bin/plexus-server" "$dir/plexus-server"
cp "$tree/build/bin/plexus-worker" "$dir/plexus-worker.real"
cat >"$dir/launcher.c" <<'EOF'
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char** argv) {
  char real[4096], out[4200];
  snprintf(real, sizeof real, "%s.real", argv[0]);
  snprintf(out, sizeof out, "--callgrind-out-file=%s.cg.%%p", argv[0]);
  char** args = calloc(argc + 8, sizeof(char*));
  int k = 0;
  args[k++] = "valgrind";
  args[k++] = "--tool=callgrind";
  args[k++] = out;
  args[k++] = "--dump-instr=no";
  args[k++] = "--instr-atstart=no";
  args[k++] = real;
  for (int i = 1; i < argc; ++i) args[k++] = argv[i];
  execvp(args[0], args);
  perror("execvp valgrind");
  return 1;
}
EOF
cc -O1 -o "$dir/plexus-worker" "$dir/launcher.c"
PYTHONPATH="$tree/python" PLEXUS_BIN_DIR="$dir" python3 - "$calls" <<'PY'
import subprocess, sys
import numpy as np
import plexus
calls = int(sys.argv[1])
with plexus.local(hosts=1, devices_per_host=1, device_memory_mib=1024,
                  heartbeat_timeout_ms=120000) as cluster:
    client = cluster.connect(name="xla-callgrind")
    s = client.slice(1)
    prog = plexus.jit(lambda x, w: x + 1.0, s, name="tiny")
    x = s.put(np.ones((8, 8), np.float32))
    w = s.put(np.ones((8, 8), np.float32))
    def chain(n):
        with client.graph():
            y = x
            for _ in range(n):
                y = prog(y, w)
        y.block_until_ready()
        return y
    for _ in range(3):
        chain(50)  # compiled, and every cache warm
    pid = str(cluster.worker_pids()[0])
    control = lambda *a: subprocess.run(["callgrind_control", *a, pid],
                                        check=True, capture_output=True)
    control("-i", "on")
    y = chain(calls)
    control("-d")
    control("-i", "off")
    assert float(np.asarray(y)[0, 0]) == 1.0 + calls
PY
dump=$(ls -S "$dir"/plexus-worker.cg.*.1 | head -1)
callgrind_annotate --inclusive=no "$dump" >"$dir/annotated.txt" 2>/dev/null
callgrind_annotate --tree=caller "$dump" >"$dir/callers.txt" 2>/dev/null
total=$(awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}' "$dir/annotated.txt")
echo "[callgrind] $tree: worker $total instructions over $calls tiny calls," \
  "$((total / calls)) per call (raw output in $dir)"
# Who allocates: operator new's callers, by instructions spent in it.
python3 - "$dir/callers.txt" "$calls" <<'PY'
import re, sys
lines, calls = open(sys.argv[1]).read().splitlines(), int(sys.argv[2])
head = re.compile(r"^\s*[\d,]+ \([^)]*\)\s+\*\s+.*operator new\[\]\(unsigned long\)")
at = next((i for i, l in enumerate(lines) if head.match(l)), None)
callers = []
while at is not None and at > 0 and re.match(r"^\s*[\d,]+ \([^)]*\)\s+<", lines[at - 1]):
    at -= 1
    n = int(lines[at].split()[0].replace(",", ""))
    where = lines[at].split("<", 1)[1].strip()
    where = where.split(":", 1)[-1] if ":" in where.split("(")[0] else where
    callers.append((n, re.sub(r"\(.*", "", where)))
for n, where in sorted(callers, reverse=True)[:12]:
    print(f"  operator new: {n / calls:5.0f} instructions per call from {where}")
PY
