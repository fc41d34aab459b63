#!/usr/bin/env python3
"""bench_flash_backward: tilelab.flash_attention_backward against PyTorch SDPA's backward (autograd
through scaled_dot_product_attention on the CPU), and against this machine's FMA peak measured in
the same run, before and after the calls of each workload (tilelab_machine_peak, see
MeasuredAlongside in bench_flash.py).

    python bench/attention/bench_flash_backward.py [--build-dir build] [--threads 2] [--quick]

Times are medians over --repeats calls after --warmup calls, ours and PyTorch's alternating. Both
sides time the backward only: PyTorch's forward runs once, and each timed call is
``torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)``; ours gets the forward's out and
lse. GFLOP/s counts 2.5 x the forward's 4·B·Hq·M·N·D (half for square causal): the five products
of the FlashAttention-2 backward, whatever an implementation recomputes. bf16 rows with P and dS
rounded to bf16 (the default) run on bf16 dot products on CPUs that prefer them
(tilelab.prefers_bf16_dot_products()) and are then judged against their peak; "fp32 P" rows keep
P and dS in fp32 (fp32_probabilities=True), as bf16 rows do on other CPUs.

The score options table times the backward with a softcap, a sliding window and sinks (their
gradient included) against our plain causal backward of the same shape and against what a
PyTorch user writes without a fused kernel: autograd through the scores, tanh, the mask, a sink
column and softmax, in eager mode (SDPA takes none of these options).
"""

from __future__ import annotations

import os
import pathlib
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import dataclasses
from collections.abc import Callable

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from bench_flash import (  # noqa: E402
    ComputePeakAlongside,
    Workload,
    format_fraction_of_compute_peak,
    fractions_of_compute_peak,
    make_inputs,
    print_ratios,
    print_table,
    start_benchmark,
    to_torch,
    write_json_report,
)
from timing import alternating_medians, alternating_medians_between_probes  # noqa: E402

BACKWARD_FLOPS_PER_FORWARD_FLOP = 2.5

WORKLOADS = [
    Workload(1, 16, 16, 512, 512, 128, "float32", causal=False),
    Workload(1, 16, 16, 512, 512, 128, "float32", causal=True),
    Workload(1, 16, 16, 512, 512, 128, "bfloat16", causal=False),
    Workload(1, 16, 16, 512, 512, 128, "bfloat16", causal=True),
    Workload(1, 16, 16, 512, 512, 128, "bfloat16", causal=False, fp32_probabilities=True),
    Workload(1, 32, 8, 2048, 2048, 128, "bfloat16", causal=True),
    Workload(4, 8, 8, 1024, 1024, 64, "float32", causal=False),
]

# (workload, options): Gemma-2-like softcap, a Mistral-like window, gpt-oss-like sinks.
OPTION_WORKLOADS = [
    (Workload(1, 16, 16, 512, 512, 128, dtype, causal=True),
     dict(softcap=30.0, sliding_window=(255, -1)))
    for dtype in ("float32", "bfloat16")
]


def run_workload(workload, tilelab, torch, peak, args, rng) -> tuple[dict, Callable]:
    """The workload's result, and our call (for print_ratios)."""
    q, k, v = make_inputs(workload, rng)
    causal = workload.causal
    out, lse = tilelab.flash_attention(q, k, v, causal=causal, return_lse=True)
    dout = rng.standard_normal(out.shape, dtype=np.float32).astype(q.dtype)

    def ours_call():
        return tilelab.flash_attention_backward(
            dout, q, k, v, out, lse, causal=causal,
            fp32_probabilities=workload.fp32_probabilities)

    calls = [ours_call]
    if torch is not None:
        tq, tk, tv = (to_torch(torch, a).clone().requires_grad_(True) for a in (q, k, v))
        t_out = torch.nn.functional.scaled_dot_product_attention(
            tq, tk, tv, is_causal=causal, enable_gqa=workload.q_heads != workload.kv_heads)
        t_dout = to_torch(torch, dout)

        def torch_call():
            return torch.autograd.grad(t_out, (tq, tk, tv), t_dout, retain_graph=True)

        calls.append(torch_call)
    alongside = ComputePeakAlongside(args.build_dir, args.threads)
    medians = alternating_medians_between_probes(calls, alongside, args.warmup, args.repeats)
    flops = BACKWARD_FLOPS_PER_FORWARD_FLOP * workload.flops
    result = {
        "workload": workload.name,
        "shape": dataclasses.asdict(workload),
        "dtype": workload.dtype,
        "causal": causal,
        "ours_median_s": medians[0],
        "flop": flops,
        "ours_gflop_per_s": flops / medians[0] * 1e-9,
    }
    result.update(fractions_of_compute_peak(result["ours_gflop_per_s"], workload, peak,
                                            alongside))
    if torch is not None:
        ours = ours_call()
        theirs = [g.float().numpy() for g in torch_call()]
        result["torch_median_s"] = medians[1]
        result["torch_over_ours"] = medians[1] / medians[0]
        result["torch_gflop_per_s"] = flops / medians[1] * 1e-9
        result["max_abs_difference_from_torch"] = max(
            float(np.max(np.abs(a.astype(np.float32) - b)))
            for a, b in zip(ours, theirs, strict=True))
    return result, ours_call


def torch_options_attention(torch, q, k, v, sinks, softcap, window_left):
    """out of softmax([softcap·tanh(scale·q kᵀ / softcap) masked causally and to the window,
    sink]) v, written out in eager PyTorch (one query head per kv head)."""
    scale = q.shape[-1] ** -0.5
    scores = softcap * torch.tanh(scale * (q @ k.transpose(-1, -2)) / softcap)
    i = torch.arange(q.shape[2])[:, None]
    j = torch.arange(k.shape[2])[None, :]
    visible = (j <= i) & (j >= i - window_left)
    scores = scores.masked_fill(~visible, float("-inf"))
    sink_column = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:3], 1)
    probabilities = torch.softmax(torch.cat([scores, sink_column], dim=-1), dim=-1)
    return probabilities[..., :-1] @ v


def run_options_workload(workload, options, tilelab, torch, args, rng) -> dict:
    q, k, v = make_inputs(workload, rng)
    sinks = rng.standard_normal(workload.q_heads, dtype=np.float32)
    out, lse = tilelab.flash_attention(q, k, v, causal=True, return_lse=True, sinks=sinks,
                                       **options)
    plain_out, plain_lse = tilelab.flash_attention(q, k, v, causal=True, return_lse=True)
    dout = rng.standard_normal(out.shape, dtype=np.float32).astype(q.dtype)
    calls = [
        lambda: tilelab.flash_attention_backward(dout, q, k, v, out, lse, causal=True,
                                                 sinks=sinks, return_dsinks=True, **options),
        lambda: tilelab.flash_attention_backward(dout, q, k, v, plain_out, plain_lse,
                                                 causal=True),
    ]
    if torch is not None:
        tq, tk, tv = (to_torch(torch, a).clone().requires_grad_(True) for a in (q, k, v))
        t_sinks = torch.from_numpy(sinks).requires_grad_(True)
        t_out = torch_options_attention(torch, tq, tk, tv, t_sinks, options["softcap"],
                                        options["sliding_window"][0])
        t_dout = to_torch(torch, dout)
        calls.append(lambda: torch.autograd.grad(t_out, (tq, tk, tv, t_sinks), t_dout,
                                                 retain_graph=True))
    medians = alternating_medians(calls, args.warmup, args.repeats)
    result = {"workload": workload.name, "dtype": workload.dtype, "options": str(options),
              "ours_median_s": medians[0], "ours_plain_causal_median_s": medians[1]}
    if torch is not None:
        result["torch_eager_median_s"] = medians[2]
        result["torch_eager_over_ours"] = medians[2] / medians[0]
        ours = calls[0]()
        theirs = [g.float().numpy() for g in calls[2]()]
        result["max_abs_difference_from_torch"] = max(
            float(np.max(np.abs(a.astype(np.float32) - b)))
            for a, b in zip(ours, theirs, strict=True))
    return result


def format_row(result: dict) -> list[str]:
    torch_ms = f"{1e3 * result['torch_median_s']:.1f}" if "torch_median_s" in result else "-"
    ratio = f"{result['torch_over_ours']:.2f}x" if "torch_over_ours" in result else "-"
    torch_rate = (f"{result['torch_gflop_per_s']:.1f} GFLOP/s"
                  if "torch_gflop_per_s" in result else "-")
    difference = (f"{result['max_abs_difference_from_torch']:.1e}"
                  if "max_abs_difference_from_torch" in result else "-")
    return [
        result["workload"],
        result["dtype"],
        "causal" if result["causal"] else "full",
        f"{1e3 * result['ours_median_s']:.1f}",
        torch_ms,
        ratio,
        f"{result['ours_gflop_per_s']:.1f} GFLOP/s",
        format_fraction_of_compute_peak(result),
        torch_rate,
        difference,
    ]


def main() -> None:
    args, tilelab, torch, peak = start_benchmark(
        __doc__.split("\n\n")[0], repeats=11, warmup=2, quick_repeats=2
    )
    print("backward GFLOP/s = 2.5 x 4·B·Hq·M·N·D (half for square causal) / time\n")

    rng = np.random.default_rng(0)
    results, rows, ours_calls = [], [], []
    for workload in WORKLOADS:
        if args.filter not in f"{workload.name} {workload.dtype}":
            continue
        result, ours_call = run_workload(workload, tilelab, torch, peak, args, rng)
        results.append(result)
        ours_calls.append(ours_call)
        rows.append(format_row(result))
    header = ["workload", "dtype", "mask", "ours ms", "torch ms", "torch/ours", "ours rate",
              "of peak", "torch rate", "max |ours - torch|"]
    print_table(header, rows, left_aligned=3)
    print_ratios(results, ours_calls, args)

    option_rows = []
    for workload, options in OPTION_WORKLOADS:
        if args.filter not in f"{workload.name} {workload.dtype} options":
            continue
        result = run_options_workload(workload, options, tilelab, torch, args, rng)
        results.append(result)
        torch_ms = result.get("torch_eager_median_s")
        option_rows.append([
            result["workload"], result["dtype"],
            f"{1e3 * result['ours_median_s']:.1f}",
            f"{1e3 * result['ours_plain_causal_median_s']:.1f}",
            f"{result['ours_median_s'] / result['ours_plain_causal_median_s']:.2f}x",
            "-" if torch_ms is None else f"{1e3 * torch_ms:.1f}",
            "-" if torch_ms is None else f"{result['torch_eager_over_ours']:.2f}x",
            (f"{result['max_abs_difference_from_torch']:.1e}"
             if "max_abs_difference_from_torch" in result else "-"),
        ])
    if option_rows:
        print("\nscore options: causal, softcap 30, sliding_window (255, -1), sinks (and dsinks)")
        print_table(["workload", "dtype", "ours ms", "ours plain causal ms", "options / plain",
                     "torch eager ms", "torch/ours", "max |ours - torch|"], option_rows,
                    left_aligned=2)
    write_json_report(args, "tilelab.bench_flash_backward", tilelab, torch, peak, results)


if __name__ == "__main__":
    main()
