#!/usr/bin/env bash
# Fails when the checked-in seed corpus (fuzz/corpus/<target>/seed-*) is not
# what the current formats encode: writes a fresh one with the corpus
# program and compares (inputs kept from crashes, regress-*, are not
# written by it and not compared). CTest runs it as fuzz_corpus_current.
#
#   fuzz/check_corpus.sh PLEXUS_FUZZ_CORPUS_BINARY CORPUS_DIR WORK_DIR
set -euo pipefail
generator=$1 corpus=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
"$generator" "$work"
stale=0
for dir in "$work"/*/; do
  t=$(basename "$dir")
  if ! diff -rq "$work/$t" "$corpus/$t" -x 'regress-*'; then
    echo "fuzz/corpus/$t is stale (the format changed): run make fuzz-corpus"
    stale=1
  fi
done
exit $stale
