#!/usr/bin/env bash
# ThreadSanitizer run of the C++ suites (not in CI: see docs/RELIABILITY.md,
# "Sanitizer stages", for what it found and what it costs).
#
# TSan sees absl::Mutex only when abseil itself is built with
# -fsanitize=thread (its Mutex then tells TSan about every lock and unlock);
# Debian's libabsl is not, so every absl::Mutex handoff would read as a race.
# This script therefore:
#   1. fetches the source package of the abseil that is installed (Debian's
#      own, with Debian's patches: the same ABI and inline namespace), with a
#      private apt configuration that adds deb-src lines for it (the
#      system's sources are left alone);
#   2. builds and installs it with clang -fsanitize=thread into
#      build-tsan/abseil/install;
#   3. builds Plexus with PLEXUS_SANITIZE=thread against it (build-tsan/);
#   4. runs ctest with that abseil first on LD_LIBRARY_PATH, so that gRPC
#      and protobuf, which link abseil too, load the same instrumented copy,
#      and every report written to build-tsan/reports; fails if any.
#
#   bench/tsan.sh [ctest args...]       e.g. bench/tsan.sh -R ObjectStore
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build="$root/build-tsan"
absl="$build/abseil"
jobs="${JOBS:-$(nproc)}"
start=$(date +%s)
step() { echo "[tsan $(( $(date +%s) - start ))s] $*"; }

bash scripts/setup.sh

version=$(dpkg-query -W -f='${Version}' libabsl-dev)
step "abseil $version (Debian source package) with -fsanitize=thread"
if [ ! -f "$absl/install/.version" ] || [ "$(cat "$absl/install/.version")" != "$version" ]; then
  rm -rf "$absl" && mkdir -p "$absl/apt/lists/partial" "$absl/apt/cache" "$absl/src"
  # The system's deb lines, as deb-src, in a private apt configuration.
  sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
    > "$absl/apt/debian-src.sources"
  apt_opts=(-o "Dir::Etc::SourceList=/dev/null"
    -o "Dir::Etc::SourceParts=$absl/apt"
    -o "Dir::State::Lists=$absl/apt/lists"
    -o "Dir::Cache=$absl/apt/cache"
    -o "Debug::NoLocking=1")
  apt-get "${apt_opts[@]}" update -qq
  (cd "$absl/src" && apt-get "${apt_opts[@]}" source -qq "abseil=$version")
  src=$(find "$absl/src" -maxdepth 1 -mindepth 1 -type d -name 'abseil-*' | head -1)
  # Debian's options (debian/rules): C++17, shared libraries (soname
  # .20220623, inline namespace debian3: Debian's patches), no NDEBUG (so
  # abseil's deadlock detection stays on, as in Debian's); no tests.
  flags="-O1 -g -fsanitize=thread -fno-omit-frame-pointer"
  cmake -S "$src" -B "$absl/build" -G Ninja \
    -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
    -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON -DBUILD_TESTING=OFF \
    -DCMAKE_BUILD_TYPE=None "-DCMAKE_CXX_FLAGS=$flags" "-DCMAKE_C_FLAGS=$flags" \
    -DCMAKE_INSTALL_PREFIX="$absl/install" -DCMAKE_INSTALL_LIBDIR=lib > /dev/null
  ninja -C "$absl/build" -j"$jobs" install > "$absl/build.log"
  echo "$version" > "$absl/install/.version"
fi

step "Plexus with PLEXUS_SANITIZE=thread in $build"
cmake -S . -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
  -DPLEXUS_SANITIZE=thread -DPLEXUS_BUILD_PYTHON=OFF -DPLEXUS_BUILD_BENCH=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" \
  -DCMAKE_PREFIX_PATH="$absl/install" -Dabsl_DIR="$absl/install/lib/cmake/absl" \
  -DPython3_EXECUTABLE="$(command -v "${PYTHON:-python3}")" > /dev/null
LD_LIBRARY_PATH="$absl/install/lib" ninja -C "$build" -j"$jobs"

reports="$build/reports"
rm -rf "$reports" && mkdir -p "$reports"
step "C++ suites under ThreadSanitizer (reports in $reports)"
rc=0
(cd "$build" && LD_LIBRARY_PATH="$absl/install/lib" \
  TSAN_OPTIONS="log_path=$reports/tsan:second_deadlock_stack=1:suppressions=$root/tests/sanitizer/tsan.supp" \
  ctest --output-on-failure -j"$jobs" --timeout 600 "$@") || rc=1
if [ -n "$(ls -A "$reports")" ]; then
  step "ThreadSanitizer reports:"
  for f in "$reports"/*; do echo "--- $f"; cat "$f"; done
  rc=1
fi
step "done (exit $rc)"
exit $rc
