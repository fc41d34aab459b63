#!/bin/bash
# Bad input to `tilelab sim` / `tilelab sweep`: each case must exit with the given code (1: error,
# 2: usage error) and print a message matching the given pattern, never crash or exit 0.
# usage: cli_bad_input.sh TILELAB_EXECUTABLE WORK_DIR
set -u
tilelab=$(realpath "$1")
work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
# Memory is capped so that an unbounded allocation fails fast instead of swapping; not under
# AddressSanitizer, which reserves terabytes of address space for its shadow memory.
if ! grep -q "__asan_init" "$tilelab" 2>/dev/null; then
  ulimit -v 4000000
fi
failures=0

# expect CODE PATTERN ARGS...
expect() {
  local code=$1 pattern=$2
  shift 2
  local out rc
  out=$("$tilelab" "$@" 2>&1 >/dev/null)
  rc=$?
  if [[ $rc -ne $code ]] || ! grep -qE -- "$pattern" <<<"$out"; then
    local args="$*"
    echo "FAILED: tilelab ${args:0:120}"
    echo "  expected exit $code and /$pattern/, got exit $rc: ${out:0:400}"
    failures=$((failures + 1))
  fi
}

echo '{"a": 1}' >a_file
echo 5 >number.json
mkdir -p a_dir

expect 1 "decode\[0\]: context length 9223372036854775807 .* limit of 1073741824 tokens" \
  sim paged-attention decode=9223372036854775807 prefill= --no-compare --json r.json
expect 1 "decode\[0\]: context length 1000000000000" \
  sim paged-attention decode=1000000000000 prefill= --no-compare --json r.json
expect 1 "prefill\[0\]: query length 9223372036854775807" \
  sim paged-attention prefill=9223372036854775807:0 decode= --no-compare --json r.json
expect 1 "decode=9223372036854775807: decode\[0\]: context length" \
  sweep paged-attention --over decode=9223372036854775807
expect 1 "--out-dir 'a_file/sub': cannot create the directory" \
  sim paged-attention --out-dir a_file/sub
expect 1 "number.json: expected a JSON object at the top level, got 5" sim matmul --machine number.json
expect 1 "machine override 'tensor_clock_ghz=1e400'.*number overflow" \
  sim matmul --set tensor_clock_ghz=1e400
expect 1 "number overflow" sim matmul --set "tensor_clock_ghz=$(printf '9%.0s' {1..400})"
expect 1 "machine.tensor_clock_ghz=1e400: .*number overflow" \
  sweep matmul --over machine.tensor_clock_ghz=1e400
expect 1 "more than 1073741824 elements \(max_buffer_elements" \
  sim matmul M=65536 K=65536 N=65536 variant=tiled
expect 1 "more than 4194304 instructions \(max_instructions\)" \
  sim matmul M=65536 K=65536 N=65536 variant=tiled --max-buffer-elements 1099511627776
expect 1 "nested more than 64 levels deep" \
  sim matmul --set "partitions=$(printf '[%.0s' {1..10000})$(printf ']%.0s' {1..10000})"
expect 1 "cannot write '/dev/full': No space left on device" sim matmul --json /dev/full
expect 1 "cannot write '/dev/full': No space left on device" sim matmul --text /dev/full
expect 1 "cannot write '/dev/full'" sim matmul --json ok.json --trace /dev/full
expect 1 "cannot write 'no_dir/r.json': No such file or directory" sim matmul --json no_dir/r.json
expect 1 "machine 'a_dir': is a directory" sim matmul --machine a_dir
expect 1 "machine 'missing.json': neither a preset nor an existing JSON file" \
  sim matmul --machine missing.json
expect 2 "--max-trace-events: expected a whole number in \[1, .*got '5x'" \
  sim matmul --trace t.json --max-trace-events 5x
expect 2 "--max-trace-events: expected a whole number in \[1, .*got '-1'" \
  sim matmul --trace t.json --max-trace-events -1
expect 2 "--max-instructions: expected a whole number" sim matmul --max-instructions 0
expect 2 "--max-buffer-elements: expected a whole number" sweep matmul --over M=128 \
  --max-buffer-elements 1e9

expect 1 "parameter 'M': expected a whole number in \[1, .*got ' 256'" \
  sim matmul variant=tiled "M= 256" K=256 N=512
expect 1 "parameter 'M': expected a whole number in \[1, .*got '\+256'" \
  sim matmul variant=tiled M=+256 K=256 N=512
expect 1 "parameter 'decode': expected non-negative integers separated by commas, got '5x'" \
  sim paged-attention decode=5x prefill= --no-compare --json r.json
expect 1 "cannot write '/dev/full': No space left on device" \
  sweep matmul variant=tiled K=256 N=512 --over M=128,256 --csv /dev/full

# A failed write leaves no partial file and the summary does not claim it.
out=$("$tilelab" sim matmul --json ok2.json --trace /dev/full 2>/dev/null)
if [[ -e ok2.json.tmp-* ]] || grep -q "wrote" <<<"$out"; then
  echo "FAILED: a failed write left a temporary file or was reported as written"
  failures=$((failures + 1))
fi
# The default paged-attention batch plus one prefill token is padded as the kernel requires
# (514 rows to 1024; it was padded to 640 and rejected with an error about seq_q).
expect 0 "" sim paged-attention prefill=160:2048,96:1024,128:3072,116:512,2:0 --no-compare \
  --json padded.json

[[ $failures -eq 0 ]] && echo "all bad-input cases passed"
exit $((failures > 0))
