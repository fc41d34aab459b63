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
