#!/usr/bin/env python3
"""bench_paged: the generated NKI-style flash paged attention (cpu schedule) against our dense
flash attention on the same tokens and PyTorch SDPA over K/V gathered through the block tables
with the same mask, in one run; then the simulator's timing-only throughput on the same batch.

    python bench/paged/bench_paged.py [--build-dir build] [--threads 2] [--repeats 5]

The batch is the simulator's default (`tilelab sim paged-attention`): 4 prefill requests with
prior context and 12 decode requests, 32 query heads, 8 kv heads, d 128, block_size 32,
LARGE_TILE_SZ 2048, bf16. Calls alternate (ours, dense, torch, ours, ...) so that all see the same
drift of a shared machine; times are medians. Rates count every score of the NKI algorithm,
masked ones included (it scores all query rows against every context tile):
4 · Hq · seq_q · (context + seq_q) · d. The cpu schedule leaves out the large tiles a 32-row
query block's mask is all zero on (without changing an output bit), so its rate is the
equivalent of computing them all.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import sys

# Before numpy loads: its OpenBLAS threads would spin on the cores the kernels run on.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "bench"))
from timing import alternating_medians  # noqa: E402

# The simulator's default problem (schedules/paged/default_problem.hpp), read from the package
# once it is imported (main): (query, context) tokens of the prefill requests, decode contexts.
PREFILL: list[tuple[int, int]] = []
DECODE_CONTEXTS: list[int] = []
BLOCK_SIZE = LARGE_TILE = 0
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128  # the simulator kernel's num_heads / num_kv_heads / head_dim


def build_batch(rng: np.random.Generator):
    """NKI-layout inputs for the batch, the natural-order boolean mask, and the gathered K/V."""
    import ml_dtypes

    requests = PREFILL + [(1, c) for c in DECODE_CONTEXTS]
    seq_q = sum(q for q, _ in requests)
    context = sum(c for _, c in requests)
    num_blocks_used = context // BLOCK_SIZE
    num_blocks = num_blocks_used + 64  # a cache with spare blocks, used in shuffled order
    block_tables = rng.permutation(num_blocks)[:num_blocks_used].astype(np.int32)

    bf16 = ml_dtypes.bfloat16
    query = rng.standard_normal((1, HEADS, HEAD_DIM, seq_q), dtype=np.float32).astype(bf16)
    key = rng.standard_normal((1, KV_HEADS, HEAD_DIM, seq_q), dtype=np.float32).astype(bf16)
    value = rng.standard_normal((1, KV_HEADS, seq_q, HEAD_DIM), dtype=np.float32).astype(bf16)
    kv_cache = rng.standard_normal(
        (2, num_blocks, KV_HEADS, BLOCK_SIZE, HEAD_DIM), dtype=np.float32
    ).astype(bf16)

    # Natural order: context columns are the requests' contexts concatenated, then the new tokens.
    mask = np.zeros((seq_q, context + seq_q), dtype=bool)
    q0 = c0 = 0
    for q_len, c_len in requests:
        mask[q0 : q0 + q_len, c0 : c0 + c_len] = True
        causal = np.tril(np.ones((q_len, q_len), dtype=bool))
        mask[q0 : q0 + q_len, context + q0 : context + q0 + q_len] = causal
        q0 += q_len
        c0 += c_len

    # K/V of every context token in column order (gathered through the block tables).
    gathered = kv_cache[:, block_tables].transpose(0, 2, 1, 3, 4).reshape(2, KV_HEADS, context,
                                                                          HEAD_DIM)
    return dict(query=query, key=key, value=value, kv_cache=kv_cache, block_tables=block_tables,
                mask=mask, gathered=gathered, seq_q=seq_q, context=context)


def simulator_throughput(build_dir: pathlib.Path) -> str:
    tool = build_dir / "tools" / "tilelab"
    if not tool.exists():
        return f"simulator: {tool} not built"
    out = subprocess.run([str(tool), "sim", "paged-attention", "--no-compare", "--text", "-",
                          "--out-dir", "/tmp"], capture_output=True, text=True, check=True).stdout
    instructions = int(re.search(r"(\d+) instructions", out).group(1))
    built, simulated = map(float, re.search(r"built in ([\d.]+) s, simulated in ([\d.]+) s",
                                            out).groups())
    return (f"simulator, timing only, default batch: {instructions} instructions built in "
            f"{built * 1e3:.1f} ms and simulated in {simulated * 1e3:.1f} ms = "
            f"{instructions / simulated / 1e6:.1f} M instructions/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", type=pathlib.Path, default=REPO_ROOT / "build")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--no-torch", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(args.build_dir / "python"))
    import tilelab

    global PREFILL, DECODE_CONTEXTS, BLOCK_SIZE, LARGE_TILE
    PREFILL, DECODE_CONTEXTS = tilelab.sim.default_batch()
    default_schedule = tilelab.sim.PagedAttentionSchedule()
    BLOCK_SIZE, LARGE_TILE = default_schedule.block_size, default_schedule.large_tile_size
    tilelab.set_num_threads(args.threads)
    torch = None
    if not args.no_torch:
        try:
            import torch

            torch.set_num_threads(args.threads)
        except ImportError:
            torch = None

    b = build_batch(np.random.default_rng(0))
    seq_q, context = b["seq_q"], b["context"]
    nki_mask = tilelab.nki.reorder_context_mask(b["mask"], LARGE_TILE, BLOCK_SIZE)

    def paged():
        return tilelab.nki.flash_paged_attention(b["query"], b["key"], b["value"], b["kv_cache"],
                                                 b["block_tables"], nki_mask, mixed_precision=True,
                                                 LARGE_TILE_SZ=LARGE_TILE)

    # Dense flash attention over the same tokens: every query row against every key, no mask.
    q_dense = np.ascontiguousarray(b["query"].transpose(0, 1, 3, 2))
    new_k = b["key"].transpose(0, 1, 3, 2)[0]
    k_dense = np.concatenate([b["gathered"][0], new_k], axis=1)[None]
    v_dense = np.concatenate([b["gathered"][1], b["value"][0]], axis=1)[None]

    def dense():
        return tilelab.flash_attention(q_dense, k_dense, v_dense)

    calls, names = [paged, dense], ["tilelab paged (cpu schedule)", "tilelab dense flash"]
    torch_out = None
    if torch is not None:
        def as_torch(a):
            return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)

        tq, tk, tv = as_torch(q_dense), as_torch(k_dense), as_torch(v_dense)
        tmask = torch.from_numpy(b["mask"])

        def sdpa():
            with torch.inference_mode():
                return torch.nn.functional.scaled_dot_product_attention(
                    tq, tk, tv, attn_mask=tmask, enable_gqa=True)

        calls.append(sdpa)
        names.append("PyTorch SDPA, gathered K/V + mask")
        torch_out = sdpa().float().numpy()

    ours = paged().astype(np.float32)
    times = alternating_medians(calls, args.warmup, args.repeats)
    flop = 4.0 * HEADS * seq_q * (context + seq_q) * HEAD_DIM

    print(f"batch: {len(PREFILL)} prefill + {len(DECODE_CONTEXTS)} decode requests, seq_q "
          f"{seq_q}, context {context} tokens ({context // BLOCK_SIZE} blocks of {BLOCK_SIZE}), "
          f"Hq {HEADS} Hkv {KV_HEADS} d {HEAD_DIM}, bf16, LARGE_TILE_SZ {LARGE_TILE}; "
          f"{args.threads} threads; medians of {args.repeats}")
    print(f"{'implementation':40s} {'ms':>9s} {'vs paged':>9s} {'GFLOP/s':>9s}")
    for name, t in zip(names, times, strict=True):
        print(f"{name:40s} {t * 1e3:9.2f} {t / times[0]:8.2f}x {flop / t * 1e-9:9.1f}")
    if torch_out is not None:
        rows = b["mask"].any(axis=1)  # every row of this batch sees a key
        diff = np.max(np.abs(ours[0][:, rows] - torch_out[0][:, rows]))
        print(f"max |paged - SDPA| over the batch's rows: {diff:.3g} (bf16 output)")
    print(simulator_throughput(args.build_dir))


if __name__ == "__main__":
    main()
