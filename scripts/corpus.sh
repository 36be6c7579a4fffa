#!/usr/bin/env bash
# Writes kiln's default training corpus, the King James Bible, to OUT_FILE.
# Needs the Debian package bible-kjv (this script installs nothing).
#
# `bible -f` prints one verse per line, prefixed with a reference such as
# "Ge1:1 ". We strip the references: they are not prose, they repeat a counter
# on every line (a small model would spend capacity learning to count verses),
# and they make the text unlike anything the model is later prompted with.
# Instead each chapter becomes one paragraph, separated from the next by a
# blank line, so `kiln tokenize` (which treats blank-line-separated paragraphs
# as documents) sees one document per chapter: 1189 documents.
set -euo pipefail
if [ $# -ne 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  echo "usage: scripts/corpus.sh OUT_FILE" >&2
  exit 2
fi
out=$1
command -v bible >/dev/null || { echo "corpus.sh: 'bible' not found (Debian package bible-kjv)" >&2; exit 1; }
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT
bible -f 'gen1:1-rev22:21' | awk '
  match($0, /^[0-9]?[A-Za-z]+[0-9]+:[0-9]+ /) {
    ref = substr($0, 1, RLENGTH - 1)
    sub(/:[0-9]+$/, "", ref)          # book+chapter, e.g. "Ge1"
    if (NR > 1 && ref != chapter) print ""
    chapter = ref
    print substr($0, RLENGTH + 1)
    next
  }
  { print }                            # continuation lines, if any
' > "$tmp"
[ -s "$tmp" ] || { echo "corpus.sh: bible printed nothing" >&2; exit 1; }
mv "$tmp" "$out"
trap - EXIT
