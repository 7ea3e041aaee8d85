#!/usr/bin/env bash
# Decode A/B of one environment knob on the GPU machine: greedy ids of a model and the bundled model's text with the
# knob at each value (and on the gather path), the dispatch trace, then tg128 alternating the values over several
# rounds in one machine start, so that the figures compare (docs/benchmarks.md records them with the card and date).
#
# Usage: tools/knob_ab.sh MOECEL MODEL_DIR KNOB VALUE_A VALUE_B [ROUNDS]
#   MOECEL     the moecel binary (a CUDA build)
#   MODEL_DIR  e.g. a `moecel make-test-model --preset olmoe-1b-7b --bits 4 --group-size 64 --dtype f16` folder
#   KNOB       an environment variable, e.g. MOECEL_CUDA_FUSED_ROUTE
# Run it from the repository root (models/default is the bundled model); one line per check and per bench run.
# AB_BACKEND=cpu runs the same on the CPU backend (default cuda).
set -euo pipefail
if [ $# -lt 5 ]; then
  sed -n '6,9p' "$0" >&2
  exit 2
fi
bin=$1 model=$2 knob=$3 a=$4 b=$5 rounds=${6:-3} backend=${AB_BACKEND:-cuda}
gen() { "$bin" generate --backend "$backend" "$@" 2>/dev/null | md5sum | cut -c1-32; }
ids() { gen --model "$model" --prompt-ids 1,2,3 -n 64 --ignore-eos "$@"; }
text() { gen --model models/default -p 'The history of the city' -n 48 "$@"; }
for v in "$a" "$b"; do
  (
    export "$knob=$v"
    echo "$knob=$v ids $(ids) text $(text)"
    echo "$knob=$v trace $(MOECEL_TRACE=moe "$bin" generate --backend "$backend" --model "$model" --prompt-ids 1,2,3 \
      -n 8 --ignore-eos 2>&1 >/dev/null | grep 'moe dispatch' || true)"
  )
done
echo "gather ids $(ids --fused-moe off) text $(text --fused-moe off)"
for ((i = 1; i <= rounds; ++i)); do
  for v in "$a" "$b"; do
    paths=on
    [ "$i" -eq 1 ] && paths=on,off
    (
      export "$knob=$v"
      "$bin" bench --backend "$backend" --model "$model" -p 0 -n 128 -r 3 --fused-moe "$paths" 2>/dev/null |
        grep tg128 | sed "s/^/round $i $knob=$v /"
    )
  done
done
