"""fp64 numpy reference for tilelab.nki and a builder of continuous-batching inputs."""

from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
MASKED = -9984.0
PARTITIONS = 128


def round_bf16(x):
    """Rounds to the nearest bfloat16 (ties to even), as float64."""
    return np.asarray(x, dtype=np.float32).astype(BF16).astype(np.float64)


def gather_context(kv_cache, block_tables):
    """(K, V) of the prior context in token order, each (n_kv_heads, context_len, d), float64."""
    cache = np.asarray(kv_cache, dtype=np.float64)
    blocks = cache[:, np.asarray(block_tables, dtype=np.int64)]  # (2, nab, hk, bs, d)
    two, nab, hk, bs, d = blocks.shape
    tokens = blocks.transpose(0, 2, 1, 3, 4).reshape(two, hk, nab * bs, d)
    return tokens[0], tokens[1]


def reference_paged_attention(query, key, value, kv_cache, block_tables, mask, *,
                              softmax_scale=None, mixed_precision=True):
    """out (1, n_heads, seq_q, d) in float64 from the *natural-order* boolean mask.

    Masked scores are -9984 (so fully masked rows average V). Blocks of min(seq_q, 512) new-token
    columns wholly right of a 128-row query tile's first row are masked, as the NKI kernel skips
    them. With mixed_precision the scaled query is rounded as the kernel rounds it,
    bf16(bf16(q) * scale) (K and V are bf16 inputs then), so the remaining difference is P's and
    the output's bf16 rounding.
    """
    _, n_heads, d, seq_q = query.shape
    n_kv_heads = key.shape[1]
    group = n_heads // n_kv_heads
    scale = 1.0 / np.sqrt(d) if softmax_scale is None else softmax_scale
    q = np.asarray(query, dtype=np.float64)[0].transpose(0, 2, 1)  # (h, seq_q, d)
    if mixed_precision:
        q = round_bf16(round_bf16(q).astype(np.float32) * np.float32(scale))
        to_kernel = round_bf16
    else:
        q = q * scale
        to_kernel = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    k_ctx, v_ctx = gather_context(kv_cache, block_tables)
    k_new = np.asarray(key, dtype=np.float64)[0].transpose(0, 2, 1)  # (hk, seq_q, d)
    v_new = np.asarray(value, dtype=np.float64)[0]
    k_all = to_kernel(np.concatenate([k_ctx, k_new], axis=1))
    v_all = to_kernel(np.concatenate([v_ctx, v_new], axis=1))
    k_all = np.repeat(k_all, group, axis=0)  # query head h reads kv head h // group
    v_all = np.repeat(v_all, group, axis=0)

    visible = np.asarray(mask, dtype=bool).copy()
    context_len = visible.shape[1] - seq_q
    block = min(seq_q, 512)
    tile_first = np.arange(seq_q) // PARTITIONS * PARTITIONS
    limit = (tile_first // block + 1) * block
    visible[:, context_len:] &= np.arange(seq_q)[None, :] < limit[:, None]

    scores = np.einsum("hid,hjd->hij", q, k_all)
    scores = np.where(visible[None], scores, MASKED)
    scores -= scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    out = np.einsum("hij,hjd->hid", weights, v_all) / weights.sum(axis=-1, keepdims=True)
    return out[None]


def continuous_batch(rng, requests, *, n_heads, n_kv_heads, head_dim, block_size, large_tile,
                     dtype, spare_blocks=3):
    """Inputs for a continuous batch: `requests` lists (query_len, context_len) pairs (decode:
    query_len 1). Each request's context sits in its own cache blocks (shuffled over the cache),
    the block table is padded to a multiple of large_tile tokens, query rows to a multiple of 128.
    Returns a dict of the kernel's arguments with `mask` in natural order (bool)."""
    blocks_per_request = [-(-ctx // block_size) for _, ctx in requests]
    active = sum(blocks_per_request)
    per_tile = large_tile // block_size
    active = max(per_tile, -(-active // per_tile) * per_tile)
    seq_q = sum(q for q, _ in requests)
    seq_q = max(PARTITIONS, -(-seq_q // PARTITIONS) * PARTITIONS)
    if seq_q > 512:
        seq_q = -(-seq_q // 512) * 512
    num_blocks = active + spare_blocks
    table = rng.permutation(num_blocks)[:active].astype(np.int32)

    context_len = active * block_size
    mask = np.zeros((seq_q, context_len + seq_q), dtype=bool)
    row = 0
    block = 0
    for (q_len, ctx), n_blocks in zip(requests, blocks_per_request, strict=True):
        start = block * block_size
        for i in range(q_len):
            mask[row + i, start:start + ctx] = True
            mask[row + i, context_len + row:context_len + row + i + 1] = True
        row += q_len
        block += n_blocks

    def normal(*shape):
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype)

    return dict(
        query=normal(1, n_heads, head_dim, seq_q),
        key=normal(1, n_kv_heads, head_dim, seq_q),
        value=rng.uniform(-1, 1, (1, n_kv_heads, seq_q, head_dim)).astype(np.float32).astype(dtype),
        kv_cache=np.concatenate(
            [normal(1, num_blocks, n_kv_heads, block_size, head_dim),
             rng.uniform(-1, 1, (1, num_blocks, n_kv_heads, block_size, head_dim))
             .astype(np.float32).astype(dtype)]),
        block_tables=table,
        mask=mask,
    )


def reorder_context_mask_reference(mask, large_tile, block_size):
    """The reordering written out with explicit loops over one load's columns."""
    seq_q, total = mask.shape
    context_len = total - seq_q
    tiled_blocks = max(PARTITIONS, large_tile // block_size)
    tiled = large_tile // tiled_blocks
    out = mask.copy()
    group = PARTITIONS * tiled
    for base in range(0, context_len, group):
        for tb in range(tiled):
            for p in range(PARTITIONS):
                out[:, base + tb * PARTITIONS + p] = mask[:, base + p * tiled + tb]
    return out
