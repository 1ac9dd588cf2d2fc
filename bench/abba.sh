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

# ab_usage MIN_ARGS LAST_USAGE_LINE "$@": prints the calling script's usage
# (its comment, lines 2 to LAST_USAGE_LINE) and exits 2 when it was given
# fewer than MIN_ARGS arguments.
ab_usage() {
  local min=$1 last=$2
  shift 2
  if [[ $# -lt $min ]]; then
    sed -n "2,${last}p" "$0" | sed 's/^# \{0,1\}//'
    exit 2
  fi
}

# ab_need DIR FILE...: exits 2 naming the first FILE missing under DIR.
ab_need() {
  local dir=$1 f
  shift
  for f in "$@"; do
    [[ -e $dir/$f ]] || { echo "no $dir/$f" >&2; exit 2; }
  done
}

# ab_dir NAME: sets `dir` to $AB_DIR (default a fresh /tmp/NAME.XXXXXX),
# makes it, and prints the time, the load and where the raw output goes.
ab_dir() {
  dir=${AB_DIR:-$(mktemp -d "/tmp/$1.XXXXXX")}
  mkdir -p "$dir"
  echo "[ab] $(date -u '+%F %T') UTC; load: $(cut -d' ' -f1-3 /proc/loadavg); raw output in $dir"
}

# ab_failed WHAT FILE: says WHAT failed with FILE's last lines, exits 1.
ab_failed() {
  echo "[ab] $1 failed:" >&2
  tail -5 "$2" >&2
  exit 1
}

# ab_run WHICH ROUND CMD...: runs CMD with its output in
# $dir/WHICH.ROUND.txt, says it failed (ab_failed) or is done.
ab_run() {
  local which=$1 round=$2
  shift 2
  "$@" >"$dir/$which.$round.txt" 2>&1 ||
    ab_failed "$which round $round" "$dir/$which.$round.txt"
  echo "[ab] round $round $which done; load $(cut -d' ' -f1 /proc/loadavg)"
}

# ab_trees BEFORE AFTER ROUNDS: sets `before` and `after` (absolute paths)
# and `rounds`.
ab_trees() {
  before=$(realpath "$1")
  after=$(realpath "$2")
  rounds=$3
}
