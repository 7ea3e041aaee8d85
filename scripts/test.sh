#!/usr/bin/env bash
# The test command of the README and CI: install dependencies, build, run every test (GPU tests skip
# with a message where there is no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
