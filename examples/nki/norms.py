"""RMSNorm and LayerNorm over the rows of a matrix (the NKI tutorials "RMSNorm" and
"LayerNorm"), in the NKI language.

rmsnorm:   out = x / sqrt(mean(x²) + eps) · g
layernorm: out = (x - mean(x)) / sqrt(var(x) + eps) · gamma + beta
x is (rows, cols), g / gamma / beta are (cols,). Rows go on partitions 128 at a time; the last
tile is cut with a mask, so any row count works. The weights are broadcast to every partition
once (a ones-vector matmul on TensorE, as the compiler does it). layernorm_bn_stats is the
tutorial's second version, with VectorE's bn_stats / bn_aggr statistics.
"""

import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
import numpy as np
from neuronxcc import nki


def broadcast_row(weights, cols):
    """A (cols,) HBM vector as a [128, cols] SBUF tile."""
    row = nl.load(weights.reshape((1, cols)))
    return row.broadcast_to((128, cols))


@nki.jit
def rmsnorm(x, g, eps=1e-6):
    rows, cols = x.shape
    out = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    g_all = broadcast_row(g, cols)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(cols)[None, :]
    for r in nl.affine_range((rows + 127) // 128):
        keep = r * 128 + i_p < rows
        t = nl.load(x[r * 128 + i_p, i_f], mask=keep)
        mean_square = nl.mean(nl.square(t, mask=keep), axis=1, mask=keep)
        inverse = nl.rsqrt(nl.add(mean_square, eps, mask=keep), mask=keep)
        normed = nl.multiply(t, inverse, mask=keep)
        nl.store(out[r * 128 + i_p, i_f], value=nl.multiply(normed, g_all, mask=keep), mask=keep)
    return out


@nki.jit
def layernorm(x, gamma, beta, eps=1e-5):
    rows, cols = x.shape
    out = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    gamma_all = broadcast_row(gamma, cols)
    beta_all = broadcast_row(beta, cols)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(cols)[None, :]
    for r in nl.affine_range((rows + 127) // 128):
        keep = r * 128 + i_p < rows
        t = nl.load(x[r * 128 + i_p, i_f], mask=keep)
        mean = nl.mean(t, axis=1, mask=keep)
        centered = nl.subtract(t, mean, mask=keep)
        variance = nl.mean(nl.square(centered, mask=keep), axis=1, mask=keep)
        inverse = nl.rsqrt(nl.add(variance, eps, mask=keep), mask=keep)
        normed = nl.multiply(centered, inverse, mask=keep)
        scaled = nl.multiply(normed, gamma_all, mask=keep)
        nl.store(out[r * 128 + i_p, i_f], value=nl.add(scaled, beta_all, mask=keep), mask=keep)
    return out


@nki.jit
def layernorm_bn_stats(x, gamma, beta, eps=1e-5):
    """LayerNorm with the statistics from VectorE's bn_stats / bn_aggr (the tutorial's second
    version): bn_stats per chunk of at most bn_stats_fmax columns, one bn_aggr over the chunks,
    then one tensor_scalar for (x - mean) * rsqrt(var + eps)."""
    rows, cols = x.shape
    out = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    gamma_all = broadcast_row(gamma, cols)
    beta_all = broadcast_row(beta, cols)
    fmax = nl.tile_size.bn_stats_fmax
    chunks = (cols + fmax - 1) // fmax
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(cols)[None, :]
    for r in nl.affine_range((rows + 127) // 128):
        keep = r * 128 + i_p < rows
        t = nl.load(x[r * 128 + i_p, i_f], mask=keep)
        stats = nl.ndarray((128, 6 * chunks), dtype=nl.float32, buffer=nl.sbuf)
        for c in nl.affine_range(chunks):
            columns = slice(c * fmax, min(cols, (c + 1) * fmax))
            stats[i_p, c * 6 + nl.arange(6)[None, :]] = nisa.bn_stats(
                t[i_p, columns], mask=keep, dtype=nl.float32
            )
        mean_var = nisa.bn_aggr(stats, mask=keep)
        inverse = nl.rsqrt(nl.add(mean_var[:, 1:2], eps, mask=keep), mask=keep)
        normed = nisa.tensor_scalar(
            t, np.subtract, mean_var[:, 0:1], op1=np.multiply, operand1=inverse, mask=keep
        )
        scaled = nl.multiply(normed, gamma_all, mask=keep)
        nl.store(out[r * 128 + i_p, i_f], value=nl.add(scaled, beta_all, mask=keep), mask=keep)
    return out
