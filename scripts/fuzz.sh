#!/usr/bin/env bash
# Bounded libFuzzer runs of fuzz/: each target for TILELAB_FUZZ_SECONDS (default 60), seeded from
# fuzz/corpus/<target>/, under ASan+UBSan, in build-fuzz (clang 19, no Halide kernels, only the
# fuzz targets). Exits non-zero on a new finding (crash, sanitizer report, an exception other than
# tilelab::Error, timeout, out of memory); its reproducer is in build-fuzz/findings/<target>/.
# Known findings (fuzz/findings/<target>/, see its README.md) are reported and do not fail the
# run unless TILELAB_FUZZ_STRICT=1.
# Usage: scripts/fuzz.sh [target...]   (default: every target)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export PATH="$root/.venv/bin:$PATH"

log() { printf '[fuzz] %s\n' "$*" >&2; }
build_dir="${TILELAB_FUZZ_BUILD_DIR:-build-fuzz}"
seconds="${TILELAB_FUZZ_SECONDS:-60}"
targets=("$@")
((${#targets[@]})) || targets=(machine_json_fuzzer schedule_json_fuzzer kernel_request_fuzzer)

if [[ ! -f "$build_dir/build.ninja" ]]; then
  log "configuring $build_dir"
  cmake -S . -B "$build_dir" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19 \
    -DTILELAB_SANITIZE=address,undefined \
    -DTILELAB_BUILD_FUZZERS=ON \
    -DTILELAB_BUILD_KERNELS=OFF \
    -DTILELAB_BUILD_PYTHON=OFF \
    -DTILELAB_BUILD_TESTS=OFF \
    -DTILELAB_BUILD_BENCH=OFF >/dev/null
fi
cmake --build "$build_dir" -j "$(nproc)" --target "${targets[@]}"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
status=0
for target in "${targets[@]}"; do
  fuzzer="$root/$build_dir/fuzz/$target"
  known_dir="fuzz/findings/$target"
  known_strings=()
  if [[ -f "$known_dir/known.txt" ]]; then
    mapfile -t known_strings < <(grep -v '^\s*#' "$known_dir/known.txt" | sed '/^\s*$/d')
  fi
  # A known finding: its output contains one of the strings of known.txt.
  is_known() {
    local output="$1" s
    for s in "${known_strings[@]}"; do [[ "$output" == *"$s"* ]] && return 0; done
    return 1
  }
  for input in "$known_dir"/*; do
    [[ -f "$input" && "$input" != *.txt ]] || continue
    if "$fuzzer" -runs=1 "$input" >/dev/null 2>&1; then
      log "$target: known finding $input no longer reproduces; delete it and its known.txt line"
    else
      log "$target: known finding $input still reproduces"
      [[ "${TILELAB_FUZZ_STRICT:-0}" == 1 ]] && status=1
    fi
  done
  # Fuzz into a scratch corpus (the repository's corpus stays small and reviewed). Fork mode goes
  # on after a crash, so a known finding does not hide new ones; every crash is classified below.
  work="$build_dir/corpus/$target"
  artifacts="$build_dir/findings/$target"
  rm -rf "$artifacts"
  mkdir -p "$work" "$artifacts"
  log "$target: ${seconds}s"
  "$fuzzer" "$work" "fuzz/corpus/$target" -fork=1 -ignore_crashes=1 -ignore_timeouts=1 \
    -ignore_ooms=1 -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" >"$build_dir/$target.log" 2>&1 || true
  grep -E '^#[0-9]+: cov' "$build_dir/$target.log" | tail -n 1 | sed "s/^/[fuzz] $target: /" >&2
  new_findings=0
  for artifact in "$artifacts"/*; do
    [[ -f "$artifact" ]] || continue
    output="$("$fuzzer" -runs=1 -timeout=10 -rss_limit_mb=2048 "$artifact" 2>&1 || true)"
    if is_known "$output"; then
      log "$target: known finding again: $artifact"
      [[ "${TILELAB_FUZZ_STRICT:-0}" == 1 ]] && status=1
    else
      printf '%s\n' "$output" | tail -n 30 >&2
      log "$target: FINDING $artifact (log $build_dir/$target.log)"
      new_findings=1
      status=1
    fi
  done
  ((new_findings)) || log "$target: no new findings"
done
exit $status
