#!/usr/bin/env bash
# The main job: installs what is missing, builds, then simulates the NKI-style flash paged
# attention kernel with its default batch on trn1 and reports DMA and engine utilization:
# report.json, trace.json and report.html in the repository root (git-ignored), the summary on
# stdout, including the block-size tiling trick against tiling_factor=1.
# Arguments are passed to `tilelab sim paged-attention` (see `build/tools/tilelab sim --help`).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
build_dir="${TILELAB_BUILD_DIR:-build}"
exec "$build_dir/tools/tilelab" sim paged-attention --out-dir "$root" "$@"
