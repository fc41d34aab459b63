"""tilelab.paged_attention and tilelab.reshape_and_cache_flash against an fp64 numpy reference
computed per sequence from K/V gathered through the block table: head layouts, head sizes, block
sizes, decode / prefill / mixed batches with ragged lengths, every score option alone and
together, fp8 caches, split-KV, non-finite data, and every documented error."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from attention_reference import DTYPES, UNIT_ROUNDOFF
from cpu_policy import rounds_bf16_probabilities

import tilelab

FP8 = {"float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
       "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2)}

# ---------------------------------------------------------------------------------------------
# The fp64 reference and batch builders


def reference_paged(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, *,
                    scale=None, causal=True, sliding_window=(-1, -1), softcap=0.0,
                    alibi_slopes=None, sinks=None, k_scale=1.0, v_scale=1.0):
    """out in float64, per sequence and query head, by the documented formulas: s = scale q.k,
    softcap, ALiBi, the causal and window masks, sinks in the denominator; 0 for a query that
    sees no key."""
    q = np.asarray(query, dtype=np.float64)
    kc = np.asarray(key_cache, dtype=np.float64) * k_scale
    vc = np.asarray(value_cache, dtype=np.float64) * v_scale
    _, q_heads, head_dim = q.shape
    kv_heads, block_size = kc.shape[1], kc.shape[2]
    group = q_heads // kv_heads
    scale = float(np.float32(1) / np.sqrt(np.float32(head_dim))) if scale is None else scale
    left, right = sliding_window
    out = np.zeros_like(q)
    for s in range(len(seq_lens)):
        q0, q1, seq_len = int(query_start_loc[s]), int(query_start_loc[s + 1]), int(seq_lens[s])
        if q1 == q0:
            continue
        positions = np.arange(seq_len)
        blocks = np.asarray(block_table)[s, positions // block_size]
        keys = kc[blocks, :, positions % block_size, :]  # [seq_len, Hkv, D]
        values = vc[blocks, :, positions % block_size, :]
        i = seq_len - (q1 - q0) + np.arange(q1 - q0)
        j = np.arange(seq_len)
        visible = np.ones((q1 - q0, seq_len), dtype=bool)
        if causal:
            visible &= j[None, :] <= i[:, None]
        if left >= 0:
            visible &= j[None, :] >= i[:, None] - left
        if right >= 0:
            visible &= j[None, :] <= i[:, None] + right
        for h in range(q_heads):
            scores = scale * (q[q0:q1, h] @ keys[:, h // group].T)
            if softcap > 0:
                scores = softcap * np.tanh(scores / softcap)
            if alibi_slopes is not None:
                scores = scores + float(alibi_slopes[h]) * (j[None, :] - i[:, None])
            scores = np.where(visible, scores, -np.inf)
            row_max = scores.max(axis=1, initial=-np.inf)
            sink = None if sinks is None else float(sinks[h])
            if sink is not None:
                row_max = np.maximum(row_max, sink)
            empty = np.isneginf(row_max)
            safe_max = np.where(empty, 0.0, row_max)[:, None]
            weights = np.where(visible, np.exp(scores - safe_max), 0.0)
            denominator = weights.sum(axis=1)
            if sink is not None:
                denominator = denominator + np.exp(sink - safe_max[:, 0])
            result = (weights @ values[:, h // group]) / np.where(empty, 1.0, denominator)[:, None]
            out[q0:q1, h] = np.where(empty[:, None], 0.0, result)
    return out


def make_batch(rng, requests, *, q_heads, kv_heads, head_dim, block_size, dtype="float32",
               spare_blocks=3, shuffle=True):
    """A paged batch: requests are (q_len, seq_len) pairs; blocks are handed out in a shuffled
    order from a cache with spare blocks (filled with a huge value nothing may read), and each
    block table row is padded with -1 past the blocks its sequence uses."""
    dtype = DTYPES[dtype]
    blocks_per_seq = [-(-seq_len // block_size) for _, seq_len in requests]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    order = rng.permutation(num_blocks) if shuffle else np.arange(num_blocks)
    max_blocks = max(max(blocks_per_seq), 1)
    block_table = np.full((len(requests), max_blocks), -1, dtype=np.int32)
    used = 0
    for s, count in enumerate(blocks_per_seq):
        block_table[s, :count] = order[used:used + count]
        used += count
    shape = (num_blocks, kv_heads, block_size, head_dim)
    key_cache = rng.standard_normal(shape, dtype=np.float32)
    value_cache = rng.standard_normal(shape, dtype=np.float32)
    # The dtype's largest value: q.k with it overflows to inf, which a read would show.
    largest = float(ml_dtypes.finfo(dtype).max)
    for spare in order[used:]:
        key_cache[spare] = largest
        value_cache[spare] = largest
    num_tokens = sum(q_len for q_len, _ in requests)
    query = rng.standard_normal((num_tokens, q_heads, head_dim), dtype=np.float32)
    seq_lens = np.array([seq_len for _, seq_len in requests], dtype=np.int32)
    query_start_loc = np.concatenate([[0], np.cumsum([q for q, _ in requests])]).astype(np.int32)
    return dict(query=query.astype(dtype), key_cache=key_cache.astype(dtype),
                value_cache=value_cache.astype(dtype), block_table=block_table,
                seq_lens=seq_lens, query_start_loc=query_start_loc)


def tolerance(dtype_name, batch, v_scale=1.0):
    """Absolute tolerance on out: the output's rounding (and P rounded to the input dtype by the
    generated dense kernel), plus fp32 accumulation over the longest sequence. The magnitude is
    that of the blocks the block table names: spare blocks hold huge values nothing may read."""
    named = np.unique(batch["block_table"][batch["block_table"] >= 0])
    values = np.asarray(batch["value_cache"][named], dtype=np.float64) * v_scale
    magnitude = float(np.max(np.abs(values), initial=1.0))
    longest = int(np.max(batch["seq_lens"], initial=1))
    accumulation = 16 * UNIT_ROUNDOFF["float32"] * np.sqrt(longest)
    return magnitude * (2 * UNIT_ROUNDOFF[dtype_name] + accumulation)


def arguments(batch):
    return (batch["query"], batch["key_cache"], batch["value_cache"], batch["block_table"],
            batch["seq_lens"], batch["query_start_loc"])


def check(batch, dtype_name="float32", **options):
    reference_options = {k: v for k, v in options.items()
                         if k not in ("split_kv", "fp32_probabilities")}
    reference = reference_paged(*arguments(batch), **reference_options)
    atol = tolerance(dtype_name, batch, options.get("v_scale", 1.0))
    out = tilelab.paged_attention(*arguments(batch), **options)
    assert out.dtype == batch["query"].dtype and out.shape == batch["query"].shape
    out64 = np.asarray(out, dtype=np.float64)
    assert np.all(np.isfinite(out64)), "out has NaN or inf"
    error = np.max(np.abs(out64 - reference), initial=0.0)
    assert error <= atol, f"max |out - reference| = {error:.3g} > {atol:.3g}"


DECODE = [(1, 1), (1, 37), (1, 300), (1, 129)]
PREFILL = [(5, 5), (70, 70), (33, 33)]
MIXED = [(40, 300), (1, 1), (1, 517), (64, 64), (3, 90), (1, 200)]
BATCHES = {"decode": DECODE, "prefill": PREFILL, "mixed": MIXED}

# ---------------------------------------------------------------------------------------------
# Shapes: heads, head sizes, block sizes and batch kinds


@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (9, 3)], ids=lambda h: f"Hq{h[0]}-Hkv{h[1]}")
@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256, 512])
def test_shapes(heads, head_dim):
    """Every (heads, head size) pair with each block size and each batch kind, cycled so that
    every block size meets every batch kind across the grid."""
    rng = np.random.default_rng(head_dim * 10 + heads[0])
    index = [64, 80, 96, 128, 256, 512].index(head_dim) + 6 * [(4, 4), (8, 2), (9, 3)].index(heads)
    block_size = [1, 16, 48, 128][index % 4]
    kind = list(BATCHES)[index % 3]
    batch = make_batch(rng, BATCHES[kind], q_heads=heads[0], kv_heads=heads[1],
                       head_dim=head_dim, block_size=block_size)
    check(batch)


@pytest.mark.parametrize("block_size", [1, 16, 48, 128])
@pytest.mark.parametrize("kind", list(BATCHES))
def test_block_sizes_and_batch_kinds(block_size, kind):
    rng = np.random.default_rng(block_size)
    batch = make_batch(rng, BATCHES[kind], q_heads=8, kv_heads=2, head_dim=64,
                       block_size=block_size)
    check(batch)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_dtypes(dtype):
    rng = np.random.default_rng(3)
    batch = make_batch(rng, MIXED, q_heads=8, kv_heads=2, head_dim=128, block_size=16,
                       dtype=dtype)
    check(batch, dtype)


def test_long_sequences():
    """A prefill whose query is its whole 8 k sequence, a 1-token context decode next to an 8 k
    decode, and a prefill with a long context."""
    rng = np.random.default_rng(8)
    requests = [(1, 2), (300, 8192), (1, 8000), (8192 // 4, 8192 // 4)]
    batch = make_batch(rng, requests, q_heads=4, kv_heads=2, head_dim=64, block_size=32,
                       dtype="bfloat16")
    check(batch, "bfloat16")


def test_sequence_without_queries():
    """A sequence with no new token (q_len 0) is skipped; the others are unaffected."""
    rng = np.random.default_rng(4)
    batch = make_batch(rng, [(3, 40), (0, 50), (1, 9)], q_heads=4, kv_heads=2, head_dim=32,
                       block_size=16)
    check(batch)


def test_non_contiguous_views_and_out():
    """Strided query and cache views are read in place; out= is written in place and returned."""
    rng = np.random.default_rng(5)
    batch = make_batch(rng, MIXED, q_heads=4, kv_heads=2, head_dim=64, block_size=16)
    reference = reference_paged(*arguments(batch))
    wide_query = np.zeros((batch["query"].shape[0], 4, 128), np.float32)
    wide_query[:, :, ::2] = batch["query"]
    key_cache = np.asfortranarray(batch["key_cache"])
    out = np.full((batch["query"].shape[0], 4, 64), np.nan, np.float32)
    result = tilelab.paged_attention(wide_query[:, :, ::2], key_cache, batch["value_cache"],
                                     batch["block_table"], batch["seq_lens"],
                                     batch["query_start_loc"], out=out)
    assert result is out
    np.testing.assert_allclose(out, reference, atol=tolerance("float32", batch))


# ---------------------------------------------------------------------------------------------
# Score options, alone and together


def option_values(q_heads, rng):
    return {
        "softcap": dict(softcap=2.5),
        "alibi": dict(alibi_slopes=(2.0 ** -np.arange(1, q_heads + 1)).astype(np.float32)),
        "window_left": dict(sliding_window=(37, -1)),
        "window_left_0": dict(sliding_window=(0, -1)),
        "sinks": dict(sinks=rng.standard_normal(q_heads).astype(np.float32) * 2),
        "scale": dict(scale=0.3),
    }


OPTION_NAMES = ["softcap", "alibi", "window_left", "window_left_0", "sinks", "scale"]


@pytest.mark.parametrize("option", OPTION_NAMES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_each_option(option, dtype):
    rng = np.random.default_rng(11)
    batch = make_batch(rng, MIXED, q_heads=8, kv_heads=2, head_dim=64, block_size=16,
                       dtype=dtype)
    check(batch, dtype, **option_values(8, rng)[option])


COMBINATIONS = [*itertools.combinations(OPTION_NAMES[:5], 2), tuple(OPTION_NAMES)]


@pytest.mark.parametrize("combination", COMBINATIONS, ids=lambda c: "+".join(c))
def test_option_combinations(combination):
    rng = np.random.default_rng(12)
    batch = make_batch(rng, MIXED, q_heads=9, kv_heads=3, head_dim=80, block_size=48)
    values = option_values(9, rng)
    options = {}
    for name in combination:
        if name == "window_left_0" and "window_left" in combination:
            continue
        options.update(values[name])
    check(batch, **options)


@pytest.mark.parametrize("window", [(-1, 0), (-1, 5), (10, 10), (0, 0), (3, 40)])
def test_non_causal_windows(window):
    """causal=False: the window alone decides, to the right of the query too."""
    rng = np.random.default_rng(13)
    batch = make_batch(rng, MIXED, q_heads=4, kv_heads=4, head_dim=64, block_size=16)
    check(batch, causal=False, sliding_window=window)


def test_non_causal_without_window():
    rng = np.random.default_rng(14)
    batch = make_batch(rng, PREFILL + DECODE, q_heads=8, kv_heads=2, head_dim=64, block_size=16)
    check(batch, causal=False)


def test_window_sides_as_large_as_int64():
    """Window sides up to int64's largest value mean "unbounded": no overflow, the same bits, on
    the paged kernel and the prefill route alike."""
    rng = np.random.default_rng(17)
    batch = make_batch(rng, [*PREFILL, *DECODE, (40, 300)], q_heads=8, kv_heads=2, head_dim=64,
                       block_size=16)
    largest = int(np.iinfo(np.int64).max)
    for causal in (True, False):
        unbounded = tilelab.paged_attention(*arguments(batch), causal=causal, softcap=5.0)
        for window in [(largest, -1), (-1, largest), (largest, largest)]:
            np.testing.assert_array_equal(
                tilelab.paged_attention(*arguments(batch), causal=causal, softcap=5.0,
                                        sliding_window=window), unbounded)


def test_sinks_extremes():
    """A sink of -inf adds nothing; a huge sink takes nearly all the weight (out near 0)."""
    rng = np.random.default_rng(15)
    batch = make_batch(rng, MIXED, q_heads=4, kv_heads=2, head_dim=32, block_size=16)
    plain = tilelab.paged_attention(*arguments(batch), sliding_window=NO_OP_WINDOW)
    none = tilelab.paged_attention(*arguments(batch), sinks=np.full(4, -np.inf, np.float32))
    np.testing.assert_array_equal(none, plain)
    heavy = tilelab.paged_attention(*arguments(batch), sinks=np.full(4, 80.0, np.float32))
    assert np.max(np.abs(heavy)) < 1e-20


@pytest.mark.parametrize("requests", [[(1, 400), (4, 300)], [(40, 400), (4, 300)]],
                         ids=["paged", "prefill-route"])
def test_window_skips_blocks_outside(requests):
    """Keys outside the window are never read: NaN there does not reach the output. The paged
    kernel skips whole blocks and masks the rest; the prefill route (sequence 0 of the second
    case) gathers from the block of its first query's window on, so NaN in the blocks before it
    leaves the sequence on the generated kernels."""
    rng = np.random.default_rng(16)
    batch = make_batch(rng, requests, q_heads=4, kv_heads=2, head_dim=32, block_size=16)
    expected = reference_paged(*arguments(batch), sliding_window=(20, -1))
    atol = tolerance("float32", batch)
    routed = requests[0][0] == 40
    for s, seq_len in enumerate(batch["seq_lens"]):
        first_visible = seq_len - requests[s][0] - 20
        end = first_visible // 16 * 16 if routed and s == 0 else first_visible - 1
        for position in range(0, end):
            block = batch["block_table"][s, position // 16]
            batch["key_cache"][block, :, position % 16] = np.nan
            batch["value_cache"][block, :, position % 16] = np.nan
    out = tilelab.paged_attention(*arguments(batch), sliding_window=(20, -1))
    np.testing.assert_allclose(out, expected, atol=atol)
    if routed:
        np.testing.assert_array_equal(out[:40], dense_result(batch, 0, causal=True,
                                                             sliding_window=(20, -1)))


# ---------------------------------------------------------------------------------------------
# fp8 caches


# Per-format tolerance against the unquantized result, a sanity bound (the exact check is against
# the dequantized cache): each stored element carries a relative error up to half an ulp of its
# significand (e4m3: 2^-4, e5m2: 2^-3), which moves scores of D = 64 products by a few percent and
# the softmax weights with them. Measured on test_fp8_cache's batch: max |error| 0.15 (e4m3) and
# 0.30 (e5m2) for outputs of magnitude up to ~1.5; the bounds leave 1.6x margin.
FP8_TOLERANCE = {"float8_e4m3fn": 0.25, "float8_e5m2": 0.5}


def quantized_copy(batch, fp8_name, k_scale, v_scale):
    """The batch with fp8 caches written by reshape_and_cache_flash (every slot of the cache)."""
    num_blocks, kv_heads, block_size, head_dim = batch["key_cache"].shape
    key_cache = np.zeros(batch["key_cache"].shape, FP8[fp8_name])
    value_cache = np.zeros(batch["value_cache"].shape, FP8[fp8_name])
    tokens = batch["key_cache"].transpose(0, 2, 1, 3).reshape(-1, kv_heads, head_dim)
    values = batch["value_cache"].transpose(0, 2, 1, 3).reshape(-1, kv_heads, head_dim)
    slots = np.arange(num_blocks * block_size, dtype=np.int32)
    tilelab.reshape_and_cache_flash(tokens, values, key_cache, value_cache, slots,
                                    k_scale=k_scale, v_scale=v_scale)
    return dict(batch, key_cache=key_cache, value_cache=value_cache)


@pytest.mark.parametrize("fp8_name", list(FP8))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fp8_cache(fp8_name, dtype):
    rng = np.random.default_rng(21)
    batch = make_batch(rng, MIXED, q_heads=8, kv_heads=2, head_dim=64, block_size=16,
                       dtype=dtype, spare_blocks=0)
    k_scale, v_scale = 0.05, 0.02
    fp8 = quantized_copy(batch, fp8_name, k_scale, v_scale)
    # Exact against the dequantized cache...
    check(fp8, dtype, k_scale=k_scale, v_scale=v_scale)
    # ...and close to the unquantized result, within the format's tolerance.
    unquantized = reference_paged(*arguments(batch))
    out = tilelab.paged_attention(*arguments(fp8), k_scale=k_scale, v_scale=v_scale)
    error = np.max(np.abs(np.asarray(out, np.float64) - unquantized))
    assert error <= FP8_TOLERANCE[fp8_name], f"{fp8_name}: {error:.3g}"


@pytest.mark.parametrize("fp8_name", list(FP8))
@pytest.mark.parametrize("head_dim", [100, 256, 263])
@pytest.mark.parametrize("query_dtype", ["float32", "bfloat16"])
def test_every_fp8_code_widens_exactly(fp8_name, head_dim, query_dtype):
    """With one visible key, out = v_scale * v exactly: a value row holding all 256 codes (the
    vector path takes 16 at a time, the scalar tail the rest) gives each code's ml_dtypes value,
    subnormals, zeros, the largest values, inf (e5m2) and NaN included. bf16 queries take P·V on
    bf16 dot products with the codes widened through byte tables, 64 elements at a time in an
    order of their own (100: the last 36 masked); every fp8 value is a bf16 value and P = 1, so
    that is exact too."""
    codes = np.arange(head_dim, dtype=np.uint32).astype(np.uint8)  # 263: codes 0-6 twice
    value_cache = codes.view(FP8[fp8_name]).reshape(1, 1, 1, head_dim)
    key_cache = np.zeros_like(value_cache)
    query = np.ones((1, 1, head_dim), DTYPES[query_dtype])
    out = tilelab.paged_attention(query, key_cache, value_cache, np.zeros((1, 1), np.int32),
                                  np.array([1], np.int32), np.array([0, 1], np.int32),
                                  v_scale=1.0)
    want = value_cache.reshape(1, 1, head_dim).astype(DTYPES[query_dtype])
    # NaN positions must match too (compared as float32, whose NaN numpy recognizes). (-0 comes
    # out +0: the accumulator starts at +0.)
    np.testing.assert_array_equal(np.asarray(out, np.float32), want.astype(np.float32))


@pytest.mark.parametrize("fp8_name", list(FP8))
@pytest.mark.parametrize("query_dtype", ["bfloat16", "float32", "float16"])
@pytest.mark.parametrize("dim", [96, 128, 160])
def test_every_fp8_key_code_scores_exactly(fp8_name, query_dtype, dim):
    """One key, `dim` one-hot query heads: head h's lse is its score k_scale * k[h] exactly, for
    every finite code (the bf16 dot-product path of bf16 queries reads fp8 keys through a lookup
    table, 64 elements at a time in an order of their own, a last 32 in order: 96 and 160 end with
    one; 160 also takes the kernel for long rows); a NaN or inf code in the key makes every head's
    score, lse and output NaN."""
    fp8 = FP8[fp8_name]
    query = np.eye(dim, dtype=np.float32).astype(DTYPES[query_dtype]).reshape(1, dim, 1, dim)
    for first in (0, 128):
        codes = np.arange(first, first + dim).astype(np.uint8)
        finite = np.isfinite(codes.view(fp8).astype(np.float32))
        key = np.where(finite, codes, 0).astype(np.uint8).view(fp8).reshape(1, 1, 1, dim)
        value = np.zeros_like(key)
        _, lse = tilelab.flash_attention(query, key, value, scale=1.0, k_scale=0.5,
                                         return_lse=True)
        np.testing.assert_array_equal(np.asarray(lse).reshape(dim),
                                      key.reshape(dim).astype(np.float32) * 0.5)
        for code in codes[~finite]:
            bad_key = key.copy()
            bad_key.view(np.uint8)[0, 0, 0, 5] = code
            out, lse = tilelab.flash_attention(query, bad_key, value, scale=1.0,
                                               return_lse=True)
            assert np.isnan(np.asarray(lse, np.float32)).all()
            assert np.isnan(np.asarray(out, np.float32)).all()


@pytest.mark.parametrize("fp8_name", list(FP8))
def test_fp8_cache_with_options_and_split(fp8_name):
    rng = np.random.default_rng(22)
    batch = make_batch(rng, [*DECODE, (7, 700)], q_heads=8, kv_heads=2, head_dim=96,
                       block_size=48, spare_blocks=0)
    fp8 = quantized_copy(batch, fp8_name, 0.1, 0.1)
    check(fp8, k_scale=0.1, v_scale=0.1, softcap=3.0, sliding_window=(200, -1), split_kv=3,
          sinks=np.ones(8, np.float32))


@pytest.mark.parametrize("fp8_name", list(FP8))
def test_reshape_and_cache_flash_quantizes_like_ml_dtypes(fp8_name):
    """Round to nearest even as ml_dtypes does for values in range; saturation beyond it; NaN
    stays NaN; inf is inf in e5m2 and NaN in e4m3fn."""
    fp8 = FP8[fp8_name]
    largest = float(ml_dtypes.finfo(fp8).max)
    rng = np.random.default_rng(23)
    in_range = rng.standard_normal(4096).astype(np.float32) * rng.choice([1e-3, 1, 30], 4096)
    in_range = np.clip(in_range, -largest, largest).astype(np.float32)
    specials = np.array([0.0, -0.0, largest * 1.5, -largest * 4, 1e30, np.nan, np.inf, -np.inf,
                         float(ml_dtypes.finfo(fp8).smallest_subnormal) / 3], np.float32)
    values = np.concatenate([in_range, specials]).reshape(-1, 1, 1)
    key_cache = np.zeros((values.shape[0], 1, 1, 1), fp8)
    value_cache = np.zeros_like(key_cache)
    slots = np.arange(values.shape[0], dtype=np.int32)
    tilelab.reshape_and_cache_flash(values, values, key_cache, value_cache, slots)
    stored = key_cache.reshape(-1).astype(np.float32)
    n = in_range.size
    np.testing.assert_array_equal(stored[:n], in_range.astype(fp8).astype(np.float32))
    assert stored[n] == 0 and not np.signbit(stored[n])
    assert stored[n + 1] == 0 and np.signbit(stored[n + 1])
    assert stored[n + 2] == largest and stored[n + 3] == -largest and stored[n + 4] == largest
    assert np.isnan(stored[n + 5])
    if fp8_name == "float8_e5m2":
        assert stored[n + 6] == np.inf and stored[n + 7] == -np.inf
    else:
        assert np.isnan(stored[n + 6]) and np.isnan(stored[n + 7])
    assert stored[n + 8] == 0
    np.testing.assert_array_equal(value_cache.view(np.uint8), key_cache.view(np.uint8))


def test_reshape_and_cache_flash_slots():
    """Slots land at (slot // block_size, slot % block_size); negative slots are skipped; the
    later of two tokens naming one slot wins; the scale divides before quantizing."""
    rng = np.random.default_rng(24)
    key = rng.standard_normal((5, 2, 8)).astype(np.float32)
    value = rng.standard_normal((5, 2, 8)).astype(np.float32)
    key_cache = np.full((3, 2, 4, 8), 7.0, np.float32)
    value_cache = np.full((3, 2, 4, 8), 7.0, np.float32)
    slots = np.array([5, -1, 11, 0, 5], np.int32)
    tilelab.reshape_and_cache_flash(key, value, key_cache, value_cache, slots)
    np.testing.assert_array_equal(key_cache[1, :, 1], key[4])
    np.testing.assert_array_equal(value_cache[2, :, 3], value[2])
    np.testing.assert_array_equal(key_cache[0, :, 0], key[3])
    untouched = np.ones((3, 4), bool)
    untouched[1, 1] = untouched[2, 3] = untouched[0, 0] = False
    assert np.all(key_cache.transpose(0, 2, 1, 3)[untouched] == 7.0)

    fp8_cache = np.zeros((3, 2, 4, 8), ml_dtypes.float8_e4m3fn)
    fp8_values = np.zeros_like(fp8_cache)
    tilelab.reshape_and_cache_flash(key, value, fp8_cache, fp8_values, slots, k_scale=0.5,
                                    v_scale=4.0)
    np.testing.assert_array_equal(fp8_cache[1, :, 1].astype(np.float32),
                                  (key[4] / 0.5).astype(ml_dtypes.float8_e4m3fn).astype(np.float32))
    np.testing.assert_array_equal(fp8_values[2, :, 3].astype(np.float32),
                                  (value[2] / 4.0).astype(ml_dtypes.float8_e4m3fn)
                                  .astype(np.float32))


def test_reshape_and_cache_flash_then_attention():
    """A decode step as a server runs it: write the new token's K/V, then attend."""
    rng = np.random.default_rng(25)
    batch = make_batch(rng, [(1, 50), (1, 17)], q_heads=4, kv_heads=2, head_dim=32, block_size=16)
    new_key = rng.standard_normal((2, 2, 32)).astype(np.float32)
    new_value = rng.standard_normal((2, 2, 32)).astype(np.float32)
    last = batch["seq_lens"] - 1
    slots = (batch["block_table"][[0, 1], last // 16] * 16 + last % 16).astype(np.int32)
    tilelab.reshape_and_cache_flash(new_key, new_value, batch["key_cache"], batch["value_cache"],
                                    slots)
    check(batch)


# ---------------------------------------------------------------------------------------------
# Split-KV


# Decode items (one query token) read K and V in place, widened in registers, on CPUs with
# AVX-512; items with more query tokens widen each chunk of keys into fp32 scratch first. The last
# token of a two-token prefill and the same token decoded alone see the same keys: both paths must
# agree to fp32 rounding (and the output dtype's), for every cache dtype, group size (tiles of four
# rows), head dim (tails of 16- and 32-element vectors) and length around the chunk sizes.
STREAMED_DTYPES = [("float32", "float32"), ("float16", "float16"), ("bfloat16", "bfloat16"),
                   ("bfloat16", "float8_e4m3fn"), ("bfloat16", "float8_e5m2"),
                   ("float32", "float8_e4m3fn"), ("float16", "float8_e5m2")]
STREAMED_LENGTHS = [2, 63, 64, 65, 127, 128, 129, 255, 256, 257, 300, 513]


@pytest.mark.parametrize("dtypes", STREAMED_DTYPES, ids=lambda d: f"{d[0]}-{d[1]}")
@pytest.mark.parametrize("heads", [(4, 4), (8, 4), (6, 2), (10, 2), (12, 2), (8, 1)],
                         ids=lambda h: f"Hq{h[0]}-Hkv{h[1]}")
@pytest.mark.parametrize("head_dim", [1, 7, 16, 33, 100, 128, 200, 512])
def test_decode_matches_the_widening_path(dtypes, heads, head_dim):
    """bf16 queries take both decode product paths: P rounded to bf16 (the default, within the
    tolerance's bf16 term) and fp32 P."""
    query_dtype, cache_dtype = dtypes
    for fp32_probabilities in [False, True] if query_dtype == "bfloat16" else [False]:
        compare_decode_with_widening_path(query_dtype, cache_dtype, heads, head_dim,
                                          fp32_probabilities)


def compare_decode_with_widening_path(query_dtype, cache_dtype, heads, head_dim,
                                      fp32_probabilities):
    rng = np.random.default_rng(head_dim * 100 + heads[0])
    batch = make_batch(rng, [(2, n) for n in STREAMED_LENGTHS], q_heads=heads[0],
                       kv_heads=heads[1], head_dim=head_dim, block_size=48,
                       dtype=query_dtype)
    cache = FP8.get(cache_dtype, DTYPES.get(cache_dtype))
    for name in ("key_cache", "value_cache"):
        batch[name] = np.asarray(batch[name], np.float32).astype(cache)
    scales = dict(k_scale=0.5, v_scale=2.0) if cache_dtype in FP8 else {}
    prefill = tilelab.paged_attention(*arguments(batch), **scales, fp32_probabilities=True)
    last = batch["query_start_loc"][1:] - 1
    decode = tilelab.paged_attention(
        batch["query"][last], batch["key_cache"], batch["value_cache"], batch["block_table"],
        batch["seq_lens"], np.arange(len(last) + 1, dtype=np.int32), **scales,
        fp32_probabilities=fp32_probabilities)
    expected = np.asarray(prefill[last], np.float64)
    got = np.asarray(decode, np.float64)
    magnitude = np.max(np.abs(expected), initial=1.0)
    atol = magnitude * (2 * UNIT_ROUNDOFF[query_dtype] + 64 * UNIT_ROUNDOFF["float32"])
    error = np.max(np.abs(got - expected))
    assert np.all(np.isfinite(got)) and error <= atol, f"{error:.3g} > {atol:.3g}"


def decode_output_with_probabilities(batch, round_p, v_scale):
    """Decode out in float64 with P = exp(s - max) computed in fp32 and, if round_p, rounded to
    bf16 before P·V (the denominator sums fp32 P); one block of keys per sequence."""
    q = np.asarray(batch["query"], np.float64)
    _, q_heads, head_dim = q.shape
    kv_heads, block_size = batch["key_cache"].shape[1], batch["key_cache"].shape[2]
    group = q_heads // kv_heads
    scale = np.float32(1) / np.sqrt(np.float32(head_dim))
    out = np.zeros_like(q)
    for s, seq_len in enumerate(batch["seq_lens"]):
        positions = np.arange(seq_len)
        blocks = batch["block_table"][s, positions // block_size]
        keys = np.asarray(batch["key_cache"], np.float64)[blocks, :, positions % block_size]
        values = np.asarray(batch["value_cache"], np.float64)[blocks, :, positions % block_size]
        for h in range(q_heads):
            scores = (scale * (keys[:, h // group] @ q[s, h])).astype(np.float32)
            p = np.exp(scores - scores.max())
            weights = p.astype(ml_dtypes.bfloat16) if round_p else p
            out[s, h] = (np.asarray(weights, np.float64) @ values[:, h // group]) / np.sum(
                p, dtype=np.float64) * v_scale
    return out


@pytest.mark.parametrize("cache_dtype", ["bfloat16", *FP8])
def test_decode_rounds_p_to_bf16_unless_fp32_probabilities(cache_dtype):
    """bf16 decode rounds P to bf16 before P·V where the call runs on bf16 dot products
    (cpu_policy.rounds_bf16_probabilities); fp32_probabilities keeps P in fp32. Each output
    element is compared, as bf16, with both float64 models: with few keys per sequence P's
    rounding moves a good share of the outputs by one bf16 step, so a kernel that rounds matches
    the rounding model almost everywhere and the other model visibly less often."""
    rng = np.random.default_rng(73)
    requests = [(1, int(n)) for n in rng.integers(2, 6, size=48)]
    batch = make_batch(rng, requests, q_heads=8, kv_heads=2, head_dim=128, block_size=16,
                       dtype="bfloat16")
    cache = FP8.get(cache_dtype, DTYPES.get(cache_dtype))
    for name in ("key_cache", "value_cache"):
        batch[name] = np.asarray(batch[name], np.float32).astype(cache)
    v_scale = 0.5 if cache_dtype in FP8 else 1.0
    models = {round_p: decode_output_with_probabilities(batch, round_p, v_scale).astype(
        ml_dtypes.bfloat16) for round_p in (True, False)}
    for fp32_probabilities in (False, True):
        out = tilelab.paged_attention(*arguments(batch), v_scale=v_scale,
                                      fp32_probabilities=fp32_probabilities)
        same = {round_p: float(np.mean(out == model)) for round_p, model in models.items()}
        rounds = rounds_bf16_probabilities(cache_dtype, fp32_probabilities)
        model, other = same[rounds], same[not rounds]
        assert model >= 0.99 and model - other >= 0.1, (fp32_probabilities, same)


@pytest.mark.parametrize("fp32_probabilities", [False, True])
def test_dense_decode_passes_fp32_probabilities_to_the_paged_kernel(fp32_probabilities):
    """flash_attention decode (one query row, no bias) runs on the paged kernel: with either
    setting of fp32_probabilities it gives paged_attention's result bit for bit on the same data,
    and the two settings differ where the call rounds P."""
    rng = np.random.default_rng(79)
    batch, q_heads, kv_heads, keys, dim = 6, 8, 2, 5, 64
    bf16 = ml_dtypes.bfloat16
    q = rng.standard_normal((batch, q_heads, 1, dim), np.float32).astype(bf16)
    k = rng.standard_normal((batch, kv_heads, keys, dim), np.float32).astype(bf16)
    v = rng.standard_normal((batch, kv_heads, keys, dim), np.float32).astype(bf16)
    assert tilelab.flash_attention_implementation(q, k, v) == "paged"
    dense = tilelab.flash_attention(q, k, v, fp32_probabilities=fp32_probabilities)
    paged = tilelab.paged_attention(q[:, :, 0], k, v, np.arange(batch, dtype=np.int32)[:, None],
                                    np.full(batch, keys, np.int32),
                                    np.arange(batch + 1, dtype=np.int32),
                                    fp32_probabilities=fp32_probabilities)
    np.testing.assert_array_equal(np.asarray(dense[:, :, 0], np.float32),
                                  np.asarray(paged, np.float32))
    other = tilelab.flash_attention(q, k, v, fp32_probabilities=not fp32_probabilities)
    differ = np.any(np.asarray(other, np.float32) != np.asarray(dense, np.float32))
    assert differ == rounds_bf16_probabilities()


@pytest.mark.parametrize("split_kv", [2, 3, 7, 1000])
def test_split_kv_matches_unsplit(split_kv):
    rng = np.random.default_rng(31)
    batch = make_batch(rng, [(1, 5000), (2, 3000), (1, 10)], q_heads=8, kv_heads=2,
                       head_dim=128, block_size=16)
    unsplit = tilelab.paged_attention(*arguments(batch), split_kv=1)
    split = tilelab.paged_attention(*arguments(batch), split_kv=split_kv)
    np.testing.assert_allclose(split, unsplit, atol=1e-6, rtol=0)
    check(batch, split_kv=split_kv)


def token_major(batch):
    """The batch with its caches stored token-major ([num_blocks, block_size, Hkv, D]) and passed
    as [num_blocks, Hkv, block_size, D] views: a key's rows of all kv heads side by side."""
    stored = dict(batch)
    for name in ("key_cache", "value_cache"):
        rows = np.ascontiguousarray(batch[name].transpose(0, 2, 1, 3))
        stored[name] = rows.transpose(0, 2, 1, 3)
    return stored


TOKEN_MAJOR_DECODE = [(1, n) for n in (1, 37, 300, 129, 2000, 16, 17, 700, 5000, 64, 65, 999)]


@pytest.mark.parametrize("case", ["options", "fp8", "split", "two_items_a_sequence"])
def test_token_major_cache_decode(restore_num_threads, case):
    """Decode over a token-major cache runs items that span several kv heads (all of a sequence's,
    or several items a sequence where the rows or their bytes would not fit one), each chunk's rows
    of every head prefetched in address order: as the reference, with score options, fp8 caches,
    split-KV, and a decode too small to keep the threads busy that falls back to one-head items."""
    tilelab.set_num_threads(2)  # enough sequences for multi-head items on two threads
    rng = np.random.default_rng(41)
    heads = dict(q_heads=8, kv_heads=4, head_dim=64) if case != "two_items_a_sequence" else \
        dict(q_heads=32, kv_heads=16, head_dim=64)  # fp32 rows: 8 kv heads an item
    dtype = "bfloat16" if case == "fp8" else "float32"
    # (fp8: no spare blocks, whose huge values would not quantize.)
    batch = make_batch(rng, TOKEN_MAJOR_DECODE, **heads, block_size=16, dtype=dtype,
                       spare_blocks=0 if case == "fp8" else 3)
    if case == "fp8":
        batch = quantized_copy(batch, "float8_e4m3fn", 0.1, 0.1)
    stored = token_major(batch)
    options = {
        "options": dict(softcap=3.0, sliding_window=(900, -1), sinks=np.ones(8, np.float32),
                        alibi_slopes=(2.0 ** -np.arange(1, 9)).astype(np.float32)),
        "fp8": dict(k_scale=0.1, v_scale=0.1, softcap=3.0),
        "split": dict(split_kv=3),
        "two_items_a_sequence": dict(sinks=rng.standard_normal(32).astype(np.float32)),
    }[case]
    check(stored, dtype, **options)
    np.testing.assert_allclose(tilelab.paged_attention(*arguments(stored), **options),
                               tilelab.paged_attention(*arguments(batch), **options),
                               atol=tolerance(dtype, batch, options.get("v_scale", 1.0)))
    # One short sequence: too few items for multi-head ones.
    short = make_batch(rng, [(1, 300)], **heads, block_size=16, dtype="float32")
    check(token_major(short), sinks=np.ones(heads["q_heads"], np.float32))


def test_split_kv_is_deterministic_and_thread_independent():
    """A forced split gives bit-identical results run to run and for 1 or 2 threads; the
    automatic choice differs from the unsplit result by fp32 summation order only."""
    rng = np.random.default_rng(32)
    batch = make_batch(rng, [(1, 32768 // 4)], q_heads=8, kv_heads=2, head_dim=128,
                       block_size=16, dtype="bfloat16")
    previous = tilelab.num_threads()
    try:
        tilelab.set_num_threads(1)
        one = tilelab.paged_attention(*arguments(batch), split_kv=4)
        tilelab.set_num_threads(2)
        two = tilelab.paged_attention(*arguments(batch), split_kv=4)
        again = tilelab.paged_attention(*arguments(batch), split_kv=4)
        automatic = tilelab.paged_attention(*arguments(batch))
        automatic_again = tilelab.paged_attention(*arguments(batch))
    finally:
        tilelab.set_num_threads(previous)
    np.testing.assert_array_equal(one.view(np.uint16), two.view(np.uint16))
    np.testing.assert_array_equal(two.view(np.uint16), again.view(np.uint16))
    np.testing.assert_array_equal(automatic.view(np.uint16), automatic_again.view(np.uint16))
    check(batch, "bfloat16", split_kv="auto")


@pytest.mark.parametrize("split_kv", [1, 3])
def test_forced_split_over_a_token_major_cache_is_thread_independent(restore_num_threads,
                                                                     split_kv):
    """Decode items span several kv heads of a token-major cache unless one-head items keep more
    threads busy; the items' heads set their chunks and so the summation order. With a forced
    split the choice does not follow the thread count: 1 and 2 threads give the same bits."""
    rng = np.random.default_rng(33)
    batch = token_major(make_batch(rng, [(1, 3000), (1, 1500)], q_heads=8, kv_heads=4,
                                   head_dim=64, block_size=16))
    results = []
    for threads in (1, 2):
        tilelab.set_num_threads(threads)
        results.append(tilelab.paged_attention(*arguments(batch), split_kv=split_kv))
    np.testing.assert_array_equal(results[0], results[1])
    check(batch, split_kv=split_kv)


# ---------------------------------------------------------------------------------------------
# Prefill sequences on the generated dense kernels

# A window no sequence reaches: it changes no bit of any sequence's result.
NO_OP_WINDOW = (1 << 30, -1)


def generated_route_rows(dtype):
    """Query rows per kv head from which a sequence takes the generated kernels."""
    return 16 if dtype == "bfloat16" else 32


def dense_result(batch, seq, **options):
    """flash_attention (bottom-right causal) on sequence seq's K/V gathered through its block
    table, as [q_len, Hq, D]. With a window's left edge, the keys before the first query's window
    (from the start of its cache block) are left out, as the route gathers them."""
    q0, q1 = batch["query_start_loc"][seq], batch["query_start_loc"][seq + 1]
    seq_len = int(batch["seq_lens"][seq])
    block_size = batch["key_cache"].shape[2]
    table = batch["block_table"][seq, : -(-seq_len // block_size)]
    left = options.get("sliding_window", (-1, -1))[0]
    first = max(seq_len - int(q1 - q0) - left, 0) // block_size * block_size if left >= 0 else 0

    def gathered(cache):
        rows = cache[table].transpose(1, 0, 2, 3).reshape(cache.shape[1], -1, cache.shape[3])
        return np.ascontiguousarray(rows[None, :, first:seq_len])

    query = batch["query"][q0:q1].transpose(1, 0, 2)[None]
    out = tilelab.flash_attention(query, gathered(batch["key_cache"]),
                                  gathered(batch["value_cache"]), causal_alignment="bottom_right",
                                  **options)
    return out[0].transpose(1, 0, 2)


def widened_for_the_route(batch, dtype, k_scale, v_scale):
    """The batch as the generated kernels see an fp8 cache: K widened to the query's dtype, V
    widened times v_scale and rounded to it."""
    query_dtype = DTYPES[dtype]
    keys = np.asarray(batch["key_cache"], np.float32).astype(query_dtype)
    values = (np.asarray(batch["value_cache"], np.float32) * np.float32(v_scale)).astype(
        query_dtype)
    head_dim = batch["query"].shape[2]
    scale = np.float32(1) / np.sqrt(np.float32(head_dim)) * np.float32(k_scale)
    return dict(batch, key_cache=keys, value_cache=values), float(scale)


def check_prefill_route(batch, dtype, **options):
    """Every sequence with enough query rows per kv head gives exactly flash_attention's result on
    its gathered K/V (an fp8 cache widened to the query's dtype); every other sequence the same
    bits with a no-op window; all match fp64."""
    out = tilelab.paged_attention(*arguments(batch), split_kv=1, **options)
    paged = tilelab.paged_attention(*arguments(batch), split_kv=1,
                                    **{"sliding_window": NO_OP_WINDOW, **options})
    group = batch["query"].shape[1] // batch["key_cache"].shape[1]
    flags = {k: v for k, v in options.items() if k not in ("causal", "k_scale", "v_scale")}
    flags["causal"] = options.get("causal", True)
    dense_batch = batch
    fp8 = batch["key_cache"].dtype in FP8.values()
    if fp8:
        dense_batch, flags["scale"] = widened_for_the_route(
            batch, dtype, options.get("k_scale", 1.0), options.get("v_scale", 1.0))
    takes_route = batch["query"].shape[2] <= 256 and (not fp8 or dtype != "float16")
    routed = 0
    for seq in range(len(batch["seq_lens"])):
        q0, q1 = batch["query_start_loc"][seq], batch["query_start_loc"][seq + 1]
        if (q1 - q0) * group >= generated_route_rows(dtype) and takes_route:
            expected = dense_result(dense_batch, seq, **flags)
            routed += 1
        else:
            expected = paged[q0:q1]
        np.testing.assert_array_equal(out[q0:q1].view(np.uint8), expected.view(np.uint8),
                                      err_msg=f"sequence {seq}")
    check(batch, dtype, split_kv=1, **options)
    return routed


ROUTE_REQUESTS = [(40, 300), (1, 77), (3, 90), (64, 64), (33, 163), (8, 8), (16, 1000)]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (9, 3), (8, 1)],
                         ids=lambda h: f"Hq{h[0]}-Hkv{h[1]}")
@pytest.mark.parametrize("block_size", [1, 7, 48])
def test_prefill_sequences_run_the_generated_kernels(dtype, heads, block_size):
    rng = np.random.default_rng(block_size * 10 + heads[0])
    batch = make_batch(rng, ROUTE_REQUESTS, q_heads=heads[0], kv_heads=heads[1], head_dim=64,
                       block_size=block_size, dtype=dtype)
    assert check_prefill_route(batch, dtype) >= 3


@pytest.mark.parametrize("head_dim", [1, 33, 100, 128, 256, 512])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non-causal"])
def test_prefill_route_head_dims_and_causality(head_dim, causal):
    """Head dims up to 256 take the generated kernels (512 stays on the paged kernel); without the
    causal mask every key of the sequence counts."""
    rng = np.random.default_rng(head_dim)
    batch = make_batch(rng, ROUTE_REQUESTS, q_heads=8, kv_heads=2, head_dim=head_dim,
                       block_size=16)
    assert check_prefill_route(batch, "float32", causal=causal) == (5 if head_dim <= 256 else 0)


@pytest.mark.parametrize("option", [*OPTION_NAMES, "window_both", "all"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_prefill_route_score_options(option, dtype):
    """Score options take the route too (the generated kernels' score options variant): a window's
    left edge leaves the blocks before the first query's window out of the gather."""
    rng = np.random.default_rng(66)
    batch = make_batch(rng, ROUTE_REQUESTS, q_heads=8, kv_heads=2, head_dim=64, block_size=16,
                       dtype=dtype)
    values = option_values(8, rng)
    values["window_both"] = dict(sliding_window=(50, 9))
    values["all"] = {**values["softcap"], **values["alibi"], **values["sinks"],
                     "sliding_window": (70, 3)}
    assert check_prefill_route(batch, dtype, **values[option]) == 5


@pytest.mark.parametrize("fp32_probabilities", [False, True])
def test_prefill_route_bf16_probabilities(fp32_probabilities):
    """bf16: the generated kernels round P to bf16 before P·V unless fp32_probabilities."""
    rng = np.random.default_rng(61)
    batch = make_batch(rng, ROUTE_REQUESTS, q_heads=8, kv_heads=2, head_dim=128, block_size=16,
                       dtype="bfloat16")
    check_prefill_route(batch, "bfloat16", fp32_probabilities=fp32_probabilities)


@pytest.mark.parametrize("fp8_name", list(FP8))
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float16"])
def test_prefill_route_fp8_caches(fp8_name, dtype):
    """bf16 and fp32 queries with an fp8 cache take the generated kernels on K widened to their
    dtype and V widened times v_scale, with k_scale in the softmax scale; fp16 queries stay on
    the paged kernel (fp16 cannot hold every v_scale · v)."""
    rng = np.random.default_rng(65)
    # No spare blocks: their huge marker value is NaN in float8_e4m3fn.
    batch = make_batch(rng, ROUTE_REQUESTS, q_heads=8, kv_heads=2, head_dim=96, block_size=16,
                       dtype=dtype, spare_blocks=0)
    for name in ("key_cache", "value_cache"):
        batch[name] = np.asarray(batch[name], np.float32).astype(FP8[fp8_name])
    routed = check_prefill_route(batch, dtype, k_scale=0.75, v_scale=3.0)
    assert routed == (0 if dtype == "float16" else 5)


def test_prefill_route_reads_strided_cache_rows():
    """Cache blocks whose rows are not adjacent (a padded head dim) are gathered row by row."""
    rng = np.random.default_rng(62)
    batch = make_batch(rng, ROUTE_REQUESTS, q_heads=8, kv_heads=2, head_dim=64, block_size=16)
    for name in ("key_cache", "value_cache"):
        padded = np.full((*batch[name].shape[:3], 80), np.nan, np.float32)
        padded[..., :64] = batch[name]
        batch[name] = padded[..., :64]
    check_prefill_route(batch, "float32")


def test_long_prefill_is_gathered_a_few_kv_heads_at_a_time():
    """A sequence whose K and V exceed the gather budget (64 MiB) is computed one kv head at a
    time."""
    rng = np.random.default_rng(63)
    batch = make_batch(rng, [(4, 17000), (40, 100)], q_heads=16, kv_heads=2, head_dim=256,
                       block_size=64, spare_blocks=0)
    assert check_prefill_route(batch, "float32") == 2


@pytest.mark.parametrize("cache", ["key_cache", "value_cache"])
def test_prefill_route_propagates_nan(cache):
    """NaN in a key or value makes the rows that see it NaN (its kv head's query heads, from its
    position on) and no other row, also the rows of its key block that do not see it."""
    rng = np.random.default_rng(64)
    batch = make_batch(rng, [(48, 100), (40, 40)], q_heads=8, kv_heads=2, head_dim=32,
                       block_size=16)
    block = batch["block_table"][0, 4]
    batch[cache][block, 1, 3, 5] = np.nan  # sequence 0, position 67, kv head 1
    out = tilelab.paged_attention(*arguments(batch))
    first_seeing = 67 - (100 - 48)  # the query row at position 67
    # A NaN key poisons every score of the rows that see it; a NaN value its own column.
    columns = slice(None) if cache == "key_cache" else 5
    assert np.all(np.isnan(out[first_seeing:48, 4:8, columns]))
    rest = np.ones(out.shape, bool)
    rest[first_seeing:48, 4:8, columns] = False
    assert np.all(np.isfinite(out[rest]))


# ---------------------------------------------------------------------------------------------
# Non-finite data


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_nan_in_a_visible_key_makes_its_rows_nan(dtype):
    rng = np.random.default_rng(41)
    batch = make_batch(rng, [(2, 40), (1, 30)], q_heads=4, kv_heads=2, head_dim=16, block_size=8,
                       dtype=dtype)
    block = batch["block_table"][0, 1]
    batch["key_cache"][block, 1, 2, 0] = np.nan  # sequence 0, position 10, kv head 1
    out = tilelab.paged_attention(*arguments(batch))
    assert np.all(np.isnan(out[0:2, 2:4]))
    assert np.all(np.isfinite(out[0:2, 0:2])) and np.all(np.isfinite(out[2]))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_inf_in_value_and_query(dtype):
    rng = np.random.default_rng(42)
    batch = make_batch(rng, [(1, 20), (1, 20)], q_heads=2, kv_heads=1, head_dim=8, block_size=4,
                       dtype=dtype)
    batch["value_cache"][batch["block_table"][1, 0], 0, 0, 3] = np.inf
    batch["query"][0, 1, 0] = np.inf
    out = tilelab.paged_attention(*arguments(batch))
    assert np.all(np.isnan(out[0, 1]))  # q·k = ±inf for every key: inf - inf
    assert np.isinf(out[1, 0, 3]) or np.isnan(out[1, 0, 3])
    assert np.all(np.isfinite(out[0, 0]))


def test_unreferenced_blocks_are_never_read():
    """make_batch fills spare blocks with the dtype's largest value (scores would overflow to
    inf): results stay
    finite and match the reference."""
    rng = np.random.default_rng(43)
    batch = make_batch(rng, MIXED, q_heads=4, kv_heads=2, head_dim=64, block_size=16,
                       spare_blocks=10)
    check(batch)


# ---------------------------------------------------------------------------------------------
# Bad input: every argument, a clear error naming it, nothing written


def good_batch():
    rng = np.random.default_rng(51)
    return make_batch(rng, [(3, 20), (1, 9)], q_heads=4, kv_heads=2, head_dim=16, block_size=8,
                      spare_blocks=0)


def call_with(batch, **changes):
    args = dict(zip(["query", "key_cache", "value_cache", "block_table", "seq_lens",
                     "query_start_loc"], arguments(batch), strict=True))
    options = {k: v for k, v in changes.items() if k not in args}
    args.update({k: v for k, v in changes.items() if k in args})
    return tilelab.paged_attention(*args.values(), **options)


BAD_VALUES = [
    ("query", lambda b: b["query"][:, :, :8], ValueError, "key_cache: expected head dim 8"),
    ("query", lambda b: b["query"][0], ValueError, "query: expected rank 3"),
    ("query", lambda b: b["query"].astype(np.float64), TypeError, "query: expected dtype"),
    ("query", lambda b: np.zeros((4, 4, 513), np.float32), ValueError, "D in [1, 512]"),
    ("query", lambda b: b["query"][:, :3], ValueError, "Hkv that divides"),
    ("key_cache", lambda b: b["key_cache"].astype(np.float16), TypeError,
     "key_cache: expected dtype"),
    ("key_cache", lambda b: b["key_cache"][:, :, :, :8], ValueError,
     "key_cache: expected head dim"),
    ("key_cache", lambda b: "cache", TypeError, "key_cache: expected"),
    ("value_cache", lambda b: b["value_cache"][:2], ValueError, "value_cache: expected shape"),
    ("value_cache", lambda b: b["value_cache"].astype(ml_dtypes.float8_e4m3fn), TypeError,
     "value_cache: expected dtype float32 (the dtype of key_cache)"),
    ("block_table", lambda b: np.where(b["block_table"] >= 0, b["block_table"] + 100, -1)
     .astype(np.int32), ValueError, "block_table: expected entries in [0, "),
    ("block_table", lambda b: np.full_like(b["block_table"], -1), ValueError,
     "block_table: expected entries in [0, "),
    ("block_table", lambda b: b["block_table"][:, :1], ValueError, "at most max_blocks_per_seq"),
    ("block_table", lambda b: b["block_table"][:1], ValueError, "block_table: expected shape"),
    ("block_table", lambda b: b["block_table"].astype(np.float32), TypeError, "block_table"),
    ("block_table", lambda b: b["block_table"].astype(np.int64) + 2**40, ValueError,
     "int32 range"),
    ("seq_lens", lambda b: np.array([2, 9], np.int32), ValueError, "seq_lens[0] = 2 < 3"),
    ("seq_lens", lambda b: np.array([20], np.int32), ValueError, "seq_lens: expected 2 entries"),
    ("seq_lens", lambda b: np.array([20, -1], np.int32), ValueError, "seq_lens[1] = -1 < 1"),
    ("query_start_loc", lambda b: np.array([0, 3, 5], np.int32), ValueError, "num_tokens = 4"),
    ("query_start_loc", lambda b: np.array([1, 3, 4], np.int32), ValueError, "0 at index 0"),
    ("query_start_loc", lambda b: np.array([0, 3, 2, 4], np.int32), ValueError, "non-decreasing"),
    ("query_start_loc", lambda b: np.array([0], np.int32), ValueError, "at least one sequence"),
    ("scale", lambda b: float("inf"), ValueError, "scale: expected a finite value"),
    ("scale", lambda b: "0.1", TypeError, "scale: expected a real number"),
    ("causal", lambda b: 1, TypeError, "causal: expected a bool"),
    ("sliding_window", lambda b: (-2, 0), ValueError, "sliding_window: expected (left, right)"),
    ("sliding_window", lambda b: 5, TypeError, "sliding_window: expected a pair"),
    ("sliding_window", lambda b: (1.5, 2), TypeError, "sliding_window: expected a pair"),
    ("softcap", lambda b: -1.0, ValueError, "softcap: expected a finite value >= 0"),
    ("softcap", lambda b: float("nan"), ValueError, "softcap: expected a finite value >= 0"),
    ("softcap", lambda b: None, TypeError, "softcap: expected a real number"),
    ("alibi_slopes", lambda b: np.ones(3, np.float32), ValueError,
     "alibi_slopes: expected shape [Hq]"),
    ("alibi_slopes", lambda b: np.ones(4, np.float64), TypeError,
     "alibi_slopes: expected dtype float32"),
    ("sinks", lambda b: np.ones((4, 1), np.float32), ValueError, "sinks: expected shape [Hq]"),
    ("k_scale", lambda b: 2.0, ValueError, "k_scale: expected 1.0 with float32 K/V"),
    ("v_scale", lambda b: float("inf"), ValueError, "v_scale: expected a finite value"),
    ("split_kv", lambda b: 0, ValueError, "split_kv: expected 'auto' or a number of pieces >= 1"),
    ("split_kv", lambda b: "many", ValueError, "split_kv: expected 'auto'"),
    ("split_kv", lambda b: 2.0, TypeError, "split_kv: expected 'auto'"),
    ("out", lambda b: np.zeros((4, 4, 16), np.float16), TypeError, "out: expected dtype float32"),
    ("out", lambda b: np.zeros((4, 4, 8), np.float32), ValueError, "out: expected shape"),
    ("out", lambda b: b["query"], ValueError, "out: expected memory disjoint from query"),
]


@pytest.mark.parametrize("name,make,error,message", BAD_VALUES,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD_VALUES)])
def test_bad_input(name, make, error, message):
    batch = good_batch()
    before = {k: np.copy(v) for k, v in batch.items()}
    out = np.full(batch["query"].shape, 5.0, np.float32)
    changes = {name: make(batch)}
    if name != "out":
        changes["out"] = out
    with pytest.raises(error, match=None) as raised:
        call_with(batch, **changes)
    assert message in str(raised.value), str(raised.value)
    assert np.all(out == 5.0), "nothing is written on error"
    for key, value in batch.items():
        np.testing.assert_array_equal(value, before[key])


def test_read_only_out_and_cache():
    batch = good_batch()
    out = np.zeros(batch["query"].shape, np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out: expected a writeable array"):
        call_with(batch, out=out)
    cache = np.zeros((3, 2, 8, 16), np.float32)
    cache.flags.writeable = False
    with pytest.raises(ValueError, match="key_cache: expected a writeable array"):
        tilelab.reshape_and_cache_flash(np.zeros((1, 2, 16), np.float32),
                                        np.zeros((1, 2, 16), np.float32), cache,
                                        np.zeros((3, 2, 8, 16), np.float32),
                                        np.zeros(1, np.int32))


CACHE_BAD_VALUES = [
    ("slot_mapping", lambda: np.array([0, 48], np.int32), ValueError,
     "slot_mapping: expected slots < num_blocks x block_size = 6 x 8 = 48"),
    ("slot_mapping", lambda: np.array([0], np.int32), ValueError, "slot_mapping: expected shape"),
    ("slot_mapping", lambda: np.array([0.0, 1.0]), TypeError, "slot_mapping"),
    ("key_cache", lambda: np.zeros((6, 2, 8, 8), np.float32), ValueError,
     "key_cache: expected shape [num_blocks, Hkv, block_size, D] (Hkv and D of key)"),
    ("value", lambda: np.zeros((2, 2, 16), np.float16), TypeError, "value: expected dtype float32"),
    ("key_cache", lambda: np.zeros((6, 2, 8, 16), np.float16), TypeError,
     "key_cache: expected dtype float32"),
    ("value_cache", lambda: np.zeros((6, 2, 4, 16), np.float32), ValueError,
     "value_cache: expected shape"),
    ("k_scale", lambda: 2.0, ValueError, "k_scale: expected 1.0 with float32 K/V"),
]


@pytest.mark.parametrize("name,make,error,message", CACHE_BAD_VALUES,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(CACHE_BAD_VALUES)])
def test_reshape_and_cache_flash_bad_input(name, make, error, message):
    args = dict(key=np.ones((2, 2, 16), np.float32), value=np.ones((2, 2, 16), np.float32),
                key_cache=np.zeros((6, 2, 8, 16), np.float32),
                value_cache=np.zeros((6, 2, 8, 16), np.float32),
                slot_mapping=np.array([0, 1], np.int32))
    args[name] = make()
    caches = (args["key_cache"], args["value_cache"])
    with pytest.raises(error) as raised:
        tilelab.reshape_and_cache_flash(**args)
    assert message in str(raised.value), str(raised.value)
    assert all(np.all(np.asarray(c, np.float32) == 0) for c in caches), "nothing written"


def test_reshape_and_cache_flash_zero_fp8_scale():
    cache = np.zeros((2, 1, 4, 8), ml_dtypes.float8_e5m2)
    with pytest.raises(ValueError, match=r"v_scale: expected a finite, nonzero value .*got 0"):
        tilelab.reshape_and_cache_flash(np.ones((1, 1, 8), np.float32),
                                        np.ones((1, 1, 8), np.float32), cache, np.zeros_like(cache),
                                        np.zeros(1, np.int32), v_scale=0.0)
