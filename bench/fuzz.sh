#!/usr/bin/env bash
# Long fuzzing, outside CI: every fuzz target (fuzz/) for MINUTES_PER_TARGET
# minutes -- 12 each, 72 minutes in total for the six targets -- from the
# seed corpus, then the line coverage that the corpus it grew reaches in the
# code each target should reach, measured with a second build instrumented
# for source coverage (clang -fprofile-instr-generate -fcoverage-mapping;
# llvm-profdata, llvm-cov).
#
#   bash bench/fuzz.sh                       # the hour
#   MINUTES_PER_TARGET=3 bash bench/fuzz.sh  # a shorter run
#   bash bench/fuzz.sh data_plane_fuzz       # some targets only (their
#                                            # rows replace theirs)
#   SKIP_FUZZ=1 bash bench/fuzz.sh           # coverage and report only
#
# Writes bench/results/fuzz.json (executions, executions per second,
# corpus size, covered lines per target) and prints a table. Crashes fail
# the run; their inputs are in build-fuzz/long/<target>/artifacts/. The
# corpus a run grows stays in build-fuzz/long/ (the repository keeps only
# the seeds and the inputs of fixed crashes).
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES_PER_TARGET=${MINUTES_PER_TARGET:-12}
JOBS=${JOBS:-$(nproc)}
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(data_plane_fuzz client_batch_fuzz worker_batch_fuzz worker_ops_fuzz
           compile_options_fuzz journal_reader_fuzz)
fi

# The code each target should reach: its line coverage is reported.
declare -A reach=(
  [data_plane_fuzz]="src/plexus/transport/data_plane_server.cc src/plexus/transport/internal/frame_socket.cc src/plexus/store/object_store.cc"
  [client_batch_fuzz]="src/plexus/server/model/cluster_state.cc src/plexus/server/scheduling/route_call.cc src/plexus/server/scheduling/slice_placement.cc"
  [worker_batch_fuzz]="src/plexus/server/model/cluster_state.cc src/plexus/server/scheduling/slice_placement.cc"
  [worker_ops_fuzz]="src/plexus/worker/op_applier.cc src/plexus/worker/worker_local.cc src/plexus/worker/data_plane_handler.cc src/plexus/worker/task_submit.cc src/plexus/worker/task_runner.cc src/plexus/worker/input_binding.cc src/plexus/worker/peer_table.cc src/plexus/store/object_store.cc"
  [compile_options_fuzz]="src/plexus/executors/xla/compile_options.cc"
  [journal_reader_fuzz]="src/plexus/journal/internal/record.cc src/plexus/journal/journal.cc"
)

cmake_common=(-G Ninja -DCMAKE_CXX_COMPILER=clang++ -DPLEXUS_BUILD_FUZZ=ON
  -DPLEXUS_BUILD_TESTS=OFF -DPLEXUS_BUILD_PYTHON=OFF -DPLEXUS_BUILD_BENCH=OFF
  -DPython3_EXECUTABLE="$(command -v python3)")
[ -f build-fuzz/build.ninja ] || cmake -S . -B build-fuzz "${cmake_common[@]}"
ninja -C build-fuzz -j"$JOBS" "${targets[@]}"

echo "[fuzz] ${#targets[@]} target(s), $MINUTES_PER_TARGET min each, on" \
  "$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
status=0
if [ -z "${SKIP_FUZZ:-}" ]; then
  bash fuzz/run.sh build-fuzz $((MINUTES_PER_TARGET * 60)) build-fuzz/long \
    "${targets[@]}" || status=$?
fi

# Coverage: each target, built for source coverage, runs every input of its
# seed corpus and of the corpus the run grew once (-runs=0 reads them all).
[ -f build-fuzz-cov/build.ninja ] ||
  cmake -S . -B build-fuzz-cov "${cmake_common[@]}" -DPLEXUS_FUZZ_COVERAGE=ON
ninja -C build-fuzz-cov -j"$JOBS" "${targets[@]}"
mkdir -p build-fuzz-cov/profiles bench/results
cov_json=()
for t in "${targets[@]}"; do
  rm -f build-fuzz-cov/profiles/"$t".*
  LLVM_PROFILE_FILE="build-fuzz-cov/profiles/$t.%p.profraw" \
    build-fuzz-cov/bin/"$t" -runs=0 -timeout=30 -max_len=65536 \
    build-fuzz/long/"$t"/corpus fuzz/corpus/"$t" >/dev/null 2>&1 || true
  llvm-profdata merge -sparse build-fuzz-cov/profiles/"$t".*.profraw \
    -o build-fuzz-cov/profiles/"$t".profdata
  # shellcheck disable=SC2086
  llvm-cov export -summary-only build-fuzz-cov/bin/"$t" \
    -instr-profile=build-fuzz-cov/profiles/"$t".profdata ${reach[$t]} \
    >build-fuzz-cov/profiles/"$t".json
  cov_json+=("$t=build-fuzz-cov/profiles/$t.json")
done

python3 - "$MINUTES_PER_TARGET" build-fuzz/long/summary.tsv "${cov_json[@]}" <<'PY'
import csv, json, platform, subprocess, sys
minutes, summary, covs = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
runs = {r["target"]: r for r in csv.DictReader(open(summary), delimiter="\t")}
try:  # targets not run now keep their figures
    previous = json.load(open("bench/results/fuzz.json"))["targets"]
except (OSError, ValueError, KeyError):
    previous = {}
out = {"command": "bash bench/fuzz.sh", "minutes_per_target": minutes,
       "machine": f"{subprocess.getoutput('nproc')} cores, "
                  + subprocess.getoutput("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip(),
       "targets": previous}
print(f"{'target':22} {'executions':>11} {'exec/s':>7} {'corpus':>6} "
      f"{'lines covered':>15}  files")
for item in covs:
    t, path = item.split("=", 1)
    data = json.load(open(path))["data"][0]
    files = {f["filename"].split("/src/plexus/")[-1]: f["summary"]["lines"]
             for f in data["files"]}
    covered = sum(f["covered"] for f in files.values())
    count = sum(f["count"] for f in files.values())
    r = runs.get(t, {})
    out["targets"][t] = {
        "executions": int(r.get("executions") or 0),
        "exec_per_s": int(r.get("exec_per_s") or 0),
        "corpus": int(r.get("corpus") or 0),
        "result": r.get("result", "not run"),
        "lines_covered": covered, "lines": count,
        "files": {f: {"covered": v["covered"], "lines": v["count"]}
                  for f, v in files.items()}}
    pct = 100.0 * covered / count if count else 0.0
    print(f"{t:22} {r.get('executions', '0'):>11} {r.get('exec_per_s', '0'):>7} "
          f"{r.get('corpus', '0'):>6} {covered:>6}/{count:<5} {pct:3.0f}%  "
          + ", ".join(f"{f} {100.0 * v['covered'] / max(v['count'], 1):.0f}%"
                      for f, v in files.items()))
json.dump(out, open("bench/results/fuzz.json", "w"), indent=2)
print("wrote bench/results/fuzz.json")
PY
exit $status
