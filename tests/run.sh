#!/usr/bin/env bash
# Runs every test binary in BUILD/tests and prints one closing line.
set -u
build=${1:-build}
cd "$(dirname "$0")/.."
pass=0; fail=0; failed=()
for t in "$build"/tests/test_*; do
  [ -x "$t" ] || continue
  case "$t" in *.o|*.d) continue;; esac
  out=$("$t" 2>&1); rc=$?
  line=$(printf '%s\n' "$out" | grep -E '[0-9]+ passed, [0-9]+ failed' | tail -n1)
  p=$(printf '%s' "$line" | sed -nE 's/.*: ([0-9]+) passed.*/\1/p'); f=$(printf '%s' "$line" | sed -nE 's/.* ([0-9]+) failed.*/\1/p')
  p=${p:-0}; f=${f:-0}
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  pass=$((pass + p)); fail=$((fail + f))
  if [ $rc -ne 0 ]; then failed+=("$t"); printf '%s\n' "$out" | tail -n 30; echo "FAILED: $t (exit $rc)"; else echo "ok: $t ($p checks)"; fi
done
echo "$build: $pass passed, $fail failed"
[ $fail -eq 0 ]
