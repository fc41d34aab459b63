"""The selective-scan core of a Mamba layer (the NKI tutorial "Fused Mamba"), in three versions
that differ only in loop order and tiling, in the NKI language.

For every batch b, channel c, state n and step t:
    deltaA[t]  = exp(delta[b, c, t] * A[c, n])
    deltaBu[t] = delta[b, c, t] * u[b, c, t] * B[b, n, t]
    h[t]       = deltaA[t] * h[t - 1] + deltaBu[t],   h[-1] = 0
    out[b, c, t] = sum over n of C[b, n, t] * h[t]

delta, u: (batch, channels, seq_len); A: (channels, state); B, C: (batch, state, seq_len); all
fp32. Channels go on partitions, 128 at a time; seq_len is the free axis. The recurrence is one
VectorE instruction per tile (nisa.tensor_tensor_scan), and the B / C rows are broadcast to the
128 partitions on TensorE.

- mamba_v1: states outside channel tiles, so delta and u are loaded again for every state.
- mamba_v2: channel tiles outside states: delta and u are loaded once per channel tile.
- mamba_v3: v2 with the time axis cut into seq_tile steps; the scan carries its last column
  into the next step through `initial`.
"""

import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
import numpy as np
from neuronxcc import nki


def _state_step(delta_t, u_t, a_column, b_row, c_row, initial):
    """C * scan(exp(delta * A), delta * u * B) for one state over one [128, n] time span."""
    rows, n = delta_t.shape
    decay = nisa.activation(op=nl.exp, data=delta_t, scale=a_column)
    drive = nisa.tensor_tensor(delta_t, u_t, op=nl.multiply)
    drive = nisa.tensor_tensor(drive, b_row.broadcast_to((rows, n)), op=nl.multiply)
    state = nisa.tensor_tensor_scan(decay, drive, initial=initial, op0=np.multiply, op1=np.add)
    weighted = nisa.tensor_tensor(state, c_row.broadcast_to((rows, n)), op=nl.multiply)
    return state, weighted


def _shapes(delta, A):
    batch, channels, seq_len = delta.shape
    states = A.shape[1]
    assert channels % 128 == 0, "channels must be a multiple of 128"
    return batch, channels // 128, seq_len, states


@nki.jit
def mamba_v1(delta, u, A, B, C):
    batch, channel_tiles, seq_len, states = _shapes(delta, A)
    out = nl.ndarray(delta.shape, dtype=delta.dtype, buffer=nl.shared_hbm)
    for b in nl.affine_range(batch):
        total = nl.zeros((channel_tiles, nl.par_dim(128), seq_len), dtype=delta.dtype)
        for n in nl.affine_range(states):
            for c in nl.affine_range(channel_tiles):
                rows = slice(c * 128, (c + 1) * 128)
                delta_t = nl.load(delta[b, rows, 0:seq_len])
                a_column = nl.load(A[rows, n])
                u_t = nl.load(u[b, rows, 0:seq_len])
                b_row = nl.load(B[b, n : n + 1, 0:seq_len])
                c_row = nl.load(C[b, n : n + 1, 0:seq_len])
                _, weighted = _state_step(delta_t, u_t, a_column, b_row, c_row, 0.0)
                total[c, 0:128, 0:seq_len] += weighted
        for c in nl.affine_range(channel_tiles):
            nl.store(out[b, c * 128 : (c + 1) * 128, 0:seq_len], total[c, 0:128, 0:seq_len])
    return out


@nki.jit
def mamba_v2(delta, u, A, B, C):
    batch, channel_tiles, seq_len, states = _shapes(delta, A)
    out = nl.ndarray(delta.shape, dtype=delta.dtype, buffer=nl.shared_hbm)
    for b in nl.affine_range(batch):
        for c in nl.affine_range(channel_tiles):
            rows = slice(c * 128, (c + 1) * 128)
            total = nl.zeros((nl.par_dim(128), seq_len), dtype=delta.dtype)
            delta_t = nl.load(delta[b, rows, 0:seq_len])
            u_t = nl.load(u[b, rows, 0:seq_len])
            for n in nl.affine_range(states):
                a_column = nl.load(A[rows, n])
                b_row = nl.load(B[b, n : n + 1, 0:seq_len])
                c_row = nl.load(C[b, n : n + 1, 0:seq_len])
                _, weighted = _state_step(delta_t, u_t, a_column, b_row, c_row, 0.0)
                total[0:128, 0:seq_len] += weighted
            nl.store(out[b, rows, 0:seq_len], total[0:128, 0:seq_len])
    return out


@nki.jit
def mamba_v3(delta, u, A, B, C, seq_tile=512):
    batch, channel_tiles, seq_len, states = _shapes(delta, A)
    assert seq_len % seq_tile == 0, "seq_len must be a multiple of seq_tile"
    out = nl.ndarray(delta.shape, dtype=delta.dtype, buffer=nl.shared_hbm)
    for b in nl.affine_range(batch):
        for c in nl.affine_range(channel_tiles):
            rows = slice(c * 128, (c + 1) * 128)
            total = nl.zeros((nl.par_dim(128), seq_len), dtype=delta.dtype)
            delta_t = nl.load(delta[b, rows, 0:seq_len])
            u_t = nl.load(u[b, rows, 0:seq_len])
            for n in nl.affine_range(states):
                a_column = nl.load(A[rows, n])
                carry = nl.zeros((128, 1), dtype=delta.dtype)
                for s in nl.static_range(seq_len // seq_tile):
                    span = slice(s * seq_tile, (s + 1) * seq_tile)
                    b_row = nl.load(B[b, n : n + 1, span])
                    c_row = nl.load(C[b, n : n + 1, span])
                    state, weighted = _state_step(
                        delta_t[0:128, span], u_t[0:128, span], a_column, b_row, c_row, carry
                    )
                    carry[...] = state[0:128, seq_tile - 1]
                    total[0:128, span] += weighted
            nl.store(out[b, rows, 0:seq_len], total[0:128, 0:seq_len])
    return out


def reference(delta, u, A, B, C):
    """The same computation in float64 numpy, for tests."""
    delta, u, A, B, C = (np.asarray(x, dtype=np.float64) for x in (delta, u, A, B, C))
    decay = np.exp(delta[:, :, None, :] * A[None, :, :, None])  # (batch, channels, state, seq)
    drive = (delta * u)[:, :, None, :] * B[:, None, :, :]
    state = np.zeros(decay.shape[:3])
    out = np.zeros(delta.shape)
    for t in range(delta.shape[2]):
        state = decay[..., t] * state + drive[..., t]
        out[:, :, t] = np.einsum("bcn,bn->bc", state, C[:, :, t])
    return out
