#!/usr/bin/env python3
"""bench_serving: tilelab.paged_attention (vLLM's paged KV layout) on serving batches, side by
side in one run with what a CPU user would otherwise run.

    python bench/paged/bench_serving.py [--build-dir build] [--threads 2] [--quick]
        [--filter mixed] [--no-torch] [--json FILE]

Workloads (Hq 32, Hkv 8, d 128, bf16 unless named):
- mixed: the simulator's default batch (4 prefill requests with context, 12 decode requests,
  block_size 32), and the same batch with an fp8 (e4m3fn) cache. Compared with PyTorch SDPA run
  per sequence on K/V gathered through the block table (the gather is timed: it is part of what
  a user would write), our dense flash attention on the same useful tokens (per sequence, K/V
  already contiguous), and the NKI-layout kernel (tilelab.nki.flash_paged_attention, cpu
  schedule) on the same batch in its own layout.
- options: the default batch's 4 prefill requests with Gemma-2-like score options (sliding window
  512, softcap 50): paged_attention, our dense flash attention per sequence on the generated
  kernels and on the paged kernel (implementation="reference"), and PyTorch SDPA per sequence
  with the window as a boolean mask (SDPA has no softcap).
- decode: 64 sequences decoding one token each, contexts 512 to 4 k, bf16 and fp8 (e4m3fn) caches,
  16-key blocks (vLLM's CPU default), also with Hq 64 (a GQA group of 8) and with 128-key blocks
  (vLLM's CPU default with Intel's extension): GB/s of K and V read against the triad bandwidth,
  and against reading the same blocks (a kv head's block of K and of V: 2 to 32 KiB, from two
  arrays, in a random order, prefetched ahead) without any arithmetic, the ceiling of the access
  pattern: both measured before and after the decode calls (tilelab_machine_peak
  --bandwidth-only), the better of the two. Each decode call is also timed with its cache in L2
  (the block tables folded onto the blocks of the first 64 keys): the arithmetic alone, as a share
  of the call's time.
- long decode: one sequence decoding one token with a 32 k context (split-KV), GB/s against triad.
"""

from __future__ import annotations

import os
import pathlib
import sys
from typing import NamedTuple

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import ml_dtypes
import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "attention"))
from bench_flash import (  # noqa: E402
    BandwidthAlongside,
    print_ours_against_ours,
    print_table,
    start_benchmark,
    write_json_report,
)
from timing import alternating_medians, alternating_medians_between_probes  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
CACHE_RESIDENT_KEYS = 64


def paged_batch(rng, requests, block_size, cache_dtype=ml_dtypes.bfloat16, heads=HEADS,
                kv_heads=KV_HEADS):
    """vLLM-layout inputs for (q_len, seq_len) requests, blocks handed out in shuffled order."""
    blocks = [-(-seq_len // block_size) for _, seq_len in requests]
    num_blocks = sum(blocks)
    order = rng.permutation(num_blocks).astype(np.int32)
    table = np.zeros((len(requests), max(blocks)), np.int32)
    used = 0
    for s, count in enumerate(blocks):
        table[s, :count] = order[used:used + count]
        used += count
    shape = (num_blocks, kv_heads, block_size, HEAD_DIM)
    bf16 = ml_dtypes.bfloat16
    key_cache = rng.standard_normal(shape, dtype=np.float32).astype(cache_dtype)
    value_cache = rng.standard_normal(shape, dtype=np.float32).astype(cache_dtype)
    tokens = sum(q for q, _ in requests)
    query = rng.standard_normal((tokens, heads, HEAD_DIM), dtype=np.float32).astype(bf16)
    seq_lens = np.array([s for _, s in requests], np.int32)
    starts = np.concatenate([[0], np.cumsum([q for q, _ in requests])]).astype(np.int32)
    return dict(query=query, key_cache=key_cache, value_cache=value_cache, block_table=table,
                seq_lens=seq_lens, query_start_loc=starts, requests=requests,
                block_size=block_size)


def paged_call(tilelab, batch, **options):
    def call():
        return tilelab.paged_attention(batch["query"], batch["key_cache"], batch["value_cache"],
                                       batch["block_table"], batch["seq_lens"],
                                       batch["query_start_loc"], **options)
    return call


def gathered_sequences(batch):
    """Per sequence: queries [1, Hq, q, d] and K/V gathered through the block table
    ([1, Hkv, seq_len, d]), contiguous."""
    block_size = batch["block_size"]
    gathered = []
    for s, (q_len, seq_len) in enumerate(batch["requests"]):
        table = batch["block_table"][s, : -(-seq_len // block_size)]
        k = batch["key_cache"][table].transpose(1, 0, 2, 3).reshape(KV_HEADS, -1, HEAD_DIM)
        v = batch["value_cache"][table].transpose(1, 0, 2, 3).reshape(KV_HEADS, -1, HEAD_DIM)
        q0 = batch["query_start_loc"][s]
        q = batch["query"][q0:q0 + q_len].transpose(1, 0, 2)
        gathered.append((np.ascontiguousarray(q[None]), np.ascontiguousarray(k[None, :, :seq_len]),
                         np.ascontiguousarray(v[None, :, :seq_len])))
    return gathered


def useful_flops(requests):
    """4 · Hq · d · (visible keys): each query row sees its causal prefix."""
    keys = sum(q * (s - q) + q * (q + 1) // 2 for q, s in requests)
    return 4.0 * HEADS * HEAD_DIM * keys


def kv_block_bytes(batch):
    """The bytes of one kv head's block of K (or V): one contiguous run of the cache."""
    return batch["block_size"] * HEAD_DIM * batch["key_cache"].dtype.itemsize


def kv_bytes(batch):
    itemsize = batch["key_cache"].dtype.itemsize
    kv_heads = batch["key_cache"].shape[1]
    return 2.0 * kv_heads * HEAD_DIM * itemsize * float(np.sum(batch["seq_lens"]))


def mixed_workload(tilelab, torch, args, rng):
    """The default batch: ours, per-sequence SDPA, dense flash, the NKI-layout kernel."""
    prefill, decode_contexts = tilelab.sim.default_batch()
    schedule = tilelab.sim.PagedAttentionSchedule()
    requests = [(q, c + q) for q, c in prefill] + [(1, c + 1) for c in decode_contexts]
    batch = paged_batch(rng, requests, schedule.block_size)
    block_size = batch["block_size"]
    calls = {"paged_attention": paged_call(tilelab, batch)}
    # The same batch with an fp8 cache (prefill sequences widen it while gathering).
    fp8_batch = dict(batch, **{name: batch[name].astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
                               for name in ("key_cache", "value_cache")})
    calls["paged_attention, fp8 e4m3fn cache"] = paged_call(tilelab, fp8_batch)

    gathered = gathered_sequences(batch)

    def dense():
        for q, k, v in gathered:
            tilelab.flash_attention(q, k, v, causal=True, causal_alignment="bottom_right")
    calls["dense flash, same useful tokens"] = dense

    if torch is not None:
        def as_torch(a):
            return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
        key_cache, value_cache = as_torch(batch["key_cache"]), as_torch(batch["value_cache"])
        tables = [torch.from_numpy(batch["block_table"][s, : -(-seq_len // block_size)]).long()
                  for s, (_, seq_len) in enumerate(requests)]
        queries = [as_torch(q) for q, _, _ in gathered]
        masks = [torch.from_numpy(np.arange(s)[None, :] <= np.arange(s - q, s)[:, None])
                 if q > 1 else None for q, s in requests]

        def sdpa():
            with torch.inference_mode():
                for s, (_, seq_len) in enumerate(requests):
                    k = key_cache.index_select(0, tables[s]).transpose(0, 1).reshape(
                        KV_HEADS, -1, HEAD_DIM)[None, :, :seq_len]
                    v = value_cache.index_select(0, tables[s]).transpose(0, 1).reshape(
                        KV_HEADS, -1, HEAD_DIM)[None, :, :seq_len]
                    torch.nn.functional.scaled_dot_product_attention(
                        queries[s], k, v, attn_mask=masks[s], enable_gqa=True)
        calls["PyTorch SDPA per sequence, gathered K/V"] = sdpa

    import bench_paged

    bench_paged.PREFILL, bench_paged.DECODE_CONTEXTS = prefill, decode_contexts
    bench_paged.BLOCK_SIZE, bench_paged.LARGE_TILE = schedule.block_size, schedule.large_tile_size
    nki = bench_paged.build_batch(rng)
    nki_mask = tilelab.nki.reorder_context_mask(nki["mask"], schedule.large_tile_size,
                                                schedule.block_size)

    def nki_kernel():
        tilelab.nki.flash_paged_attention(nki["query"], nki["key"], nki["value"],
                                          nki["kv_cache"], nki["block_tables"], nki_mask,
                                          mixed_precision=True,
                                          LARGE_TILE_SZ=schedule.large_tile_size)
    calls["NKI-layout kernel (cpu schedule)"] = nki_kernel

    times = alternating_medians(list(calls.values()), args.warmup, args.repeats)
    flops = useful_flops(requests)
    ours = times[0]
    rows, results = [], []
    for (name, _), t in zip(calls.items(), times, strict=True):
        rows.append([name, f"{t * 1e3:.2f}", f"{t / ours:.2f}", f"{flops / t * 1e-9:.1f}"])
        results.append({"workload": "mixed", "implementation": name, "seconds": t,
                        "time_vs_paged_attention": t / ours,
                        "useful_gflop_per_s": flops / t * 1e-9})
    print(f"mixed: the default batch, {len(prefill)} prefill + {len(decode_contexts)} decode "
          f"requests, {sum(q for q, _ in requests)} query tokens, "
          f"{int(np.sum(batch['seq_lens']))} keys, block_size {block_size}, bf16")
    print_table(["implementation", "ms", "time / ours", "useful GFLOP/s"], rows, 1)
    return results


def options_workload(tilelab, torch, args, rng):
    """The default batch's prefill requests with a sliding window and softcap."""
    prefill, _ = tilelab.sim.default_batch()
    schedule = tilelab.sim.PagedAttentionSchedule()
    requests = [(q, c + q) for q, c in prefill]
    batch = paged_batch(rng, requests, schedule.block_size)
    window, softcap = 512, 50.0
    options = dict(sliding_window=(window, -1), softcap=softcap)
    calls = {"paged_attention": paged_call(tilelab, batch, **options)}
    gathered = gathered_sequences(batch)

    def dense(implementation):
        def call():
            for q, k, v in gathered:
                tilelab.flash_attention(q, k, v, causal=True, causal_alignment="bottom_right",
                                        implementation=implementation, **options)
        return call
    calls["dense flash per sequence, generated kernels"] = dense("automatic")
    calls["dense flash per sequence, paged kernel"] = dense("reference")
    if torch is not None:
        def as_torch(a):
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        tensors = [tuple(as_torch(a) for a in arrays) for arrays in gathered]
        masks = []
        for q_len, seq_len in requests:
            i = np.arange(seq_len - q_len, seq_len)[:, None]
            j = np.arange(seq_len)[None, :]
            masks.append(torch.from_numpy((j <= i) & (j >= i - window)))

        def sdpa():
            with torch.inference_mode():
                for (q, k, v), mask in zip(tensors, masks, strict=True):
                    torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                     enable_gqa=True)
        calls["PyTorch SDPA per sequence, window mask only"] = sdpa
    times = alternating_medians(list(calls.values()), args.warmup, args.repeats)
    ours = times[0]
    rows, results = [], []
    for (name, _), t in zip(calls.items(), times, strict=True):
        rows.append([name, f"{t * 1e3:.2f}", f"{t / ours:.2f}"])
        results.append({"workload": "options", "implementation": name, "seconds": t,
                        "time_vs_paged_attention": t / ours})
    print(f"\noptions: the default batch's {len(prefill)} prefill requests, sliding_window "
          f"({window}, -1), softcap {softcap:g}, bf16")
    print_table(["implementation", "ms", "time / ours"], rows, 1)
    return results


class DecodeCase(NamedTuple):
    name: str
    requests: list[tuple[int, int]]
    cache_dtype: type
    options: dict
    q_heads: int
    block_size: int


def decode_workloads(tilelab, args, rng):
    decode_64 = [(1, int(c)) for c in rng.integers(512, 4097, size=64)]
    fp8 = ml_dtypes.float8_e4m3fn
    fp8_scales = dict(k_scale=0.05, v_scale=0.05)
    # Hq 64 over Hkv 8 (Llama-3-70B's grouping) does twice the products per byte read. Block
    # sizes: vLLM's CPU backend uses 16 by default and 128 with Intel's extension; a kv head's
    # block is one contiguous run of K (and one of V) of block_size rows.
    cases = [DecodeCase("decode 64 seqs, bf16", decode_64, ml_dtypes.bfloat16, {}, HEADS, 16),
             DecodeCase("decode 64 seqs, fp8 e4m3fn", decode_64, fp8, fp8_scales, HEADS, 16),
             DecodeCase("decode 64 seqs, Hq 64, bf16", decode_64, ml_dtypes.bfloat16, {}, 64, 16),
             DecodeCase("decode 64 seqs, Hq 64, fp8 e4m3fn", decode_64, fp8, fp8_scales, 64, 16),
             DecodeCase("decode 64 seqs, bf16, 128-key blocks", decode_64, ml_dtypes.bfloat16, {},
                        HEADS, 128),
             DecodeCase("decode 64 seqs, fp8 e4m3fn, 128-key blocks", decode_64, fp8, fp8_scales,
                        HEADS, 128),
             DecodeCase("decode 1 seq 32k, bf16, split auto", [(1, 32768)], ml_dtypes.bfloat16, {},
                        HEADS, 16),
             DecodeCase("decode 1 seq 32k, bf16, no split", [(1, 32768)], ml_dtypes.bfloat16,
                        dict(split_kv=1), HEADS, 16),
             DecodeCase("decode 1 seq 32k, fp8 e4m3fn, split auto", [(1, 32768)], fp8, fp8_scales,
                        HEADS, 16)]
    batches, calls = [], []
    for case in cases:
        if args.filter and args.filter not in case.name:
            continue
        batch = paged_batch(rng, case.requests, case.block_size, case.cache_dtype,
                            heads=case.q_heads)
        batches.append((case.name, batch))
        calls.append(paged_call(tilelab, batch, **case.options))
        # The same work with every block-table entry among the blocks of the first 64 keys (K
        # and V of every kv head: 256 KiB in bf16, 512 KiB with 128-key blocks), so the cache
        # stays in L2: the time of the arithmetic alone, which says how much of the call waits
        # on memory.
        resident_blocks = max(1, CACHE_RESIDENT_KEYS // case.block_size)
        resident = dict(batch, block_table=batch["block_table"] % resident_blocks)
        calls.append(paged_call(tilelab, resident, **case.options))
    if not calls:
        return []
    bandwidth = BandwidthAlongside(args.build_dir, args.threads,
                                   sorted({kv_block_bytes(batch) for _, batch in batches}))
    times = alternating_medians_between_probes(calls, bandwidth, args.warmup, args.repeats)
    triad = bandwidth.triad()
    rows, results = [], []
    for (name, batch), t, t_resident in zip(batches, times[::2], times[1::2], strict=True):
        rate = kv_bytes(batch) / t * 1e-9
        block_read = bandwidth.block_read(kv_block_bytes(batch))
        rows.append([name, str(batch["block_size"]), f"{t * 1e3:.3f}", f"{rate:.1f}",
                     f"{100 * rate / triad:.0f}%",
                     f"{100 * rate / block_read:.0f}% of {block_read:.1f}" if block_read else "-",
                     f"{t_resident * 1e3:.3f}", f"{100 * t_resident / t:.0f}%"])
        results.append({"workload": name, "block_size": batch["block_size"], "seconds": t,
                        "kv_gb_per_s": rate,
                        "fraction_of_triad": rate / triad,
                        "fraction_of_block_read": rate / block_read if block_read else None,
                        "cache_resident_seconds": t_resident})
    low, high = bandwidth.triad_range()
    print(f"\ndecode: GB/s of K and V read, against triad {triad:.1f} GB/s "
          f"({low:.1f}-{high:.1f}) and random-order, prefetched reads of one block's bytes from "
          "two arrays, both measured before and after the calls (the better); the same calls with "
          f"the cache in L2 (block tables folded onto the blocks of {CACHE_RESIDENT_KEYS} keys): "
          "their time, and its share of the call's (near 100%: the arithmetic bounds the call, "
          "not the memory)")
    print_table(["workload", "block", "ms", "GB/s", "of triad", "of block read", "in L2 ms",
                 "share"], rows, 1)
    seconds = {r["workload"]: r["seconds"] for r in results}
    pairs = [("decode 64 seqs, bf16", "decode 64 seqs, fp8 e4m3fn"),
             ("decode 64 seqs, Hq 64, bf16", "decode 64 seqs, Hq 64, fp8 e4m3fn"),
             ("decode 64 seqs, bf16, 128-key blocks", "decode 64 seqs, fp8 e4m3fn, 128-key blocks"),
             ("decode 1 seq 32k, bf16, split auto", "decode 1 seq 32k, fp8 e4m3fn, split auto")]
    print_ours_against_ours([f"{fp8}: {seconds[bf16] / seconds[fp8]:.2f}x faster than bf16"
                             for bf16, fp8 in pairs if bf16 in seconds and fp8 in seconds])
    return results


def main() -> None:
    args, tilelab, torch, peak = start_benchmark(__doc__.split("\n\n")[0], repeats=10, warmup=2,
                                                 quick_repeats=3)
    rng = np.random.default_rng(0)
    results = []
    if not args.filter or args.filter in "mixed":
        results += mixed_workload(tilelab, torch, args, rng)
    if not args.filter or args.filter in "options":
        results += options_workload(tilelab, torch, args, rng)
    results += decode_workloads(tilelab, args, rng)
    write_json_report(args, "tilelab.bench_serving", tilelab, torch, peak, results)


if __name__ == "__main__":
    main()
