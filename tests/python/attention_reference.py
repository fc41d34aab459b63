"""fp64 numpy reference for flash attention, and helpers shared by the attention tests."""

from __future__ import annotations

import ml_dtypes
import numpy as np

DTYPES = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}

# The three masks every attention test covers, as keyword arguments.
MASKS = {
    "full": dict(causal=False),
    "causal_top_left": dict(causal=True, causal_alignment="top_left"),
    "causal_bottom_right": dict(causal=True, causal_alignment="bottom_right"),
}

# Unit roundoff (half an ulp at 1) of each dtype's significand.
UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}


def random_qkv(rng, batch, q_heads, kv_heads, q_len, kv_len, head_dim, dtype):
    """q [B, Hq, M, D], k and v [B, Hkv, N, D] of `dtype`, standard normal."""
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    q = rng.standard_normal((batch, q_heads, q_len, head_dim), dtype=np.float32).astype(dtype)
    k = rng.standard_normal((batch, kv_heads, kv_len, head_dim), dtype=np.float32).astype(dtype)
    v = rng.standard_normal((batch, kv_heads, kv_len, head_dim), dtype=np.float32).astype(dtype)
    return q, k, v


def reference_attention(q, k, v, *, causal=False, causal_alignment="top_left", scale=None,
                        bias=None):
    """(out, lse) in float64: softmax(scale * q k^T + bias, masked) v, per the tilelab contract.

    A fully masked row gives out 0 and lse -inf.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    _, q_heads, q_len, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    group = q_heads // kv_heads
    k = np.repeat(k, group, axis=1)  # query head h reads kv head h // group
    v = np.repeat(v, group, axis=1)
    scale = 1.0 / np.sqrt(head_dim) if scale is None else float(scale)
    scores = scale * np.einsum("bhmd,bhnd->bhmn", q, k)
    if bias is not None:
        scores = scores + np.asarray(bias, dtype=np.float64)
    if causal:
        offset = 0 if causal_alignment == "top_left" else kv_len - q_len
        visible = np.arange(kv_len)[None, :] <= np.arange(q_len)[:, None] + offset
        scores = np.where(visible, scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True)
    masked_row = ~np.isfinite(row_max)
    safe_max = np.where(masked_row, 0.0, row_max)
    weights = np.exp(scores - safe_max)
    row_sum = weights.sum(axis=-1, keepdims=True)
    out = np.einsum("bhmn,bhnd->bhmd", weights, v) / np.where(masked_row, 1.0, row_sum)
    out = np.where(masked_row, 0.0, out)
    with np.errstate(divide="ignore"):
        lse = np.where(masked_row, -np.inf, safe_max + np.log(row_sum))[..., 0]
    return out, lse


def output_tolerance(dtype_name, v, kv_len):
    """Absolute tolerance on out.

    Rounding the result to the output dtype costs one unit roundoff of |out| <= max|v|; the
    generated kernels may also round P to the input dtype before P·V (one more). fp32
    accumulation over N keys adds about sqrt(N) fp32 roundoffs; 16 covers exp and the
    online-softmax rescaling. (Measured with the reference implementation: float32 errors reach 4%
    of this, float16 and bfloat16 about 25%.)
    """
    magnitude = float(np.max(np.abs(np.asarray(v, dtype=np.float64)), initial=1.0))
    accumulation = 16 * UNIT_ROUNDOFF["float32"] * np.sqrt(kv_len)
    return magnitude * (2 * UNIT_ROUNDOFF[dtype_name] + accumulation)


def lse_tolerance(head_dim, kv_len):
    """Absolute tolerance on lse (fp32 everywhere): scores accumulate D fp32 products, the log-sum
    N terms; 16 roundoffs per sqrt(term) as for out (measured: under 5% of this)."""
    return 16 * UNIT_ROUNDOFF["float32"] * (np.sqrt(head_dim) + np.sqrt(kv_len))


def assert_attention_close(out, reference_out, dtype_name, v, kv_len):
    out64 = np.asarray(out, dtype=np.float64)
    assert out64.shape == reference_out.shape
    assert np.all(np.isfinite(out64)), "out has NaN or inf"
    error = np.max(np.abs(out64 - reference_out), initial=0.0)
    tolerance = output_tolerance(dtype_name, v, kv_len)
    assert error <= tolerance, f"max |out - reference| = {error:.3g} > {tolerance:.3g}"


def assert_lse_close(lse, reference_lse, head_dim, kv_len):
    assert lse.dtype == np.float32
    assert lse.shape == reference_lse.shape
    masked = np.isneginf(reference_lse)
    assert np.array_equal(np.isneginf(lse), masked), "lse is -inf exactly on fully masked rows"
    error = np.max(np.abs(lse[~masked].astype(np.float64) - reference_lse[~masked]), initial=0.0)
    tolerance = lse_tolerance(head_dim, kv_len)
    assert error <= tolerance, f"max |lse - reference| = {error:.3g} > {tolerance:.3g}"


def reference_attention_backward(dout, q, k, v, *, causal=False, causal_alignment="top_left",
                                 scale=None, bias=None):
    """(dq, dk, dv, dbias) in float64: the analytic gradients of reference_attention's out.

    dk and dv of a kv head sum over the query heads of its group; dbias has the bias's shape
    (summed over its broadcast dims), or None without a bias. Masked pairs contribute nothing.
    """
    dout = np.asarray(dout, dtype=np.float64)
    q64 = np.asarray(q, dtype=np.float64)
    k64 = np.asarray(k, dtype=np.float64)
    v64 = np.asarray(v, dtype=np.float64)
    batch, q_heads, q_len, head_dim = q64.shape
    kv_heads, kv_len = k64.shape[1], k64.shape[2]
    group = q_heads // kv_heads
    scale = 1.0 / np.sqrt(head_dim) if scale is None else float(scale)
    out, lse = reference_attention(q, k, v, causal=causal, causal_alignment=causal_alignment,
                                   scale=scale, bias=bias)
    k_rep = np.repeat(k64, group, axis=1)
    v_rep = np.repeat(v64, group, axis=1)
    scores = scale * np.einsum("bhmd,bhnd->bhmn", q64, k_rep)
    if bias is not None:
        scores = scores + np.asarray(bias, dtype=np.float64)
    visible = np.ones((q_len, kv_len), dtype=bool)
    if causal:
        offset = 0 if causal_alignment == "top_left" else kv_len - q_len
        visible = np.arange(kv_len)[None, :] <= np.arange(q_len)[:, None] + offset
    visible = visible & (scores != -np.inf)
    with np.errstate(invalid="ignore"):
        prob = np.where(visible, np.exp(np.where(visible, scores, 0.0) - lse[..., None]), 0.0)
    dv = np.einsum("bhmn,bhmd->bhnd", prob, dout)
    dprob = np.einsum("bhmd,bhnd->bhmn", dout, v_rep)
    delta = np.sum(dout * out, axis=-1, keepdims=True)
    dscore = np.where(prob == 0.0, 0.0, prob * (dprob - delta))
    dq = scale * np.einsum("bhmn,bhnd->bhmd", dscore, k_rep)
    dk = scale * np.einsum("bhmn,bhmd->bhnd", dscore, q64)
    dk = dk.reshape(batch, kv_heads, group, kv_len, head_dim).sum(axis=2)
    dv = dv.reshape(batch, kv_heads, group, kv_len, head_dim).sum(axis=2)
    dbias = None
    if bias is not None:
        axes = tuple(a for a in range(3) if np.shape(bias)[a] == 1)
        dbias = dscore.sum(axis=axes, keepdims=True)
    return dq, dk, dv, dbias


# Test data of the score options (docs/attention_options.md) for 6 query heads: each option alone
# and all together.
SLOPES = (2.0 ** -np.arange(1, 7)).astype(np.float32)
SINKS = np.array([0.5, -1.0, 3.0, -np.inf, 0.0, 1.5], np.float32)
SCORE_OPTIONS = {
    "softcap": dict(softcap=1.7),
    "alibi": dict(alibi_slopes=SLOPES),
    "window": dict(sliding_window=(11, -1)),
    "window_both": dict(sliding_window=(5, 7)),
    "sinks": dict(sinks=SINKS),
    "all": dict(softcap=4.0, alibi_slopes=SLOPES, sliding_window=(20, 3), sinks=SINKS),
}


def visible_keys(q_len, kv_len, causal, causal_alignment, sliding_window):
    """(i, j, visible): query positions (row + N - M for bottom_right, row for top_left), key
    positions, and the [M, N] mask of causality and the window."""
    i = np.arange(q_len) + (kv_len - q_len if causal_alignment == "bottom_right" else 0)
    j = np.arange(kv_len)
    visible = np.ones((q_len, kv_len), bool)
    if causal:
        visible &= j[None, :] <= i[:, None]
    left, right = sliding_window
    if left >= 0:
        visible &= j[None, :] >= i[:, None] - left
    if right >= 0:
        visible &= j[None, :] <= i[:, None] + right
    return i, j, visible


def central_differences(loss, arrays, step=1e-6):
    """d loss / d array for each of `arrays` (float64, perturbed in place and restored) by
    central differences; loss takes the arrays as arguments."""
    gradients = []
    for array in arrays:
        numeric = np.zeros_like(array)
        for position in np.ndindex(array.shape):
            saved = array[position]
            array[position] = saved + step
            plus = loss(*arrays)
            array[position] = saved - step
            minus = loss(*arrays)
            array[position] = saved
            numeric[position] = (plus - minus) / (2 * step)
        gradients.append(numeric)
    return gradients


def option_scores(q, k, scale, softcap, slope, i, j):
    """(scores, d scores / d (scale * q.k)) of one head, [M, N] in float64: scale * q k^T, then
    the softcap (whose derivative is 1 - tanh^2) and ALiBi's slope * (j - i), unmasked."""
    s = scale * (q @ k.T)
    derivative = np.ones_like(s)
    if softcap > 0:
        t = np.tanh(s / softcap)
        s = softcap * t
        derivative = 1.0 - t * t
    if slope is not None:
        s = s + float(slope) * (j[None, :] - i[:, None])
    return s, derivative


def reference_options(q, k, v, *, causal=False, causal_alignment="top_left", scale=None,
                      sliding_window=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None,
                      k_scale=1.0, v_scale=1.0, fp32_probabilities=False):
    """(out, lse) in float64 by the documented formulas (fp32_probabilities changes only the
    kernels' rounding); positions i = row + (N - M) for bottom_right, row for top_left."""
    q = np.asarray(q, np.float64)
    k = np.asarray(k, np.float64) * k_scale
    v = np.asarray(v, np.float64) * v_scale
    batch, q_heads, q_len, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    group = q_heads // kv_heads
    scale = float(np.float32(1) / np.sqrt(np.float32(head_dim))) if scale is None else scale
    i, j, visible = visible_keys(q_len, kv_len, causal, causal_alignment, sliding_window)
    out = np.zeros_like(q)
    lse = np.full((batch, q_heads, q_len), -np.inf)
    for b in range(batch):
        for h in range(q_heads):
            s, _ = option_scores(q[b, h], k[b, h // group], scale, softcap,
                                 None if alibi_slopes is None else alibi_slopes[h], i, j)
            s = np.where(visible, s, -np.inf)
            m = s.max(axis=1)
            if sinks is not None:
                m = np.maximum(m, float(sinks[h]))
            # No term in the denominator: 0 and -inf for a row that sees no key, NaN (0/0) for
            # one whose visible scores are all -inf.
            empty = np.isneginf(m)
            all_minus_inf = empty & visible.any(axis=1)
            safe = np.where(empty, 0.0, m)
            p = np.where(visible, np.exp(s - safe[:, None]), 0.0)
            denominator = p.sum(axis=1)
            if sinks is not None:
                denominator = denominator + np.exp(float(sinks[h]) - safe)
            weighted = (p @ v[b, h // group]) / np.where(empty, 1.0, denominator)[:, None]
            out[b, h] = np.where(empty[:, None], 0.0, weighted)
            out[b, h][all_minus_inf] = np.nan
            with np.errstate(divide="ignore"):
                lse[b, h] = np.where(empty, -np.inf, safe + np.log(denominator))
            lse[b, h][all_minus_inf] = np.nan
    return out, lse


def reference_options_backward(dout, q, k, v, *, causal=False, causal_alignment="top_left",
                               scale=None, sliding_window=(-1, -1), softcap=0.0,
                               alibi_slopes=None, sinks=None, fp32_probabilities=False):
    """(dq, dk, dv, dsinks) in float64: the analytic gradients of reference_options' out
    (docs/attention_options.md; fp32_probabilities changes only the kernels' rounding). The
    softcap's derivative 1 - tanh^2 carries dS back to scale * q.k; ALiBi and the window change
    P only; dsinks[h] = -sum over rows of e^(sink - lse) * rowsum(dout * out) (None without
    sinks). Masked pairs contribute nothing."""
    out, lse = reference_options(q, k, v, causal=causal, causal_alignment=causal_alignment,
                                 scale=scale, sliding_window=sliding_window, softcap=softcap,
                                 alibi_slopes=alibi_slopes, sinks=sinks)
    dout = np.asarray(dout, np.float64)
    q = np.asarray(q, np.float64)
    k = np.asarray(k, np.float64)
    v = np.asarray(v, np.float64)
    batch, q_heads, q_len, head_dim = q.shape
    kv_len = k.shape[2]
    group = q_heads // k.shape[1]
    scale = float(np.float32(1) / np.sqrt(np.float32(head_dim))) if scale is None else scale
    i, j, visible = visible_keys(q_len, kv_len, causal, causal_alignment, sliding_window)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    dsinks = None if sinks is None else np.zeros(q_heads)
    delta = np.sum(dout * out, axis=-1)
    for b in range(batch):
        for h in range(q_heads):
            hk = h // group
            s, derivative = option_scores(q[b, h], k[b, hk], scale, softcap,
                                          None if alibi_slopes is None else alibi_slopes[h], i, j)
            row_lse = lse[b, h][:, None]
            with np.errstate(invalid="ignore", over="ignore"):
                p = np.where(visible, np.exp(np.where(visible, s, 0.0) - row_lse), 0.0)
            dv[b, hk] += p.T @ dout[b, h]
            dp = dout[b, h] @ v[b, hk].T
            ds = np.where(p == 0.0, 0.0, p * (dp - delta[b, h][:, None])) * derivative
            dq[b, h] = scale * (ds @ k[b, hk])
            dk[b, hk] += scale * (ds.T @ q[b, h])
            if sinks is not None:
                seen = ~np.isneginf(lse[b, h])  # a row that sees no key adds nothing
                dsinks[h] -= np.sum(np.exp(float(sinks[h]) - lse[b, h][seen]) * delta[b, h][seen])
    return dq, dk, dv, dsinks
