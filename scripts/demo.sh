#!/usr/bin/env bash
# The demo of the README: install dependencies, build, and generate text from the bundled model
# (models/default, a small OLMoE trained on the King James Bible). Pass another prompt as $1.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "building (log in build.log) ..." >&2
bash scripts/build.sh > build.log 2>&1 || { tail -50 build.log; exit 1; }
build/moecel generate --prompt "${1:-And the LORD spake unto Moses, saying,}" --max-tokens 64
