#!/usr/bin/env bash
# Prints the gist of each sanitizer report in a folder: its ERROR line, and
# for each section (the access, "freed by", "previously allocated by",
# thread creation) its header and the frames in Plexus's own sources (the
# first 8 of each), so the few lines CI shows at the end of a failed run
# say where the bug is. The whole reports are printed before this.
# Usage: sanitizer-summary.sh DIR
set -euo pipefail
dir=${1:?usage: sanitizer-summary.sh DIR}
shopt -s nullglob
reports=("$dir"/*)
[ ${#reports[@]} -eq 0 ] && exit 0
echo "[sanitizer] the gist of ${#reports[@]} report(s) (whole reports above):"
for f in "${reports[@]:0:4}"; do
  echo "--- $(basename "$f")"
  awk '
    /ERROR: |runtime error:/ { print "  " $0; next }
    /^(READ|WRITE) of size|^[a-z].* by thread T[0-9]+|^Thread T[0-9]+ created|^previously allocated/ {
      print "  " $0; n = 0; next }
    /^ *#[0-9]+ / && /src\/plexus\/|\/plexus\/python|tests\// {
      if (n++ < 8) { sub(/^ +/, ""); print "    " $0 } }
    /^SUMMARY:/ { print "  " $0 }
  ' "$f"
done
