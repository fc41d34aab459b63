#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, then runs CTest (Catch2 cases, the
# downstream find_package project) and pytest. Exits non-zero when any test fails.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
build_dir="${TILELAB_BUILD_DIR:-build}"
status=0
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" || status=1
PYTHONPATH="$root/$build_dir/python${PYTHONPATH:+:$PYTHONPATH}" \
  .venv/bin/python -m pytest -q tests/python || status=1
exit $status
