#!/usr/bin/env bash
# Installs what is missing and builds: Debian packages (apt-packages.txt), the project venv
# (.venv, from requirements.txt), then configures and builds build/. Idempotent and fast when
# nothing changed: each step is skipped when its inputs are unchanged.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

log() { printf '[bootstrap] %s\n' "$*" >&2; }

# --- Debian packages ---------------------------------------------------------------------------
mapfile -t apt_wanted < <(grep -v '^\s*#' apt-packages.txt | sed '/^\s*$/d')
apt_missing=()
for pkg in "${apt_wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || apt_missing+=("$pkg")
done
if ((${#apt_missing[@]})); then
  log "installing Debian packages: ${apt_missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${apt_missing[@]}" >/dev/null
fi

# --- project venv -----------------------------------------------------------------------------
python="${TILELAB_PYTHON:-python3}"
stamp=".venv/.requirements.sha256"
want_hash="$(sha256sum requirements.txt | cut -d' ' -f1)"
if [[ ! -x .venv/bin/python || ! -f "$stamp" || "$(cat "$stamp")" != "$want_hash" ]]; then
  log "installing the project venv from requirements.txt"
  [[ -x .venv/bin/python ]] || "$python" -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt
  echo "$want_hash" > "$stamp"
fi
export PATH="$root/.venv/bin:$PATH"

# --- configure and build ----------------------------------------------------------------------
build_dir="${TILELAB_BUILD_DIR:-build}"
if [[ ! -f "$build_dir/build.ninja" ]]; then
  log "configuring $build_dir"
  halide_prefix="$(.venv/bin/python -c 'import halide; print(halide.install_dir())')"
  pybind11_dir="$(.venv/bin/python -c 'import pybind11; print(pybind11.get_cmake_dir())')"
  cmake -S . -B "$build_dir" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$halide_prefix" \
    -Dpybind11_DIR="$pybind11_dir" \
    -DPython3_EXECUTABLE="$root/.venv/bin/python" \
    -DCMAKE_INSTALL_PREFIX="$root/$build_dir/install" >/dev/null
fi
cmake --build "$build_dir" -j "$(nproc)"
