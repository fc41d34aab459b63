"""tilelab.flash_attention_backward against the analytic fp64 gradients (and those against finite
differences): dtypes, masks, GQA/MQA, bias shapes and its gradient, head dims, ragged lengths,
strides, non-finite values and bad input."""

import numpy as np
import pytest
from attention_reference import (
    DTYPES,
    MASKS,
    UNIT_ROUNDOFF,
    central_differences,
    random_qkv,
    reference_attention,
    reference_attention_backward,
)
from cpu_policy import rounds_bf16_probabilities

import tilelab

# (B, Hq, Hkv, M, N, D): lengths 1, 7, 113, 1023 and M != N both ways (bottom-right alignment with
# M > N has fully masked rows), GQA groups 1, 2, 4, 8 and MQA, odd head dims.
SHAPES = {
    "minimal": (1, 1, 1, 1, 1, 1),
    "m7_n113_gqa2_d40": (2, 4, 2, 7, 113, 40),
    "m113_n7_gqa4_d80": (1, 8, 2, 113, 7, 80),
    "m113_n113_mqa_d96": (1, 3, 1, 113, 113, 96),
    "m1_n113_gqa8_d128": (1, 8, 1, 1, 113, 128),
    "m64_n200_d64": (2, 2, 2, 64, 200, 64),
    "m33_n33_d256": (1, 2, 2, 33, 33, 256),
    "m1023_n1023_d16": (1, 1, 1, 1023, 1023, 16),
}

# Bias shapes as [B|1, Hq|1, M|1, N] flags: which dims are full. The kernel reads a bias broadcast
# over rows and heads, over rows only, and one that varies by row on separate paths.
BIAS_SHAPES = {
    "none": None,
    "full": (True, True, True),
    "per_head_row": (False, True, True),
    "per_row_key": (False, False, True),
    "per_head_key": (False, True, False),
    "keys_only": (False, False, False),
    "per_batch_key": (True, False, False),
}


def gradient_tolerance(dtype_name, references, length):
    """Absolute tolerance on the gradients: rounding the result, dout and out (which delta reads)
    to the dtype costs a few unit roundoffs of the largest gradient; fp32 accumulation over the
    longer length about sqrt(length) fp32 roundoffs (64 covers exp and the three chained
    products). The largest of all gradients sets the scale: one of them can be 0 analytically
    (dq of a query that sees a single key) while its rounding error is not.
    Measured: float32 errors reach about 5% of this, float16 and bfloat16 about 10%."""
    magnitude = max(float(np.max(np.abs(r), initial=1e-30)) for r in references if r is not None)
    accumulation = 64 * UNIT_ROUNDOFF["float32"] * np.sqrt(length)
    return magnitude * (8 * UNIT_ROUNDOFF[dtype_name] + accumulation)


def make_bias(rng, flags, batch, q_heads, q_len, kv_len):
    if flags is None:
        return None
    shape = (
        batch if flags[0] else 1,
        q_heads if flags[1] else 1,
        q_len if flags[2] else 1,
        kv_len,
    )
    return rng.standard_normal(shape, dtype=np.float32)


def forward_and_gradient(rng, q, k, v, dtype_name, bias=None, **options):
    out, lse = tilelab.flash_attention(q, k, v, bias=bias, return_lse=True, **options)
    dout = rng.standard_normal(out.shape, dtype=np.float32).astype(DTYPES[dtype_name])
    return out, lse, dout


def check(rng, q, k, v, dtype_name, bias=None, implementation="automatic", **options):
    out, lse, dout = forward_and_gradient(rng, q, k, v, dtype_name, bias=bias, **options)
    grads = tilelab.flash_attention_backward(
        dout, q, k, v, out, lse, bias=bias, return_dbias=bias is not None,
        implementation=implementation, **options,
    )
    expected = reference_attention_backward(dout, q, k, v, bias=bias, **options)
    length = max(q.shape[2], k.shape[2])
    for name, got, want, like in zip(("dq", "dk", "dv", "dbias"), grads, expected,
                                     (q, k, k, bias), strict=False):
        assert got.shape == like.shape, name
        assert got.dtype == (np.float32 if name == "dbias" else q.dtype), name
        assert np.all(np.isfinite(got.astype(np.float32))), name
        error = np.max(np.abs(got.astype(np.float64) - want))
        tolerance = gradient_tolerance(dtype_name, expected, length)
        assert error <= tolerance, f"{name}: error {error:.3e} > tolerance {tolerance:.3e}"
    return grads


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("mask", MASKS.values(), ids=MASKS.keys())
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_matches_reference(rng, dtype_name, mask, shape):
    q, k, v = random_qkv(rng, *shape, dtype_name)
    check(rng, q, k, v, dtype_name, implementation="generated", **mask)


@pytest.mark.parametrize("bias_shape", BIAS_SHAPES.values(), ids=BIAS_SHAPES.keys())
@pytest.mark.parametrize("mask", MASKS.values(), ids=MASKS.keys())
@pytest.mark.parametrize("implementation", ["generated", "reference"])
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_bias_and_its_gradient(rng, dtype_name, implementation, mask, bias_shape):
    batch, q_heads, kv_heads, q_len, kv_len, head_dim = 2, 4, 2, 37, 70, 40
    q, k, v = random_qkv(rng, batch, q_heads, kv_heads, q_len, kv_len, head_dim, dtype_name)
    bias = make_bias(rng, bias_shape, batch, q_heads, q_len, kv_len)
    check(rng, q, k, v, dtype_name, bias=bias, implementation=implementation, **mask)


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("group", [1, 2, 4, 8, "mqa"])
def test_gqa_groups_both_implementations(rng, dtype_name, group):
    kv_heads = 1 if group == "mqa" else 2
    q_heads = 8 if group == "mqa" else 2 * group
    q, k, v = random_qkv(rng, 1, q_heads, kv_heads, 45, 77, 64, dtype_name)
    generated = check(rng, q, k, v, dtype_name, implementation="generated", causal=True)
    assert all(g.dtype == q.dtype for g in generated)
    check(rng, q, k, v, dtype_name, implementation="reference", causal=True)


@pytest.mark.parametrize("mask", MASKS.values(), ids=MASKS.keys())
@pytest.mark.parametrize("head_dim", [33, 128])
def test_bf16_probabilities_and_fp32_probabilities(rng, head_dim, mask):
    """bf16: by default P and dS are rounded to bf16 for dV, dK and dQ on CPUs that prefer bf16 dot
    products; fp32_probabilities keeps them fp32, as other CPUs always do. Both match fp64 within
    the bf16 tolerance, and the flag reaches the kernel where it matters."""
    q, k, v = random_qkv(rng, 1, 4, 2, 70, 113, head_dim, "bfloat16")
    out, lse, dout = forward_and_gradient(rng, q, k, v, "bfloat16", **mask)
    expected = reference_attention_backward(dout, q, k, v, **mask)
    results = {}
    for fp32_probabilities in (False, True):
        grads = tilelab.flash_attention_backward(
            dout, q, k, v, out, lse, implementation="generated",
            fp32_probabilities=fp32_probabilities, **mask)
        tolerance = gradient_tolerance("bfloat16", expected, 113)
        for name, got, want in zip(("dq", "dk", "dv"), grads, expected[:3], strict=True):
            error = np.max(np.abs(got.astype(np.float64) - want))
            assert error <= tolerance, f"{name}: error {error:.3e} > tolerance {tolerance:.3e}"
        results[fp32_probabilities] = grads
    differ = any(not np.array_equal(a, b) for a, b in zip(results[False], results[True],
                                                           strict=True))
    assert differ == rounds_bf16_probabilities()


@pytest.mark.parametrize("head_dim", [1, 7, 16, 33, 40, 64, 80, 96, 127, 128, 129, 192, 256])
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_head_dims(rng, dtype_name, head_dim):
    """Odd head dims too: bf16 products pair up head dims, and an odd D's last one is alone."""
    q, k, v = random_qkv(rng, 1, 2, 1, 19, 70, head_dim, dtype_name)
    check(rng, q, k, v, dtype_name, implementation="generated", causal=True,
          causal_alignment="bottom_right")


def test_reference_gradients_match_finite_differences(rng):
    """The analytic fp64 gradients the tests trust, and the kernel, against central differences
    of loss = Σ out · dout, on a small shape with GQA, a causal mask and a broadcast bias."""
    batch, q_heads, kv_heads, q_len, kv_len, head_dim = 1, 4, 2, 5, 7, 3
    options = dict(causal=True, causal_alignment="bottom_right", scale=0.7)
    q, k, v = (a.astype(np.float64) for a in
               random_qkv(rng, batch, q_heads, kv_heads, q_len, kv_len, head_dim, "float32"))
    bias = rng.standard_normal((1, q_heads, 1, kv_len))
    dout = rng.standard_normal((batch, q_heads, q_len, head_dim))

    def loss(q_, k_, v_, bias_):
        out, _ = reference_attention(q_, k_, v_, bias=bias_, **options)
        return float(np.sum(out * dout))

    analytic = reference_attention_backward(dout, q, k, v, bias=bias, **options)
    for got, numeric in zip(analytic, central_differences(loss, [q, k, v, bias]), strict=True):
        np.testing.assert_allclose(got, numeric, rtol=1e-6, atol=1e-8)

    f32 = [a.astype(np.float32) for a in (q, k, v, bias, dout)]
    out, lse = tilelab.flash_attention(f32[0], f32[1], f32[2], bias=f32[3], return_lse=True,
                                       **options)
    ours = tilelab.flash_attention_backward(f32[4], f32[0], f32[1], f32[2], out, lse, bias=f32[3],
                                            return_dbias=True, **options)
    for got, want in zip(ours, analytic, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_fully_masked_rows_give_zero_gradients(rng):
    # Bottom-right alignment with M > N: the first M - N queries see no key.
    q, k, v = random_qkv(rng, 1, 2, 2, 40, 9, 32, "float32")
    out, lse, dout = forward_and_gradient(rng, q, k, v, "float32", causal=True,
                                          causal_alignment="bottom_right")
    assert np.all(lse[:, :, :31] == -np.inf)
    for implementation in ("generated", "reference"):
        dq, dk, dv = tilelab.flash_attention_backward(
            dout, q, k, v, out, lse, causal=True, causal_alignment="bottom_right",
            implementation=implementation)
        assert np.all(np.isfinite(dq)) and np.all(np.isfinite(dk)) and np.all(np.isfinite(dv))
        assert np.all(dq[:, :, :31] == 0)


@pytest.mark.parametrize("bias_rows", [16, 1], ids=["per_row", "broadcast_rows"])
def test_bias_of_minus_infinity_masks(rng, bias_rows):
    q, k, v = random_qkv(rng, 1, 2, 2, 16, 24, 32, "float32")
    bias = rng.standard_normal((1, 1, bias_rows, 24), dtype=np.float32)
    bias[..., 5:9] = -np.inf
    if bias_rows > 1:
        bias[0, 0, 3, :] = -np.inf  # a row masked entirely by the bias
    out, lse, dout = forward_and_gradient(rng, q, k, v, "float32", bias=bias)
    for implementation in ("generated", "reference"):
        dq, dk, dv, dbias = tilelab.flash_attention_backward(
            dout, q, k, v, out, lse, bias=bias, return_dbias=True, implementation=implementation)
        for grad in (dq, dk, dv, dbias):
            assert np.all(np.isfinite(grad))
        assert np.all(dbias[..., 5:9] == 0)
        assert np.all(dk[..., 5:9, :] == 0) and np.all(dv[..., 5:9, :] == 0)
        if bias_rows > 1:
            assert np.all(dq[:, :, 3] == 0)


@pytest.mark.parametrize("mask", MASKS.values(), ids=MASKS.keys())
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_bias_varying_by_row_across_tiles_and_heads(rng, dtype_name, mask):
    """A bias that varies by row, whose tiles (rows in the vector lanes) gather it: 45 queries of a
    GQA group of 2 put tile boundaries inside heads and head boundaries inside tiles, 141 keys end
    inside a block and a register tile, and single -inf entries mask single (row, key) pairs
    (their dbias is 0)."""
    q, k, v = random_qkv(rng, 1, 4, 2, 45, 141, 64, dtype_name)
    bias = 2 * rng.standard_normal((1, 4, 45, 141), dtype=np.float32)
    masked = rng.random(bias.shape) < 0.05
    bias[masked] = -np.inf
    grads = check(rng, q, k, v, dtype_name, bias=bias, implementation="generated", **mask)
    assert np.all(grads[3][masked] == 0)


@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("implementation", ["generated", "reference"])
def test_nan_propagates(rng, implementation, dtype_name):
    q, k, v = random_qkv(rng, 1, 2, 1, 20, 30, 16, dtype_name)
    out, lse, dout = forward_and_gradient(rng, q, k, v, dtype_name)
    q_nan = q.copy()
    q_nan[0, 1, 4, 2] = np.nan
    dq, dk, dv = (
        grad.astype(np.float32)
        for grad in tilelab.flash_attention_backward(
            dout, q_nan, k, v, out, lse, implementation=implementation
        )
    )
    assert np.all(np.isnan(dq[0, 1, 4]))
    assert np.all(np.isnan(dk[0, 0]))  # every key the row sees
    assert np.all(np.isfinite(dq[0, 0])) and np.all(np.isfinite(dq[0, 1, :4]))
    dout_nan = dout.copy()
    dout_nan[0, 0, 7, 0] = np.nan
    dq, dk, dv = (
        grad.astype(np.float32)
        for grad in tilelab.flash_attention_backward(
            dout_nan, q, k, v, out, lse, implementation=implementation
        )
    )
    assert np.all(np.isnan(dq[0, 0, 7])) and np.all(np.isnan(dv[0, 0, :, 0]))
    assert np.all(np.isfinite(dq[0, 1]))


def test_strided_views(rng):
    q, k, v = random_qkv(rng, 2, 4, 2, 33, 50, 24, "bfloat16")
    out, lse, dout = forward_and_gradient(rng, q, k, v, "bfloat16", causal=True)
    expected = tilelab.flash_attention_backward(dout, q, k, v, out, lse, causal=True)
    reference = reference_attention_backward(dout, q, k, v, causal=True)
    # Heads and rows transposed in memory: innermost stride 1, still the generated kernel, and
    # the same bits.
    q_t = np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    assert tilelab.flash_attention_implementation(q_t, k, v) == "generated"
    got = tilelab.flash_attention_backward(dout, q_t, k, v, out, lse, causal=True)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)
    # Every other element of a wider buffer (innermost stride 2): the reference implementation.
    wide = np.zeros((*k.shape[:3], 2 * k.shape[3]), dtype=k.dtype)
    wide[..., ::2] = k
    k_strided = wide[..., ::2]
    assert tilelab.flash_attention_implementation(q, k_strided, v) == "reference"
    got = tilelab.flash_attention_backward(dout, q, k_strided, v, out, lse, causal=True)
    for a, want in zip(got, reference[:3], strict=True):
        error = np.max(np.abs(a.astype(np.float64) - want))
        assert error <= gradient_tolerance("bfloat16", reference, 50)


def test_deterministic(rng):
    q, k, v = random_qkv(rng, 1, 8, 2, 130, 190, 64, "float32")
    out, lse, dout = forward_and_gradient(rng, q, k, v, "float32", causal=True)
    first = tilelab.flash_attention_backward(dout, q, k, v, out, lse, causal=True)
    second = tilelab.flash_attention_backward(dout, q, k, v, out, lse, causal=True)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_independent_of_the_thread_count(rng, dtype_name):
    """One kv head: the keys split into chunks whose partial dq sums are added in a fixed order,
    so every thread count gives the same bits."""
    q, k, v = random_qkv(rng, 1, 2, 1, 200, 700, 64, dtype_name)
    out, lse, dout = forward_and_gradient(rng, q, k, v, dtype_name, causal=True)
    threads = tilelab.num_threads()
    try:
        results = []
        for n in sorted({1, 2, 3, threads}):
            tilelab.set_num_threads(n)
            results.append(tilelab.flash_attention_backward(dout, q, k, v, out, lse, causal=True))
    finally:
        tilelab.set_num_threads(threads)
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            np.testing.assert_array_equal(a, b)


class TestBadInput:
    @pytest.fixture
    def call(self, rng):
        q, k, v = random_qkv(rng, 2, 4, 2, 8, 12, 16, "float32")
        out, lse = tilelab.flash_attention(q, k, v, return_lse=True)
        dout = np.ones_like(out)
        return dict(dout=dout, q=q, k=k, v=v, out=out, lse=lse)

    def test_valid_call(self, call):
        dq, dk, dv = tilelab.flash_attention_backward(**call)
        assert dq.shape == call["q"].shape and dk.shape == dv.shape == call["k"].shape

    @pytest.mark.parametrize(
        "name, value, message",
        [
            ("dout", np.ones((2, 4, 8, 15), np.float32), "dout: expected shape"),
            ("out", np.ones((2, 4, 9, 16), np.float32), "out: expected shape"),
            ("lse", np.zeros((2, 4, 9), np.float32), "lse: expected shape"),
            ("lse", np.zeros((2, 4), np.float32), "lse: expected rank 3"),
            ("v", np.ones((2, 2, 13, 16), np.float32), "v: expected shape"),
        ],
    )
    def test_shape_mismatch(self, call, name, value, message):
        call[name] = value
        with pytest.raises(ValueError, match=message):
            tilelab.flash_attention_backward(**call)

    @pytest.mark.parametrize(
        "name, value, error, message",
        [
            ("lse", np.zeros((2, 4, 8), np.float64), TypeError, "lse: expected dtype float32"),
            ("lse", [[0.0]], TypeError, "lse: expected a numpy.ndarray"),
            (
                "lse",
                np.ma.zeros((2, 4, 8), np.float32),
                TypeError,
                "lse: expected a numpy.ndarray, got a numpy.ma.MaskedArray",
            ),
            ("dout", np.ones((2, 4, 8, 16), np.float16), TypeError, "dout: expected dtype float32"),
            ("out", np.ones((2, 4, 8, 16), np.float16), TypeError, "out: expected dtype float32"),
        ],
    )
    def test_wrong_dtype(self, call, name, value, error, message):
        call[name] = value
        with pytest.raises(error, match=message):
            tilelab.flash_attention_backward(**call)

    def test_dbias_needs_a_bias(self, call):
        with pytest.raises(ValueError, match="return_dbias: expected False without a bias"):
            tilelab.flash_attention_backward(**call, return_dbias=True)

    def test_bias_shape(self, call):
        with pytest.raises(ValueError, match="bias: expected shape"):
            tilelab.flash_attention_backward(**call, bias=np.zeros((1, 1, 3, 12), np.float32))

    def test_scale(self, call):
        with pytest.raises(ValueError, match="scale: expected a finite value"):
            tilelab.flash_attention_backward(**call, scale=float("nan"))
