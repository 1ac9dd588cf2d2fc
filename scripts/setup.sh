#!/usr/bin/env bash
# Installs everything Plexus needs to build and test, idempotently.
# Debian packages through apt-get, Python packages through pip. Fast when done.
set -euo pipefail
APT_PKGS=(cmake ninja-build g++ ccache pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev
  libgoogle-perftools-dev clang-format)
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
PY=${PYTHON:-python3}
# numpy>=1.26: the buffer protocol and dtype behaviour the binding relies on.
# pybind11>=2.11: py::array and GIL release helpers used by the binding.
# scikit-build-core: builds the C++ tree for `pip install .`.
if ! $PY -c "import numpy, pytest, pybind11, scikit_build_core" 2>/dev/null; then
  echo "[setup] pip install numpy pytest pybind11 scikit-build-core"
  $PY -m pip install -q --disable-pip-version-check "numpy>=1.26" "pytest>=7" "pybind11>=2.11" "scikit-build-core>=0.8"
fi
echo "[setup] dependencies present"
