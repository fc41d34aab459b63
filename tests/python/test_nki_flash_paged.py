"""Flash paged attention written in the NKI language (examples/nki/flash_paged_attention.py),
traced by tilelab.nki: its outputs against the CPU kernel tilelab.nki.flash_paged_attention, the
fp64 reference and the simulator's C++ kernel on the same numbers; its timed report on the
default batch against `tilelab sim paged-attention`."""

import importlib.util
import os
import pathlib

import ml_dtypes
import numpy as np
import pytest
from nki_examples import load_example
from nki_reference import continuous_batch, reference_paged_attention

import tilelab.nki as tn
from tilelab import sim
from tilelab.nki import language as nl


@pytest.fixture(scope="module")
def kernel():
    return load_example("flash_paged_attention").flash_paged_attention


# (requests, heads, kv heads, head dim, block size, large tile, dtype, mixed precision)
CASES = [
    ([(5, 40), (1, 17), (1, 3)], 4, 2, 32, 16, 512, np.float32, False),
    ([(7, 0), (1, 100), (30, 33)], 4, 4, 64, 32, 512, ml_dtypes.bfloat16, True),
    ([(1, 300), (1, 1), (2, 64)], 6, 2, 16, 8, 1024, np.float32, True),
    ([(130, 20), (1, 250)], 2, 1, 128, 64, 512, ml_dtypes.bfloat16, True),
]


def case_inputs(rng, case):
    """A case's kernel arguments without the mask, its mask in natural order, and the mask
    reordered for the kernel (uint8)."""
    requests, heads, kv_heads, d, block_size, large, dtype, _ = case
    args = continuous_batch(
        rng,
        requests,
        n_heads=heads,
        n_kv_heads=kv_heads,
        head_dim=d,
        block_size=block_size,
        large_tile=large,
        dtype=dtype,
    )
    natural = args.pop("mask")
    return args, natural, tn.reorder_context_mask(natural, large, block_size).astype(np.uint8)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{len(c[0])}req-d{c[3]}-bs{c[4]}")
def test_outputs_match_the_cpu_kernel_and_the_cpp_program(kernel, rng, case):
    d, large, dtype, mixed = case[3], case[5], case[6], case[7]
    args, natural, mask = case_inputs(rng, case)
    out = tn.simulate_kernel(kernel, **args, mask=mask, mixed_precision=mixed, LARGE_TILE_SZ=large)
    assert out.dtype == np.dtype(dtype) and out.shape == (
        *args["query"].shape[:2],
        args["query"].shape[3],
        d,
    )
    cpu = tn.flash_paged_attention(**args, mask=mask, mixed_precision=mixed, LARGE_TILE_SZ=large)
    np.testing.assert_allclose(out.astype(np.float64), cpu.astype(np.float64), atol=1e-2)
    expected = reference_paged_attention(**args, mask=natural, mixed_precision=mixed)
    tolerance = 3e-2 if mixed or dtype != np.float32 else 2e-4
    np.testing.assert_allclose(out.astype(np.float64), expected, atol=tolerance)
    # The C++ simulator kernel builds the same program: the same numbers, bit for bit.
    _, cpp = sim.simulate_flash_paged_attention(
        **args, mask=mask, mixed_precision=mixed, LARGE_TILE_SZ=large
    )
    np.testing.assert_array_equal(out, cpp)


def test_default_batch_times_like_the_cpp_kernel(kernel):
    """The default batch of `tilelab sim paged-attention`: 70,769 instructions."""
    reference = sim.simulate_paged_attention_batch()
    p = reference.parameters
    seq_q, blocks = int(p["query_len"]), int(p["num_active_blocks"])
    heads, kv_heads, d = int(p["num_heads"]), int(p["num_kv_heads"]), int(p["head_dim"])
    block_size = int(p["block_size"])
    bf16 = nl.bfloat16
    _, report = tn.profile_kernel(
        kernel,
        tn.tensor((1, heads, d, seq_q), bf16),
        tn.tensor((1, kv_heads, d, seq_q), bf16),
        tn.tensor((1, kv_heads, seq_q, d), bf16),
        tn.tensor((2, blocks + 1, kv_heads, block_size, d), bf16),
        tn.tensor((blocks,), nl.int32),
        tn.tensor((seq_q, blocks * block_size + seq_q), nl.uint8),
        functional=False,
    )
    ours = {e["name"]: e["instruction_count"] for e in report.engines}
    theirs = {e["name"]: e["instruction_count"] for e in reference.engines}
    assert ours == theirs
    assert report.total_time_ns == pytest.approx(reference.total_time_ns, rel=0.02)


# vLLM's own kernel file (vllm/attention/ops/nki_flash_attn.py), run unmodified when a copy is on
# disk: TILELAB_VLLM_NKI_FLASH_ATTN=/path/to/nki_flash_attn.py.
VLLM_KERNEL_FILE = os.environ.get("TILELAB_VLLM_NKI_FLASH_ATTN")


def load_vllm_kernel_file(path: str, stubs: pathlib.Path):
    """The file's module, through the neuronxcc alias. Besides neuronxcc it imports torch (for
    annotations of its host-side helpers) and vLLM's ceil_div: stand-ins are put on the path
    for whichever of the two is not installed."""
    tn.install_neuronxcc_alias()
    if importlib.util.find_spec("vllm") is None:
        package = stubs / "vllm/model_executor/layers/quantization/utils"
        package.mkdir(parents=True)
        for parent in [
            package,
            *list(package.parents)[: len(package.relative_to(stubs).parts) - 1],
        ]:
            (parent / "__init__.py").touch()
        (package / "fp8_utils.py").write_text("def ceil_div(a, b):\n    return -(-a // b)\n")
    if importlib.util.find_spec("torch") is None:
        (stubs / "torch").mkdir()
        (stubs / "torch/__init__.py").write_text("class Tensor:\n    pass\n")
    spec = importlib.util.spec_from_file_location("vllm_nki_flash_attn", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(
    not VLLM_KERNEL_FILE, reason="TILELAB_VLLM_NKI_FLASH_ATTN names no copy of vLLM's file"
)
@pytest.mark.parametrize("machine", ["trn1", "trn2"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{len(c[0])}req-d{c[3]}-bs{c[4]}")
def test_vllm_kernel_file_unmodified(rng, tmp_path, monkeypatch, machine, case):
    monkeypatch.syspath_prepend(str(tmp_path))
    vllm_kernel = load_vllm_kernel_file(VLLM_KERNEL_FILE, tmp_path).flash_paged_attention
    kv_heads, large, mixed = case[2], case[5], case[7]
    args, _, mask = case_inputs(rng, case)
    out, _ = tn.profile_kernel(
        vllm_kernel[1, kv_heads],
        **args,
        mask=mask,
        mixed_precision=mixed,
        LARGE_TILE_SZ=large,
        machine=machine,
    )
    cpu = tn.flash_paged_attention(**args, mask=mask, mixed_precision=mixed, LARGE_TILE_SZ=large)
    np.testing.assert_allclose(out.astype(np.float64), cpu.astype(np.float64), atol=1e-2)
