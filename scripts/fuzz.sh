#!/usr/bin/env bash
# Bounded libFuzzer runs of fuzz/: each target for TILELAB_FUZZ_SECONDS (default 60) on a copy of
# its corpus in fuzz/corpus/<target>/, under ASan+UBSan, in build-fuzz (clang, no Halide kernels,
# only the fuzz targets). Exits non-zero on a finding (crash, sanitizer report, an exception other
# than tilelab::Error, timeout, out of memory); the reproducer is written to
# build-fuzz/findings/<target>/. Known reproducers in fuzz/findings/<target>/ are re-run first and
# reported, but only fail the run when TILELAB_FUZZ_STRICT=1 (they are tracked, not new).
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
  known="fuzz/findings/$target"
  if compgen -G "$known/*" >/dev/null; then
    # Each known reproducer alone: a fixed one passes and can be deleted.
    for input in "$known"/*; do
      [[ "$input" == *.txt ]] && continue
      if "$fuzzer" -runs=1 "$input" >/dev/null 2>&1; then
        log "$target: known finding $input no longer reproduces; delete it"
      else
        log "$target: known finding $input still reproduces"
        [[ "${TILELAB_FUZZ_STRICT:-0}" == 1 ]] && status=1
      fi
    done
  fi
  # Fuzz on a scratch copy: the corpus in the repository stays small and reviewed.
  work="$build_dir/corpus/$target"
  artifacts="$build_dir/findings/$target"
  mkdir -p "$work" "$artifacts"
  log "$target: ${seconds}s"
  if ! "$fuzzer" "$work" fuzz/corpus/"$target" -max_total_time="$seconds" -timeout=10 \
      -rss_limit_mb=2048 -max_len=16384 -print_final_stats=1 \
      -artifact_prefix="$artifacts/" 2>"$build_dir/$target.log"; then
    tail -n 40 "$build_dir/$target.log" >&2
    log "$target: FINDING, reproducer in $artifacts/ (log $build_dir/$target.log)"
    status=1
  else
    grep -E 'stat::number_of_executed_units|stat::peak_rss_mb' "$build_dir/$target.log" |
      sed "s/^/[fuzz] $target: /" >&2
  fi
done
exit $status
