"""tilelab.flash_attention_backward with the score options (softcap, ALiBi, sliding window,
sinks and their gradient) against the analytic fp64 gradients of docs/attention_options.md (and
those against finite differences): each option alone and together, both causal alignments, GQA,
every dtype, both implementations, long rows whose key blocks the window skips, masked non-finite
values, determinism and bad input."""

import ml_dtypes
import numpy as np
import pytest
from attention_reference import (
    DTYPES,
    SCORE_OPTIONS,
    SINKS,
    SLOPES,
    UNIT_ROUNDOFF,
    central_differences,
    reference_options,
    reference_options_backward,
)

import tilelab

OPTIONS = SCORE_OPTIONS
MASKS = {
    "full": dict(causal=False),
    "causal_top_left": dict(causal=True, causal_alignment="top_left"),
    "causal_bottom_right": dict(causal=True, causal_alignment="bottom_right"),
    "full_bottom_right": dict(causal=False, causal_alignment="bottom_right"),
}


def inputs(rng, batch=2, q_heads=6, kv_heads=2, q_len=37, kv_len=90, head_dim=40,
           dtype="float32"):
    dtype = DTYPES[dtype]
    shape_q = (batch, q_heads, q_len, head_dim)
    shape_k = (batch, kv_heads, kv_len, head_dim)
    return tuple(rng.standard_normal(shape, dtype=np.float32).astype(dtype)
                 for shape in (shape_q, shape_k, shape_k))


def gradient_tolerance(dtype_name, references, length):
    """As test_flash_attention_backward's: a few unit roundoffs of the dtype, and fp32
    accumulation over the longer length, of the largest gradient."""
    magnitude = max(float(np.max(np.abs(r), initial=1e-30)) for r in references if r is not None)
    accumulation = 64 * UNIT_ROUNDOFF["float32"] * np.sqrt(length)
    return magnitude * (8 * UNIT_ROUNDOFF[dtype_name] + accumulation)


def check(rng, q, k, v, dtype_name="float32", implementation="automatic", **options):
    """dq, dk, dv and dsinks (with sinks) against the reference; returns them."""
    out, lse = tilelab.flash_attention(q, k, v, return_lse=True, **options)
    dout = rng.standard_normal(out.shape, dtype=np.float32).astype(q.dtype)
    sinks = options.get("sinks") is not None
    grads = tilelab.flash_attention_backward(dout, q, k, v, out, lse, return_dsinks=sinks,
                                             implementation=implementation, **options)
    assert len(grads) == (4 if sinks else 3)
    expected = reference_options_backward(dout, q, k, v, **options)
    length = max(q.shape[2], k.shape[2])
    tolerance = gradient_tolerance(dtype_name, expected[:3], length)
    for name, got, want, like in zip(("dq", "dk", "dv"), grads, expected, (q, k, k),
                                     strict=False):
        assert got.shape == like.shape and got.dtype == q.dtype, name
        assert np.all(np.isfinite(got.astype(np.float32))), name
        error = np.max(np.abs(got.astype(np.float64) - want))
        assert error <= tolerance, f"{name}: error {error:.3e} > tolerance {tolerance:.3e}"
    if sinks:
        dsinks = grads[3]
        assert dsinks.shape == (q.shape[1],) and dsinks.dtype == np.float32
        # A sum over B·M rows of products with |out| <= max|v|: the rows' own rounding.
        sink_tolerance = (np.max(np.abs(expected[3])) + 1.0) * (
            4 * UNIT_ROUNDOFF[dtype_name] + 16 * UNIT_ROUNDOFF["float32"] * np.sqrt(length))
        np.testing.assert_allclose(dsinks, expected[3], rtol=0, atol=sink_tolerance)
    return grads


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("implementation", ["generated", "reference"])
def test_options_match_reference(option, mask, implementation):
    rng = np.random.default_rng(1)
    q, k, v = inputs(rng)
    check(rng, q, k, v, implementation=implementation, **MASKS[mask], **OPTIONS[option])


@pytest.mark.parametrize("dtype,fp32_probabilities", [("float16", False), ("bfloat16", False),
                                                      ("bfloat16", True)])
@pytest.mark.parametrize("option", ["softcap", "window_both", "all"])
@pytest.mark.parametrize("implementation", ["generated", "reference"])
def test_options_with_16_bit_inputs(dtype, fp32_probabilities, option, implementation):
    rng = np.random.default_rng(2)
    q, k, v = inputs(rng, dtype=dtype)
    check(rng, q, k, v, dtype, implementation=implementation, causal=True,
          fp32_probabilities=fp32_probabilities, **OPTIONS[option])


@pytest.mark.parametrize("lengths", [(1, 1), (1, 300), (50, 20), (7, 113), (113, 7)],
                         ids=lambda lengths: f"m{lengths[0]}_n{lengths[1]}")
@pytest.mark.parametrize("mask", ["causal_bottom_right", "full"])
@pytest.mark.parametrize("implementation", ["generated", "reference"])
def test_ragged_lengths(lengths, mask, implementation):
    """Single rows and keys, M > N with bottom-right alignment (rows that see no key: zero
    gradients, and nothing added to dsinks), and M != N both ways, with every option."""
    rng = np.random.default_rng(8)
    q, k, v = inputs(rng, batch=1, q_len=lengths[0], kv_len=lengths[1], head_dim=24)
    grads = check(rng, q, k, v, implementation=implementation, **MASKS[mask], **OPTIONS["all"])
    if mask == "causal_bottom_right" and lengths[0] > lengths[1]:
        unseen = lengths[0] - lengths[1]
        assert not np.any(grads[0][:, :, :unseen])


@pytest.mark.parametrize("head_dim", [17, 64, 128])
@pytest.mark.parametrize("window", [(0, -1), (100, -1), (63, 64), (-1, 0)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_windows_over_many_key_blocks(dtype, window, head_dim):
    """Long rows (several 64-key blocks, ragged lengths): the generated kernel skips the key
    blocks left of a row tile's window and masks the rest per key; GQA and MQA."""
    rng = np.random.default_rng(7)
    for q_heads, kv_heads in [(4, 2), (3, 1)]:
        q, k, v = inputs(rng, batch=1, q_heads=q_heads, kv_heads=kv_heads, q_len=150, kv_len=423,
                         head_dim=head_dim, dtype=dtype)
        for causal, alignment in [(True, "bottom_right"), (False, "top_left")]:
            check(rng, q, k, v, dtype, implementation="generated", causal=causal,
                  causal_alignment=alignment, sliding_window=window, softcap=30.0,
                  alibi_slopes=SLOPES[:q_heads], sinks=SINKS[:q_heads])


def test_reference_gradients_match_finite_differences():
    """The analytic fp64 gradients (the sinks' included) against central differences of
    loss = sum(out * dout) through reference_options, with every option and GQA; then both
    implementations against them."""
    rng = np.random.default_rng(3)
    batch, q_heads, kv_heads, q_len, kv_len, head_dim = 1, 4, 2, 5, 9, 3
    sinks = np.array([0.3, -0.7, 1.1, -2.0])
    options = dict(causal=True, causal_alignment="bottom_right", scale=0.9, softcap=1.3,
                   alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625]), sliding_window=(4, -1))
    q = rng.standard_normal((batch, q_heads, q_len, head_dim))
    k = rng.standard_normal((batch, kv_heads, kv_len, head_dim))
    v = rng.standard_normal((batch, kv_heads, kv_len, head_dim))
    dout = rng.standard_normal((batch, q_heads, q_len, head_dim))

    def loss(q_, k_, v_, sinks_):
        out, _ = reference_options(q_, k_, v_, sinks=sinks_, **options)
        return float(np.sum(out * dout))

    analytic = reference_options_backward(dout, q, k, v, sinks=sinks, **options)
    for got, numeric in zip(analytic, central_differences(loss, [q, k, v, sinks]), strict=True):
        np.testing.assert_allclose(got, numeric, rtol=1e-6, atol=1e-8)

    f32 = dict(options, alibi_slopes=options["alibi_slopes"].astype(np.float32),
               sinks=sinks.astype(np.float32))
    arrays32 = [a.astype(np.float32) for a in (q, k, v, dout)]
    out, lse = tilelab.flash_attention(*arrays32[:3], return_lse=True, **f32)
    for implementation in ["generated", "reference"]:
        ours = tilelab.flash_attention_backward(arrays32[3], *arrays32[:3], out, lse,
                                                return_dsinks=True, implementation=implementation,
                                                **f32)
        for got, want in zip(ours, analytic, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("implementation", ["automatic", "reference"])
def test_masked_non_finite_values_reach_no_gradient(implementation):
    """NaN and inf in keys, values and rows the window masks change no gradient (the automatic
    dispatch runs such calls on the reference); a visible NaN makes its row's gradients NaN."""
    rng = np.random.default_rng(4)
    q, k, v = inputs(rng, batch=1, q_heads=2, kv_heads=1, q_len=40, kv_len=40)
    options = dict(causal=True, sliding_window=(4, -1), softcap=5.0)
    # One forward implementation for both calls (with inf in v, the automatic one is the paged
    # kernel), so that rows the NaN does not reach have the same out and lse bits.
    out, lse = tilelab.flash_attention(q, k, v, return_lse=True, implementation="reference",
                                       **options)
    dout = rng.standard_normal(out.shape, dtype=np.float32)
    clean = tilelab.flash_attention_backward(dout, q, k, v, out, lse, implementation="reference",
                                             **options)
    k_bad, v_bad = k.copy(), v.copy()
    k_bad[0, 0, 20] = np.nan  # visible to queries 20..24 only
    v_bad[0, 0, 20] = np.inf
    out_bad, lse_bad = tilelab.flash_attention(q, k_bad, v_bad, return_lse=True,
                                               implementation="reference", **options)
    grads = tilelab.flash_attention_backward(dout, q, k_bad, v_bad, out_bad, lse_bad,
                                             implementation=implementation, **options)
    rows = np.r_[0:20, 25:40]
    np.testing.assert_array_equal(grads[0][:, :, rows], clean[0][:, :, rows])
    assert np.all(np.isnan(grads[0][:, :, 20:25]))
    keys = np.r_[0:16, 25:40]  # keys no NaN row sees (rows 20..24 see keys 16..24)
    for got, want in zip(grads[1:], clean[1:], strict=True):
        np.testing.assert_array_equal(got[:, :, keys], want[:, :, keys])


def test_deterministic_and_independent_of_the_thread_count():
    rng = np.random.default_rng(5)
    q, k, v = inputs(rng, batch=1, q_heads=4, kv_heads=2, q_len=300, kv_len=700, head_dim=64)
    options = dict(causal=True, causal_alignment="bottom_right", **OPTIONS["all"])
    options["alibi_slopes"], options["sinks"] = SLOPES[:4], SINKS[:4]
    out, lse = tilelab.flash_attention(q, k, v, return_lse=True, **options)
    dout = rng.standard_normal(out.shape, dtype=np.float32)
    saved = tilelab.num_threads()
    try:
        results = []
        for threads in (1, 2, 3, 2):
            tilelab.set_num_threads(threads)
            results.append(tilelab.flash_attention_backward(dout, q, k, v, out, lse,
                                                            return_dsinks=True, **options))
    finally:
        tilelab.set_num_threads(saved)
    for result in results[1:]:
        for got, want in zip(result, results[0], strict=True):
            np.testing.assert_array_equal(got, want)


def test_bad_input():
    rng = np.random.default_rng(6)
    q, k, v = inputs(rng, batch=1, q_heads=6, kv_heads=2, q_len=9, kv_len=9)
    out, lse = tilelab.flash_attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match=r"^return_dsinks: expected False without sinks"):
        tilelab.flash_attention_backward(out, q, k, v, out, lse, return_dsinks=True)
    with pytest.raises(ValueError, match=r"^sinks: expected shape \[Hq\]"):
        tilelab.flash_attention_backward(out, q, k, v, out, lse, sinks=np.zeros(5, np.float32))
    with pytest.raises(ValueError, match=r"^softcap: expected a finite value >= 0"):
        tilelab.flash_attention_backward(out, q, k, v, out, lse, softcap=np.inf)
    with pytest.raises(ValueError, match=r"^sliding_window"):
        tilelab.flash_attention_backward(out, q, k, v, out, lse, sliding_window=(-2, 0))
    with pytest.raises(ValueError, match=r"^bias: expected no bias together with score options"):
        tilelab.flash_attention_backward(out, q, k, v, out, lse, softcap=2.0,
                                         bias=np.zeros((1, 1, 1, 9), np.float32))
    k8 = k.astype(ml_dtypes.float8_e4m3fn)
    with pytest.raises(TypeError, match=r"^k: expected the dtype of q \(float32\) for the "
                                        r"backward"):
        tilelab.flash_attention_backward(out, q, k8, k8, out, lse)
    with pytest.raises(ValueError, match=r"^implementation: 'generated' does not cover"):
        bad_k = k.copy()
        bad_k[0, 0, 0, 0] = np.nan
        tilelab.flash_attention_backward(out, q, bad_k, v, out, lse, softcap=2.0,
                                         implementation="generated")
