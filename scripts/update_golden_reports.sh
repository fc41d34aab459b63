#!/usr/bin/env bash
# Rewrites tests/sim/golden/*.json from the current simulator. Run it after an intended change to
# the timing model or the report schema, then review `git diff tests/sim/golden` before committing.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${1:-build}"
cmake --build "$build_dir" --target tilelab_sim_tests -j2
TILELAB_UPDATE_GOLDEN=1 "$build_dir/tests/sim/tilelab_sim_tests" "golden reports*"
git diff --stat -- tests/sim/golden
