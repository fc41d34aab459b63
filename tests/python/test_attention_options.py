"""The score options (softcap, ALiBi, sliding window, sinks) and fp8 k/v on the dense
tilelab.flash_attention, against an fp64 numpy evaluation of docs/attention_options.md: each
option alone and together, both causal alignments, lse, fp8 formats, non-finite values, on both
implementations that take them (the generated prefill kernels, the paged kernel for decode-sized
calls, fp8 and non-finite v), and the calls that refuse them."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from attention_reference import (
    DTYPES,
    SCORE_OPTIONS,
    SINKS,
    SLOPES,
    UNIT_ROUNDOFF,
    reference_options,
)

import tilelab

FP8 = [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2]


def inputs(rng, batch=2, q_heads=6, kv_heads=2, q_len=37, kv_len=90, head_dim=40,
           dtype="float32"):
    dtype = DTYPES[dtype]
    shape_q = (batch, q_heads, q_len, head_dim)
    shape_k = (batch, kv_heads, kv_len, head_dim)
    return (rng.standard_normal(shape_q, dtype=np.float32).astype(dtype),
            rng.standard_normal(shape_k, dtype=np.float32).astype(dtype),
            rng.standard_normal(shape_k, dtype=np.float32).astype(dtype))


def check(q, k, v, dtype_name="float32", **options):
    """out and lse against the reference; NaN exactly where the reference has NaN."""
    with np.errstate(invalid="ignore", over="ignore"):
        expected_out, expected_lse = reference_options(q, k, v, **options)
    out, lse = tilelab.flash_attention(q, k, v, return_lse=True, **options)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(expected_out))
    np.testing.assert_array_equal(np.isnan(lse), np.isnan(expected_lse))
    finite_v = np.asarray(v, np.float64)[np.isfinite(np.asarray(v, np.float64))]
    magnitude = float(np.max(np.abs(finite_v * options.get("v_scale", 1.0))))
    atol = magnitude * (2 * UNIT_ROUNDOFF[dtype_name] + 16 * 2.0**-24 * np.sqrt(k.shape[2]))
    rows = ~np.isnan(expected_out)
    error = np.max(np.abs(out.astype(np.float64)[rows] - expected_out[rows]), initial=0.0)
    assert error <= atol, f"max |out - reference| = {error:.3g} > {atol:.3g}"
    finite = np.isfinite(expected_lse)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(expected_lse))
    np.testing.assert_allclose(lse[finite], expected_lse[finite], atol=1e-4, rtol=1e-5)


OPTIONS = SCORE_OPTIONS
# Query lengths (with 3 query heads per kv head) that run on the generated prefill kernels, and
# decode-sized ones (at most 8 rows per kv head) that stay on the paged kernel.
ROWS = {"prefill": (37, "generated"), "decode": (2, "paged")}


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("causal,alignment", [(False, "top_left"), (True, "top_left"),
                                              (True, "bottom_right"), (False, "bottom_right")])
@pytest.mark.parametrize("rows", list(ROWS))
def test_options_on_flash_attention(option, causal, alignment, rows):
    q_len, implementation = ROWS[rows]
    rng = np.random.default_rng(1)
    q, k, v = inputs(rng, q_len=q_len)
    check(q, k, v, causal=causal, causal_alignment=alignment, **OPTIONS[option])
    assert tilelab.flash_attention_implementation(
        q, k, v, causal=causal, causal_alignment=alignment, **OPTIONS[option]) == implementation


@pytest.mark.parametrize("dtype,fp32_probabilities,implementation",
                         [("float16", False, "generated"), ("bfloat16", False, "generated"),
                          ("bfloat16", True, "generated")])
@pytest.mark.parametrize("option", ["softcap", "window", "all"])
def test_options_with_16_bit_inputs(dtype, fp32_probabilities, implementation, option):
    rng = np.random.default_rng(2)
    q, k, v = inputs(rng, dtype=dtype)
    options = dict(causal=True, fp32_probabilities=fp32_probabilities, **OPTIONS[option])
    check(q, k, v, dtype, **options)
    assert tilelab.flash_attention_implementation(q, k, v, **options) == implementation


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("head_dim", [64, 128, 17])
@pytest.mark.parametrize("window", [(0, -1), (100, -1), (63, 64), (-1, 0)])
def test_windows_over_many_key_blocks(dtype, head_dim, window):
    """Long rows (several 64-key blocks): blocks left of a tile's window are skipped, the rest
    masked per key; ragged lengths and a head dim without a fast path."""
    rng = np.random.default_rng(7)
    q, k, v = inputs(rng, batch=1, q_heads=4, kv_heads=2, q_len=150, kv_len=423,
                     head_dim=head_dim, dtype=dtype)
    for causal, alignment in [(True, "bottom_right"), (False, "top_left")]:
        check(q, k, v, dtype, causal=causal, causal_alignment=alignment, sliding_window=window,
              softcap=30.0, alibi_slopes=SLOPES[:4], sinks=SINKS[:4])


@pytest.mark.parametrize("rows", list(ROWS))
def test_non_finite_values_follow_ieee(rows):
    """softcap maps a score of ±inf to ±softcap and keeps NaN; a NaN or +inf sink makes its head's
    rows NaN, -inf adds nothing; a row whose scores are all -inf is 0 with a finite sink."""
    q_len, implementation = ROWS[rows]
    rng = np.random.default_rng(8)
    q, k, v = inputs(rng, q_len=q_len)
    q[0, 0, 0, 3] = np.inf   # scores ±inf (softcapped to ±softcap)
    q[0, 1, 1, 5] = np.nan   # a NaN row
    q[1, 2, 0, :] = 0.0
    q[1, 2, 0, 0] = -np.inf  # scores ±inf: -inf where k[.., 0] > 0
    sinks = np.array([0.5, np.nan, np.inf, -np.inf, 2.0, 0.0], np.float32)
    for options in [dict(softcap=5.0), dict(sinks=sinks), dict(softcap=5.0, sinks=sinks),
                    dict(softcap=5.0, alibi_slopes=SLOPES, sliding_window=(9, -1))]:
        check(q, k, v, causal=True, **options)
        assert tilelab.flash_attention_implementation(q, k, v, causal=True,
                                                      **options) == implementation
    # Every score -inf in the window: NaN without a sink, 0 with a finite one.
    k_inf = k.copy()
    q_ones = np.ones_like(q)
    k_inf[:, :, :, 0] = -np.inf
    check(q_ones, k_inf, v, causal=True, sliding_window=(2, -1))
    check(q_ones, k_inf, v, causal=True, sliding_window=(2, -1), sinks=SINKS)


def test_rows_that_see_no_key():
    """Top-left causal with a window right of the diagonal only: a row sees no key when its
    window is empty (M > N), giving out 0 and lse -inf."""
    rng = np.random.default_rng(3)
    q, k, v = inputs(rng, q_len=50, kv_len=20)
    check(q, k, v, causal=True, causal_alignment="bottom_right", sliding_window=(3, -1))


@pytest.mark.parametrize("fp8", FP8, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fp8_k_and_v(fp8, dtype):
    rng = np.random.default_rng(4)
    q, k, v = inputs(rng, dtype=dtype)
    k8 = (k.astype(np.float32) / 0.25).astype(fp8)
    v8 = (v.astype(np.float32) / 0.5).astype(fp8)
    check(q, k8, v8, dtype, causal=True, k_scale=0.25, v_scale=0.5)
    assert tilelab.flash_attention_implementation(q, k8, v8, k_scale=0.25, v_scale=0.5) == "paged"


@pytest.mark.parametrize("q_len", [8, 40])
def test_nan_outside_the_window_is_never_read(q_len):
    """NaN in masked k and v stays out: the generated kernels multiply a masked key's v by 0, so a
    call whose v holds NaN or inf runs on the paged kernel, which never reads masked keys."""
    rng = np.random.default_rng(5)
    q, k, v = inputs(rng, q_len=q_len, kv_len=128)
    options = dict(causal=True, causal_alignment="bottom_right", sliding_window=(4, -1))
    expected, _ = reference_options(q, k, v, **options)
    k[:, :, :40] = np.nan
    out = tilelab.flash_attention(q, k, v, **options)
    np.testing.assert_allclose(out, expected, atol=1e-5)
    v[:, :, :40] = np.nan
    assert tilelab.flash_attention_implementation(q, k, v, **options) == "paged"
    out = tilelab.flash_attention(q, k, v, **options)
    np.testing.assert_allclose(out, expected, atol=1e-5)
    with pytest.raises(ValueError, match=r"^implementation: 'generated' does not cover"):
        tilelab.flash_attention(q, k, v, implementation="generated", **options)


def test_refusals_name_the_argument():
    rng = np.random.default_rng(6)
    q, k, v = inputs(rng)
    bias = np.zeros((1, 1, q.shape[2], k.shape[2]), np.float32)
    with pytest.raises(ValueError, match=r"^bias: expected no bias together with score options"):
        tilelab.flash_attention(q, k, v, bias=bias, softcap=2.0)
    with pytest.raises(ValueError, match=r"^implementation: 'generated' does not cover"):
        tilelab.flash_attention(q[:, :, :2], k, v, sliding_window=(4, 4),
                                implementation="generated")
    with pytest.raises(ValueError, match=r"^implementation: 'generated' does not cover"):
        tilelab.flash_attention(q, k.astype(ml_dtypes.float8_e4m3fn),
                                v.astype(ml_dtypes.float8_e4m3fn), implementation="generated")
    with pytest.raises(ValueError, match=r"^k_scale: expected 1.0 with float32 K/V"):
        tilelab.flash_attention(q, k, v, k_scale=0.5)
    with pytest.raises(TypeError, match=r"^v: expected dtype float8_e4m3fn \(the dtype of k\)"):
        tilelab.flash_attention(q, k.astype(ml_dtypes.float8_e4m3fn), v)
    with pytest.raises(ValueError, match=r"^alibi_slopes: expected shape \[Hq\]"):
        tilelab.flash_attention(q, k, v, alibi_slopes=np.ones(5, np.float32))
    with pytest.raises(ValueError, match=r"^softcap: expected a finite value >= 0"):
        tilelab.flash_attention(q, k, v, softcap=-1.0)


@pytest.mark.parametrize("rows", list(ROWS))
@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
def test_window_sides_as_large_as_int64(rows, alignment):
    """Window sides up to int64's largest value mean "unbounded": no overflow, the same bits."""
    q_len, _ = ROWS[rows]
    rng = np.random.default_rng(9)
    q, k, v = inputs(rng, q_len=q_len, kv_len=20)
    largest = int(np.iinfo(np.int64).max)
    for causal in (True, False):
        options = dict(causal=causal, causal_alignment=alignment, softcap=5.0)
        unbounded = tilelab.flash_attention(q, k, v, **options)
        for window in [(largest, -1), (-1, largest), (largest, largest)]:
            np.testing.assert_array_equal(
                tilelab.flash_attention(q, k, v, sliding_window=window, **options), unbounded)
