#!/usr/bin/env bash
# Installs everything Plexus needs to build and test, idempotently.
# Debian packages through apt-get, Python packages through pip. Fast when done.
set -euo pipefail
APT_PKGS=(cmake ninja-build g++ ccache pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  # OpenBLAS 0.3.21: BLAS for the built-in kernels, and the LAPACK the
  # workers serve jaxlib's LAPACK custom calls with (jnp.linalg on CPU;
  # src/plexus/executors/xla/lapack/): libopenblas0 carries both.
  libopenblas-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # The controller's journal (src/plexus/journal/): SQLite 3.40, its store;
  # LevelDB 1.23, the store bench/journal.cc compares it with.
  libsqlite3-dev libleveldb-dev
  libgoogle-perftools-dev clang-format
  # clang 14, its sanitizer runtimes and llvm-symbolizer: the thread-safety
  # and sanitizer stages of make test.
  clang libclang-rt-14-dev llvm
  # openssl and iproute2: the tests make TLS certificates (openssl req) and
  # hosts in network namespaces (ip netns).
  openssl iproute2
  # The server's live page and /metrics (src/plexus/web/CMakeLists.txt):
  # civetweb (HTTP), prometheus-cpp (the text format), Chart.js (compiled
  # into the server with the page).
  libcivetweb-dev prometheus-cpp-dev libjs-chart.js)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[setup] apt-get install ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# Without their recommends: a single-node Slurm for tests/test_deploy_slurm.py
# (deploy/slurm): the daemons, srun/sbatch and munge (8 packages,
# ~13 MB installed; with them 42 packages, ~44 MB: HDF5, ROCm SMI, IPMI
# and database plugins nothing here uses). The test starts munged,
# slurmctld and slurmd itself, with configuration in a folder of its own.
LEAN_PKGS=(slurmd slurmctld slurm-client munge
  # Headless Chromium: tests/test_live_page.py opens the live page in it and
  # saves a screenshot (without recommends: no desktop integration).
  chromium)
missing=()
for p in "${LEAN_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[setup] apt-get install --no-install-recommends ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
PY=${PYTHON:-python3}
# numpy>=1.26: the buffer protocol and dtype behaviour the binding relies on.
# pybind11>=2.11: py::array and GIL release helpers used by the binding.
# scikit-build-core: builds the C++ tree for `pip install .`.
# pytest-xdist 3.8.0: make test runs the Python suites in several pytest
# processes (PYTEST_WORKERS in the Makefile; --dist worksteal needs >= 3.2).
if ! $PY -c "import numpy, pytest, pybind11, scikit_build_core, xdist" 2>/dev/null; then
  echo "[setup] pip install numpy pytest pytest-xdist pybind11 scikit-build-core"
  $PY -m pip install -q --disable-pip-version-check "numpy>=1.26" "pytest>=7" "pytest-xdist==3.8.0" "pybind11>=2.11" "scikit-build-core>=0.8"
fi
# The XLA backend, pinned together because behaviour depends on the pair:
# - xla-cpu-pjrt 0.0.1 (the only release) ships the CPU PJRT C API plugin
#   the workers load and include/pjrt_c_api.h (PJRT C API 0.81) that the C++
#   build compiles against; its StableHLO parser (v1.13) accepts portable
#   artifacts up to 12 weeks older.
# - jax/jaxlib 0.10.2 are the newest for Python 3.11: plexus.jit lowers
#   with jax.export and builds compile options with jaxlib; their artifacts
#   load in that plugin (tests/test_xla.py checks it).
XLA_PKGS=("jax==0.10.2" "jaxlib==0.10.2" "xla-cpu-pjrt==0.0.1")
if ! $PY -c "import jax, xla_plugins.xla_cpu_pjrt; assert jax.__version__ == '0.10.2'" 2>/dev/null; then
  echo "[setup] pip install ${XLA_PKGS[*]}"
  $PY -m pip install -q --disable-pip-version-check "${XLA_PKGS[@]}"
fi
# plexus.torch (tests/test_torch.py, examples/torch_gpt.py), pinned together:
# - torchax 0.0.13 (the newest; it needs jax >= 0.6.2 only, and runs on
#   the jax 0.10.2 above) turns torch code into JAX functions;
# - torch 2.11.0: the newest torch that torchax 0.0.13 imports with (torch
#   2.13 and later dropped the named-tensor overloads such as
#   aten.prod.dim_Dimname that torchax's amp table names). PyPI's Linux
#   wheel is the CUDA build (its nvidia-* wheels come along, ~3 GB; only the
#   CPU is used): the CPU-only index is not reachable from these machines.
TORCH_PKGS=("torch==2.11.0" "torchax==0.0.13")
if ! $PY -c "import torch, torchax; assert torch.__version__.split('+')[0] == '2.11.0' and torchax.__version__ == '0.0.13'" 2>/dev/null; then
  echo "[setup] pip install ${TORCH_PKGS[*]}"
  $PY -m pip install -q --disable-pip-version-check "${TORCH_PKGS[@]}"
fi
# The launchers' tests (docs/DEPLOY.md), pinned so that what they check
# does not move under them:
# - kubernetes-validate 1.37.0: the Kubernetes JSON schemas (1.37 and
#   older) offline; tests/test_deploy_kubernetes.py validates
#   deploy/kubernetes/ against them (strict: unknown fields are errors).
# - ray 2.60.0: plexus.ray starts a cluster on resources Ray reserved;
#   tests/test_ray.py runs it on a local Ray (under CI=true it fails, not
#   skips, without Ray). The plain `ray` wheel (core only, no dashboard).
DEPLOY_PKGS=("kubernetes-validate==1.37.0" "ray==2.60.0")
if ! $PY -c "import importlib.metadata as m; assert m.version('kubernetes-validate') == '1.37.0' and m.version('ray') == '2.60.0'" 2>/dev/null; then
  echo "[setup] pip install ${DEPLOY_PKGS[*]}"
  $PY -m pip install -q --disable-pip-version-check "${DEPLOY_PKGS[@]}"
fi
# The newest jax, for the jax-next stage of make test: plexus.jit supports
# jax 0.10.2 to 0.12.x (python/plexus/_jax_version.py, JAX_OLDEST/JAX_NEWEST), and
# CI runs its suites on both ends: 0.10.2 above, and here jax/jaxlib
# 0.12.0.1, the newest 0.12 (it writes StableHLO 1.18, which plexus.jit
# writes down to the plugin's 1.13; tests/test_stablehlo_version.py). They
# need Python 3.12, so they go in a venv of their own, .venv-jax-next, made
# from a Python 3.12 (python3.12 on PATH, or pyenv's), with the same plugin;
# CMake builds plexus._core for it too (PLEXUS_PYTHON_NEXT). A venv with
# another jax (0.11.0 before) is made again. Where there is no Python 3.12
# the stage says so and is skipped; under CI=true that is a failure here.
NEXT_VENV=$(cd "$(dirname "$0")/.." && pwd)/.venv-jax-next
NEXT_JAX=0.12.0.1
NEXT_PKGS=("jax==$NEXT_JAX" "jaxlib==$NEXT_JAX" "xla-cpu-pjrt==0.0.1" "numpy>=1.26" "pytest>=7" "pytest-xdist==3.8.0")
if ! "$NEXT_VENV/bin/python" -c "import jax, jaxlib, xla_plugins.xla_cpu_pjrt, pytest; assert jax.__version__ == jaxlib.__version__ == '$NEXT_JAX'" 2>/dev/null; then
  # The first that runs (a pyenv shim on PATH may refuse to).
  PY312=""
  for c in $(command -v python3.12 || true) \
      $( (command -v pyenv >/dev/null && ls -d "$(pyenv root)"/versions/3.12.*/bin/python3.12 | sort -rV) 2>/dev/null || true); do
    if "$c" -c "import sys, venv; assert sys.version_info[:2] == (3, 12)" 2>/dev/null; then PY312=$c; break; fi
  done
  if [ -z "$PY312" ]; then
    echo "[setup] no Python 3.12 (python3.12 or pyenv): the jax-next stage will be skipped"
    case "${CI:-}" in [Tt]rue|TRUE|1|[Yy]es) echo "[setup] CI=true: a Python 3.12 is required"; exit 1;; esac
  else
    echo "[setup] $NEXT_VENV ($PY312): pip install ${NEXT_PKGS[*]}"
    rm -rf "$NEXT_VENV"
    "$PY312" -m venv "$NEXT_VENV"
    "$NEXT_VENV/bin/python" -m pip install -q --disable-pip-version-check "${NEXT_PKGS[@]}"
  fi
fi
if [ -x "$NEXT_VENV/bin/python" ] && ! "$NEXT_VENV/bin/python" -c "import xdist" 2>/dev/null; then
  echo "[setup] $NEXT_VENV: pip install pytest-xdist==3.8.0"
  "$NEXT_VENV/bin/python" -m pip install -q --disable-pip-version-check "pytest-xdist==3.8.0"
fi
echo "[setup] dependencies present"
