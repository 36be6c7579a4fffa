#!/usr/bin/env bash
# The test command: installs dependencies, builds kiln twice (optimised, and
# with ASan+UBSan) with -Wall -Wextra -Werror, and runs every test in both.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh --test
jobs=$(nproc)
make -j"$jobs" all
make -j"$jobs" asan
status=0
bash tests/run.sh build || status=1
# oneDNN's JIT trips LeakSanitizer's view of its code caches: leaks are not errors here
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  bash tests/run.sh build-asan || status=1
exit $status
