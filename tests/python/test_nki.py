"""tilelab.nki against the fp64 reference: flash_paged_attention over block sizes, large tiles,
GQA ratios, head sizes, both schedules, mixed precision on and off, continuous-batching masks
(prefill with and without prior context, decode); the two helpers; bad inputs."""

import numpy as np
import pytest
from nki_reference import (
    BF16,
    continuous_batch,
    reference_paged_attention,
    reorder_context_mask_reference,
)

import tilelab.nki as nki

UNIT_ROUNDOFF_F32 = 2.0**-24
UNIT_ROUNDOFF_BF16 = 2.0**-8

# Prefill with prior context, decode (query length 1), prefill without context, padded rows.
MIXED_BATCH = [(40, 300), (1, 700), (1, 33), (50, 0)]


def tolerance(args, mixed_precision, dtype, n_keys):
    """Absolute tolerance on out (|v| <= 1). fp32: accumulation over the keys (16 roundoffs per
    sqrt(term), as for flash attention). Mixed precision: P rounded to bf16 (each weight off by
    at most one roundoff, so out by at most max|v| of them) and the output rounding; float32
    inputs with mixed precision go through the same bf16 values. bfloat16 output without mixed
    precision: one output rounding."""
    accumulation = 16 * UNIT_ROUNDOFF_F32 * np.sqrt(n_keys)
    if mixed_precision:
        return 3 * UNIT_ROUNDOFF_BF16 + accumulation
    if np.dtype(dtype) == BF16:
        return UNIT_ROUNDOFF_BF16 + accumulation
    return accumulation


def run_case(rng, *, requests=MIXED_BATCH, n_heads=4, n_kv_heads=2, head_dim=32, block_size=32,
             large_tile=512, mixed_precision=True, dtype=BF16, schedule="cpu",
             softmax_scale=None):
    args = continuous_batch(rng, requests, n_heads=n_heads, n_kv_heads=n_kv_heads,
                            head_dim=head_dim, block_size=block_size, large_tile=large_tile,
                            dtype=dtype)
    reordered = nki.reorder_context_mask(args["mask"], large_tile, block_size)
    out = nki.flash_paged_attention(
        args["query"], args["key"], args["value"], args["kv_cache"], args["block_tables"],
        reordered, softmax_scale=softmax_scale, mixed_precision=mixed_precision,
        LARGE_TILE_SZ=large_tile, schedule=schedule)
    expected = reference_paged_attention(
        args["query"], args["key"], args["value"], args["kv_cache"], args["block_tables"],
        args["mask"], softmax_scale=softmax_scale, mixed_precision=mixed_precision)
    assert out.dtype == args["query"].dtype
    assert out.shape == (1, n_heads, args["query"].shape[3], head_dim)
    error = np.abs(out.astype(np.float64) - expected).max()
    limit = tolerance(args, mixed_precision, dtype, args["mask"].shape[1])
    assert error <= limit, f"max error {error:.3g} > {limit:.3g}"
    return out, args


SCHEDULES = ["cpu", "tile"]
PRECISIONS = {
    "mixed_bf16": (True, BF16),
    "mixed_f32_inputs": (True, np.float32),
    "fp32": (False, np.float32),
    "fp32_bf16_inputs": (False, BF16),
}


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("precision", PRECISIONS.values(), ids=PRECISIONS.keys())
@pytest.mark.parametrize("block_size", [1, 2, 8, 16, 64, 128, 256])
def test_block_sizes(rng, schedule, precision, block_size):
    mixed, dtype = precision
    large_tile = 512 if block_size <= 128 else 1024
    run_case(rng, block_size=block_size, large_tile=large_tile, mixed_precision=mixed,
             dtype=dtype, schedule=schedule)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("mixed_precision", [True, False])
@pytest.mark.parametrize(("large_tile", "block_size"),
                         [(512, 4), (1024, 32), (2048, 16), (2048, 256), (4096, 32), (8192, 64)])
def test_large_tiles(rng, schedule, mixed_precision, large_tile, block_size):
    # Enough context for two large tiles, so the merge across tiles is exercised.
    requests = [(30, large_tile), (1, large_tile // 2 + 5), (60, 17)]
    run_case(rng, requests=requests, block_size=block_size, large_tile=large_tile,
             mixed_precision=mixed_precision, dtype=np.float32, schedule=schedule)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize(("n_heads", "n_kv_heads"),
                         [(1, 1), (8, 8), (16, 1), (32, 2), (64, 4), (64, 64)])
def test_heads(rng, schedule, n_heads, n_kv_heads):
    run_case(rng, requests=[(20, 100), (1, 40), (1, 9)], n_heads=n_heads, n_kv_heads=n_kv_heads,
             head_dim=16, schedule=schedule)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("head_dim", [8, 17, 64, 96, 128])
@pytest.mark.parametrize("mixed_precision", [True, False])
def test_head_dims(rng, schedule, head_dim, mixed_precision):
    run_case(rng, head_dim=head_dim, mixed_precision=mixed_precision, dtype=np.float32,
             schedule=schedule)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("seq_q_requests", [[(300, 20), (100, 600)], [(700, 64)]],
                         ids=["seq_q_512", "seq_q_1024"])
def test_long_queries(rng, schedule, seq_q_requests):
    # seq_q > 128: several query tiles, and above 512 the new tokens' tile spans several
    # 512-column score blocks (some skipped as wholly above the diagonal).
    run_case(rng, requests=seq_q_requests, head_dim=32, schedule=schedule, mixed_precision=False,
             dtype=np.float32)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_decode_only_batch_and_scale(rng, schedule):
    run_case(rng, requests=[(1, 5), (1, 400), (1, 1), (1, 129)], schedule=schedule,
             softmax_scale=0.5)


def test_schedules_agree(rng):
    out_cpu, args = run_case(rng, schedule="cpu", mixed_precision=False, dtype=np.float32)
    reordered = nki.reorder_context_mask(args["mask"], 512, 32)
    out_tile = nki.flash_paged_attention(
        args["query"], args["key"], args["value"], args["kv_cache"], args["block_tables"],
        reordered, mixed_precision=False, LARGE_TILE_SZ=512, schedule="tile")
    np.testing.assert_allclose(out_cpu, out_tile, atol=1e-5, rtol=0)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_active_blocks_right_of_the_tile_are_skipped(rng, schedule):
    # A mask that lets every query see every new token: the kernel still skips the new tokens'
    # 512-column blocks wholly right of each 128-row query tile's first row (the NKI kernel's
    # causal shortcut); the reference applies the same rule.
    args = continuous_batch(rng, [(1024, 512)], n_heads=2, n_kv_heads=1, head_dim=16,
                            block_size=16, large_tile=512, dtype=np.float32)
    mask = args["mask"].copy()
    mask[:, 512:] = True
    out = nki.flash_paged_attention(
        args["query"], args["key"], args["value"], args["kv_cache"], args["block_tables"],
        nki.reorder_context_mask(mask, 512, 16), mixed_precision=False, LARGE_TILE_SZ=512,
        schedule=schedule)
    expected = reference_paged_attention(
        args["query"], args["key"], args["value"], args["kv_cache"], args["block_tables"], mask,
        mixed_precision=False)
    np.testing.assert_allclose(out, expected, atol=1e-5, rtol=0)


def test_fully_masked_rows_average_all_values(rng):
    # Padding rows see nothing: every score is -9984, so out is the mean of V over all keys.
    out, args = run_case(rng, requests=[(3, 10)], mixed_precision=False, dtype=np.float32)
    _, v_ctx = __import__("nki_reference").gather_context(args["kv_cache"], args["block_tables"])
    values = np.concatenate([v_ctx, args["value"][0].astype(np.float64)], axis=1)
    expected = np.repeat(values.mean(axis=1), 2, axis=0)  # (n_heads, d), GQA group 2
    np.testing.assert_allclose(out[0, :, 100], expected, atol=1e-5)


@pytest.mark.parametrize("precision", PRECISIONS.values(), ids=PRECISIONS.keys())
def test_masked_tiles_left_out_change_no_bit(rng, precision):
    # The cpu schedule leaves out a 32-row query block's all-zero large tiles only when every row
    # of the block sees a key. The same batch with one fully masked row in every block computes
    # every tile; the rows both runs share must agree bit for bit (rows are independent). The
    # batch has all-zero and partial tiles, padding rows, a row whose only key is one context
    # token late in the context, and rows that see only new tokens.
    mixed_precision, dtype = precision
    requests = [(40, 1100), (1, 700), (1, 33), (50, 0), (20, 600), (1, 1500), (9, 2047)]
    args = continuous_batch(rng, requests, n_heads=4, n_kv_heads=2, head_dim=32, block_size=16,
                            large_tile=512, dtype=dtype)
    mask = args["mask"].copy()
    seq_q = mask.shape[0]
    context_len = mask.shape[1] - seq_q
    mask[5] = False
    mask[5, context_len - 3] = True
    mask[64:66, :context_len] = False
    call = dict(query=args["query"], key=args["key"], value=args["value"],
                kv_cache=args["kv_cache"], block_tables=args["block_tables"],
                mixed_precision=mixed_precision, LARGE_TILE_SZ=512)
    skipping = nki.flash_paged_attention(mask=nki.reorder_context_mask(mask, 512, 16), **call)
    every_tile_mask = mask.copy()
    masked_rows = np.arange(31, seq_q, 32)
    every_tile_mask[masked_rows] = False
    every_tile = nki.flash_paged_attention(
        mask=nki.reorder_context_mask(every_tile_mask, 512, 16), **call)
    shared = np.setdiff1d(np.arange(seq_q), masked_rows)
    np.testing.assert_array_equal(skipping[:, :, shared].view(np.uint8),
                                  every_tile[:, :, shared].view(np.uint8))
    expected = reference_paged_attention(
        args["query"], args["key"], args["value"], args["kv_cache"], args["block_tables"], mask,
        mixed_precision=mixed_precision)
    error = np.abs(skipping.astype(np.float64) - expected).max()
    assert error <= tolerance(args, mixed_precision, dtype, mask.shape[1])


@pytest.mark.parametrize("mixed_precision", [True, False])
def test_skip_masked_tiles_changes_no_bit(rng, mixed_precision):
    # A causal batch with long contexts: most (query block, large tile) pairs are all masked.
    requests = [(40, 1100), (1, 700), (50, 0), (20, 600), (9, 2047)]
    args = continuous_batch(rng, requests, n_heads=4, n_kv_heads=2, head_dim=32, block_size=16,
                            large_tile=512, dtype=np.float32)
    call = dict(query=args["query"], key=args["key"], value=args["value"],
                kv_cache=args["kv_cache"], block_tables=args["block_tables"],
                mask=nki.reorder_context_mask(args["mask"], 512, 16),
                mixed_precision=mixed_precision, LARGE_TILE_SZ=512)
    skipping = nki.flash_paged_attention(**call)
    every_pair = nki.flash_paged_attention(**call, skip_masked_tiles=False)
    np.testing.assert_array_equal(skipping.view(np.uint8), every_pair.view(np.uint8))
    with pytest.raises(TypeError, match=r"^skip_masked_tiles: expected a bool"):
        nki.flash_paged_attention(**call, skip_masked_tiles="yes")


def test_integer_mask_is_accepted(rng):
    args = continuous_batch(rng, [(5, 7)], n_heads=1, n_kv_heads=1, head_dim=8, block_size=8,
                            large_tile=512, dtype=np.float32)
    mask = nki.reorder_context_mask(args["mask"], 512, 8)
    call = dict(query=args["query"], key=args["key"], value=args["value"],
                kv_cache=args["kv_cache"], block_tables=args["block_tables"].astype(np.int64),
                LARGE_TILE_SZ=512)
    as_bool = nki.flash_paged_attention(mask=mask, **call)
    as_int = nki.flash_paged_attention(mask=mask.astype(np.int8) * 3, **call)
    np.testing.assert_array_equal(as_bool, as_int)


# --- reorder_context_mask ----------------------------------------------------------------------

@pytest.mark.parametrize(("large_tile", "block_size"),
                         [(512, 1), (512, 4), (512, 32), (1024, 8), (2048, 256), (4096, 16),
                          (8192, 128), (128, 128)])
def test_reorder_context_mask(rng, large_tile, block_size):
    seq_q = 7
    mask = rng.random((seq_q, 2 * large_tile + seq_q)) < 0.5
    out = nki.reorder_context_mask(mask, large_tile, block_size)
    assert out.dtype == mask.dtype
    np.testing.assert_array_equal(out, reorder_context_mask_reference(mask, large_tile,
                                                                      block_size))
    ints = nki.reorder_context_mask(mask.astype(np.int32), large_tile, block_size)
    np.testing.assert_array_equal(ints, out.astype(np.int32))


def test_reorder_context_mask_errors():
    with pytest.raises(ValueError, match="multiple of LARGE_TILE_SZ"):
        nki.reorder_context_mask(np.ones((4, 500 + 4), dtype=bool), 512, 16)
    with pytest.raises(ValueError, match="block_size"):
        nki.reorder_context_mask(np.ones((4, 512 + 4), dtype=bool), 512, 3)
    with pytest.raises(TypeError, match="mask"):
        nki.reorder_context_mask(np.ones((4, 516), dtype=np.float32), 512, 16)


# --- reshape_and_cache -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
def test_reshape_and_cache(rng, dtype):
    num_blocks, n_kv_heads, block_size, d, tokens = 5, 3, 4, 8, 9
    cache = rng.standard_normal((2, num_blocks, n_kv_heads, block_size, d)).astype(dtype)
    key = rng.standard_normal((tokens, n_kv_heads, d)).astype(dtype)
    value = rng.standard_normal((tokens, n_kv_heads, d)).astype(dtype)
    slots = np.array([0, 19, 7, -1, 3, 7, 12, -1, 8], dtype=np.int64)  # 7 twice: later wins
    expected = cache.copy()
    for t, slot in enumerate(slots):
        if slot >= 0:
            expected[0, slot // block_size, :, slot % block_size] = key[t]
            expected[1, slot // block_size, :, slot % block_size] = value[t]
    assert nki.reshape_and_cache(key, value, cache, slots) is None
    np.testing.assert_array_equal(cache.view(np.uint8), expected.view(np.uint8))


def test_reshape_and_cache_errors(rng):
    cache = np.zeros((2, 2, 1, 4, 8), dtype=np.float32)
    key = np.ones((2, 1, 8), dtype=np.float32)
    with pytest.raises(ValueError, match=r"slot_mapping.*8"):
        nki.reshape_and_cache(key, key, cache, np.array([0, 8]))
    with pytest.raises(TypeError, match="kv_cache"):
        nki.reshape_and_cache(key, key, cache.astype(np.float16), np.array([0, 1]))
    with pytest.raises(ValueError, match="in place"):
        nki.reshape_and_cache(key, key, cache[:, :, :, ::-1], np.array([0, 1]))
    with pytest.raises(ValueError, match="value"):
        nki.reshape_and_cache(key, key[:1], cache, np.array([0, 1]))
    np.testing.assert_array_equal(cache, 0)


# --- bad inputs to flash_paged_attention ---------------------------------------------------------

def valid_call(rng, **overrides):
    args = continuous_batch(rng, [(5, 20)], n_heads=4, n_kv_heads=2, head_dim=16, block_size=16,
                            large_tile=512, dtype=np.float32)
    args["mask"] = nki.reorder_context_mask(args["mask"], 512, 16)
    args["LARGE_TILE_SZ"] = 512
    args.update(overrides)
    return args


def test_valid_call_runs(rng):
    nki.flash_paged_attention(**valid_call(rng))


@pytest.mark.parametrize(
    ("change", "error", "pattern"),
    [
        (lambda a: {"LARGE_TILE_SZ": 768}, ValueError, "LARGE_TILE_SZ.*multiple of free_tile"),
        (lambda a: {"LARGE_TILE_SZ": 16384}, ValueError, r"LARGE_TILE_SZ.*\[512, 8192\]"),
        (lambda a: {"LARGE_TILE_SZ": 1024}, ValueError, "block_tables.*multiple of"),
        (lambda a: {"block_tables": a["block_tables"][:-1]}, ValueError, "mask"),
        (lambda a: {"block_tables": a["block_tables"] + 100}, ValueError, "block_tables.*entries"),
        (lambda a: {"query": a["query"][:, :3]}, ValueError, "num_heads.*multiple of"),
        (lambda a: {"query": a["query"][..., :100], "key": a["key"][..., :100],
                    "value": a["value"][:, :, :100], "mask": a["mask"][:100, :612]},
         ValueError, "seq_q.*multiple of 128"),
        (lambda a: {"key": a["key"][:, :1]}, ValueError, "key"),
        (lambda a: {"value": a["value"].transpose(0, 1, 3, 2)}, ValueError, "value"),
        (lambda a: {"mask": a["mask"][:, 1:]}, ValueError, "mask"),
        (lambda a: {"query": a["query"].astype(np.float16)}, TypeError, "query"),
        (lambda a: {"kv_cache": a["kv_cache"].astype(BF16)}, TypeError, "kv_cache"),
        (lambda a: {"mask": a["mask"].astype(np.float32)}, TypeError, "mask"),
        (lambda a: {"block_tables": a["block_tables"].astype(np.float32)}, TypeError,
         "block_tables"),
        (lambda a: {"softmax_scale": float("nan")}, ValueError, "softmax_scale"),
        (lambda a: {"softmax_scale": "big"}, TypeError, "softmax_scale"),
        (lambda a: {"schedule": "gpu"}, ValueError, "schedule"),
        (lambda a: {"kv_cache": a["kv_cache"][:, :, :, :, :8]}, ValueError, "kv_cache"),
    ],
    ids=["tile_not_512_multiple", "tile_too_large", "context_not_tile_multiple",
         "table_vs_mask", "table_out_of_range", "heads_not_group_multiple", "seq_q_not_128",
         "key_heads", "value_layout", "mask_shape", "f16", "mixed_dtypes", "float_mask",
         "float_table", "nan_scale", "string_scale", "schedule", "cache_head_dim"],
)
def test_bad_inputs(rng, change, error, pattern):
    args = valid_call(rng)
    args.update(change(args))
    with pytest.raises(error, match=pattern):
        nki.flash_paged_attention(**args)


def test_head_dim_above_128_rejected(rng):
    args = continuous_batch(rng, [(5, 20)], n_heads=1, n_kv_heads=1, head_dim=160, block_size=16,
                            large_tile=512, dtype=np.float32)
    with pytest.raises(ValueError, match=r"head_dim.*128"):
        nki.flash_paged_attention(**args, LARGE_TILE_SZ=512)


def test_empty_context_rejected(rng):
    args = valid_call(rng)
    args["block_tables"] = args["block_tables"][:0]
    args["mask"] = args["mask"][:, 512:]
    with pytest.raises(ValueError, match="at least one block"):
        nki.flash_paged_attention(**args)
