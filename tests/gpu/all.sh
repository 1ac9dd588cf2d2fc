#!/usr/bin/env bash
# Everything the accelerator issue must show, in one call on the GPU machine
# (its bundle's run.sh builds the tree and sets the CUDA plugin first):
#   1. tests/gpu, with pytest's temporary folders (the clusters' logs) kept
#      under $OUT/pytest so that a failure can be read afterwards;
#   2. tests/gpu/bench.sh: XLA programs beside in-process JAX, and a 1 GiB
#      value between two workers sharing the GPU by each path;
#   0. which of the CUDA plugin's allocators CUDA IPC can export from
#      (tests/gpu/probe_allocators.py);
#   3. bench/multitenant.py as it is (MULTITENANT=0 skips it): the steady clients' p99 beside a
#      flooding client, on a machine with more cores than the benchmark
#      has processes.
# Each step has its own time limit and the next runs even when one fails, so
# one call brings back every figure it can.
#
#   DEADLINE_S=560 bash .gpu-bundle/run.sh bash tests/gpu/all.sh
#                                   (device tool: carry [".gpu-bundle"],
#                                    timeout_s 600)
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${OUT:-$root/bench/results/gpu}"
mkdir -p "$out"
cd "$root"
PY="${PYTHON:-python3}"
start=$(date +%s)
step() { echo "[gpu-all $(( $(date +%s) - start ))s] $*"; }
declare -A rc

step "the CUDA plugin's allocators and CUDA IPC"
timeout -k 10 60 "$PY" tests/gpu/probe_allocators.py --json "$out/allocators.json"
rc[probe]=$?

step "tests/gpu"
timeout -k 10 "${PYTEST_S:-150}" "$PY" -m pytest -q -rs --durations=10 \
  --basetemp="$out/pytest" -p no:cacheprovider tests/gpu
rc[pytest]=$?

step "tests/gpu/bench.sh"
timeout -k 10 "${BENCH_S:-260}" bash tests/gpu/bench.sh "$out"
rc[bench]=$?

if [ "${MULTITENANT:-1}" = 1 ]; then
  step "bench/multitenant.py"
  timeout -k 10 "${MULTITENANT_S:-110}" "$PY" bench/multitenant.py \
    --seconds "${MULTITENANT_SECONDS:-8}" --json "$out/multitenant_gpu_machine.json"
  rc[multitenant]=$?
else
  rc[multitenant]=skipped
fi

nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv || true
summary="SUMMARY(all.sh):"
worst=0
for k in probe pytest bench multitenant; do
  summary+=" $k=${rc[$k]}"
  case "${rc[$k]}" in 0|skipped) ;; *) worst=1 ;; esac
done
step "$summary"
exit $worst
