"""tilelab.flash_attention with NaN, ±inf and overflowing inputs: only the mask (causal, a bias
of exactly -inf) masks a key; every other score follows IEEE arithmetic, as PyTorch does, and
every implementation agrees."""

import numpy as np
import pytest
from attention_reference import DTYPES

import tilelab

IMPLEMENTATIONS = ["generated", "reference"]


def problem(rng, q_len, kv_len=70, head_dim=16, dtype_name="float32"):
    dtype = DTYPES[dtype_name]
    q = rng.uniform(-0.5, 0.5, (1, 2, q_len, head_dim)).astype(np.float32).astype(dtype)
    k = rng.uniform(-0.5, 0.5, (1, 2, kv_len, head_dim)).astype(np.float32).astype(dtype)
    v = rng.uniform(-1, 1, (1, 2, kv_len, head_dim)).astype(np.float32).astype(dtype)
    return q, k, v


def run(q, k, v, implementation, **options):
    return tilelab.flash_attention(
        q, k, v, return_lse=True, implementation=implementation, **options
    )


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("q_len", [1, 5, 40])
def test_nan_in_a_query_row_gives_that_row_nan(rng, implementation, q_len, dtype_name):
    q, k, v = problem(rng, q_len, dtype_name=dtype_name)
    q[0, 1, q_len - 1, 3] = np.nan
    out, lse = run(q, k, v, implementation)
    out = out.astype(np.float32)
    assert np.isnan(out[0, 1, q_len - 1]).all()
    assert np.isnan(lse[0, 1, q_len - 1])
    assert np.isfinite(out[0, 0]).all() and np.isfinite(out[0, 1, : q_len - 1]).all()


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("q_len", [1, 5])
def test_nan_in_a_key_gives_nan_not_a_dropped_key(rng, implementation, q_len):
    q, k, v = problem(rng, q_len)
    k[0, 0, 66, 0] = np.nan
    out, lse = run(q, k, v, implementation)
    assert np.isnan(out[0, 0]).all() and np.isnan(lse[0, 0]).all()
    assert np.isfinite(out[0, 1]).all()


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_nan_or_plus_inf_bias_gives_nan(rng, implementation, value):
    q, k, v = problem(rng, 5)
    bias = np.zeros((1, 1, 5, 70), np.float32)
    bias[0, 0, 2, 40] = value
    out, lse = run(q, k, v, implementation, bias=bias)
    assert np.isnan(out[:, :, 2]).all() and np.isnan(lse[:, :, 2]).all()
    others = [0, 1, 3, 4]
    assert np.isfinite(out[:, :, others]).all() and np.isfinite(lse[:, :, others]).all()


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("q_len", [1, 5])
@pytest.mark.parametrize("k_value", [1e20, -1e20])
def test_overflowing_scores_give_nan(rng, implementation, q_len, k_value):
    """q·k = +inf (inf - inf) or -inf for every key (0 / 0): NaN, as IEEE arithmetic gives."""
    q, k, v = problem(rng, q_len)
    q[...] = 1e20
    k[...] = k_value
    out, lse = run(q, k, v, implementation)
    assert np.isnan(out).all() and np.isnan(lse).all()


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_minus_inf_score_contributes_nothing(rng, implementation):
    """Head dim 0 makes key 0 score -inf (1e20 · -1e20) and adds 0 to every other score: the
    result is attention over keys 1.. with head dims 1.."""
    q, k, v = problem(rng, 5)
    q[..., 0] = 1e20
    k[..., 0] = 0
    k[:, :, 0, :] = 0
    k[:, :, 0, 0] = -1e20
    out, lse = run(q, k, v, implementation, scale=0.25)
    expected, _ = run(
        q[..., 1:].copy(),
        k[:, :, 1:, 1:].copy(),
        v[:, :, 1:, 1:].copy(),
        implementation,
        scale=0.25,
    )
    np.testing.assert_allclose(out[..., 1:], expected, atol=1e-6)
    assert np.isfinite(lse).all()


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_minus_inf_bias_masks_whatever_q_is(rng, implementation):
    q, k, v = problem(rng, 5)
    bias = np.zeros((1, 1, 5, 70), np.float32)
    bias[0, 0, 1, :] = -np.inf
    q[0, :, 1, :] = np.nan
    out, lse = run(q, k, v, implementation, bias=bias)
    assert (out[:, :, 1] == 0).all() and np.isneginf(lse[:, :, 1]).all()
    assert np.isfinite(out[:, :, [0, 2, 3, 4]]).all()


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("bias_heads", [1, 2], ids=["keys_only", "per_head_key"])
def test_minus_inf_bias_broadcast_over_rows_masks_whatever_k_is(rng, implementation, bias_heads):
    """A bias broadcast over the rows (one value per key, read once per key by the kernel) of -inf
    masks its keys for every row, NaN keys included."""
    q, k, v = problem(rng, 40)
    bias = np.zeros((1, bias_heads, 1, k.shape[2]), np.float32)
    bias[..., 3:9] = -np.inf
    k[:, :, 3:9] = np.nan
    out, lse = run(q, k, v, implementation, bias=bias)
    kept = np.r_[0:3, 9 : k.shape[2]]
    expected, expected_lse = run(q, k[:, :, kept], v[:, :, kept], implementation)
    np.testing.assert_allclose(out, expected, atol=1e-6)
    np.testing.assert_allclose(lse, expected_lse, atol=1e-6)


def test_very_negative_finite_scores_agree_in_every_implementation(rng):
    """A bias of -1e30 is a score, not a mask: the row averages V, whichever implementation runs
    (automatic picks the reference for a q with a non-unit innermost stride)."""
    q, k, v = problem(rng, 5)
    bias = np.zeros((1, 1, 5, 70), np.float32)
    bias[0, 0, 3, :] = -1e30
    q_strided = np.repeat(q, 2, axis=3)[..., ::2]
    assert tilelab.flash_attention_implementation(q_strided, k, v, bias=bias) == "reference"
    assert tilelab.flash_attention_implementation(q, k, v, bias=bias) == "generated"
    results = [run(q, k, v, implementation, bias=bias) for implementation in IMPLEMENTATIONS]
    results.append(run(q_strided, k, v, "automatic", bias=bias))
    mean_v = v.astype(np.float64).mean(axis=2)
    for out, lse in results:
        np.testing.assert_allclose(out[:, :, 3], mean_v, atol=1e-5)
        np.testing.assert_allclose(lse[:, :, 3], -1e30, rtol=1e-6)
        np.testing.assert_allclose(out, results[0][0], atol=1e-5)


# The one exception (README): a key hidden from a row by the causal mask still meets the row's
# p·v as 0 · v if a row of the same query tile sees a key in its group of 8. A NaN in that key's
# V row reaches those rows of the tile, and no row of an earlier tile.
@pytest.mark.parametrize(
    ("dtype_name", "options"),
    [
        ("float32", {}),
        ("float16", {}),
        ("bfloat16", {}),
        ("bfloat16", {"fp32_probabilities": True}),
        ("float32", {"bias": np.zeros((1, 1, 300, 300), np.float32)}),
    ],
    ids=["f32", "f16", "bf16", "bf16_fp32_probabilities", "f32_bias"],
)
def test_a_hidden_nan_value_reaches_only_the_query_tile_by_its_key(rng, dtype_name, options):
    q, k, v = (
        rng.uniform(-0.5, 0.5, (1, 2, 300, 32)).astype(np.float32).astype(DTYPES[dtype_name])
        for _ in range(3)
    )
    kernel = tilelab.flash_attention_kernel(q, k, v, causal=True, **options)
    if kernel is None:
        pytest.skip("this build has no generated kernel for the call (TILELAB_BUILD_KERNELS=OFF)")
    tile_rows = 64 if kernel.endswith("_tall") else 32
    hidden = 255
    v_nan = v.copy()
    v_nan[0, 1, hidden, 5] = np.nan
    out = tilelab.flash_attention(q, k, v_nan, causal=True, **options)
    clean = tilelab.flash_attention(q, k, v, causal=True, **options)
    # The first tile with a row that sees a key of the hidden key's group.
    reaching_tile = (hidden // 8 * 8) // tile_rows
    earlier_rows = reaching_tile * tile_rows
    np.testing.assert_array_equal(out[0, 1, :earlier_rows], clean[0, 1, :earlier_rows])
    assert np.isfinite(out[0, 1, :earlier_rows].astype(np.float32)).all()
    assert np.isnan(out[0, 1, hidden:, 5].astype(np.float32)).all()
    np.testing.assert_array_equal(out[0, 0], clean[0, 0])
