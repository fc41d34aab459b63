#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, then runs CTest (Catch2 cases, the
# downstream find_package project) and pytest, then the C++ tests and the CLI under ASan+UBSan
# (scripts/sanitize.sh) and bounded fuzz runs (scripts/fuzz.sh). Exits non-zero when any test
# fails. TILELAB_SKIP_SANITIZE=1 or TILELAB_SKIP_FUZZ=1 leave out those two steps.
# The tilelab.torch tests run in their own venv, .venv-torch (requirements-torch.txt, made here
# with .venv's python when missing or when the file changed): torch stays out of the project
# venv, so the pytest run in .venv shows the rest passes without it. TILELAB_SKIP_TORCH=1 skips.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Each step's time, so that the command's budget (README) can be watched.
step_start=$SECONDS
step_done() {
  printf '[test] %s: %d s (total %d s)\n' "$1" "$((SECONDS - step_start))" "$SECONDS" >&2
  step_start=$SECONDS
}
"$root/scripts/bootstrap.sh"
step_done "install and build"
cd "$root"
build_dir="${TILELAB_BUILD_DIR:-build}"
# numpy's OpenBLAS threads (the fp64 references) keep spinning after a call and take the cores
# from tilelab's OpenMP pool.
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
status=0
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" || status=1
step_done ctest
PYTHONPATH="$root/$build_dir/python${PYTHONPATH:+:$PYTHONPATH}" \
  .venv/bin/python -m pytest -q tests/python || status=1
step_done pytest
if [[ "${TILELAB_SKIP_TORCH:-0}" != 1 ]]; then
  torch_venv=.venv-torch
  torch_stamp="$torch_venv/.requirements.sha256"
  torch_hash="$(sha256sum requirements-torch.txt | cut -d' ' -f1)"
  install_torch_venv() {
    echo "[test] installing $torch_venv from requirements-torch.txt" >&2
    if [[ ! -x "$torch_venv/bin/python" ]]; then
      "$(.venv/bin/python -c 'import sys; print(sys._base_executable)')" -m venv "$torch_venv"
    fi
    "$torch_venv/bin/python" -m pip install -q --disable-pip-version-check \
      -r requirements-torch.txt && echo "$torch_hash" > "$torch_stamp"
  }
  if [[ ! -x "$torch_venv/bin/python" || ! -f "$torch_stamp" ||
        "$(cat "$torch_stamp")" != "$torch_hash" ]]; then
    install_torch_venv || status=1
  fi
  PYTHONPATH="$root/$build_dir/python${PYTHONPATH:+:$PYTHONPATH}" \
    "$torch_venv/bin/python" -m pytest -q tests/python/torch || status=1
  step_done "torch tests"
fi
if [[ "${TILELAB_SKIP_SANITIZE:-0}" != 1 ]]; then
  "$root/scripts/sanitize.sh" || status=1
  step_done sanitizers
fi
if [[ "${TILELAB_SKIP_FUZZ:-0}" != 1 ]]; then
  "$root/scripts/fuzz.sh" || status=1
  step_done fuzzing
fi
exit $status
