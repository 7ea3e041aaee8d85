#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) in build-fuzz/ and runs each for SECONDS (default 60).
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]   targets: safetensors config tokenizer_text tokenizer_json
#        chat_template (default: all, one after another). New corpus entries go to build-fuzz/corpus/TARGET
# (the committed seeds in fuzz/corpus/TARGET are read, never written); crashes to build-fuzz/artifacts/TARGET;
# logs to build-fuzz/logs/TARGET.log (or FUZZ_LOG_DIR/TARGET.log). Exits non-zero when any target finds a crash, leak, timeout or OOM.
# Environment: FUZZ_SKIP_BUILD=1 (reuse the build), FUZZ_NICE (default 19), FUZZ_ARGS (extra libFuzzer flags),
# FUZZ_LOG_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(safetensors config tokenizer_text tokenizer_json chat_template)
build=build-fuzz

if [ "${FUZZ_SKIP_BUILD:-0}" != 1 ]; then
  cmake -S . -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOECEL_FUZZ=ON \
    -DMOECEL_SANITIZE=ON -DMOECEL_CUDA=OFF -DMOECEL_BUILD_TESTS=OFF >/dev/null
  cmake --build "$build" -j 2 --target $(printf 'fuzz_%s ' "${targets[@]}")
fi

# Inputs past these sizes only slow the search down: the seeds of each target fit well inside.
declare -A max_len=([safetensors]=4096 [config]=4096 [tokenizer_text]=2048 [tokenizer_json]=20000
  [chat_template]=8192)

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
status=0
summary=()
for t in "${targets[@]}"; do
  bin="$build/fuzz/fuzz_$t"
  [ -x "$bin" ] || { echo "no fuzz target '$t' ($bin)" >&2; exit 2; }
  logs=${FUZZ_LOG_DIR:-$build/logs}
  mkdir -p "$build/corpus/$t" "$build/artifacts/$t" "$logs"
  log="$logs/$t.log"
  echo "== fuzz_$t for ${seconds}s (log: $log)"
  set +e
  nice -n "${FUZZ_NICE:-19}" "$bin" "$build/corpus/$t" "fuzz/corpus/$t" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2560 -max_len="${max_len[$t]:-4096}" -print_final_stats=1 \
    -artifact_prefix="$build/artifacts/$t/" ${FUZZ_ARGS:-} >"$log" 2>&1
  rc=$?
  set -e
  final=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  execs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}' || true)
  if [ $rc -ne 0 ]; then
    status=1
    summary+=("fuzz_$t: FINDING (exit $rc), see $log and $build/artifacts/$t/")
    grep -E 'ERROR|SUMMARY|runtime error|deadly|Test unit written' "$log" | head -5 >&2 || true
  else
    summary+=("fuzz_$t: ok, ${execs:-?} executions; $final")
  fi
done
printf '%s\n' "${summary[@]}"
exit $status
