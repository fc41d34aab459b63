"""Flash paged attention in the NKI language: prefix prefill with a paged KV cache, block tables
and continuous batching through a mask, as vLLM's NKI kernel (vllm/attention/ops/
nki_flash_attn.py, flash_paged_attention) computes it.

The kernel takes that kernel's arrays: query (1, n_heads, d, seq_q), key (1, n_kv_heads, d,
seq_q), value (1, n_kv_heads, seq_q, d), kv_cache (2, num_blocks, n_kv_heads, block_size, d),
block_tables (num_active_blocks,) int32 and mask (seq_q, context + seq_q) uint8 with its context
columns in the kernel's order (tilelab.nki.reorder_context_mask). It returns the output
(1, n_heads, seq_q, d).

Its instruction sequence is the one tilelab's C++ simulator kernel builds
(sim/kernels/flash_paged_attention.cpp): the block-table transform for vectorized K/V gathers
(with the block-size tiling trick), PE transposes grouped per PSUM bank, the running-max flash
core per query tile and head, and the causal tile of the new tokens with whole score pieces
above the diagonal skipped. Tiles declared once outside the loops are single-buffered; tiles
declared inside them are double-buffered, as the C++ kernel's pools are.
"""

import math

import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
import numpy as np
from neuronxcc import nki

B_P_SIZE = 128  # query rows per tile = SBUF partitions
B_F_SIZE = 512  # score columns per matmul = one PSUM bank of fp32
MASKED = -9984.0  # the score of a masked key (finite: a fully masked row stays finite)


def reduction_tile(columns):
    return min(2048, columns // 2)


def transpose_chunks(dst, dst_rows, sources, piece, per_bank, psum=None):
    """dst[0:dst_rows, j*piece:(j+1)*piece] = sources[j]^T: PE transposes grouped per PSUM bank,
    each bank evicted on ScalarE in one copy. `psum`: a bank to reuse (else one per group)."""
    for first in range(0, len(sources), per_bank):
        group = sources[first : first + per_bank]
        bank = (
            psum
            if psum is not None
            else nl.ndarray((B_P_SIZE, B_F_SIZE), nl.float32, buffer=nl.psum)
        )
        for j, source in enumerate(group):
            rows = source.shape[0]
            bank[0:dst_rows, j * piece : j * piece + rows] = nisa.nc_transpose(source)
        dst[0:dst_rows, first * piece : (first + len(group)) * piece] = nisa.tensor_copy(
            bank[0:dst_rows, 0 : len(group) * piece], engine=nisa.scalar_engine
        )


def load_query(query, head, col0, scale, kernel_dtype, d):
    raw = nl.ndarray((d, B_P_SIZE), dtype=query.dtype, buffer=nl.sbuf)
    raw[0:d, 0:B_P_SIZE] = nl.load(query[0, head, :, col0 : col0 + B_P_SIZE])
    source = raw
    if query.dtype != kernel_dtype:
        cast = nl.ndarray((d, B_P_SIZE), dtype=kernel_dtype, buffer=nl.sbuf)
        cast[...] = nisa.tensor_copy(raw, engine=nisa.scalar_engine)
        source = cast
    q = nl.ndarray((d, B_P_SIZE), dtype=kernel_dtype, buffer=nl.sbuf)
    q[...] = nisa.activation(op=nl.copy, data=source, scale=scale)
    return q


def flash_core(q, k_t, v, mask, acc, tile, sizes, kernel_dtype, acc_dtype):
    """One key tile against one query tile and head: scores, masked fill, the running maximum,
    exp with fused row sums, P transposed, P·V, and the merge into acc = (o, lse, m) (lse holds
    m + log(row sum))."""
    o, lse, m = acc
    d = o.shape[1]
    keys, score_tile, rows, reduction = (
        tile["keys"],
        tile["score_tile"],
        tile["rows"],
        tile["reduction"],
    )
    pieces = keys // score_tile
    qk_res = nl.ndarray((B_P_SIZE, sizes["keys"]), dtype=acc_dtype, buffer=nl.sbuf)
    max_local = nl.ndarray((B_P_SIZE, sizes["pieces"]), dtype=acc_dtype, buffer=nl.sbuf)
    for k in nl.affine_range(pieces):
        columns = slice(k * score_tile, (k + 1) * score_tile)
        if tile["causal"] and tile["query_row0"] + B_P_SIZE <= k * score_tile:
            qk_res[:, columns] = nisa.memset((B_P_SIZE, score_tile), MASKED, acc_dtype)
        else:
            qk_psum = nl.ndarray((B_P_SIZE, B_F_SIZE), nl.float32, buffer=nl.psum)
            qk_psum[:, 0:score_tile] = nisa.nc_matmul(q, k_t[0:d, columns])
            qk_res[:, columns] = nl.where(mask[:, columns], qk_psum[:, 0:score_tile], MASKED)
        max_local[:, k : k + 1] = nl.max(qk_res[:, columns], axis=1)

    stats = nl.ndarray((B_P_SIZE, 8), dtype=acc_dtype, buffer=nl.sbuf)
    tile_max, prev_max, neg_max = stats[:, 0:1], stats[:, 1:2], stats[:, 2:3]
    alpha, row_sum, log_tmp = stats[:, 3:4], stats[:, 4:5], stats[:, 5:6]
    stats[:, 0:1] = nl.max(max_local[:, 0:pieces], axis=1)
    if tile["initialize"]:
        m[...] = nl.copy(tile_max)
    else:
        stats[:, 1:2] = nl.copy(m)
        m[...] = nl.maximum(prev_max, tile_max)
    stats[:, 2:3] = nl.multiply(m, -1.0)
    if not tile["initialize"]:
        stats[:, 3:4] = nisa.activation(op=nl.exp, data=prev_max, bias=neg_max)
        o_scaled = nl.ndarray((B_P_SIZE, d), dtype=acc_dtype, buffer=nl.sbuf)
        o_scaled[...] = nl.multiply(o, alpha)

    p_local = nl.ndarray((B_P_SIZE, sizes["keys"]), dtype=kernel_dtype, buffer=nl.sbuf)
    partial = nl.ndarray((B_P_SIZE, sizes["reductions"]), dtype=acc_dtype, buffer=nl.sbuf)
    reductions = keys // reduction
    for r in nl.affine_range(reductions):
        columns = slice(r * reduction, (r + 1) * reduction)
        p_local[:, columns] = nisa.activation_reduce(
            op=nl.exp,
            data=qk_res[:, columns],
            bias=neg_max,
            reduce_op=np.add,
            reduce_res=partial[:, r : r + 1],
        )
    stats[:, 4:5] = nl.sum(partial[:, 0:reductions], axis=1)

    chunks = keys // rows
    p_t = nl.ndarray((B_P_SIZE, sizes["chunks"] * B_P_SIZE), dtype=kernel_dtype, buffer=nl.sbuf)
    sources = [p_local[:, j * rows : (j + 1) * rows] for j in range(chunks)]
    transpose_chunks(p_t, rows, sources, B_P_SIZE, max(1, min(B_F_SIZE, score_tile) // B_P_SIZE))

    pv = nl.zeros((B_P_SIZE, d), nl.float32, buffer=nl.psum)
    for j in nl.affine_range(chunks):
        pv[...] += nisa.nc_matmul(
            p_t[0:rows, j * B_P_SIZE : (j + 1) * B_P_SIZE], v[0:rows, j * d : (j + 1) * d]
        )

    if tile["initialize"]:
        o[...] = nl.copy(pv)
        stats[:, 5:6] = nl.log(row_sum)
        lse[...] = nl.add(log_tmp, tile_max)
    else:
        o[...] = nl.add(o_scaled, pv)
        stats[:, 5:6] = nisa.activation(op=nl.exp, data=lse, bias=neg_max)
        stats[:, 5:6] = nl.add(log_tmp, row_sum)
        stats[:, 5:6] = nl.log(log_tmp)
        lse[...] = nl.add(m, log_tmp)


@nki.jit
def flash_paged_attention(
    query,
    key,
    value,
    kv_cache,
    block_tables,
    mask,
    softmax_scale=None,
    mixed_precision=True,
    LARGE_TILE_SZ=2048,
):
    _, n_heads, d, seq_q = query.shape
    _, n_kv_heads, _, _ = key.shape
    _, num_blocks, _, block_size, _ = kv_cache.shape
    (num_active_blocks,) = block_tables.shape
    assert d <= B_P_SIZE and seq_q % B_P_SIZE == 0
    assert LARGE_TILE_SZ % B_F_SIZE == 0 and 512 <= LARGE_TILE_SZ <= 8192
    assert block_size & (block_size - 1) == 0 and block_size <= 256
    assert (num_active_blocks * block_size) % LARGE_TILE_SZ == 0
    group = n_heads // n_kv_heads
    q_tiles = seq_q // B_P_SIZE
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    kernel_dtype = nl.bfloat16 if mixed_precision else query.dtype
    acc_dtype = nl.float32 if mixed_precision else query.dtype
    output = nl.ndarray((1, n_heads, seq_q, d), dtype=query.dtype, buffer=nl.shared_hbm)

    # The block-size tiling trick: with fewer blocks per large tile than partitions, each block
    # is cut into `factor` pieces so that one gather spans all partitions.
    blocks_per_tile = LARGE_TILE_SZ // block_size
    factor = max(1, B_P_SIZE // blocks_per_tile)
    rows = min(B_P_SIZE, blocks_per_tile * factor)  # partitions one gather spans
    loads = blocks_per_tile * factor // rows  # gathers per large tile, for K and for V
    tiled_block_size = block_size // factor
    run = tiled_block_size * d  # contiguous elements each partition gathers
    chunks = LARGE_TILE_SZ // rows
    large_tiles = num_active_blocks * block_size // LARGE_TILE_SZ
    cache = kv_cache.reshape((2, num_blocks * n_kv_heads * factor, run))
    tables = block_tables.reshape((large_tiles, blocks_per_tile))

    # Block tables: large tiles on partitions, in chunks of 128.
    tables_sbuf = []
    for chunk in range((large_tiles + B_P_SIZE - 1) // B_P_SIZE):
        tiles = min(B_P_SIZE, large_tiles - chunk * B_P_SIZE)
        t = nl.ndarray((tiles, blocks_per_tile), dtype=nl.int32, buffer=nl.sbuf)
        t[...] = nl.load(tables[chunk * B_P_SIZE : chunk * B_P_SIZE + tiles, :])
        tables_sbuf.append(t)
    first_tiles = min(B_P_SIZE, large_tiles)
    folded = nl.ndarray((first_tiles, blocks_per_tile * factor), dtype=nl.int32, buffer=nl.sbuf)
    as_float = nl.ndarray((first_tiles, rows), dtype=nl.float32, buffer=nl.sbuf)
    tables_psum = nl.ndarray((rows, first_tiles), dtype=nl.float32, buffer=nl.psum)
    k_t_psum = nl.ndarray((B_P_SIZE, B_F_SIZE), dtype=nl.float32, buffer=nl.psum)
    k_cast = None
    if kv_cache.dtype != kernel_dtype:
        k_cast = nl.ndarray((rows, chunks * d), dtype=kernel_dtype, buffer=nl.sbuf)

    tile_max = max(LARGE_TILE_SZ, seq_q)
    sizes = {
        "keys": tile_max,
        "pieces": (tile_max + B_F_SIZE - 1) // B_F_SIZE,
        "reductions": max(
            LARGE_TILE_SZ // reduction_tile(LARGE_TILE_SZ), seq_q // reduction_tile(seq_q)
        ),
        "chunks": max(chunks, seq_q // B_P_SIZE),
    }
    o_all = nl.ndarray((B_P_SIZE, q_tiles * group * d), dtype=acc_dtype, buffer=nl.sbuf)
    l_all = nl.ndarray((B_P_SIZE, q_tiles * group), dtype=acc_dtype, buffer=nl.sbuf)
    m_all = nl.ndarray((B_P_SIZE, q_tiles * group), dtype=acc_dtype, buffer=nl.sbuf)

    def accumulator(slot):
        return (
            o_all[:, slot * d : (slot + 1) * d],
            l_all[:, slot : slot + 1],
            m_all[:, slot : slot + 1],
        )

    for head in nl.affine_range(n_kv_heads):
        # Row of the reshaped cache for (block, head, piece), transposed so that the rows of one
        # gather lie on the partitions.
        index = nl.ndarray((rows, loads * large_tiles), dtype=nl.int32, buffer=nl.sbuf)
        for chunk, t in enumerate(tables_sbuf):
            tiles = t.shape[0]
            for j in range(factor):
                folded[0:tiles, j::factor] = nisa.tensor_scalar(
                    t[0:tiles, 0:blocks_per_tile],
                    np.multiply,
                    float(n_kv_heads * factor),
                    op1=np.add,
                    operand1=float(head * factor + j),
                    engine=nisa.gpsimd_engine,
                )
            for load in range(loads):
                as_float[0:tiles, 0:rows] = nisa.tensor_copy(
                    folded[0:tiles, load * rows : (load + 1) * rows], engine=nisa.gpsimd_engine
                )
                tables_psum[0:rows, 0:tiles] = nisa.nc_transpose(as_float[0:tiles, 0:rows])
                column = load * large_tiles + chunk * B_P_SIZE
                index[0:rows, column : column + tiles] = nl.copy(tables_psum[0:rows, 0:tiles])

        # The large tiles of prior context, then the new tokens (causal).
        for tile in nl.sequential_range(large_tiles + 1):
            k_t = nl.ndarray((d, tile_max), dtype=kernel_dtype, buffer=nl.sbuf)
            v = nl.ndarray((B_P_SIZE, sizes["chunks"] * d), dtype=kernel_dtype, buffer=nl.sbuf)
            if tile < large_tiles:
                k_loaded = nl.ndarray((rows, chunks * d), dtype=kv_cache.dtype, buffer=nl.sbuf)
                for load in range(loads):
                    k_loaded[0:rows, load * run : (load + 1) * run] = nl.load(
                        cache[0, index[0:rows, tile + load * large_tiles], 0:run]
                    )
                k_source = k_loaded
                if k_cast is not None:
                    k_cast[...] = nisa.tensor_copy(k_loaded, engine=nisa.gpsimd_engine)
                    k_source = k_cast
                transpose_chunks(
                    k_t,
                    d,
                    [k_source[0:rows, j * d : (j + 1) * d] for j in range(chunks)],
                    rows,
                    max(1, B_F_SIZE // rows),
                    psum=k_t_psum,
                )
                v_target = v
                if kv_cache.dtype != kernel_dtype:
                    v_target = nl.ndarray((rows, chunks * d), dtype=kv_cache.dtype, buffer=nl.sbuf)
                for load in range(loads):
                    v_target[0:rows, load * run : (load + 1) * run] = nl.load(
                        cache[1, index[0:rows, tile + load * large_tiles], 0:run]
                    )
                if v_target is not v:
                    v[0:rows, 0 : chunks * d] = nisa.tensor_copy(
                        v_target, engine=nisa.gpsimd_engine
                    )
                key_tile = dict(
                    keys=LARGE_TILE_SZ,
                    score_tile=B_F_SIZE,
                    rows=rows,
                    reduction=reduction_tile(LARGE_TILE_SZ),
                    causal=False,
                    initialize=tile == 0,
                )
            else:
                if key.dtype == kernel_dtype:
                    k_t[0:d, 0:seq_q] = nl.load(key[0, head, :, :])
                    for c in range(seq_q // B_P_SIZE):
                        v[:, c * d : (c + 1) * d] = nl.load(
                            value[0, head, c * B_P_SIZE : (c + 1) * B_P_SIZE, :]
                        )
                else:
                    k_raw = nl.ndarray((d, seq_q), dtype=key.dtype, buffer=nl.sbuf)
                    k_raw[...] = nl.load(key[0, head, :, :])
                    k_t[0:d, 0:seq_q] = nisa.tensor_copy(k_raw, engine=nisa.gpsimd_engine)
                    v_raw = nl.ndarray(
                        (B_P_SIZE, seq_q // B_P_SIZE * d), dtype=value.dtype, buffer=nl.sbuf
                    )
                    for c in range(seq_q // B_P_SIZE):
                        v_raw[:, c * d : (c + 1) * d] = nl.load(
                            value[0, head, c * B_P_SIZE : (c + 1) * B_P_SIZE, :]
                        )
                    v[:, 0 : seq_q // B_P_SIZE * d] = nisa.tensor_copy(
                        v_raw, engine=nisa.gpsimd_engine
                    )
                key_tile = dict(
                    keys=seq_q,
                    score_tile=min(seq_q, B_F_SIZE),
                    rows=B_P_SIZE,
                    reduction=reduction_tile(seq_q),
                    causal=True,
                    initialize=False,
                )
            mask_column = tile * LARGE_TILE_SZ
            for i in nl.affine_range(q_tiles):
                mask_tile = nl.ndarray((B_P_SIZE, tile_max), dtype=nl.uint8, buffer=nl.sbuf)
                mask_tile[:, 0 : key_tile["keys"]] = nl.load(
                    mask[
                        i * B_P_SIZE : (i + 1) * B_P_SIZE,
                        mask_column : mask_column + key_tile["keys"],
                    ]
                )
                for qh in nl.affine_range(group):
                    q = load_query(query, head * group + qh, i * B_P_SIZE, scale, kernel_dtype, d)
                    flash_core(
                        q,
                        k_t,
                        v,
                        mask_tile,
                        accumulator(i * group + qh),
                        dict(key_tile, query_row0=i * B_P_SIZE),
                        sizes,
                        kernel_dtype,
                        acc_dtype,
                    )

        # out = o * exp(m - l), in the kernel's dtype.
        for qh in nl.affine_range(group):
            for i in nl.affine_range(q_tiles):
                o, lse, m = accumulator(i * group + qh)
                stats = nl.ndarray((B_P_SIZE, 8), dtype=acc_dtype, buffer=nl.sbuf)
                stats[:, 3:4] = nl.subtract(m, lse)
                stats[:, 3:4] = nl.exp(stats[:, 3:4])
                out = nl.ndarray((B_P_SIZE, d), dtype=kernel_dtype, buffer=nl.sbuf)
                out[...] = nl.multiply(o, stats[:, 3:4])
                nl.store(
                    output[0, head * group + qh, i * B_P_SIZE : (i + 1) * B_P_SIZE, :], value=out
                )
    return output
