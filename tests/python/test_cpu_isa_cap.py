"""TILELAB_MAX_CPU_ISA (README, "Instruction sets"): read once per process, so every case runs
in a subprocess. With "avx2" on an AVX-512 CPU, the kernel tests run again on the AVX2 code
paths, generated and hand-written, which the main run does not reach there."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cpu_policy import cpu_vendor_and_flags

TESTS = Path(__file__).resolve().parent

# The kernel tests whose code paths depend on the instruction set: the generated kernels'
# variants, the paged kernel's streaming micro-kernels, the softmax's exp.
KERNEL_TESTS = [
    "test_flash_attention.py",
    "test_flash_attention_backward.py",
    "test_flash_bf16_products.py",
    "test_attention_options.py",
    "test_attention_options_backward.py",
    "test_paged_attention.py",
    "test_blocksparse.py",
    "test_nonfinite.py",
]


def run_python(code, isa):
    environment = dict(os.environ, TILELAB_MAX_CPU_ISA=isa)
    return subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=300
    )


CALL = """
import numpy as np
import tilelab
q = np.ones((1, 2, 3, 8), np.float32)
out = tilelab.flash_attention(q, q, q)
print(tilelab.prefers_bf16_dot_products(), float(out[0, 0, 0, 0]))
"""


@pytest.mark.parametrize("isa", ["sse2", "AVX2", "", "avx2 "])
def test_other_values_are_an_error_naming_the_variable(isa):
    result = run_python(CALL, isa)
    assert result.returncode != 0
    assert (
        f"ValueError: TILELAB_MAX_CPU_ISA: got '{isa}', expected 'avx2' or 'avx512' (or unset)"
        in result.stderr
    )


def test_avx512_is_no_limit():
    result = run_python(CALL, "avx512")
    assert result.returncode == 0, result.stderr
    prefers, value = result.stdout.split()
    import tilelab

    assert prefers == str(tilelab.prefers_bf16_dot_products())
    assert float(value) == 1.0


def test_avx2_leaves_out_bf16_dot_products():
    result = run_python(CALL, "avx2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "1.0"]


@pytest.mark.skipif(
    "avx512f" not in cpu_vendor_and_flags()[1],
    reason="without AVX-512 the AVX2 code paths are the ones the main run tests",
)
def test_kernel_tests_pass_on_the_avx2_code_paths():
    environment = dict(os.environ, TILELAB_MAX_CPU_ISA="avx2")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        + [str(TESTS / name) for name in KERNEL_TESTS],
        env=environment,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
