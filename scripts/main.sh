#!/usr/bin/env bash
# The main job: installs what is missing, builds, then runs the flash attention benchmark in quick
# mode (our kernels vs PyTorch SDPA when torch is importable, vs this machine's measured FMA peak
# and triad bandwidth). Arguments are passed to bench/attention/bench_flash.py.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
build_dir="${TILELAB_BUILD_DIR:-build}"
PYTHONPATH="$root/$build_dir/python${PYTHONPATH:+:$PYTHONPATH}" \
  exec .venv/bin/python bench/attention/bench_flash.py --build-dir "$build_dir" --quick "$@"
