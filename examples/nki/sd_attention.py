"""Fused self-attention for Stable Diffusion's small head sizes (the NKI tutorial "fused
self-attention"; nki-samples' fused_self_attn_for_SD_small_head_size), in the NKI language.

out[b] = softmax(0.125 · q[b]ᵀ k[b]ᵀ) v[b] with q (bs, d, seq), k (bs, seq, d), v (bs, seq, d)
and out (bs, seq, d), d <= 128. One 128-row strip of queries at a time: the scores of the strip
against every key stay in SBUF (a full 4096² score matrix would not fit), and the division by the
row sum waits until after the P·V matmuls. TensorE inputs are bf16 (mixed precision); the
other intermediates keep the IO dtype. The SPMD grid is [bs].
"""

import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
import numpy as np
from neuronxcc import nki

TILE = 128


@nki.jit
def fused_self_attention(q, k, v, scale=0.125):
    bs, d, seq = q.shape
    assert d <= TILE and seq % TILE == 0
    kernel_dtype = q.dtype
    pe_dtype = nl.bfloat16
    b = nl.program_id(0)
    tiles = seq // TILE
    out = nl.ndarray((bs, seq, d), dtype=q.dtype, buffer=nl.shared_hbm)

    # V with keys on partitions; Q scaled, d on partitions; K transposed while loading.
    v_local = nl.ndarray((tiles, nl.par_dim(TILE), d), dtype=pe_dtype, buffer=nl.sbuf)
    q_local = nl.ndarray((tiles, nl.par_dim(d), TILE), dtype=pe_dtype, buffer=nl.sbuf)
    k_local = nl.ndarray((tiles, nl.par_dim(d), TILE), dtype=pe_dtype, buffer=nl.sbuf)
    for t in nl.affine_range(tiles):
        v_local[t, :, :] = nl.load(v[b, t * TILE : (t + 1) * TILE, :], dtype=pe_dtype)
    for t in nl.affine_range(tiles):
        q_raw = nl.load(q[b, :, t * TILE : (t + 1) * TILE])
        q_local[t, :, :] = nl.multiply(q_raw, scale, dtype=pe_dtype)
    for t in nl.affine_range(tiles):
        k_local[t, :, :] = nl.load_transpose2d(k[b, t * TILE : (t + 1) * TILE, :], dtype=pe_dtype)

    for i in nl.affine_range(tiles):
        scores = nl.ndarray((TILE, seq), dtype=kernel_dtype, buffer=nl.sbuf)
        neg_max = nl.ndarray((TILE, tiles), dtype=kernel_dtype, buffer=nl.sbuf)
        for j in nl.affine_range(tiles):
            qk = nl.ndarray((TILE, TILE), dtype=nl.float32, buffer=nl.psum)
            qk[...] = nisa.nc_matmul(q_local[i, :, :], k_local[j, :, :])
            scores[:, j * TILE : (j + 1) * TILE] = nl.copy(qk, dtype=kernel_dtype)
            neg_max[:, j : j + 1] = nisa.tensor_reduce(
                np.max, scores[:, j * TILE : (j + 1) * TILE], axis=(1,), negate=True
            )
        row_neg_max = nisa.tensor_reduce(np.min, neg_max, axis=(1,))
        exps = nl.ndarray((TILE, seq), dtype=kernel_dtype, buffer=nl.sbuf)
        exps[...] = nisa.activation(op=nl.exp, data=scores, bias=row_neg_max)
        row_sum = nisa.tensor_reduce(np.add, exps, axis=(1,))
        probabilities = nl.ndarray((TILE, seq), dtype=pe_dtype, buffer=nl.sbuf)
        probabilities[...] = nl.copy(exps, dtype=pe_dtype)
        divisor = nl.ndarray((TILE, d), dtype=kernel_dtype, buffer=nl.sbuf)
        divisor[...] = nl.copy(nl.reciprocal(row_sum).broadcast_to((TILE, d)))

        transposed = nl.ndarray((tiles, nl.par_dim(TILE), TILE), dtype=pe_dtype, buffer=nl.sbuf)
        for j in nl.affine_range(tiles):
            transposed[j, :, :] = nisa.nc_transpose(probabilities[:, j * TILE : (j + 1) * TILE])
        pv = nl.zeros((d, TILE), dtype=nl.float32, buffer=nl.psum)
        for j in nl.affine_range(tiles):
            pv += nisa.nc_matmul(v_local[j, :, :], transposed[j, :, :])
        attention = nl.ndarray((d, TILE), dtype=kernel_dtype, buffer=nl.sbuf)
        attention[...] = nl.copy(pv, dtype=kernel_dtype)
        divisor_t = nisa.nc_transpose(divisor)
        result = nl.ndarray((d, TILE), dtype=kernel_dtype, buffer=nl.sbuf)
        result[...] = nl.multiply(attention, divisor_t)
        # d on partitions: each partition writes one element of every output row.
        i_p = nl.arange(d)[:, None]
        i_f = nl.arange(TILE)[None, :]
        nl.store(out[b, i * TILE + i_f, i_p], value=result)
    return out
