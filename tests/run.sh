#!/usr/bin/env bash
# Runs every test binary in BUILD/tests and prints, per test, its checks and
# seconds (wall clock), then one closing line.
#   tests/run.sh [BUILD] [-j N] [-x LIST]
#     -j N     N test binaries at a time (default 1, or $KILN_TEST_JOBS); the
#              lines still come in name order, each when its test is done
#     -x LIST  leaves out the tests LIST names (one name per line, # starts a
#              comment), and says which in one line: scripts/test.sh uses it
#              for tests/sanitize-once in the clang sanitizer build
# Every test makes its own temporary directory (mkdtemp or its pid) and its
# own compile cache where it needs one, so tests may run side by side; each
# still runs its OpenMP threads as it would alone.
# libgomp's idle threads spin ~300k rounds at every barrier before they
# sleep; the tests' tiny models hit barriers all the time, and beside another
# process (a second test, a build, other users) the spinning took most of
# the CPU (test_train: 81% of its samples in libgomp, 23-64 s; 5-6 s with
# the short spin). So the tests wait with a short spin (GOMP_SPINCOUNT=1000,
# shorter than the kiln command's 10000, as -j runs several binaries at once;
# and KMP_BLOCKTIME=0 for the clang build's libomp: src/cli/main.c) unless
# the caller chose a policy.
# The wait policy changes no result. KILN_TEST_SPINCOUNT tells
# tests/cli_run.h to hand the kiln command the environment unchanged, so
# that kiln still picks its own policy there.
set -u
build=build; jobs=${KILN_TEST_JOBS:-1}; exclude=
while [ $# -gt 0 ]; do
  case "$1" in
    -j|-x) [ $# -ge 2 ] || { echo "run.sh: $1 wants a value" >&2; exit 2; }
           if [ "$1" = -j ]; then jobs=$2; else exclude=$2; fi; shift 2 ;;
    -j*) jobs=${1#-j}; shift ;;
    *) build=$1; shift ;;
  esac
done
case "$jobs" in ''|*[!0-9]*|0) echo "run.sh: -j wants a count of 1 or more, got '$jobs'" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
left_out=()
if [ -n "$exclude" ]; then
  [ -r "$exclude" ] || { echo "run.sh: -x: cannot read the list '$exclude'" >&2; exit 2; }
  while read -r name _; do
    name=${name%%#*}
    [ -n "$name" ] || continue
    [ -x "$build/tests/$name" ] || { echo "run.sh: $exclude names '$name', which $build/tests does not have" >&2; exit 2; }
    left_out+=("$name")
  done <"$exclude"
fi
if [ -z "${OMP_WAIT_POLICY:-}" ] && [ -z "${GOMP_SPINCOUNT:-}" ] && [ -z "${KMP_BLOCKTIME:-}" ]; then
  export GOMP_SPINCOUNT=1000 KMP_BLOCKTIME=0 KILN_TEST_SPINCOUNT=1
fi
tests=()
for t in "$build"/tests/test_*; do
  [ -x "$t" ] || continue
  case "$t" in *.o|*.d) continue;; esac
  case " ${left_out[*]} " in *" ${t##*/} "*) continue;; esac
  tests+=("$t")
done
work=$(mktemp -d "${TMPDIR:-/tmp}/kiln_run_XXXXXX")
trap 'rm -rf "$work"' EXIT
now() { date +%s%N; }
# one test: its output, exit status and nanoseconds into $work/I.{out,rc,ns}
one() {
  local i=$1 s e rc
  s=$(now)
  "${tests[$i]}" >"$work/$i.out" 2>&1; rc=$?
  e=$(now)
  echo $((e - s)) >"$work/$i.ns"
  echo $rc >"$work/$i.rc" # written last: the test is done
}
pass=0; fail=0; failed=()
report() { # the closing lines of test I
  local i=$1 t=${tests[$1]} rc line p f secs
  rc=$(cat "$work/$i.rc")
  secs=$(awk -v ns="$(cat "$work/$i.ns")" 'BEGIN { printf "%.1f", ns / 1e9 }')
  line=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$work/$i.out" | tail -n1)
  p=$(printf '%s' "$line" | sed -nE 's/.*: ([0-9]+) passed.*/\1/p'); f=$(printf '%s' "$line" | sed -nE 's/.* ([0-9]+) failed.*/\1/p')
  p=${p:-0}; f=${f:-0}
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  pass=$((pass + p)); fail=$((fail + f))
  if [ "$rc" -ne 0 ]; then
    failed+=("$t"); tail -n 30 "$work/$i.out"; echo "FAILED: $t (exit $rc, ${secs}s)"
  else
    echo "ok: $t ($p checks, ${secs}s)"
  fi
}
[ ${#left_out[@]} -eq 0 ] || echo "left out here (listed in $exclude): ${left_out[*]}"
start=$(now)
next=0; shown=0; running=0; n=${#tests[@]}
while [ $shown -lt $n ]; do
  while [ $running -lt "$jobs" ] && [ $next -lt $n ]; do
    one $next &
    next=$((next + 1)); running=$((running + 1))
  done
  if [ -e "$work/$shown.rc" ]; then
    report $shown
    shown=$((shown + 1))
  else
    wait -n 2>/dev/null
    # count what is still running (wait -n reaps one; a report may lag)
    running=$(jobs -rp | wc -l)
    # nothing left running and still no status: the runner itself was hit
    if [ "$running" -eq 0 ] && [ $next -eq $n ] && [ ! -e "$work/$shown.rc" ]; then
      echo 125 >"$work/$shown.rc"; [ -e "$work/$shown.ns" ] || echo 0 >"$work/$shown.ns"
    fi
  fi
done
wait
secs=$(awk -v ns="$(($(now) - start))" 'BEGIN { printf "%.0f", ns / 1e9 }')
echo "$build: $pass passed, $fail failed (${secs}s, $jobs at a time)"
[ $fail -eq 0 ]
