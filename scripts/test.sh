#!/usr/bin/env bash
# The test command: installs dependencies (scripts/deps.sh --test), builds
# kiln three times with -Wall -Wextra -Werror (optimised with gcc; ASan +
# UBSan incl. float-cast-overflow with gcc and with clang), runs every test
# in the first two and all but tests/sanitize-once in the clang one, then
# runs every libFuzzer harness over a fixed number of executions on its seed
# corpus (so no harness rots; they link the clang sanitizer build's library:
# make fuzz-ci). One closing line each, then the
# total, with the seconds of each step.
# The builds are one make call, so that one build's link and last files
# overlap the next one's compiles; each build's tests then run $jobs binaries
# at a time (tests/run.sh -j: most tests keep one core busy or wait on node,
# python or a child kiln, and the lines come out in name order regardless).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh --test
jobs=$(nproc)
t0=$SECONDS
make -j"$jobs" all asan asan-clang fuzz-ci
echo "builds: $((SECONDS - t0))s"
status=0
summary=()
# the layering of docs/DESIGN.md, checked against the includes, and the
# device seam (no tensor storage touched outside the backends and kernels)
bash scripts/layers.sh || status=1
bash scripts/storage.sh || status=1
run() { # NAME COMMAND...: runs it, keeps its closing "N passed, N failed" line
  local out; out=$(mktemp)
  local t=$SECONDS
  "${@:2}" 2>&1 | tee "$out" || status=1
  echo "$1: $((SECONDS - t))s"
  summary+=("$(grep -E '^[a-z0-9-]+: [0-9]+ passed, [0-9]+ failed' "$out" | tail -n1)")
  rm -f "$out"
}
san_env=(env ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1)
run build bash tests/run.sh build -j "$jobs"
# oneDNN's JIT trips LeakSanitizer's view of its code caches: leaks are not errors here
run build-asan "${san_env[@]}" bash tests/run.sh build-asan -j "$jobs"
# clang's sanitizer build runs every test but the whole-training, child-process
# ones of tests/sanitize-once, which gcc's has just run under ASan+UBSan
run build-clang "${san_env[@]}" bash tests/run.sh build-clang -j "$jobs" -x tests/sanitize-once
run fuzz env FUZZ_DIR=build-clang bash tests/fuzz/run.sh runs "${FUZZ_RUNS:-2000}"
p=0; f=0
for line in "${summary[@]}"; do
  n=$(sed -nE 's/.*: ([0-9]+) passed, ([0-9]+) failed.*/\1 \2/p' <<<"$line")
  [ -n "$n" ] || { status=1; continue; }
  p=$((p + ${n% *})); f=$((f + ${n#* }))
done
[ $status -eq 0 ] || [ $f -gt 0 ] || f=1
echo "total: $p passed, $f failed ($((SECONDS - t0))s from the first build)"
exit $status
