#!/usr/bin/env bash
# The demo of the README: install dependencies, build, and generate text from the bundled model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh > build.log 2>&1 || { tail -50 build.log; exit 1; }
if [ -f models/default/config.json ]; then
  build/moecel generate --prompt "${1:-In the beginning}" --max-tokens 64
else
  # No bundled trained model yet: run the engine end to end on a tiny random checkpoint.
  build/moecel make-test-model --preset tiny --bits 4 --out build/tiny-olmoe
  build/moecel inspect --model build/tiny-olmoe
  build/moecel generate --model build/tiny-olmoe --prompt-ids 1,2,3,4 --max-tokens 16
fi
