#!/usr/bin/env bash
# Runs every libFuzzer harness in $FUZZ_DIR/fuzz/ (default build-fuzz, built
# by `make fuzz-build`; CI: build-clang, built by `make fuzz-ci`).
#   run.sh time SECONDS   each harness for SECONDS (make fuzz)
#   run.sh runs N         each harness for N executions (make fuzz-check, CI)
# Seeds: tests/fuzz/corpus/NAME (committed, read only); what libFuzzer finds
# goes to $FUZZ_DIR/corpus/NAME, crashes to $FUZZ_DIR/crashes/. Prints the
# executions of each harness and one closing line.
set -u
cd "$(dirname "$0")/../.."
how=${1:-runs}; amount=${2:-3000}
case "$how" in
  time) limit=(-max_total_time="$amount") ;;
  runs) limit=(-runs="$amount") ;;
  *) echo "run.sh: expected 'time SECONDS' or 'runs N', got '$how'" >&2; exit 2 ;;
esac
dir=${FUZZ_DIR:-build-fuzz}
mkdir -p "$dir/crashes"
pass=0; fail=0
for bin in "$dir"/fuzz/fuzz_*; do
  [ -x "$bin" ] || continue
  name=$(basename "$bin"); name=${name#fuzz_}
  seeds=tests/fuzz/corpus/$name
  work=$dir/corpus/$name
  mkdir -p "$work"
  log=$dir/$name.log
  # inputs up to 64 kB, except chat templates: past the nesting limits
  # (src/template/jinja_impl.h) a template needs more than 64 kB
  case "$name" in
    jinja) max_len=131072 ;;
    *) max_len=65536 ;;
  esac
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$bin" "${limit[@]}" -max_len="$max_len" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="$dir/crashes/$name"- "$work" "$seeds" > "$log" 2>&1
  rc=$?
  execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p' "$log" | tail -n1)
  if [ $rc -eq 0 ]; then
    pass=$((pass + 1)); echo "ok: fuzz_$name: ${execs:-?} executions, 0 crashes (corpus $(ls "$work" | wc -l) + $(ls "$seeds" | wc -l) seeds)"
  else
    fail=$((fail + 1)); tail -n 40 "$log"; echo "FAILED: fuzz_$name (exit $rc) after ${execs:-?} executions; input in $dir/crashes/"
  fi
done
echo "fuzz: $pass passed, $fail failed"
[ $fail -eq 0 ]
