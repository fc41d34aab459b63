"""TILELAB_MAX_CPU_ISA (README, "Instruction sets"): read once per process, so every case runs
in a subprocess. The kernel tests run again on the code paths the main run does not reach: with
"sse2" on every CPU, the baseline ones (the generated kernels' last variant, the runtime's
baseline loops); with "avx2" on an AVX-512 CPU, the AVX2 ones."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cpu_policy import cpu_vendor_and_flags

TESTS = Path(__file__).resolve().parent

# The kernel tests whose code paths depend on the instruction set: the generated kernels'
# variants (the NKI layout's paged kernels among them), the paged kernel's streaming
# micro-kernels, the runtime's vectorized loops, the softmax's exp.
KERNEL_TESTS = [
    "test_flash_attention.py",
    "test_flash_attention_backward.py",
    "test_flash_bf16_products.py",
    "test_attention_options.py",
    "test_attention_options_backward.py",
    "test_paged_attention.py",
    "test_blocksparse.py",
    "test_nonfinite.py",
    "test_nki_flash_paged.py",
    "test_nki_nonfinite.py",
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

# Every entry point whose work depends on the setting reports a bad one, before any parallel work
# (an error thrown inside a parallel region would end the process). Small valid calls.
ENTRY_POINTS = {
    "prefers_bf16_dot_products": "tilelab.prefers_bf16_dot_products()",
    "flash_attention": "tilelab.flash_attention(q, q, q)",
    "flash_attention_decode": "tilelab.flash_attention(q[:, :, :1], q, q)",
    "flash_attention_reference": "tilelab.flash_attention(q, q, q, implementation='reference')",
    "flash_attention_backward": (
        "out, lse = tilelab.flash_attention(q, q, q, return_lse=True)\n"
        "tilelab.flash_attention_backward(q, q, q, q, out, lse)"
    ),
    "paged_attention": (
        "cache = np.ones((2, 2, 4, 8), np.float32)\n"
        "tilelab.paged_attention(q[0].transpose(1, 0, 2), cache, cache,"
        " np.array([[0, 1]], np.int32), np.array([7], np.int32), np.array([0, 3], np.int32))"
    ),
    "blocksparse_attention": (
        "layout = tilelab.BlockSparseLayout.from_dense(np.ones((2, 1, 1), bool), 16)\n"
        "packed = np.ones((3, 2, 8), np.float32)\n"
        "tilelab.blocksparse_attention(packed, packed, packed, layout,"
        " cu_seqlens_q=np.array([0, 3], np.int32), cu_seqlens_k=np.array([0, 3], np.int32))"
    ),
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("isa", ["avx", "AVX2", "", "avx2 "])
def test_other_values_are_an_error_naming_the_variable(entry, isa):
    code = "import numpy as np\nimport tilelab\nq = np.ones((1, 2, 3, 8), np.float32)\n"
    result = run_python(code + ENTRY_POINTS[entry], isa)
    assert result.returncode == 1, result.stderr
    assert (
        f"ValueError: TILELAB_MAX_CPU_ISA: got '{isa}', expected 'sse2', 'avx2' or 'avx512'"
        " (or unset)" in result.stderr
    )


@pytest.mark.parametrize("isa", ["sse2", "avx2"])
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_entry_point_runs_capped(entry, isa):
    code = "import numpy as np\nimport tilelab\nq = np.ones((1, 2, 3, 8), np.float32)\n"
    result = run_python(code + ENTRY_POINTS[entry], isa)
    assert result.returncode == 0, result.stderr


def test_avx512_is_no_limit():
    result = run_python(CALL, "avx512")
    assert result.returncode == 0, result.stderr
    prefers, value = result.stdout.split()
    import tilelab

    assert prefers == str(tilelab.prefers_bf16_dot_products())
    assert float(value) == 1.0


@pytest.mark.parametrize("isa", ["sse2", "avx2"])
def test_caps_leave_out_bf16_dot_products(isa):
    result = run_python(CALL, isa)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "1.0"]


def run_kernel_tests(isa, names, *pytest_args):
    environment = dict(os.environ, TILELAB_MAX_CPU_ISA=isa)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args]
        + [str(TESTS / name) for name in names],
        env=environment,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]


@pytest.mark.skipif(
    "avx512f" not in cpu_vendor_and_flags()[1],
    reason="without AVX-512 the AVX2 code paths are the ones the main run tests",
)
def test_kernel_tests_pass_on_the_avx2_code_paths():
    run_kernel_tests("avx2", KERNEL_TESTS)


def test_kernel_tests_pass_on_the_baseline_code_paths():
    # bf16 products need AVX-512; the streamed decode that the widening comparison checks needs
    # AVX2, and the long sequences only repeat the other cases' code at length: what is left
    # took 29 s on two Zen 3 cores, 17 s on two Zen 4 cores.
    names = [name for name in KERNEL_TESTS if name != "test_flash_bf16_products.py"]
    run_kernel_tests("sse2", names, "-k", "not matches_the_widening_path and not long")
