# bench/abba.sh: sourced by the A/B scripts (ab.sh, dispatch_ab.sh,
# roundtrip_ab.sh, timeline_ab.sh, xla_ab.sh): their paired rounds, in ABBA order.
#
#   abba ROUNDS A B
#
# calls the caller's `run A r; run B r` on even rounds and `run B r; run A r`
# on odd ones (so neither side always runs first on a machine whose load
# drifts), then prints the time and the load.
abba() {
  local rounds=$1 a=$2 b=$3 r
  for ((r = 0; r < rounds; r++)); do
    if ((r % 2 == 0)); then
      run "$a" "$r"; run "$b" "$r"
    else
      run "$b" "$r"; run "$a" "$r"
    fi
  done
  echo "[ab] $(date -u '+%F %T') UTC; load: $(cut -d' ' -f1-3 /proc/loadavg)"
}
