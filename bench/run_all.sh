#!/usr/bin/env bash
# Builds the Plexus benchmarks and runs each with its default flags; the
# figures go to bench/results/<name>.json (and the tables to stdout).
#   bench/run_all.sh [build-dir]     (default: build, configured already)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
results="$root/bench/results"
mkdir -p "$results"
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
export PLEXUS_BIN_DIR="$build/bin"
PY="${PYTHON:-python3}"

cmake -S "$root" -B "$build" -DPLEXUS_BUILD_BENCH=ON > /dev/null
ninja -C "$build" plexus-bench-dispatch plexus-bench-transfer plexus-bench-model \
  _core

status=0
for bench in dispatch transfer; do
  echo "== plexus-bench-$bench"
  if ! "$build/bin/plexus-bench-$bench" --json "$results/$bench.json"; then
    echo "plexus-bench-$bench failed" >&2
    status=1
  fi
done
echo "== plexus-bench-model"
if ! "$build/bin/plexus-bench-model" --benchmark_out="$results/model.json" \
    --benchmark_out_format=json; then
  echo "plexus-bench-model failed" >&2
  status=1
fi
for bench in stages pipeline rl xla multitenant; do
  echo "== bench/$bench.py"
  if ! "$PY" "$root/bench/$bench.py" --json "$results/$bench.json"; then
    echo "bench/$bench.py failed" >&2
    status=1
  fi
done
echo
echo "figures: $results/{dispatch,transfer,model,stages,pipeline,rl,xla,multitenant}.json"
exit $status
