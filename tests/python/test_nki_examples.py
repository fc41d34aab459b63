"""The NKI-language examples other than matmul and flash paged attention (tested beside the
language and the C++ kernel): outputs against fp64 numpy."""

import ml_dtypes
import numpy as np
import pytest
from nki_examples import load_example

import tilelab.nki as tn


@pytest.mark.parametrize(
    ("dtype", "d", "tolerance"),
    [(np.float32, 64, 1e-2), (ml_dtypes.bfloat16, 128, 3e-2), (np.float16, 32, 1e-2)],
)
def test_sd_attention(rng, dtype, d, tolerance):
    kernel = load_example("sd_attention").fused_self_attention
    bs, seq = 2, 384
    q = rng.standard_normal((bs, d, seq)).astype(dtype)
    k = rng.standard_normal((bs, seq, d)).astype(dtype)
    v = rng.standard_normal((bs, seq, d)).astype(dtype)
    out, report = tn.profile_kernel(kernel[bs], q, k, v)
    assert out.shape == (bs, seq, d) and out.dtype == np.dtype(dtype)
    scores = 0.125 * np.einsum("bds,btd->bst", q.astype(np.float64), k.astype(np.float64))
    p = np.exp(scores - scores.max(-1, keepdims=True))
    expected = (p / p.sum(-1, keepdims=True)) @ v.astype(np.float64)
    np.testing.assert_allclose(out.astype(np.float64), expected, atol=tolerance)
    engines = {e["name"]: e["instruction_count"] for e in report.engines}
    tiles = seq // 128
    # Per instance and query tile: QK, P transposes, P·V and one divisor transpose on TensorE.
    assert engines["tensor"] == bs * tiles * (3 * tiles + 1)
    assert len(tn.instances(report)) == bs


@pytest.mark.parametrize("rows", [1, 100, 128, 300])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_norms(rng, rows, dtype):
    norms = load_example("norms")
    cols = 200
    x = rng.standard_normal((rows, cols)).astype(dtype)
    g = rng.uniform(0.5, 1.5, cols).astype(dtype)
    b = rng.standard_normal(cols).astype(dtype)
    a, gw, bw = (v.astype(np.float64) for v in (x, g, b))
    tolerance = 1e-4 if dtype == np.float32 else 5e-2
    out = tn.simulate_kernel(norms.rmsnorm, x, g)
    expected = a / np.sqrt((a * a).mean(1, keepdims=True) + 1e-6) * gw
    np.testing.assert_allclose(out.astype(np.float64), expected, atol=tolerance, rtol=tolerance)
    out = tn.simulate_kernel(norms.layernorm, x, g, b)
    centered = a - a.mean(1, keepdims=True)
    expected = centered / np.sqrt((centered**2).mean(1, keepdims=True) + 1e-5) * gw + bw
    np.testing.assert_allclose(out.astype(np.float64), expected, atol=tolerance, rtol=tolerance)


def mamba_inputs(rng, batch, channels, seq_len, states):
    f32 = np.float32
    delta = rng.uniform(0.01, 0.3, (batch, channels, seq_len)).astype(f32)
    u = rng.standard_normal((batch, channels, seq_len)).astype(f32)
    a = -rng.uniform(0.5, 2.0, (channels, states)).astype(f32)
    b = rng.standard_normal((batch, states, seq_len)).astype(f32)
    c = rng.standard_normal((batch, states, seq_len)).astype(f32)
    return delta, u, a, b, c


@pytest.mark.parametrize(
    ("batch", "channels", "seq_len", "states"), [(1, 128, 1, 1), (2, 256, 96, 3)]
)
def test_mamba(rng, batch, channels, seq_len, states):
    mamba = load_example("mamba")
    inputs = mamba_inputs(rng, batch, channels, seq_len, states)
    expected = mamba.reference(*inputs)
    outputs = {}
    for name, kernel, kwargs in [
        ("v1", mamba.mamba_v1, {}),
        ("v2", mamba.mamba_v2, {}),
        ("v3", mamba.mamba_v3, {"seq_tile": 32 if seq_len % 32 == 0 else 1}),
    ]:
        out, report = tn.profile_kernel(kernel, *inputs, **kwargs)
        assert out.shape == (batch, channels, seq_len) and out.dtype == np.float32
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4, err_msg=name)
        outputs[name] = (out, report)
    # The three versions sum the states in the same order and carry the scan exactly (fp32)
    # across time tiles, so they agree bit for bit, as the tutorial checks.
    np.testing.assert_array_equal(outputs["v2"][0], outputs["v1"][0])
    np.testing.assert_array_equal(outputs["v3"][0], outputs["v1"][0])
    # One scan per (batch, channel tile, state[, time tile]); v1 loads delta and u per state,
    # v2 once per channel tile.
    tiles = batch * (channels // 128)
    loads = {name: r.dma_transfer_count for name, (_, r) in outputs.items()}
    assert loads["v1"] == loads["v2"] + 2 * tiles * (states - 1)
    engines = {e["name"]: e["instruction_count"] for e in outputs["v2"][1].engines}
    assert engines["tensor"] == 2 * tiles * states  # the B and C row broadcasts


def test_mamba_propagates_nan(rng):
    mamba = load_example("mamba")
    delta, u, a, b, c = mamba_inputs(rng, 1, 128, 16, 2)
    u[0, 5, 7] = np.nan
    out = tn.simulate_kernel(mamba.mamba_v2, delta, u, a, b, c)
    # NaN enters channel 5's scan at step 7 and stays; other channels are untouched.
    assert np.isnan(out[0, 5, 7:]).all() and not np.isnan(out[0, 5, :7]).any()
    assert not np.isnan(np.delete(out[0], 5, axis=0)).any()


def test_mamba_rejects_ragged_channels(rng):
    mamba = load_example("mamba")
    inputs = mamba_inputs(rng, 1, 100, 8, 1)
    with pytest.raises(AssertionError, match="multiple of 128"):
        tn.simulate_kernel(mamba.mamba_v2, *inputs)


@pytest.mark.parametrize(
    ("shape", "pool", "dtype"),
    [
        ((2, 6, 6), 2, np.float16),  # the tutorial's own example
        ((128, 12, 20), 2, np.float32),
        ((37, 10, 13), 3, np.float32),  # rows and columns past the last whole window
        ((5, 8, 8), 4, ml_dtypes.bfloat16),
        ((3, 5, 5), 1, np.float32),
    ],
)
def test_avgpool(rng, shape, pool, dtype):
    kernel = load_example("avgpool").avgpool2d
    x = rng.standard_normal(shape).astype(dtype)
    out, report = tn.profile_kernel(kernel, x, pool)
    c, h, w = shape
    ho, wo = h // pool, w // pool
    windows = x[:, : ho * pool, : wo * pool].astype(np.float64).reshape(c, ho, pool, wo, pool)
    expected = windows.mean(axis=(2, 4))
    assert out.shape == (c, ho, wo) and out.dtype == np.dtype(dtype)
    tolerance = 1e-5 if dtype == np.float32 else 2e-2
    np.testing.assert_allclose(out.astype(np.float64), expected, atol=tolerance, rtol=tolerance)
    # pool * pool window positions: a copy or pool² - 1 adds, then the division, on VectorE.
    engines = {e["name"]: e["instruction_count"] for e in report.engines}
    assert engines["vector"] == max(pool * pool - 1, 1) + 1


def test_avgpool_propagates_nan_and_inf(rng):
    kernel = load_example("avgpool").avgpool2d
    x = rng.standard_normal((4, 4, 4)).astype(np.float32)
    x[1, 0, 1] = np.nan
    x[2, 3, 3] = np.inf
    out = tn.simulate_kernel(kernel, x, 2)
    assert np.isnan(out[1, 0, 0]) and np.isposinf(out[2, 1, 1])
    assert np.isfinite(np.delete(out.reshape(4, 4), [4, 11])).all()


def test_avgpool_rejects_too_many_channels(rng):
    kernel = load_example("avgpool").avgpool2d
    with pytest.raises(tn.NkiError, match="pmax"):
        tn.simulate_kernel(kernel, np.ones((130, 4, 4), np.float32), 2)


@pytest.mark.parametrize(("rows", "cols"), [(1, 7), (300, 1100), (128, 512)])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_layernorm_with_bn_stats(rng, rows, cols, dtype):
    norms = load_example("norms")
    x = (3 * rng.standard_normal((rows, cols)) + 5).astype(dtype)
    g = rng.uniform(0.5, 1.5, cols).astype(dtype)
    b = rng.standard_normal(cols).astype(dtype)
    out, report = tn.profile_kernel(norms.layernorm_bn_stats, x, g, b)
    a = x.astype(np.float64)
    centered = a - a.mean(1, keepdims=True)
    expected = centered / np.sqrt((centered**2).mean(1, keepdims=True) + 1e-5) * g.astype(
        np.float64
    ) + b.astype(np.float64)
    tolerance = 2e-5 if dtype == np.float32 else 6e-2
    np.testing.assert_allclose(out.astype(np.float64), expected, atol=tolerance, rtol=tolerance)
    # One bn_stats per 512 columns and one bn_aggr per row tile, all on VectorE.
    tiles, chunks = -(-rows // 128), -(-cols // 512)

    def instructions(call: str) -> int:
        return next(line["instructions"] for line in report.by_line if call in line["text"])

    assert instructions("nisa.bn_stats(") == tiles * chunks
    assert instructions("nisa.bn_aggr(") == tiles
