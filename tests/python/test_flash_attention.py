"""tilelab.flash_attention against the fp64 numpy reference: dtypes, masks, GQA, bias, shapes."""

import itertools

import numpy as np
import pytest
from attention_reference import (
    DTYPES,
    MASKS,
    assert_attention_close,
    assert_lse_close,
    random_qkv,
    reference_attention,
)

import tilelab

# (B, Hq, Hkv, M, N, D): edge sizes, M < N and M > N (bottom-right then has fully masked rows),
# GQA and MQA, the largest head dim, decode-like single queries.
SHAPES = {
    "minimal": (1, 1, 1, 1, 1, 1),
    "ragged_m_lt_n": (2, 3, 3, 17, 33, 64),
    "gqa4_m_gt_n": (1, 8, 2, 65, 31, 128),
    "mqa_square": (1, 4, 1, 128, 128, 32),
    "short_q_long_kv": (2, 2, 2, 3, 200, 80),
    "decode_d256": (1, 2, 1, 1, 257, 256),
    "square_d8": (1, 2, 2, 64, 64, 8),
}


def check(q, k, v, dtype_name, implementation="automatic", **options):
    out, lse = tilelab.flash_attention(
        q, k, v, return_lse=True, implementation=implementation, **options
    )
    reference_out, reference_lse = reference_attention(q, k, v, **options)
    assert out.dtype == q.dtype
    assert_attention_close(out, reference_out, dtype_name, v, k.shape[2])
    assert_lse_close(lse, reference_lse, q.shape[3], k.shape[2])
    return out


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("mask", MASKS.values(), ids=MASKS.keys())
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_matches_reference(rng, dtype_name, mask, shape):
    q, k, v = random_qkv(rng, *shape, dtype_name)
    check(q, k, v, dtype_name, **mask)


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "head_dim", [1, 2, 7, 8, 15, 16, 31, 33, 63, 64, 65, 96, 127, 128, 129, 192, 255, 256]
)
def test_head_dims(rng, head_dim, dtype_name):
    q, k, v = random_qkv(rng, 1, 2, 1, 9, 37, head_dim, dtype_name)
    check(q, k, v, dtype_name, causal=True, causal_alignment="bottom_right")


# Lengths around block boundaries {1, tile - 1, tile, tile + 1, k * tile + r} for tiles of 16/64.
@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
@pytest.mark.parametrize(
    ("q_len", "kv_len"), list(itertools.product([1, 15, 16, 17, 65], [1, 16, 17, 64, 130]))
)
def test_ragged_lengths(rng, q_len, kv_len, alignment):
    q, k, v = random_qkv(rng, 1, 2, 2, q_len, kv_len, 32, "float32")
    check(q, k, v, "float32", causal=True, causal_alignment=alignment)


# Without a causal mask the prefill kernels take 128-key blocks, and a last block that kv_len cuts
# short stops at the group of 8 keys that holds kv_len - 1: lengths around both boundaries.
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize(
    ("q_len", "kv_len"),
    [(9, 127), (33, 128), (40, 129), (70, 257), (31, 1), (65, 136), (17, 137), (40, 263)],
)
def test_lengths_around_wide_key_blocks(rng, q_len, kv_len, dtype_name):
    q, k, v = random_qkv(rng, 1, 4, 2, q_len, kv_len, 48, dtype_name)
    check(q, k, v, dtype_name)


BIAS_SHAPES = {
    "full": lambda b, h, m, n: (b, h, m, n),
    "one_batch": lambda b, h, m, n: (1, h, m, n),
    "one_head": lambda b, h, m, n: (b, 1, m, n),
    "one_row": lambda b, h, m, n: (b, h, 1, n),
    "key_only": lambda b, h, m, n: (1, 1, 1, n),
    "shared_mn": lambda b, h, m, n: (1, 1, m, n),
}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal_bottom_right"])
@pytest.mark.parametrize("bias_shape", BIAS_SHAPES.values(), ids=BIAS_SHAPES.keys())
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_bias(rng, dtype_name, bias_shape, causal):
    batch, q_heads, kv_heads, q_len, kv_len, head_dim = 2, 4, 2, 19, 40, 64
    q, k, v = random_qkv(rng, batch, q_heads, kv_heads, q_len, kv_len, head_dim, dtype_name)
    bias = 2 * rng.standard_normal(bias_shape(batch, q_heads, q_len, kv_len), dtype=np.float32)
    check(q, k, v, dtype_name, bias=bias, causal=causal, causal_alignment="bottom_right")


@pytest.mark.parametrize("mask", MASKS.values(), ids=MASKS.keys())
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_bias_varying_by_row_across_tiles_and_heads(rng, dtype_name, mask):
    """A bias that varies by row is read a row at a time and transposed for the score tiles (whose
    rows are the vector lanes): a GQA group of 2 with 45 queries puts a tile boundary inside each
    query head and a head boundary inside a tile, 141 keys end inside a block and inside a
    register tile of 8, and single -inf entries mask single (row, key) pairs."""
    batch, q_heads, kv_heads, q_len, kv_len, head_dim = 1, 4, 2, 45, 141, 64
    q, k, v = random_qkv(rng, batch, q_heads, kv_heads, q_len, kv_len, head_dim, dtype_name)
    bias = 2 * rng.standard_normal((batch, q_heads, q_len, kv_len), dtype=np.float32)
    bias[rng.random(bias.shape) < 0.05] = -np.inf
    check(q, k, v, dtype_name, bias=bias, **mask)


def test_bias_non_contiguous(rng):
    q, k, v = random_qkv(rng, 1, 2, 2, 12, 20, 16, "float32")
    bias = rng.standard_normal((1, 2, 20, 12), dtype=np.float32).transpose(0, 1, 3, 2)
    check(q, k, v, "float32", bias=bias)


@pytest.mark.parametrize("scale", [0.0, 0.3, 2.5, np.float32(0.125), -1.0])
def test_explicit_scale(rng, scale):
    q, k, v = random_qkv(rng, 1, 2, 2, 7, 23, 32, "float32")
    check(q, k, v, "float32", scale=scale, causal=True)


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_fully_masked_rows_give_zero_and_negative_infinite_lse(rng, dtype_name):
    # Bottom-right with M = 8 > N = 3: query i sees keys j <= i - 5, so rows 0..4 see nothing.
    q, k, v = random_qkv(rng, 1, 2, 1, 8, 3, 16, dtype_name)
    out, lse = tilelab.flash_attention(
        q, k, v, causal=True, causal_alignment="bottom_right", return_lse=True
    )
    out64 = out.astype(np.float64)
    assert not np.any(np.isnan(out64))
    assert np.all(out64[:, :, :5] == 0.0)
    assert np.all(np.isneginf(lse[:, :, :5]))
    assert np.all(np.isfinite(lse[:, :, 5:]))
    check(q, k, v, dtype_name, causal=True, causal_alignment="bottom_right")


def test_alignments_agree_when_square(rng):
    q, k, v = random_qkv(rng, 1, 2, 2, 33, 33, 16, "float32")
    top_left = tilelab.flash_attention(q, k, v, causal=True, causal_alignment="top_left")
    bottom_right = tilelab.flash_attention(q, k, v, causal=True, causal_alignment="bottom_right")
    np.testing.assert_array_equal(top_left, bottom_right)


def test_return_lse_false_returns_only_out(rng):
    q, k, v = random_qkv(rng, 1, 1, 1, 4, 4, 8, "float32")
    out = tilelab.flash_attention(q, k, v)
    assert isinstance(out, np.ndarray)
    assert out.shape == q.shape


@pytest.mark.parametrize("implementation", ["automatic", "reference"])
def test_implementations_agree_with_reference(rng, implementation):
    q, k, v = random_qkv(rng, 1, 4, 2, 40, 70, 64, "float32")
    check(q, k, v, "float32", causal=True, implementation=implementation)


def test_generated_matches_reference_when_it_covers_the_call(rng):
    q, k, v = random_qkv(rng, 1, 4, 2, 64, 64, 64, "float32")
    if tilelab.flash_attention_implementation(q, k, v) != "generated":
        pytest.skip("this build has no generated kernel for the call (TILELAB_BUILD_KERNELS=OFF)")
    check(q, k, v, "float32", implementation="generated")


def test_implementation_query(rng):
    q, k, v = random_qkv(rng, 1, 2, 2, 8, 8, 16, "float32")
    assert tilelab.flash_attention_implementation(q, k, v) in ("generated", "reference")


def test_kernel_query(rng):
    q, k, v = random_qkv(rng, 1, 4, 2, 40, 70, 64, "float32")
    kernel = tilelab.flash_attention_kernel(q, k, v, causal=True)
    if tilelab.flash_attention_implementation(q, k, v, causal=True) != "generated":
        assert kernel is None
        pytest.skip("this build has no generated kernel for the call (TILELAB_BUILD_KERNELS=OFF)")
    assert kernel == "flash_fwd_f32"
    assert tilelab.flash_attention_kernel(q, k, v) == "flash_fwd_f32"
    bias = np.zeros((1, 1, 40, 70), np.float32)
    assert tilelab.flash_attention_kernel(q, k, v, bias=bias) == "flash_fwd_f32_bias"
    assert (
        tilelab.flash_attention_kernel(q, k, v, causal=True, softcap=5.0) == "flash_fwd_f32_options"
    )
    # Decode runs on the paged kernel, a head dim in steps of 2 on the reference: no kernel.
    assert tilelab.flash_attention_kernel(q[:, :, :1], k, v) is None
    assert tilelab.flash_attention_kernel(q[..., ::2], k[..., ::2], v[..., ::2]) is None


# The prefill kernels that widen 16-bit K and V per tile (fp16, and bf16 with fp32 probabilities,
# with and without a bias) come with 32- and 64-row query tiles; which one runs depends on the
# rows per kv head, the kv heads and the thread count (schedules/flash/tiling.hpp,
# prefers_tall_query_tiles): one kv head of 33 to 64 rows, or 65, takes the tall tile on one
# thread and two short ones on two. Each result against the reference, and the two bit for bit:
# a row's arithmetic does not depend on its tile.
@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
@pytest.mark.parametrize(
    ("q_len", "tall_on_one_thread", "tall_on_two"),
    [(31, False, False), (33, True, False), (64, True, False), (65, False, True), (97, True, True)],
)
def test_query_tile_heights_agree(
    rng, restore_num_threads, q_len, tall_on_one_thread, tall_on_two, dtype_name, causal, with_bias
):
    q, k, v = random_qkv(rng, 1, 1, 1, q_len, 150, 40, dtype_name)
    bias = rng.standard_normal((1, 1, q_len, 150), dtype=np.float32) if with_bias else None
    options = dict(
        causal=causal, causal_alignment="bottom_right", bias=bias, fp32_probabilities=True
    )
    if tilelab.flash_attention_implementation(q, k, v, **options) != "generated":
        pytest.skip("this build has no generated kernel for the call (TILELAB_BUILD_KERNELS=OFF)")
    reference_out, reference_lse = reference_attention(
        q, k, v, causal=causal, causal_alignment="bottom_right", bias=bias
    )
    results = []
    for threads, tall in ((1, tall_on_one_thread), (2, tall_on_two)):
        tilelab.set_num_threads(threads)
        assert tilelab.flash_attention_kernel(q, k, v, **options).endswith("_tall") == tall
        out, lse = tilelab.flash_attention(
            q, k, v, return_lse=True, implementation="generated", **options
        )
        assert_attention_close(out, reference_out, dtype_name, v, k.shape[2])
        assert_lse_close(lse, reference_lse, q.shape[3], k.shape[2])
        results.append((out, lse))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])
