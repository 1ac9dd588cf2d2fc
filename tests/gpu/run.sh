#!/usr/bin/env bash
# The GPU checks of the XLA backend, in one go, for a machine with an NVIDIA
# GPU: installs the CUDA PJRT plugin (jax[cuda13] 0.10.2: jax-cuda13-pjrt and
# the nvidia-* library wheels it links against), builds (incremental), runs
# tests/gpu (XLA programs on the GPU through Plexus) and the matmul / per-call
# benchmark, and prints what it measured. Under 5 minutes with a warm build.
#   tests/gpu/run.sh [out-dir]      (figures -> out-dir/xla_gpu.json)
# CI never runs this; without a GPU the tests in tests/gpu skip with a reason.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-${OUT:-$root/bench/results}}"
mkdir -p "$out"
cd "$root"
PY="${PYTHON:-python3}"
start=$(date +%s)
step() { echo "[gpu $(( $(date +%s) - start ))s] $*"; }

step "GPU:"; nvidia-smi -L || { echo "no NVIDIA GPU here: nothing to check"; exit 2; }
step "dependencies"
bash scripts/setup.sh
if ! $PY -c "import jax_plugins.xla_cuda13" 2>/dev/null; then
  # Same version as jax/jaxlib (scripts/setup.sh): the plugin must accept
  # the StableHLO artifacts that jax.export writes.
  $PY -m pip install -q --disable-pip-version-check "jax[cuda13]==0.10.2" ||
    { echo "cannot install jax[cuda13]==0.10.2 (offline?)"; exit 3; }
fi
plugin=$($PY -c "import sys; sys.path.insert(0, 'python'); from plexus._binaries import cuda_pjrt_plugin as p; print(p() or '')")
[ -n "$plugin" ] || { echo "the CUDA PJRT plugin is missing"; exit 3; }
libs=$($PY -c "import sys; sys.path.insert(0, 'python'); from plexus._binaries import nvidia_library_dirs as d; print(':'.join(d()))")
export PLEXUS_PJRT_PLUGIN="$plugin"
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
step "plugin $plugin"

step "build"
cmake -S . -B build -G Ninja > /dev/null
ninja -C build plexus-server plexus-worker _core xla_executor_test \
  nccl_api_test nccl_collective_test > /dev/null
step "NCCL and CUDA loaders with a GPU (the wheels' libraries)"
build/bin/nccl_api_test --gtest_brief=1
build/bin/nccl_collective_test --gtest_brief=1

export PYTHONPATH="$root/python" PLEXUS_BIN_DIR="$root/build/bin"
step "tests/gpu"
$PY -m pytest -q -rs tests/gpu
step "benchmark"
bash tests/gpu/bench.sh "$out"
step "done: figures in $out"
