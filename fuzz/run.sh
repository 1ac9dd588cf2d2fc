#!/usr/bin/env bash
# Runs fuzz targets of a fuzz build, each for a set time, from its seed
# corpus in fuzz/corpus/<target>/ (read only: what the run finds goes to
# WORK_DIR/<target>/corpus). Prints one line per target (executions,
# executions per second, corpus size) and writes them to
# WORK_DIR/summary.tsv. Exits non-zero if any target crashed, hung or ran
# out of memory; the input that did is in WORK_DIR/<target>/artifacts/.
#
#   fuzz/run.sh BUILD_DIR SECONDS_PER_TARGET WORK_DIR [TARGET...]
#
# Used by `make fuzz-smoke` (20 s each) and bench/fuzz.sh (an hour).
set -uo pipefail
cd "$(dirname "$0")/.."
build=$1 seconds=$2 work=$3
shift 3
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(data_plane_fuzz client_batch_fuzz worker_batch_fuzz worker_ops_fuzz
           compile_options_fuzz journal_reader_fuzz)
fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:handle_abort=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
mkdir -p "$work"
# One row per target: a rerun of some targets replaces their rows only.
if [ -f "$work/summary.tsv" ]; then
  awk -F'\t' -v run=" ${targets[*]} " 'NR == 1 || index(run, " " $1 " ") == 0' \
    "$work/summary.tsv" >"$work/summary.tsv.new"
  mv "$work/summary.tsv.new" "$work/summary.tsv"
else
  printf 'target\tseconds\texecutions\texec_per_s\tcorpus\tresult\n' >"$work/summary.tsv"
fi
failed=0
for t in "${targets[@]}"; do
  dir=$work/$t
  mkdir -p "$dir/corpus" "$dir/artifacts"
  # -timeout: one input running this long is a hang (every wait in the
  # code under test has a way out). -max_len: frames and batches of
  # several records. -rss_limit_mb: a claimed size that makes the process
  # allocate beyond its bound is a finding.
  "$build/bin/$t" -max_total_time="$seconds" -timeout=30 -max_len=65536 \
    -rss_limit_mb=4096 -print_final_stats=1 -dict=fuzz/proto.dict \
    -artifact_prefix="$dir/artifacts/" "$dir/corpus" "fuzz/corpus/$t" \
    >"$dir/log.txt" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log.txt" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$dir/log.txt" | tail -1)
  corpus=$(find "$dir/corpus" "fuzz/corpus/$t" -type f | wc -l)
  result=ok
  if [ $rc -ne 0 ]; then
    result="FAILED (exit $rc): $(ls "$dir/artifacts" | tr '\n' ' ')"
    failed=1
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$seconds" "${execs:-0}" \
    "${rate:-0}" "$corpus" "$result" >>"$work/summary.tsv"
  printf '[fuzz] %-22s %10s execs  %7s/s  corpus %5s  %s\n' "$t" \
    "${execs:-0}" "${rate:-0}" "$corpus" "$result"
  if [ $rc -ne 0 ]; then
    grep -m1 -B2 -A30 -E 'ERROR: |runtime error|invariant broken|data_plane_fuzz:' \
      "$dir/log.txt" | head -60
  fi
done
exit $failed
