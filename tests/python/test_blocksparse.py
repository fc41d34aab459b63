"""tilelab.BlockSparseLayout and tilelab.blocksparse_attention against an fp64 numpy reference
that applies the layout's sparse token mask: layouts, varlen prefill and decode, GQA, dtypes, and
every documented error."""

import ml_dtypes
import numpy as np
import pytest
from attention_reference import DTYPES, assert_attention_close, reference_attention
from cpu_policy import cpu_streams_cache_rows

import tilelab

# ---------------------------------------------------------------------------------------------
# The fp64 reference and input helpers


def kept_by_rule(n_heads, rows, local_blocks, vert_stride, homo_head, head_sliding_step):
    """[H, R, R] bool: the local + strided rule of the issue, evaluated block by block."""
    if homo_head:
        step = 0
    elif head_sliding_step is not None:
        step = head_sliding_step
    else:
        step = max(1, vert_stride // n_heads)
    mask = np.zeros((n_heads, rows, rows), dtype=bool)
    for h in range(n_heads):
        for qb in range(rows):
            for kb in range(rows):
                mask[h, qb, kb] = qb >= kb and (
                    qb - kb < local_blocks or (kb + h * step + 1) % vert_stride == 0
                )
    return mask


def token_mask_from_blocks(block_mask, block_size, seqlen, causal):
    """[H, S, S] bool: each block expanded to tokens, cut to seqlen, causal inside when causal."""
    tokens = np.repeat(np.repeat(block_mask, block_size, axis=1), block_size, axis=2)
    tokens = tokens[:, :seqlen, :seqlen]
    if causal:
        tokens = tokens & np.tril(np.ones((seqlen, seqlen), dtype=bool))
    return tokens


def reference_blocksparse(q, k, v, layout, cu_seqlens_q, cu_seqlens_k, scale=None):
    """out in float64: per sequence and query head, softmax over the keys the layout's token mask
    shows the query (its last q_len positions), 0 for a query that sees no key."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    q_heads, head_dim = q.shape[1], q.shape[2]
    group = q_heads // k.shape[1]
    scale = 1.0 / np.sqrt(head_dim) if scale is None else float(scale)
    out = np.zeros_like(q)
    for s in range(len(cu_seqlens_q) - 1):
        q0, q1 = int(cu_seqlens_q[s]), int(cu_seqlens_q[s + 1])
        k0, k1 = int(cu_seqlens_k[s]), int(cu_seqlens_k[s + 1])
        q_len, k_len = q1 - q0, k1 - k0
        if q_len == 0:
            continue
        for h in range(q_heads):
            # One layout head per query head, per kv head, or one for all.
            head = {q_heads: h, k.shape[1]: h // group, 1: 0}[layout.n_heads]
            visible = layout.token_mask(k_len, head=head)[k_len - q_len :]
            scores = scale * q[q0:q1, h] @ k[k0:k1, h // group].T
            scores = np.where(visible, scores, -np.inf)
            row_max = scores.max(axis=1, keepdims=True, initial=-np.inf)
            seen = np.isfinite(row_max)
            weights = np.exp(scores - np.where(seen, row_max, 0.0))
            row_sum = weights.sum(axis=1, keepdims=True)
            result = weights @ v[k0:k1, h // group] / np.where(seen, row_sum, 1.0)
            out[q0:q1, h] = np.where(seen, result, 0.0)
    return out


def cu_seqlens(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def random_packed(rng, q_lens, k_lens, q_heads, kv_heads, head_dim, dtype_name):
    """Packed q [sum q_lens, Hq, D], k and v [sum k_lens, Hkv, D], standard normal."""
    dtype = DTYPES[dtype_name]

    def randn(*shape):
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype)

    total_q, total_k = int(np.sum(q_lens)), int(np.sum(k_lens))
    return (
        randn(total_q, q_heads, head_dim),
        randn(total_k, kv_heads, head_dim),
        randn(total_k, kv_heads, head_dim),
    )


def check(q, k, v, layout, q_lens, k_lens, dtype_name, **options):
    cu_q, cu_k = cu_seqlens(q_lens), cu_seqlens(k_lens)
    out = tilelab.blocksparse_attention(
        q, k, v, layout, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **options
    )
    expected = reference_blocksparse(q, k, v, layout, cu_q, cu_k, scale=options.get("scale"))
    assert out.dtype == q.dtype
    assert out.shape == q.shape
    assert_attention_close(out, expected, dtype_name, v, max(k_lens))
    return out


# ---------------------------------------------------------------------------------------------
# Layouts


@pytest.mark.parametrize(
    ("n_heads", "max_seqlen", "block_size", "local_blocks", "vert_stride", "homo", "sliding"),
    [
        (4, 300, 16, 4, 3, False, None),
        (4, 300, 16, 4, 3, True, None),
        (4, 300, 16, 4, 3, False, 2),
        (40, 1000, 64, 3, 8, False, None),
        (32, 4096, 64, 16, 8, False, None),
        (2, 64, 64, 1, 1, False, None),
        (3, 200, 8, 0, 5, False, 7),
    ],
)
def test_local_strided_keeps_exactly_the_blocks_of_the_rule(
    n_heads, max_seqlen, block_size, local_blocks, vert_stride, homo, sliding
):
    layout = tilelab.BlockSparseLayout.local_strided(
        n_heads,
        max_seqlen,
        block_size,
        local_blocks,
        vert_stride,
        homo_head=homo,
        head_sliding_step=sliding,
    )
    rows = -(-max_seqlen // block_size)
    assert layout.n_heads == n_heads
    assert layout.block_size == block_size
    assert layout.num_row_blocks == rows
    assert layout.max_seqlen == rows * block_size
    assert layout.causal
    expected = kept_by_rule(n_heads, rows, local_blocks, vert_stride, homo, sliding)
    np.testing.assert_array_equal(layout.to_dense(), expected)
    causal_blocks = n_heads * rows * (rows + 1) // 2
    assert layout.density == pytest.approx(expected.sum() / causal_blocks)
    if homo:
        assert (layout.to_dense() == layout.to_dense()[:1]).all()


def test_local_window_shorter_than_the_sequence_drops_blocks():
    # Phi-3-small-like settings: at 4k tokens the local window covers only part of the row.
    layout = tilelab.BlockSparseLayout.local_strided(32, 4096, 64, 16, 8)
    assert 0.2 < layout.density < 0.6
    dense = layout.to_dense()
    assert not dense[0, 63, 46]  # outside the window (63 - 46 >= 16), (46 + 1) % 8 != 0
    assert dense[0, 63, 47]  # outside the window, (47 + 1) % 8 == 0
    assert dense[0, 63, 48]  # inside the window
    assert dense[0, 63, 7]  # (7 + 1) % 8 == 0


def test_csr_arrays_and_dense_round_trip(rng):
    block_mask = np.tril(rng.random((3, 7, 7)) < 0.4)
    block_mask[1] = False  # a head with no block at all
    layout = tilelab.BlockSparseLayout.from_dense(block_mask, 16)
    np.testing.assert_array_equal(layout.to_dense(), block_mask)
    crow, col = layout.crow, layout.col
    assert crow.dtype == np.int32 and col.dtype == np.int32
    assert crow.shape == (3, 8)
    assert col.shape == (3, layout.nnz_max)
    assert layout.nnz_max == block_mask.sum(axis=(1, 2)).max()
    for h in range(3):
        nnz = crow[h, -1]
        assert nnz == block_mask[h].sum()
        assert (col[h, nnz:] == -1).all()  # padding
        for r in range(7):
            np.testing.assert_array_equal(col[h, crow[h, r] : crow[h, r + 1]],
                                          np.flatnonzero(block_mask[h, r]))
    # The CSR constructor accepts the arrays back (any integer dtype, any padding).
    padded = col.astype(np.int64)
    padded[padded < 0] = 5
    same = tilelab.BlockSparseLayout(crow, padded, 16)
    np.testing.assert_array_equal(same.to_dense(), block_mask)
    np.testing.assert_array_equal(same.col, col)
    assert layout.density == pytest.approx(block_mask.sum() / (3 * 7 * 8 / 2))
    assert "n_heads=3" in repr(layout)


def test_non_causal_layout_round_trip(rng):
    block_mask = rng.random((2, 5, 5)) < 0.5
    layout = tilelab.BlockSparseLayout.from_dense(block_mask, 8, causal=False)
    assert not layout.causal
    np.testing.assert_array_equal(layout.to_dense(), block_mask)
    assert layout.density == pytest.approx(block_mask.sum() / (2 * 25))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("seqlen", [80, 75, 33, 1, 0])
def test_token_mask(rng, causal, seqlen):
    block_mask = rng.random((3, 5, 5)) < 0.5
    if causal:
        block_mask = np.tril(block_mask)
    layout = tilelab.BlockSparseLayout.from_dense(block_mask, 16, causal=causal)
    expected = token_mask_from_blocks(block_mask, 16, seqlen, causal)
    tokens = layout.token_mask(seqlen)
    assert tokens.dtype == np.bool_ and tokens.shape == (3, seqlen, seqlen)
    np.testing.assert_array_equal(tokens, expected)
    np.testing.assert_array_equal(layout.token_mask(seqlen, head=2), expected[2])


# ---------------------------------------------------------------------------------------------
# Attention against the reference

# name: (Hq, Hkv, D, layout arguments of local_strided, q_lens, k_lens). The local window never
# covers the whole longest sequence; q_len 1 rows are decode, q_len < k_len chunked prefill.
CASES = {
    "ragged_prefill_decode": (
        4, 4, 64, dict(n_heads=4, max_seqlen=300, block_size=16, local_blocks=4, vert_stride=3),
        [300, 17, 1, 40, 1], [300, 17, 150, 64, 299],
    ),
    "gqa_d112_homo_head": (
        8, 2, 112,
        dict(n_heads=8, max_seqlen=256, block_size=16, local_blocks=4, vert_stride=3,
             homo_head=True),
        [200, 1, 97], [256, 180, 97],
    ),
    "40_heads_sliding_step": (
        40, 8, 64,
        dict(n_heads=40, max_seqlen=200, block_size=16, local_blocks=2, vert_stride=4,
             head_sliding_step=1),
        [150, 1, 33], [200, 120, 60],
    ),
    "one_layout_head_mqa": (
        4, 1, 32, dict(n_heads=1, max_seqlen=160, block_size=16, local_blocks=3, vert_stride=2),
        [160, 1], [160, 159],
    ),
    # One layout head per kv head: the strided pattern slides by kv head (vLLM's negative
    # head_sliding_step); the query heads of a group share it.
    "kv_head_sliding": (
        8, 4, 64,
        dict(n_heads=4, max_seqlen=256, block_size=16, local_blocks=3, vert_stride=4,
             head_sliding_step=1),
        [256, 1, 70], [256, 200, 100],
    ),
    # A GQA group of 8 sharing one layout head: folded into prefill tasks, but too large for a
    # 4-row decode tile, so short sequences (q_len 3 and 1) run one head per task.
    "mqa_group_8_short_queries": (
        8, 1, 64, dict(n_heads=1, max_seqlen=160, block_size=32, local_blocks=2, vert_stride=2),
        [3, 1, 90, 8], [150, 70, 130, 9],
    ),
    # Per-query-head layouts in GQA groups of 4: the paged kernel reads each group's K/V once and
    # folds each head's own blocks in; the generated kernels run one head per task.
    "gqa_4_per_head_layouts_decode": (
        8, 2, 64,
        dict(n_heads=8, max_seqlen=256, block_size=16, local_blocks=2, vert_stride=4,
             head_sliding_step=1),
        [1, 1, 2, 100], [256, 130, 200, 100],
    ),
    # Blocks longer than the reference's 64-row and 64-key chunks.
    "block_80": (
        2, 1, 48, dict(n_heads=2, max_seqlen=400, block_size=80, local_blocks=2, vert_stride=2),
        [400, 1, 150], [400, 333, 170],
    ),
    "block_not_dividing_seqlen": (
        2, 2, 16, dict(n_heads=2, max_seqlen=100, block_size=24, local_blocks=1, vert_stride=2),
        [100, 30, 1], [100, 77, 5],
    ),
}


def kernels_built(rng):
    """Whether the generated kernels exist (the dense flash attention's answer)."""
    q = rng.standard_normal((1, 1, 4, 16), dtype=np.float32)
    return tilelab.flash_attention_implementation(q, q, q) == "generated"


@pytest.mark.parametrize("implementation", ["generated", "reference"])
@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", CASES)
def test_matches_sparse_reference(rng, case, dtype_name, implementation):
    if implementation == "generated" and not kernels_built(rng):
        pytest.skip("built without the generated kernels")
    q_heads, kv_heads, head_dim, layout_args, q_lens, k_lens = CASES[case]
    layout = tilelab.BlockSparseLayout.local_strided(**layout_args)
    assert max(k_lens) > layout_args["local_blocks"] * layout_args["block_size"]
    q, k, v = random_packed(rng, q_lens, k_lens, q_heads, kv_heads, head_dim, dtype_name)
    check(q, k, v, layout, q_lens, k_lens, dtype_name, implementation=implementation)


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
@pytest.mark.parametrize("implementation", ["generated", "reference"])
def test_long_sequences_phi3_small_layout(rng, dtype_name, implementation):
    # 64-token blocks, 16 local blocks, vertical stride 8: 1 k-token windows in 2-4 k sequences
    # (prefill, decode and a chunked-prefill tail).
    if implementation == "generated" and not kernels_built(rng):
        pytest.skip("built without the generated kernels")
    layout = tilelab.BlockSparseLayout.local_strided(4, 4096, 64, 16, 8)
    q_lens, k_lens = [2500, 1, 300], [2500, 3000, 4096]
    q, k, v = random_packed(rng, q_lens, k_lens, 4, 2, 64, dtype_name)
    check(q, k, v, layout, q_lens, k_lens, dtype_name, implementation=implementation)


def test_kv_head_layout_equals_its_per_query_head_expansion(rng):
    # A layout of Hkv heads is the layout of Hq heads that repeats each kv head's blocks for the
    # query heads of its group.
    per_kv_head = tilelab.BlockSparseLayout.local_strided(2, 128, 16, 2, 4, head_sliding_step=1)
    per_q_head = tilelab.BlockSparseLayout.from_dense(np.repeat(per_kv_head.to_dense(), 3, axis=0),
                                                      16)
    q, k, v = random_packed(rng, [128, 1], [128, 90], 6, 2, 32, "float32")
    cu_q, cu_k = cu_seqlens([128, 1]), cu_seqlens([128, 90])
    results = [
        tilelab.blocksparse_attention(q, k, v, layout, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
        for layout in (per_kv_head, per_q_head)
    ]
    np.testing.assert_array_equal(results[0], results[1])
    # ... and differs from using kv head 0's blocks for everyone.
    single = tilelab.BlockSparseLayout.from_dense(per_kv_head.to_dense()[:1], 16)
    other = tilelab.BlockSparseLayout.from_dense(per_kv_head.to_dense()[1:], 16)
    assert not np.array_equal(single.to_dense(), other.to_dense())


def test_strided_views_of_a_packed_qkv_tensor(rng):
    # vLLM-style packed qkv [total, 3, H, D]: q, k and v are strided views, read in place.
    layout = tilelab.BlockSparseLayout.local_strided(4, 128, 16, 2, 3)
    lens = [128, 50]
    qkv = rng.standard_normal((sum(lens), 3, 4, 32), dtype=np.float32).astype(np.float16)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    assert not q.flags.c_contiguous and tilelab._core._views_in_place(q)
    check(q, k, v, layout, lens, lens, "float16")
    out = np.zeros((sum(lens), 4, 2, 32), np.float16)[:, :, 1]  # a strided out
    expected = tilelab.blocksparse_attention(
        q, k, v, layout, cu_seqlens_q=cu_seqlens(lens), cu_seqlens_k=cu_seqlens(lens))
    tilelab.blocksparse_attention(q, k, v, layout, cu_seqlens_q=cu_seqlens(lens),
                                  cu_seqlens_k=cu_seqlens(lens), out=out)
    np.testing.assert_array_equal(out, expected)


def test_sequence_without_queries(rng):
    # q_len 0: the sequence's keys are skipped, the others unaffected.
    layout = tilelab.BlockSparseLayout.local_strided(2, 64, 16, 1, 2)
    q, k, v = random_packed(rng, [0, 5, 1], [30, 5, 64], 2, 2, 16, "float32")
    check(q, k, v, layout, [0, 5, 1], [30, 5, 64], "float32")


def test_explicit_scale_and_head_dim_256(rng):
    layout = tilelab.BlockSparseLayout.local_strided(2, 64, 16, 1, 2)
    q, k, v = random_packed(rng, [64, 1], [64, 40], 2, 1, 256, "float32")
    check(q, k, v, layout, [64, 1], [64, 40], "float32", scale=0.3)


def test_non_causal_layout(rng):
    block_mask = rng.random((2, 6, 6)) < 0.5
    block_mask[:, 2] = False  # queries of block 2 see nothing: out 0
    layout = tilelab.BlockSparseLayout.from_dense(block_mask, 16, causal=False)
    q_lens, k_lens = [96, 20], [96, 70]
    q, k, v = random_packed(rng, q_lens, k_lens, 2, 2, 32, "float32")
    out = check(q, k, v, layout, q_lens, k_lens, "float32")
    assert (out[32:48] == 0).all()


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_dense_causal_layout_gives_the_dense_flash_result(rng, dtype_name):
    rows = 10
    layout = tilelab.BlockSparseLayout.from_dense(np.tril(np.ones((1, rows, rows), bool)), 16)
    assert layout.density == 1.0
    q_lens, k_lens = [150, 1, 37], [160, 99, 37]
    q, k, v = random_packed(rng, q_lens, k_lens, 4, 2, 64, dtype_name)
    out = tilelab.blocksparse_attention(
        q, k, v, layout, cu_seqlens_q=cu_seqlens(q_lens), cu_seqlens_k=cu_seqlens(k_lens)
    )
    q_starts, k_starts = cu_seqlens(q_lens), cu_seqlens(k_lens)
    for s in range(len(q_lens)):
        # [len, H, D] -> [1, H, len, D]
        def batch(x, starts, s=s):
            return np.ascontiguousarray(x[starts[s] : starts[s + 1]].transpose(1, 0, 2)[None])

        dense = tilelab.flash_attention(
            batch(q, q_starts), batch(k, k_starts), batch(v, k_starts), causal=True,
            causal_alignment="bottom_right",
        )
        expected, _ = reference_attention(
            batch(q, q_starts), batch(k, k_starts), batch(v, k_starts), causal=True,
            causal_alignment="bottom_right",
        )
        sparse = out[q_starts[s] : q_starts[s + 1]].transpose(1, 0, 2)[None]
        assert_attention_close(sparse, expected, dtype_name, v, k_lens[s])
        # Both are fp32 online softmaxes over the same keys: they agree to a few output ulps.
        tolerance = 4 * float(np.finfo(np.float32).eps if dtype_name == "float32" else 2.0**-7)
        difference = np.abs(sparse.astype(np.float64) - dense.astype(np.float64))
        assert difference.max() <= tolerance * np.abs(v.astype(np.float64)).max()


def keys_some_query_sees(layout, q_lens, k_lens):
    """Over the packed keys: whether any query of any layout head sees the key."""
    k_starts = cu_seqlens(k_lens)
    seen = np.zeros(k_starts[-1], dtype=bool)
    for s, (q_len, k_len) in enumerate(zip(q_lens, k_lens, strict=True)):
        for h in range(layout.n_heads):
            tokens = layout.token_mask(k_len, head=h)[k_len - q_len :]
            seen[k_starts[s] : k_starts[s + 1]] |= tokens.any(axis=0)
    return seen


def check_unseen_keys_are_never_read(rng, layout, q_lens, k_lens, head_dim, dtype_name, **options):
    """NaN in every key and value no query may see: a kernel that loaded an absent block (or
    computed it and masked it afterwards) would turn outputs NaN."""
    q, k, v = random_packed(rng, q_lens, k_lens, 2, 1, head_dim, dtype_name)
    k_starts = cu_seqlens(k_lens)
    seen = keys_some_query_sees(layout, q_lens, k_lens)
    assert (~seen).sum() > 50
    clean_k, clean_v = k.copy(), v.copy()
    k[~seen] = np.nan
    v[~seen] = np.nan
    out = tilelab.blocksparse_attention(
        q, k, v, layout, cu_seqlens_q=cu_seqlens(q_lens), cu_seqlens_k=k_starts, **options
    )
    assert np.isfinite(out.astype(np.float32)).all()
    expected = reference_blocksparse(q, clean_k, clean_v, layout, cu_seqlens(q_lens), k_starts)
    assert_attention_close(out, expected, dtype_name, clean_v, max(k_lens))


def test_absent_blocks_are_never_read(rng):
    layout = tilelab.BlockSparseLayout.local_strided(2, 256, 16, 2, 4)
    check_unseen_keys_are_never_read(rng, layout, [256, 1], [256, 200], 32, "float32")


def test_nan_in_a_visible_key_gives_nan_rows(rng):
    layout = tilelab.BlockSparseLayout.local_strided(1, 64, 16, 4, 1)
    q, k, v = random_packed(rng, [64], [64], 1, 1, 8, "float32")
    k[40, 0, 3] = np.nan
    out = tilelab.blocksparse_attention(
        q, k, v, layout, cu_seqlens_q=cu_seqlens([64]), cu_seqlens_k=cu_seqlens([64])
    )
    # Queries at positions >= 40 see key 40 (causal); earlier ones do not.
    assert np.isnan(out[40:]).all(axis=(1, 2)).all()
    assert np.isfinite(out[:40]).all()


def test_rows_whose_visible_scores_are_all_negative_infinity_are_nan_as_in_flash_attention():
    # q·k overflows float32 to -inf for every key: 0 / 0, NaN, as the dense reference gives;
    # the finite rows of q stay finite.
    layout = tilelab.BlockSparseLayout.from_dense(np.tril(np.ones((1, 2, 2), bool)), 16)
    q = np.ones((32, 1, 2), np.float32)
    q[20:] = 1e30
    k = np.full((32, 1, 2), -1e30, np.float32)
    v = np.ones((32, 1, 2), np.float32)
    cu = cu_seqlens([32])
    out = tilelab.blocksparse_attention(q, k, v, layout, cu_seqlens_q=cu, cu_seqlens_k=cu)
    dense = tilelab.flash_attention(q.transpose(1, 0, 2)[None], k.transpose(1, 0, 2)[None],
                                    v.transpose(1, 0, 2)[None], causal=True)
    assert np.isnan(out[20:]).all() and np.isfinite(out[:20]).all()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(dense[0].transpose(1, 0, 2)))


def test_queries_that_see_no_key_give_zero(rng):
    block_mask = np.tril(np.ones((1, 4, 4), bool))
    block_mask[0, 3] = False  # the last query block keeps nothing
    layout = tilelab.BlockSparseLayout.from_dense(block_mask, 16)
    q, k, v = random_packed(rng, [64], [64], 2, 2, 16, "float16")
    out = check(q, k, v, layout, [64], [64], "float16")
    assert (out[48:] == 0).all()


def test_out_argument_is_written_in_place(rng):
    layout = tilelab.BlockSparseLayout.local_strided(2, 64, 16, 2, 2)
    q, k, v = random_packed(rng, [64], [64], 2, 2, 16, "bfloat16")
    cu = cu_seqlens([64])
    out = np.full(q.shape, np.nan, dtype=ml_dtypes.bfloat16)
    returned = tilelab.blocksparse_attention(q, k, v, layout, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                             out=out)
    assert returned is out
    expected = tilelab.blocksparse_attention(q, k, v, layout, cu_seqlens_q=cu, cu_seqlens_k=cu)
    np.testing.assert_array_equal(out.view(np.uint16), expected.view(np.uint16))


def test_results_do_not_depend_on_thread_count(rng, restore_num_threads):
    layout = tilelab.BlockSparseLayout.local_strided(4, 300, 16, 4, 3)
    q_lens, k_lens = [300, 1, 40], [300, 150, 64]
    q, k, v = random_packed(rng, q_lens, k_lens, 4, 2, 32, "float32")
    results = []
    for n in (1, 2):
        tilelab.set_num_threads(n)
        results.append(tilelab.blocksparse_attention(
            q, k, v, layout, cu_seqlens_q=cu_seqlens(q_lens), cu_seqlens_k=cu_seqlens(k_lens)))
    assert (results[0] == results[1]).all()


@pytest.mark.parametrize("implementation", ["automatic", "reference", "generated"])
def test_implementations(rng, implementation):
    layout = tilelab.BlockSparseLayout.local_strided(2, 64, 16, 2, 2)
    q_lens, k_lens = [64, 1], [64, 30]
    q, k, v = random_packed(rng, q_lens, k_lens, 2, 2, 16, "float32")
    if implementation != "generated" or kernels_built(rng):
        check(q, k, v, layout, q_lens, k_lens, "float32", implementation=implementation)
        return
    with pytest.raises(ValueError, match=r"^implementation: 'generated' does not cover this call"):
        check(q, k, v, layout, q_lens, k_lens, "float32", implementation=implementation)


KERNEL_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def prefill_kernel(dtype_name):
    """The prefill kernel of 32-row tasks that runs for dtype_name with fp32 probabilities."""
    name = f"blocksparse_{KERNEL_DTYPES[dtype_name]}_prefill"
    return name + "_fp32_probabilities" if dtype_name == "bfloat16" else name


def decode_kernel(dtype_name):
    return f"blocksparse_{KERNEL_DTYPES[dtype_name]}_decode"


# The prefill kernels on fp32 FMAs (fp32, fp16, and bf16 with fp32 probabilities) come with 32-
# and 64-row tasks; which one runs depends on the tasks the call makes (split at layout row
# blocks) and the thread count (schedules/flash/tiling.hpp, widening_tiles_cost). One head, one
# sequence whose queries are positions k_len - q_len .. k_len - 1. Each result against the
# reference, and the two bit for bit: a row's arithmetic does not depend on its task.
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize(
    ("q_len", "k_len", "block_size", "tall_on_one_thread", "tall_on_two"),
    [
        (31, 31, 64, False, False),  # one task either way: a tall one only pads
        (64, 64, 64, True, False),  # two tasks or one: on two threads the two run side by side
        (256, 256, 64, True, True),  # eight or four
        (100, 300, 64, True, True),  # rows 200-299 over two row blocks: four or two
        (64, 64, 32, False, False),  # split at 32-row blocks: as many tall tasks as short ones
    ],
)
def test_prefill_task_heights_agree(
    rng,
    restore_num_threads,
    q_len,
    k_len,
    block_size,
    tall_on_one_thread,
    tall_on_two,
    dtype_name,
    causal,
):
    if not kernels_built(rng):
        pytest.skip("built without the generated kernels")
    blocks = -(-k_len // block_size)
    block_mask = rng.random((1, blocks, blocks)) < 0.7
    if causal:
        block_mask &= np.tril(np.ones((blocks, blocks), dtype=bool))
    layout = tilelab.BlockSparseLayout.from_dense(block_mask, block_size, causal=causal)
    q, k, v = random_packed(rng, [q_len], [k_len], 1, 1, 40, dtype_name)
    cu_q, cu_k = cu_seqlens([q_len]), cu_seqlens([k_len])
    arguments = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, fp32_probabilities=True)
    expected = reference_blocksparse(q, k, v, layout, cu_q, cu_k)
    results = []
    for threads, tall in ((1, tall_on_one_thread), (2, tall_on_two)):
        tilelab.set_num_threads(threads)
        kernel = prefill_kernel(dtype_name) + ("_tall" if tall else "")
        assert tilelab.blocksparse_attention_kernels(q, k, v, layout, **arguments) == [kernel]
        out = tilelab.blocksparse_attention(
            q, k, v, layout, implementation="generated", **arguments
        )
        assert_attention_close(out, expected, dtype_name, v, k_len)
        results.append(out)
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
def test_kernels_name_one_kernel_per_kind_of_task(rng, restore_num_threads, dtype_name):
    if not kernels_built(rng):
        pytest.skip("built without the generated kernels")
    tilelab.set_num_threads(1)
    layout = tilelab.BlockSparseLayout.local_strided(4, 512, 64, 4, 2)
    q_lens, k_lens = [1, 256, 1], [300, 512, 40]
    q, k, v = random_packed(rng, q_lens, k_lens, 4, 2, 32, dtype_name)
    arguments = dict(
        cu_seqlens_q=cu_seqlens(q_lens), cu_seqlens_k=cu_seqlens(k_lens), fp32_probabilities=True
    )
    prefill = prefill_kernel(dtype_name) + "_tall"
    decode = decode_kernel(dtype_name)
    assert tilelab.blocksparse_attention_kernels(q, k, v, layout, **arguments) == sorted(
        [decode, prefill]
    )
    # Decode alone: on the paged kernel where the CPU streams cache rows.
    first = dict(cu_seqlens_q=cu_seqlens([1]), cu_seqlens_k=cu_seqlens([300]))
    assert tilelab.blocksparse_attention_kernels(q[:1], k[:300], v[:300], layout, **first) == [
        "paged" if cpu_streams_cache_rows() else decode
    ]
    # The implementation asked for: the generated decode kernel, or none on the reference.
    kernels = tilelab.blocksparse_attention_kernels
    assert kernels(q[:1], k[:300], v[:300], layout, implementation="generated", **first) == [
        decode
    ]
    assert kernels(q[:1], k[:300], v[:300], layout, implementation="reference", **first) == []
    assert kernels(q, k, v, layout, implementation="generated", **arguments) == sorted(
        [decode, prefill]
    )
    assert kernels(q, k, v, layout, implementation="reference", **arguments) == []

    # A head dim read with a stride runs on the reference: no kernel, and "generated" says so as
    # blocksparse_attention does.
    q2, k2, v2 = (np.repeat(a, 2, axis=2)[:, :, ::2] for a in (q, k, v))
    assert tilelab.blocksparse_attention_kernels(q2, k2, v2, layout, **arguments) == []
    for call in (tilelab.blocksparse_attention, tilelab.blocksparse_attention_kernels):
        with pytest.raises(ValueError, match="implementation: 'generated' does not cover"):
            call(q2, k2, v2, layout, implementation="generated", **arguments)
    with pytest.raises(ValueError, match="implementation"):
        kernels(q, k, v, layout, implementation="fastest", **arguments)


# Decode (one query per sequence) runs on the paged kernel's streamed micro-kernels, K and V read
# in place through block tables of the blocks some head keeps (on CPUs that run them); with
# implementation="generated" on the generated decode kernels.
def heads_keep_different_blocks(layout, k_lens):
    """Whether some sequence's query heads keep different blocks in its last row block."""
    dense = layout.to_dense()
    rows = [(k_len - 1) // layout.block_size for k_len in k_lens]
    return any((dense[:, row] != dense[0, row]).any() for row in rows)


@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", CASES)
def test_decode_matches_sparse_reference(rng, restore_num_threads, case, dtype_name):
    q_heads, kv_heads, head_dim, layout_args, _, k_lens = CASES[case]
    layout = tilelab.BlockSparseLayout.local_strided(**layout_args)
    # Block ends, a block's first key, a 1-key sequence and the case's own lengths.
    block = layout_args["block_size"]
    k_lens = [*k_lens, 1, block, block + 1, 2 * block - 1]
    q_lens = [1] * len(k_lens)
    q, k, v = random_packed(rng, q_lens, k_lens, q_heads, kv_heads, head_dim, dtype_name)
    arguments = dict(cu_seqlens_q=cu_seqlens(q_lens), cu_seqlens_k=cu_seqlens(k_lens))
    kernels = tilelab.blocksparse_attention_kernels(q, k, v, layout, **arguments)
    if cpu_streams_cache_rows():
        assert kernels == ["paged"]
    elif kernels_built(rng):
        assert kernels == [decode_kernel(dtype_name)]
    results = []
    for threads in (1, 2):
        tilelab.set_num_threads(threads)
        results.append(check(q, k, v, layout, q_lens, k_lens, dtype_name))
        if kernels_built(rng):
            check(q, k, v, layout, q_lens, k_lens, dtype_name, implementation="generated")
    # Without split-KV, the threads do not change a result.
    np.testing.assert_array_equal(results[0], results[1])


def test_decode_cases_include_heads_keeping_the_same_and_different_blocks():
    differ = [
        heads_keep_different_blocks(tilelab.BlockSparseLayout.local_strided(**layout_args), k_lens)
        for _, _, _, layout_args, _, k_lens in CASES.values()
    ]
    assert any(differ) and not all(differ)


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_decode_on_the_paged_kernel_agrees_with_the_generated_kernel(rng, dtype_name):
    layout = tilelab.BlockSparseLayout.local_strided(8, 1024, 64, 4, 3, homo_head=True)
    k_lens = [1000, 64, 65, 700, 1]
    q_lens = [1] * len(k_lens)
    q, k, v = random_packed(rng, q_lens, k_lens, 8, 2, 128, dtype_name)
    arguments = dict(
        cu_seqlens_q=cu_seqlens(q_lens), cu_seqlens_k=cu_seqlens(k_lens), fp32_probabilities=True
    )
    if not kernels_built(rng) or not cpu_streams_cache_rows():
        pytest.skip("needs the generated kernels and the streamed micro-kernels")
    assert tilelab.blocksparse_attention_kernels(q, k, v, layout, **arguments) == ["paged"]
    paged = tilelab.blocksparse_attention(q, k, v, layout, **arguments)
    generated = tilelab.blocksparse_attention(q, k, v, layout, implementation="generated",
                                              **arguments)
    # fp32 P on both: the two differ by fp32 summation order (and bf16 rounding of out).
    expected = reference_blocksparse(q, k, v, layout, arguments["cu_seqlens_q"],
                                     arguments["cu_seqlens_k"])
    assert_attention_close(paged, expected, dtype_name, v, max(k_lens))
    assert_attention_close(generated, expected, dtype_name, v, max(k_lens))
    tolerance = 1e-5 if dtype_name == "float32" else 1e-2
    np.testing.assert_allclose(paged.astype(np.float32), generated.astype(np.float32),
                               atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_decode_on_the_paged_kernel_rows_without_keys_and_absent_blocks(rng, causal):
    # Row block 2 keeps nothing (its queries give 0); NaN in every key no query sees.
    blocks = 5
    block_mask = rng.random((1, blocks, blocks)) < 0.5
    if causal:
        block_mask &= np.tril(np.ones((blocks, blocks), dtype=bool))
    block_mask[0, 2] = False
    block_mask[0, 4, 0] = True
    layout = tilelab.BlockSparseLayout.from_dense(block_mask, 16, causal=causal)
    k_lens = [80, 40, 47, 33, 75, 17]
    q_lens = [1] * len(k_lens)
    q, k, v = random_packed(rng, q_lens, k_lens, 4, 2, 24, "float32")
    arguments = dict(cu_seqlens_q=cu_seqlens(q_lens), cu_seqlens_k=cu_seqlens(k_lens))
    if cpu_streams_cache_rows():
        assert tilelab.blocksparse_attention_kernels(q, k, v, layout, **arguments) == ["paged"]
    seen = keys_some_query_sees(layout, q_lens, k_lens)
    clean_k, clean_v = k.copy(), v.copy()
    k[~seen] = np.nan
    v[~seen] = np.nan
    out = tilelab.blocksparse_attention(q, k, v, layout, **arguments)
    expected = reference_blocksparse(q, clean_k, clean_v, layout, arguments["cu_seqlens_q"],
                                     arguments["cu_seqlens_k"])
    assert np.isfinite(out).all()
    assert_attention_close(out, expected, "float32", clean_v, max(k_lens))
    # Sequences of 33 to 47 keys decode in row block 2.
    assert (out[1:4] == 0).all()


def test_decode_on_the_paged_kernel_non_finite_scores(rng):
    layout = tilelab.BlockSparseLayout.local_strided(1, 64, 16, 2, 2)
    q, k, v = random_packed(rng, [1, 1, 1], [64, 40, 30], 2, 1, 8, "float32")
    k[64 + 35, 0, 3] = np.nan  # visible to the second sequence's query (position 39)
    q[2] = 1e30  # q·k overflows to -inf for every key of the third: 0 / 0
    k[104:] = -1e30
    arguments = dict(cu_seqlens_q=cu_seqlens([1, 1, 1]), cu_seqlens_k=cu_seqlens([64, 40, 30]))
    if cpu_streams_cache_rows():
        assert tilelab.blocksparse_attention_kernels(q, k, v, layout, **arguments) == ["paged"]
    out = tilelab.blocksparse_attention(q, k, v, layout, **arguments)
    assert np.isfinite(out[0]).all()
    assert np.isnan(out[1]).all() and np.isnan(out[2]).all()


# Heads keeping different blocks: the table lists the blocks some head keeps; a GQA group is read
# once, over the blocks some head of it keeps, and each head folds in only its own.
def per_head_decode_layout(rng, n_heads, blocks, block_size, causal):
    """Random per-head blocks; in the last row block head 0 keeps nothing and head 1 everything."""
    block_mask = rng.random((n_heads, blocks, blocks)) < 0.4
    if causal:
        block_mask &= np.tril(np.ones((blocks, blocks), dtype=bool))
    block_mask[0, -1] = False
    block_mask[1, -1] = np.tril(np.ones((blocks, blocks), dtype=bool))[-1] if causal else True
    return tilelab.BlockSparseLayout.from_dense(block_mask, block_size, causal=causal)


# (Hq, Hkv, head dim, layout heads, block size): per query head and per kv head layouts, GQA 4
# and 3, blocks of 1 and 48 keys, and 16 kv heads, whose decode items span some of them (a block
# that no head of an item keeps is then skipped by that item).
HETERO_DECODE = {
    "gqa4_per_query_head": (8, 2, 64, 8, 16),
    "gqa3_per_query_head_block48": (9, 3, 40, 9, 48),
    "per_kv_head_block1": (8, 4, 32, 4, 1),
    "16_kv_heads_d128": (32, 16, 128, 32, 16),
}


@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("case", HETERO_DECODE)
def test_decode_with_heads_keeping_different_blocks(rng, restore_num_threads, case, causal,
                                                    dtype_name):
    q_heads, kv_heads, head_dim, layout_heads, block_size = HETERO_DECODE[case]
    blocks = -(-200 // block_size) if block_size > 1 else 40
    layout = per_head_decode_layout(rng, layout_heads, blocks, block_size, causal)
    max_len = blocks * block_size
    k_lens = [max_len, 1, block_size, block_size + 1, max_len - 1, max_len // 2 + 3]
    q_lens = [1] * len(k_lens)
    assert heads_keep_different_blocks(layout, k_lens)
    q, k, v = random_packed(rng, q_lens, k_lens, q_heads, kv_heads, head_dim, dtype_name)
    arguments = dict(cu_seqlens_q=cu_seqlens(q_lens), cu_seqlens_k=cu_seqlens(k_lens))
    if cpu_streams_cache_rows():
        assert tilelab.blocksparse_attention_kernels(q, k, v, layout, **arguments) == ["paged"]
    results = []
    for threads in (1, 2):
        tilelab.set_num_threads(threads)
        results.append(check(q, k, v, layout, q_lens, k_lens, dtype_name))
    np.testing.assert_array_equal(results[0], results[1])
    # Head 0 keeps no block of the longest sequences' last row block: 0, never NaN.
    assert (results[0][0, 0] == 0).all()
    # K and V whose kv heads lie further apart than their tokens: one kv head per decode item.
    k_by_head, v_by_head = (np.ascontiguousarray(a.transpose(1, 0, 2)).transpose(1, 0, 2)
                            for a in (k, v))
    check(q, k_by_head, v_by_head, layout, q_lens, k_lens, dtype_name)


@pytest.mark.parametrize("implementation", ["automatic", "generated"])
@pytest.mark.parametrize("by_head", [False, True], ids=["token_major", "head_major"])
def test_decode_with_heads_keeping_different_blocks_non_finite_values(rng, by_head,
                                                                      implementation):
    if implementation == "generated" and not kernels_built(rng):
        pytest.skip("built without the generated kernels")
    # One kv head, a group of 4 query heads; in the last row block head 0 keeps blocks 0 and 2,
    # head 1 block 1, head 2 blocks 0-2 and head 3 block 3.
    block_mask = np.tril(np.ones((4, 4, 4), dtype=bool))
    block_mask[:, 3] = [[1, 0, 1, 0], [0, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 1]]
    layout = tilelab.BlockSparseLayout.from_dense(block_mask, 16)
    q, k, v = random_packed(rng, [1], [64], 4, 1, 32, "float32")
    clean = (q.copy(), k.copy(), v.copy())
    v[20, 0, 5] = np.nan  # block 1: heads 1 and 2 see it
    k[40, 0, :] = -1e30   # block 2: heads 0 and 2 see it
    q[0, 3] = 1e30        # head 3 sees only block 3, its scores overflow to -inf: 0 / 0
    k[48:, 0, :] = -1e30
    if by_head:
        k, v = (np.ascontiguousarray(a.transpose(1, 0, 2)).transpose(1, 0, 2) for a in (k, v))
    arguments = dict(cu_seqlens_q=cu_seqlens([1]), cu_seqlens_k=cu_seqlens([64]))
    if cpu_streams_cache_rows():
        assert tilelab.blocksparse_attention_kernels(q, k, v, layout, **arguments) == ["paged"]
    out = tilelab.blocksparse_attention(q, k, v, layout, implementation=implementation,
                                        **arguments)
    # Heads 1 and 2 see value 20's NaN in element 5 (that column only); head 3's sum is 0.
    for head in (1, 2):
        assert np.isnan(out[0, head]).tolist() == [d == 5 for d in range(32)]
    assert np.isnan(out[0, 3]).all()
    # Head 0 never sees key 20's NaN, and key 40's -inf score weighs 0 in its softmax.
    expected_k = clean[1].copy()
    expected_k[40, 0, :] = -1e30
    expected = reference_blocksparse(clean[0], expected_k, clean[2], layout, *arguments.values())
    assert np.isfinite(out[0, 0]).all()
    np.testing.assert_allclose(out[0, 0], expected[0, 0], rtol=1e-5, atol=1e-6)


def test_kernels_validates_like_the_call(rng):
    arguments = _valid_call(rng)
    arguments["cu_seqlens_q"] = np.array([1, 10, 11], np.int32)
    with pytest.raises(ValueError, match=r"^cu_seqlens_q: expected 0 at index 0, got 1"):
        tilelab.blocksparse_attention_kernels(
            arguments.pop("q"), arguments.pop("k"), arguments.pop("v"), arguments.pop("layout"),
            **arguments,
        )
    with pytest.raises(TypeError, match=r"^q: "):
        tilelab.blocksparse_attention_kernels(
            [1.0], *(_valid_call(rng)[name] for name in ("k", "v", "layout")),
            cu_seqlens_q=cu_seqlens([10, 1]), cu_seqlens_k=cu_seqlens([40, 20]),
        )


# ---------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(
    ("crow", "col", "match"),
    [
        ([[0, 1, 3], [1, 1, 2]], [[0, 0, 1], [0, 1, 0]], r"^crow: expected 0 .* head 1"),
        ([[0, 2, 1], [0, 1, 2]], [[0, 0, 1], [0, 1, 0]],
         r"^crow: expected non-decreasing .* head 0, row 1"),
        ([[0, 1, 4], [0, 1, 2]], [[0, 0, 1], [0, 1, 0]], r"^col: expected at least 4 .* head 0"),
        ([[0, 1, 3], [0, 1, 2]], [[0, 0, 1], [0, 2, 0]],
         r"^col: expected block indices in \[0, 2\), got 2 at head 1, row 1"),
        ([[0, 1, 3], [0, 1, 2]], [[0, 0, -1], [0, 1, 0]], r"^col: .* got -1 at head 0, row 1"),
        ([[0, 1, 3], [0, 1, 2]], [[0, 1, 0], [0, 1, 0]], r"^col: expected sorted, unique .* "
                                                         r"got 1 then 0 at head 0, row 1"),
        ([[0, 1, 3], [0, 1, 2]], [[0, 1, 1], [0, 1, 0]], r"^col: expected sorted, unique .* "
                                                         r"got 1 then 1 at head 0, row 1"),
        ([[0, 1, 3], [0, 1, 2]], [[1, 0, 1], [0, 1, 0]],
         r"^col: expected no block above the diagonal .* column 1 at head 0, row 0"),
        ([[0, 1, 3], [0, 1, 2]], [[0, 0, 1]], r"^col: expected 2 rows"),
        ([[0, 1, 3]], [0, 0, 1], r"^col: expected rank 2"),
        ([[0]], [[0]], r"^crow: expected n_heads x \(num_row_blocks \+ 1\) entries"),
        ([[0, 1, 2**31]], [[0, 0, 1]], r"^crow: expected values in the int32 range"),
    ],
)
def test_bad_csr_layouts(crow, col, match):
    with pytest.raises(ValueError, match=match):
        tilelab.BlockSparseLayout(np.array(crow), np.array(col), 16)


def test_above_diagonal_block_is_fine_when_not_causal():
    layout = tilelab.BlockSparseLayout(np.array([[0, 1, 3]]), np.array([[1, 0, 1]]), 16,
                                       causal=False)
    assert layout.to_dense().tolist() == [[[False, True], [True, True]]]


def test_bad_layout_arguments():
    with pytest.raises(TypeError, match=r"^crow: expected an integer dtype"):
        tilelab.BlockSparseLayout(np.zeros((1, 3)), np.zeros((1, 1), np.int32), 16)
    with pytest.raises(TypeError, match=r"^col: expected a numpy.ndarray \(or an object with "
                       r"__dlpack__ or the buffer protocol\) of int32, got list"):
        tilelab.BlockSparseLayout(np.zeros((1, 3), np.int32), [[0]], 16)
    with pytest.raises(ValueError, match=r"^block_size: expected a value >= 1, got 0"):
        tilelab.BlockSparseLayout(np.array([[0, 1]]), np.array([[0]]), 0)
    with pytest.raises(ValueError, match=r"^block_mask: expected no block above the diagonal .* "
                                         r"column 1 at head 0, row 0"):
        tilelab.BlockSparseLayout.from_dense(np.ones((1, 2, 2), bool), 16)
    with pytest.raises(ValueError, match=r"^block_mask: expected shape \[n_heads, num_blocks, "
                                         r"num_blocks\], got shape \(1, 2, 3\)"):
        tilelab.BlockSparseLayout.from_dense(np.zeros((1, 2, 3), bool), 16)
    with pytest.raises(TypeError, match=r"^block_mask: expected a numpy.ndarray of bool, got "
                                        r"dtype int64"):
        tilelab.BlockSparseLayout.from_dense(np.zeros((1, 2, 2), np.int64), 16)
    for args, match in [
        ((0, 64, 16, 1, 1), r"^n_heads: expected a value >= 1, got 0"),
        ((1, 0, 16, 1, 1), r"^max_seqlen: expected a value >= 1, got 0"),
        ((1, 64, 0, 1, 1), r"^block_size: expected a value >= 1, got 0"),
        ((1, 64, 16, -1, 1), r"^local_blocks: expected a value >= 0, got -1"),
        ((1, 64, 16, 1, 0), r"^vert_stride: expected a value >= 1, got 0"),
    ]:
        with pytest.raises(ValueError, match=match):
            tilelab.BlockSparseLayout.local_strided(*args)
    with pytest.raises(ValueError, match=r"^head_sliding_step: expected a value >= 0"):
        tilelab.BlockSparseLayout.local_strided(2, 64, 16, 1, 2, head_sliding_step=-1)
    layout = tilelab.BlockSparseLayout.local_strided(2, 64, 16, 1, 2)
    with pytest.raises(ValueError, match=r"^seqlen: expected a length in \[0, 64\] .*got 65"):
        layout.token_mask(65)
    with pytest.raises(ValueError, match=r"^head: expected a head in \[0, 2\), got 2"):
        layout.token_mask(10, head=2)


def _valid_call(rng, dtype_name="float32"):
    layout = tilelab.BlockSparseLayout.local_strided(4, 64, 16, 2, 2)
    q, k, v = random_packed(rng, [10, 1], [40, 20], 4, 2, 16, dtype_name)
    return dict(q=q, k=k, v=v, layout=layout, cu_seqlens_q=cu_seqlens([10, 1]),
                cu_seqlens_k=cu_seqlens([40, 20]))


def _call(arguments):
    arguments = dict(arguments)
    return tilelab.blocksparse_attention(
        arguments.pop("q"), arguments.pop("k"), arguments.pop("v"), arguments.pop("layout"),
        **arguments,
    )


def test_valid_call_succeeds(rng):
    _call(_valid_call(rng))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(cu_seqlens_q=np.array([1, 10, 11], np.int32)),
         r"^cu_seqlens_q: expected 0 at index 0, got 1"),
        (dict(cu_seqlens_k=np.array([0, 40, 30, 60], np.int32)),
         r"^cu_seqlens_k: expected non-decreasing prefix sums, got 40 then 30 at index 2"),
        (dict(cu_seqlens_q=np.array([0, 10, 12], np.int32)),
         r"^cu_seqlens_q: expected the last entry to be total_q = 11, got 12 at index 2"),
        (dict(cu_seqlens_k=np.array([0, 40, 59], np.int32)),
         r"^cu_seqlens_k: expected the last entry to be total_k = 60, got 59"),
        (dict(cu_seqlens_k=np.array([0, 20, 40, 60], np.int32)),
         r"^cu_seqlens_k: expected 3 entries \(num_seqs \+ 1, the length of cu_seqlens_q\), got 4"),
        (dict(cu_seqlens_q=np.array([0, 10, 11], np.int32),
              cu_seqlens_k=np.array([0, 5, 60], np.int32)),
         r"^cu_seqlens_q: expected q_len <= k_len .* got q_len 10 > k_len 5 in sequence 0"),
        (dict(cu_seqlens_q=np.array([0], np.int32)),
         r"^cu_seqlens_q: expected num_seqs \+ 1 >= 2 entries"),
        (dict(cu_seqlens_q=np.array([[0, 10, 11]], np.int32)),
         r"^cu_seqlens_q: expected rank 1 \[num_seqs \+ 1\], got shape \(1, 3\)"),
        (dict(cu_seqlens_k=np.array([0, 40, 2**31], np.int64)),
         r"^cu_seqlens_k: expected values in the int32 range"),
        (dict(cu_seqlens_k=np.array([0, 40, 2**64 - 1], np.uint64)),
         r"^cu_seqlens_k: expected values in the int32 range, got values in \[0, "
         r"18446744073709551615\]"),
        (dict(layout=tilelab.BlockSparseLayout.local_strided(3, 64, 16, 2, 2)),
         r"^layout: expected 1 head, Hq = 4 heads \(one per query head\) or Hkv = 2 heads \(one "
         r"per kv head\), got 3"),
        (dict(layout=tilelab.BlockSparseLayout.local_strided(4, 32, 16, 2, 2)),
         r"^layout: expected num_row_blocks x block_size = 2 x 16 = 32 tokens to cover every "
         r"sequence, got k_len 40 in sequence 0"),
        (dict(scale=float("inf")), r"^scale: expected a finite value, got inf"),
        (dict(implementation="fast"),
         r"^implementation: expected 'automatic', 'generated' or 'reference', got 'fast'"),
    ],
)
def test_bad_arguments(rng, change, match):
    arguments = _valid_call(rng)
    arguments.update(change)
    with pytest.raises(ValueError, match=match):
        _call(arguments)


def test_cu_seqlens_of_different_lengths(rng):
    arguments = _valid_call(rng)
    arguments["cu_seqlens_k"] = np.array([0, 20, 30, 60], np.int32)
    arguments["cu_seqlens_q"] = np.array([0, 10, 10, 11], np.int32)
    arguments["cu_seqlens_k"] = np.array([0, 40, 60], np.int32)
    with pytest.raises(ValueError, match=r"^cu_seqlens_k: expected 4 entries \(num_seqs \+ 1, "
                                         r"the length of cu_seqlens_q\), got 3"):
        _call(arguments)


@pytest.mark.parametrize(
    ("change", "exception", "match"),
    [
        (lambda a: a.update(q=a["q"][None]), ValueError, r"^q: expected rank 3 \[total_q, Hq, D\]"),
        (lambda a: a.update(k=a["k"][:, :, :8]), ValueError,
         r"^k: expected head dim 16 \(from q\)"),
        (lambda a: a.update(v=a["v"][:50]), ValueError, r"^v: expected shape \[60, 2, 16\]"),
        (lambda a: a.update(k=a["k"][:, :1].repeat(3, axis=1), v=a["v"][:, :1].repeat(3, axis=1)),
         ValueError, r"^k: expected a head count that divides q's"),
        (lambda a: a.update(q=np.zeros((11, 4, 257), np.float32)), ValueError,
         r"^q: expected head dim D in \[1, 256\]"),
        (lambda a: a.update(k=a["k"].astype(np.float16)), TypeError,
         r"^k: expected dtype float32 \(the dtype of q\), got float16"),
        (lambda a: a.update(q=a["q"].astype(np.float64)), TypeError, r"^q: expected dtype"),
        (lambda a: a.update(cu_seqlens_q=np.array([0.0, 10, 11])), TypeError,
         r"^cu_seqlens_q: expected an integer dtype \(int32\), got float64"),
        (lambda a: a.update(cu_seqlens_k=[0, 40, 60]), TypeError,
         r"^cu_seqlens_k: expected a numpy.ndarray \(or an object with __dlpack__ or the "
         r"buffer protocol\) of int32, got list"),
        (lambda a: a.update(out=np.zeros((11, 4, 16), np.float16)), TypeError,
         r"^out: expected dtype float32 \(the dtype of q\), got float16"),
        (lambda a: a.update(out=np.zeros((11, 4, 8), np.float32)), ValueError,
         r"^out: expected shape \[11, 4, 16\] \(the shape of q\)"),
        (lambda a: a.update(out=a["q"]), ValueError, r"^out: expected memory disjoint from q"),
    ],
)
def test_bad_tensors(rng, change, exception, match):
    arguments = _valid_call(rng)
    change(arguments)
    with pytest.raises(exception, match=match):
        _call(arguments)


def test_read_only_out_is_rejected(rng):
    arguments = _valid_call(rng)
    out = np.zeros((11, 4, 16), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match=r"^out: expected a writeable array"):
        _call(dict(arguments, out=out))


def test_errors_leave_out_untouched(rng):
    arguments = _valid_call(rng)
    out = np.full((11, 4, 16), 7.0, np.float32)
    arguments.update(out=out, cu_seqlens_k=np.array([0, 40, 59], np.int32))
    with pytest.raises(ValueError):
        _call(arguments)
    assert (out == 7.0).all()


# ---------------------------------------------------------------------------------------------
# bfloat16 on bf16 dot products (P rounded to bf16) and with fp32 probabilities


@pytest.mark.parametrize("fp32_probabilities", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_bf16_both_probability_precisions_match_the_sparse_reference(rng, case, fp32_probabilities):
    q_heads, kv_heads, head_dim, layout_args, q_lens, k_lens = CASES[case]
    layout = tilelab.BlockSparseLayout.local_strided(**layout_args)
    q, k, v = random_packed(rng, q_lens, k_lens, q_heads, kv_heads, head_dim, "bfloat16")
    check(q, k, v, layout, q_lens, k_lens, "bfloat16", fp32_probabilities=fp32_probabilities)


@pytest.mark.parametrize("fp32_probabilities", [False, True])
@pytest.mark.parametrize("head_dim", [7, 64])
def test_bf16_absent_blocks_and_padding_keys_are_never_read(rng, head_dim, fp32_probabilities):
    # In bf16 the key pairs of a tile that runs past its block's keys must read zeros, not the NaN
    # of a key no query sees.
    layout = tilelab.BlockSparseLayout.local_strided(2, 256, 24, 2, 4)
    check_unseen_keys_are_never_read(
        rng,
        layout,
        [250, 1],
        [250, 201],
        head_dim,
        "bfloat16",
        fp32_probabilities=fp32_probabilities,
    )


def test_fp32_probabilities_must_be_a_bool(rng):
    layout = tilelab.BlockSparseLayout.local_strided(1, 64, 16, 4, 1)
    q, k, v = random_packed(rng, [64], [64], 1, 1, 8, "bfloat16")
    with pytest.raises(TypeError, match="fp32_probabilities"):
        tilelab.blocksparse_attention(
            q,
            k,
            v,
            layout,
            cu_seqlens_q=cu_seqlens([64]),
            cu_seqlens_k=cu_seqlens([64]),
            fp32_probabilities="yes",
        )
