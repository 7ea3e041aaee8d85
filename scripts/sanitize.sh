#!/usr/bin/env bash
# CI sanitizer job: builds build-asan/ with AddressSanitizer + UndefinedBehaviorSanitizer (CPU backend only) and
# runs the CPU tests (unit, model and the broken-checkpoint corpus) under them. Reports from every process,
# including the moecel binaries the model tests start, go to build-asan/sanitizer-logs/; any report fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${SANITIZE_BUILD_DIR:-build-asan}
start=$(date +%s)

# -O1 keeps the instrumented build quick to compile while the tests still run fast enough; -g1 gives line numbers.
cmake -S . -B "$build" -DMOECEL_SANITIZE=ON -DMOECEL_CUDA=OFF -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g1 -DNDEBUG" >/dev/null
cmake --build "$build" -j 2 --target moecel moecel_tests
built=$(date +%s)

logs="$(realpath "$build")/sanitizer-logs"
rm -rf "$logs"
mkdir -p "$logs"
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1:check_initialization_order=1:log_path=$logs/asan"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1:log_path=$logs/ubsan"
export LSAN_OPTIONS="log_path=$logs/lsan"
status=0
ctest --test-dir "$build" -L cpu -j 2 --timeout 900 --output-on-failure || status=$?
end=$(date +%s)

if compgen -G "$logs/*" >/dev/null; then
  echo "sanitizer reports:" >&2
  for f in "$logs"/*; do
    echo "== $f" >&2
    head -60 "$f" >&2
  done
  status=1
fi
echo "sanitize.sh: build $((built - start))s, tests $((end - built))s, total $((end - start))s; exit $status"
exit $status
