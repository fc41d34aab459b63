#!/usr/bin/env python3
"""bench_blocksparse: tilelab.blocksparse_attention against our dense causal flash attention and
PyTorch SDPA with the layout's dense boolean mask, at Phi-3-small-like settings (local + vertically
strided blocks), with the layout's density, all measured in one run.

    python bench/attention/bench_blocksparse.py [--build-dir build] [--threads 2] [--quick]
        [--filter S8192] [--no-torch]

Each prefill workload is one sequence of S tokens (every query of the sequence); each decode
workload is a batch of sequences with one new query each, against our dense decode over all keys.
The target is time(block-sparse) <= 1.25 x density x time(dense): the kernel's time follows the
layout's density. For prefill, SDPA runs head by head with that head's [S, S] boolean mask (a
[Hq, S, S] mask does not fit in memory at 16 k tokens), and its time is the sum over heads.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from bench_flash import (  # noqa: E402
    BandwidthAlongside,
    ComputePeakAlongside,
    bf16_prefill_on_dot_products,
    print_table,
    start_benchmark,
    to_torch,
    write_json_report,
)
from timing import alternating_medians, alternating_medians_between_probes  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Workload:
    seqlen: int
    q_heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 64
    local_blocks: int = 16
    vert_stride: int = 8
    dtype: str = "bfloat16"

    @property
    def name(self) -> str:
        return (
            f"S{self.seqlen} Hq{self.q_heads} Hkv{self.kv_heads} D{self.head_dim} "
            f"block{self.block_size} local{self.local_blocks} vert{self.vert_stride}"
        )

    @property
    def dense_causal_flops(self) -> float:
        return 4.0 * self.q_heads * self.seqlen * self.seqlen * self.head_dim / 2


WORKLOADS = [
    Workload(2048),
    Workload(8192),
    Workload(16384),
    Workload(2048, dtype="float32"),
    Workload(8192, dtype="float32"),
]


@dataclasses.dataclass(frozen=True)
class DecodeWorkload:
    """One new query per sequence against kv_len cached keys: its last row of the layout."""

    batch: int = 8
    kv_len: int = 4096
    q_heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 64
    local_blocks: int = 16
    vert_stride: int = 8
    homo_head: bool = False
    dtype: str = "bfloat16"

    @property
    def name(self) -> str:
        homo = " homo" if self.homo_head else ""
        return (
            f"decode B{self.batch} N{self.kv_len} Hq{self.q_heads} Hkv{self.kv_heads} "
            f"D{self.head_dim} block{self.block_size} local{self.local_blocks} "
            f"vert{self.vert_stride}{homo}"
        )


DECODE_WORKLOADS = [
    DecodeWorkload(),
    DecodeWorkload(homo_head=True),
    DecodeWorkload(dtype="float32"),
]


def run_decode_workload(w: DecodeWorkload, tilelab, torch, peak, args, rng) -> dict:
    import ml_dtypes

    dtype = np.float32 if w.dtype == "float32" else ml_dtypes.bfloat16
    layout = tilelab.BlockSparseLayout.local_strided(
        w.q_heads, w.kv_len, w.block_size, w.local_blocks, w.vert_stride, homo_head=w.homo_head
    )
    # The fraction of the last query's keys the layout keeps, over heads: the decode "density".
    last_row = layout.token_mask(w.kv_len)[:, -1, :]
    kept = float(last_row.mean())
    total_k = w.batch * w.kv_len
    q = rng.standard_normal((w.batch, w.q_heads, w.head_dim), dtype=np.float32).astype(dtype)
    k = rng.standard_normal((total_k, w.kv_heads, w.head_dim), dtype=np.float32).astype(dtype)
    v = rng.standard_normal((total_k, w.kv_heads, w.head_dim), dtype=np.float32).astype(dtype)
    cu_q = np.arange(w.batch + 1, dtype=np.int32)
    cu_k = (np.arange(w.batch + 1) * w.kv_len).astype(np.int32)

    def dense_view(a):
        return np.ascontiguousarray(
            a.reshape(w.batch, w.kv_len, w.kv_heads, w.head_dim).transpose(0, 2, 1, 3)
        )

    q_dense, k_dense, v_dense = np.ascontiguousarray(q[:, :, None, :]), dense_view(k), dense_view(v)

    def sparse_call():
        return tilelab.blocksparse_attention(q, k, v, layout, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)

    def dense_call():
        return tilelab.flash_attention(q_dense, k_dense, v_dense, causal=False)

    calls = [sparse_call, dense_call]
    if torch is not None:
        tq, tk, tv = (to_torch(torch, a) for a in (q_dense, k_dense, v_dense))
        mask = torch.from_numpy(np.ascontiguousarray(last_row[None, :, None, :]))

        def torch_call():
            return torch.nn.functional.scaled_dot_product_attention(
                tq, tk, tv, attn_mask=mask, enable_gqa=True
            )

        calls.append(torch_call)
    bandwidth = BandwidthAlongside(args.build_dir, args.threads)
    medians = alternating_medians_between_probes(calls, bandwidth, args.warmup, args.repeats * 10)
    sparse_s, dense_s = medians[0], medians[1]
    triad = bandwidth.triad()
    kv_bytes = 2.0 * total_k * w.kv_heads * w.head_dim * np.dtype(dtype).itemsize
    result = {
        "workload": w.name,
        "dtype": w.dtype,
        "density": kept,
        "blocksparse_median_s": sparse_s,
        "dense_median_s": dense_s,
        "sparse_over_density_dense": sparse_s / (kept * dense_s),
        "triad_alongside_gb_per_s": triad,
        "sparse_fraction_of_triad": kept * kv_bytes / sparse_s * 1e-9 / triad,
        "dense_fraction_of_triad": kv_bytes / dense_s * 1e-9 / triad,
    }
    if torch is not None:
        result["torch_masked_median_s"] = medians[2]
        result["torch_over_blocksparse"] = medians[2] / sparse_s
    return result


def run_workload(w: Workload, tilelab, torch, peak, args, rng) -> dict:
    import ml_dtypes

    dtype = np.float32 if w.dtype == "float32" else ml_dtypes.bfloat16
    layout = tilelab.BlockSparseLayout.local_strided(
        w.q_heads, w.seqlen, w.block_size, w.local_blocks, w.vert_stride
    )
    # Packed [S, H, D] for block-sparse; [1, H, S, D] views of the same data for dense.
    q = rng.standard_normal((w.seqlen, w.q_heads, w.head_dim), dtype=np.float32).astype(dtype)
    k = rng.standard_normal((w.seqlen, w.kv_heads, w.head_dim), dtype=np.float32).astype(dtype)
    v = rng.standard_normal((w.seqlen, w.kv_heads, w.head_dim), dtype=np.float32).astype(dtype)
    cu_seqlens = np.array([0, w.seqlen], dtype=np.int32)
    q_dense, k_dense, v_dense = (
        np.ascontiguousarray(a.transpose(1, 0, 2))[None] for a in (q, k, v)
    )

    def sparse_call():
        return tilelab.blocksparse_attention(
            q, k, v, layout, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens
        )

    def dense_call():
        return tilelab.flash_attention(q_dense, k_dense, v_dense, causal=True)

    calls = [sparse_call, dense_call]
    if torch is not None:
        group = w.q_heads // w.kv_heads
        tq, tk, tv = (to_torch(torch, a) for a in (q_dense, k_dense, v_dense))
        masks = [torch.from_numpy(layout.token_mask(w.seqlen, head=h)) for h in range(w.q_heads)]

        def torch_call():
            for h in range(w.q_heads):
                torch.nn.functional.scaled_dot_product_attention(
                    tq[:, h : h + 1],
                    tk[:, h // group : h // group + 1],
                    tv[:, h // group : h // group + 1],
                    attn_mask=masks[h],
                )

        calls.append(torch_call)
    repeats = args.repeats if w.seqlen <= 4096 else max(1, args.repeats // 3)
    warmup = args.warmup if w.seqlen <= 4096 else 0
    # The peaks before and after the calls (alternating_medians_between_probes), here by hand:
    # long sequences skip SDPA's warm-up (a masked call takes seconds), not ours, whose first call
    # in a process measured 10-20% slower than the next ones.
    alongside = ComputePeakAlongside(args.build_dir, args.threads)
    alongside()
    if warmup == 0:
        sparse_call()
        dense_call()
    medians = alternating_medians(calls, warmup, repeats)
    alongside()
    density = layout.density
    sparse_s, dense_s = medians[0], medians[1]
    peaks = alongside.peaks()
    # bf16 runs on bf16 dot products where the CPU prefers them, as the dense kernels do.
    on_dot_products = bf16_prefill_on_dot_products(w.dtype, peak)
    peak_name = "bf16 dot" if on_dot_products else "FMA"
    compute_peak = peaks["bf16_dot_peak_gflop_per_s" if on_dot_products
                         else "fma_peak_fp32_gflop_per_s"]
    result = {
        "workload": w.name,
        "dtype": w.dtype,
        "density": density,
        "blocksparse_median_s": sparse_s,
        "dense_median_s": dense_s,
        "sparse_over_density_dense": sparse_s / (density * dense_s),
        "peaks_alongside": peaks,
        "compute_peak": peak_name,
        "dense_fraction_of_compute_peak": w.dense_causal_flops / dense_s * 1e-9 / compute_peak,
        "sparse_fraction_of_compute_peak": density * w.dense_causal_flops / sparse_s * 1e-9
        / compute_peak,
    }
    if torch is not None:
        result["torch_masked_median_s"] = medians[2]
        result["torch_over_blocksparse"] = medians[2] / sparse_s
    return result


def format_row(r: dict) -> list[str]:
    def ms(seconds: float) -> str:
        return f"{1e3 * seconds:.2f}" if seconds < 0.1 else f"{1e3 * seconds:.0f}"

    torch_ms = ms(r["torch_masked_median_s"]) if "torch_masked_median_s" in r else "-"
    torch_ratio = f"{r['torch_over_blocksparse']:.2f}x" if "torch_over_blocksparse" in r else "-"
    if "sparse_fraction_of_compute_peak" in r:
        of_peak = [
            f"{100 * r['sparse_fraction_of_compute_peak']:.1f}% {r['compute_peak']}",
            f"{100 * r['dense_fraction_of_compute_peak']:.1f}% {r['compute_peak']}",
        ]
    else:
        of_peak = [
            f"{100 * r['sparse_fraction_of_triad']:.1f}% triad",
            f"{100 * r['dense_fraction_of_triad']:.1f}% triad",
        ]
    return [
        r["workload"],
        r["dtype"],
        f"{r['density']:.3f}",
        ms(r["blocksparse_median_s"]),
        ms(r["dense_median_s"]),
        f"{r['sparse_over_density_dense']:.2f}",
        torch_ms,
        torch_ratio,
        *of_peak,
    ]


def main() -> None:
    args, tilelab, torch, peak = start_benchmark(
        __doc__.split("\n\n")[0], repeats=3, warmup=1, quick_repeats=1
    )
    print(
        "prefill rows: density = kept blocks / causal blocks (layout.density), dense = our dense "
        "causal flash attention, of peak = useful FLOPs (density x 4·H·S²·D/2) / time against the "
        "fp32 FMA peak (bf16 on dot products: theirs) measured around the calls (the better); "
        "decode rows: density = kept fraction of the last row's keys, dense = our dense decode "
        "over all keys, of peak = kept K/V bytes / time against the triad measured around the "
        "calls (the better). "
        "sparse/(density*dense) is the target ratio (<= 1.25)\n"
    )
    rng = np.random.default_rng(0)
    results, rows = [], []
    for workload in WORKLOADS + DECODE_WORKLOADS:
        if args.filter not in workload.name + " " + workload.dtype:
            continue
        if args.quick and isinstance(workload, Workload) and workload.seqlen > 2048:
            continue
        run = run_workload if isinstance(workload, Workload) else run_decode_workload
        result = run(workload, tilelab, torch, peak, args, rng)
        results.append(result)
        rows.append(format_row(result))
    header = [
        "workload",
        "dtype",
        "density",
        "sparse ms",
        "dense ms",
        "sparse/(density*dense)",
        "torch masked ms",
        "torch/sparse",
        "sparse of peak",
        "dense of peak",
    ]
    print_table(header, rows, left_aligned=2)
    write_json_report(args, "tilelab.bench_blocksparse", tilelab, torch, peak, results)


if __name__ == "__main__":
    main()
