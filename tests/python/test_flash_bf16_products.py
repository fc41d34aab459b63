"""bfloat16 flash attention: P rounded to bf16 before P·V for bf16 dot products (the default on
CPUs that prefer them) or kept in float32 (fp32_probabilities=True, and other CPUs), both against
the fp64 reference, with ragged shapes, every option, NaN and inf."""

import ml_dtypes
import numpy as np
import pytest
from attention_reference import (
    assert_attention_close,
    assert_lse_close,
    random_qkv,
    reference_attention,
)
from cpu_policy import cpu_prefers_bf16_dot_products, rounds_bf16_probabilities

import tilelab


def test_the_cpu_policy_is_the_documented_one():
    assert tilelab.prefers_bf16_dot_products() is cpu_prefers_bf16_dot_products()


# (B, Hq, Hkv, M, N, D), all with more than 8 rows per kv head (the prefill kernels): odd and
# ragged head dims (the last pair of head dims reads a zero), ragged M and N around the 32-row
# tile and the 64-key block (odd N: the last pair of keys reads a clamped key), GQA.
SHAPES = {
    "odd_everything": (1, 2, 1, 37, 65, 7),
    "gqa4_ragged": (2, 8, 2, 19, 131, 33),
    "d1": (1, 1, 1, 33, 5, 1),
    "d128_block_edges": (1, 2, 2, 64, 129, 128),
    "d256": (1, 1, 1, 17, 100, 256),
    "d96_long": (1, 2, 1, 90, 300, 96),
}


@pytest.mark.parametrize("fp32_probabilities", [False, True])
@pytest.mark.parametrize("causal", ["none", "top_left", "bottom_right"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_matches_fp64_reference(rng, shape, causal, fp32_probabilities):
    q, k, v = random_qkv(rng, *shape, "bfloat16")
    options = {} if causal == "none" else {"causal": True, "causal_alignment": causal}
    out, lse = tilelab.flash_attention(
        q,
        k,
        v,
        return_lse=True,
        implementation="generated",
        fp32_probabilities=fp32_probabilities,
        **options,
    )
    reference_out, reference_lse = reference_attention(q, k, v, **options)
    assert out.dtype == ml_dtypes.bfloat16
    assert_attention_close(out, reference_out, "bfloat16", v, k.shape[2])
    assert_lse_close(lse, reference_lse, q.shape[3], k.shape[2])


@pytest.mark.parametrize("fp32_probabilities", [False, True])
def test_bias_and_scale(rng, fp32_probabilities):
    q, k, v = random_qkv(rng, 2, 4, 2, 21, 70, 63, "bfloat16")
    bias = 2 * rng.standard_normal((1, 4, 21, 70), dtype=np.float32)
    options = {"bias": bias, "scale": 0.3, "causal": True, "causal_alignment": "bottom_right"}
    out, lse = tilelab.flash_attention(
        q, k, v, return_lse=True, fp32_probabilities=fp32_probabilities, **options
    )
    reference_out, reference_lse = reference_attention(q, k, v, **options)
    assert_attention_close(out, reference_out, "bfloat16", v, k.shape[2])
    assert_lse_close(lse, reference_lse, q.shape[3], k.shape[2])


# The kernels on bf16 dot products, built for the targets that have them and the x86-64 baseline
# fallback only (generators/CMakeLists.txt, BF16_DOT_PRODUCTS): on other CPUs they would run the
# baseline's code.
BF16_DOT_PRODUCT_KERNELS = {
    "flash_fwd_bf16",
    "flash_fwd_bf16_bias",
    "flash_fwd_bf16_options",
}


@pytest.mark.parametrize("fp32_probabilities", [False, True])
@pytest.mark.parametrize("call", ["plain", "causal", "bias", "softcap"])
def test_bf16_dot_product_kernels_run_only_where_preferred(rng, call, fp32_probabilities):
    q, k, v = random_qkv(rng, 1, 2, 2, 40, 96, 64, "bfloat16")
    options = {
        "plain": {},
        "causal": {"causal": True},
        "bias": {"bias": np.zeros((1, 1, 40, 96), np.float32)},
        "softcap": {"softcap": 30.0},
    }[call]
    kernel = tilelab.flash_attention_kernel(
        q, k, v, fp32_probabilities=fp32_probabilities, **options
    )
    assert kernel is not None and kernel.startswith("flash_fwd_bf16")
    assert (kernel in BF16_DOT_PRODUCT_KERNELS) is rounds_bf16_probabilities(
        fp32_probabilities=fp32_probabilities
    )


# 16 rows run on the generated prefill kernels, 1 on the paged kernel (decode); fp8 k/v always
# on the paged kernel.
@pytest.mark.parametrize("rows,kv_dtype", [(16, "bfloat16"), (1, "bfloat16"), (16, "float8_e4m3fn"),
                                           (1, "float8_e5m2")])
def test_rounding_of_p_is_what_the_option_says(rows, kv_dtype):
    """Two keys with probabilities 1 and exp(-0.001) and values 1 and -1: out = (1 - p) / (1 + p)
    is 5.0e-4 with float32 P, and exactly 0 once p = 0.999 rounds to 1.0 in bf16. P is rounded
    where the call runs on bf16 dot products: bf16 k/v on CPUs that prefer them, fp8 k/v on every
    CPU that has them."""
    q = np.ones((1, 1, rows, 1), ml_dtypes.bfloat16)
    storage = getattr(ml_dtypes, kv_dtype)
    # k = k_scale · stored: -0.001 is below fp8's smallest normal.
    k_scale = 1.0 if kv_dtype == "bfloat16" else 2.0**-10
    k = (np.array([0.0, -0.001], np.float32) / k_scale).reshape(1, 1, 2, 1).astype(storage)
    v = np.array([1.0, -1.0], np.float32).reshape(1, 1, 2, 1).astype(storage)
    p = np.exp(np.float64(k[0, 0, 1, 0].astype(np.float32)) * k_scale)
    exact = (1 - p) / (1 + p)
    scales = {} if kv_dtype == "bfloat16" else {"k_scale": k_scale}

    kept = tilelab.flash_attention(q, k, v, scale=1.0, fp32_probabilities=True, **scales)
    np.testing.assert_allclose(kept.astype(np.float64), exact, rtol=1e-2)
    rounded = tilelab.flash_attention(q, k, v, scale=1.0, **scales)
    expected = 0.0 if rounds_bf16_probabilities(kv_dtype) else exact
    np.testing.assert_allclose(rounded.astype(np.float64), expected, rtol=1e-2, atol=0)
    # The reference keeps P in float32 whatever the option says.
    if kv_dtype == "bfloat16":
        reference = tilelab.flash_attention(q, k, v, scale=1.0, implementation="reference")
        np.testing.assert_allclose(reference.astype(np.float64), exact, rtol=1e-2)


@pytest.mark.parametrize("fp32_probabilities", [False, True])
def test_nan_and_inf_propagate(rng, fp32_probabilities):
    """The semantics of tilelab.flash_attention: NaN or a +inf score makes the row NaN, a -inf
    score contributes nothing, an inf value gives inf in its column."""
    q, k, v = random_qkv(rng, 1, 2, 1, 40, 70, 7, "bfloat16")
    q[0, 0, 3, 6] = np.nan  # the odd head dim's last column: its pair partner is padding
    k[0, 0, 50, 0] = np.inf  # score +inf where q[..., 0] > 0, -inf where q[..., 0] < 0
    v[0, 0, 10, 2] = np.inf  # an unmasked key: column 2 of every other row is +inf
    out, lse = tilelab.flash_attention(
        q, k, v, return_lse=True, fp32_probabilities=fp32_probabilities
    )
    out64 = out.astype(np.float64)
    nan_rows = q[..., 0].astype(np.float32) > 0
    nan_rows[0, 0, 3] = True
    assert np.isnan(out64[nan_rows]).all() and np.isnan(lse[nan_rows]).all()

    # The other rows: key 50 contributes nothing, column 2 is +inf, the rest is attention over
    # the keys without key 50.
    keep = np.arange(70) != 50
    reference_out, reference_lse = reference_attention(q, k[:, :, keep], v[:, :, keep])
    rows = ~nan_rows
    assert np.all(np.isposinf(out64[rows][:, 2]))
    columns = np.arange(7) != 2
    error = np.abs(out64[rows][:, columns] - reference_out[rows][:, columns]).max()
    assert error < 0.02
    assert np.abs(lse[rows] - reference_lse[rows]).max() < 1e-3


def test_overflowing_products_give_nan():
    """bf16 reaches 3e38: q·k products overflow float32 to inf (inf - inf in the softmax)."""
    q = np.full((1, 1, 20, 4), 1e30, ml_dtypes.bfloat16)
    k = np.full((1, 1, 9, 4), 1e30, ml_dtypes.bfloat16)
    v = np.ones((1, 1, 9, 4), ml_dtypes.bfloat16)
    out, lse = tilelab.flash_attention(q, k, v, return_lse=True)
    assert np.isnan(out.astype(np.float32)).all() and np.isnan(lse).all()


def test_fp32_probabilities_must_be_a_bool(rng):
    q, k, v = random_qkv(rng, 1, 1, 1, 16, 16, 8, "bfloat16")
    with pytest.raises(TypeError, match="fp32_probabilities"):
        tilelab.flash_attention(q, k, v, fp32_probabilities=1)
