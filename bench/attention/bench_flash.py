#!/usr/bin/env python3
"""bench_flash: tilelab.flash_attention against PyTorch SDPA, and against this machine's FMA peak
and triad bandwidth measured in the same run (by tilelab_machine_peak at the start, and again
before and after the calls of each workload: see MeasuredAlongside).

    python bench/attention/bench_flash.py [--build-dir build] [--threads 2] [--quick] [--json f]

Times are medians over --repeats calls after --warmup calls, ours and PyTorch's alternating.
Machines are noisy: the ratio torch/ours and the fraction of peak are the figures to compare
across runs, not absolute times.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import platform
import subprocess
import sys
from collections.abc import Callable

# Before numpy loads: its OpenBLAS threads would spin on the cores the kernels run on.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "bench"))
from timing import alternating_medians, alternating_medians_between_probes  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Workload:
    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    dtype: str  # "float32" or "bfloat16"
    causal: bool
    # Decode is bound by reading K and V: it is reported in GB/s against the triad bandwidth;
    # everything else in GFLOP/s against the FMA peak (bf16: also the bf16 dot-product peak).
    decode: bool = False
    # bf16: keep P in fp32 (fp32 FMAs) instead of bf16 dot products.
    fp32_probabilities: bool = False
    # An additive fp32 bias of shape [B, Hq, M, N] (the bias kernels; SDPA's float attn_mask).
    bias: bool = False

    @property
    def name(self) -> str:
        heads = (
            f"H{self.q_heads}"
            if self.q_heads == self.kv_heads
            else f"Hq{self.q_heads} Hkv{self.kv_heads}"
        )
        lengths = (
            f"S{self.q_len}" if self.q_len == self.kv_len else f"M{self.q_len} N{self.kv_len}"
        )
        prefix = "decode " if self.decode else ""
        suffix = " fp32 P" if self.fp32_probabilities else ""
        suffix += " bias" if self.bias else ""
        return f"{prefix}B{self.batch} {heads} {lengths} D{self.head_dim}{suffix}"

    @property
    def flops(self) -> float:
        """4·B·Hq·M·N·D (two matmuls, multiply + add), half for square causal."""
        full = 4.0 * self.batch * self.q_heads * self.q_len * self.kv_len * self.head_dim
        return full / 2 if self.causal and self.q_len == self.kv_len else full

    def kv_bytes(self, itemsize: int) -> float:
        """Bytes of K and V, each read once."""
        return 2.0 * self.batch * self.kv_heads * self.kv_len * self.head_dim * itemsize


WORKLOADS = [
    Workload(1, 16, 16, 512, 512, 128, "float32", causal=False),
    Workload(1, 16, 16, 512, 512, 128, "float32", causal=True),
    Workload(1, 16, 16, 512, 512, 128, "bfloat16", causal=False),
    Workload(1, 16, 16, 512, 512, 128, "bfloat16", causal=True),
    Workload(1, 16, 16, 512, 512, 128, "bfloat16", causal=False, fp32_probabilities=True),
    Workload(1, 16, 16, 512, 512, 128, "float32", causal=False, bias=True),
    Workload(1, 25, 25, 1024, 1024, 64, "float32", causal=False),
    Workload(1, 32, 8, 2048, 2048, 128, "bfloat16", causal=True),
    # One new query per sequence sees every cached key: not causal.
    Workload(8, 32, 8, 1, 4096, 128, "float32", causal=False, decode=True),
    Workload(8, 32, 8, 1, 4096, 128, "bfloat16", causal=False, decode=True),
]


def parse_benchmark_args(description: str, *, repeats: int, warmup: int,
                         quick_repeats: int) -> argparse.Namespace:
    """The options every attention benchmark takes (also bench_flash_backward.py)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--build-dir", type=pathlib.Path, default=REPO_ROOT / "build",
                        help="build directory with python/tilelab and tilelab_machine_peak "
                        "(default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2,
                        help="threads for tilelab, torch and the peak probe (default: 2)")
    parser.add_argument("--repeats", type=int, default=repeats,
                        help=f"timed calls (default: {repeats})")
    parser.add_argument("--warmup", type=int, default=warmup,
                        help=f"untimed calls first (default: {warmup})")
    parser.add_argument("--quick", action="store_true",
                        help=f"{quick_repeats} repeats and 1 warmup (for a demo)")
    parser.add_argument("--filter", default="",
                        help="only workloads whose name contains this text")
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch even if importable")
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.warmup = quick_repeats, 1
    if args.threads < 1 or args.repeats < 1 or args.warmup < 0:
        parser.error("--threads and --repeats must be >= 1, --warmup >= 0")
    return args


def import_tilelab(build_dir: pathlib.Path):
    package_parent = build_dir.resolve() / "python"
    if not (package_parent / "tilelab" / "__init__.py").exists():
        sys.exit(f"bench_flash: no tilelab package in {package_parent}; build the "
                 "tilelab_core_module target first (or pass --build-dir)")
    sys.path.insert(0, str(package_parent))
    import tilelab

    return tilelab


def run_machine_peak(build_dir: pathlib.Path, threads: int, *options: str) -> dict:
    probe = build_dir.resolve() / "bench" / "attention" / "tilelab_machine_peak"
    if not probe.exists():
        sys.exit(f"bench_flash: {probe} is missing; build the tilelab_machine_peak target first")
    command = [str(probe), "--threads", str(threads), *options]
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)


class MeasuredAlongside:
    """Short runs of tilelab_machine_peak just before and just after a workload's calls (see
    timing.alternating_medians_between_probes). What a shared machine gives drifts within a run
    (triad 24-56 GB/s in one hour on a Zen 4 VM, 2 threads; the FMA peak halves while another
    guest is busy), so a rate is judged against what was measured around its calls, not at the run's
    start: against the better of the two samples, as a peak is the best the machine gives (one
    sample can land in a moment when another guest holds the core)."""

    def __init__(self, build_dir: pathlib.Path, threads: int, options: list[str]):
        self.build_dir, self.threads, self.options = build_dir, threads, options
        self.samples: list[dict] = []

    def __call__(self) -> None:
        self.samples.append(run_machine_peak(self.build_dir, self.threads, *self.options))

    def best(self, key: str) -> float:
        return max(s[key] for s in self.samples)

    def range(self, key: str) -> tuple[float, float]:
        values = [s[key] for s in self.samples]
        return min(values), max(values)


class BandwidthAlongside(MeasuredAlongside):
    """The triad and block-read bandwidths around the calls of a bandwidth-bound workload."""

    def __init__(self, build_dir: pathlib.Path, threads: int, read_blocks: list[int] | None = None):
        """read_blocks: the block sizes (bytes) whose random-order reads block_read gives;
        tilelab_machine_peak's own (2048 and 4096) when None."""
        blocks = ["--read-blocks", ",".join(map(str, read_blocks))] if read_blocks else []
        # Arrays of 64 MiB (192 MiB for the triad, 6x a Zen 4 L3) measure what 256 MiB do, in a
        # quarter of the time.
        super().__init__(build_dir, threads,
                         ["--trials", "1", "--triad-mib", "64", "--bandwidth-only", *blocks])

    def triad(self) -> float:
        return self.best("triad_bandwidth_gb_per_s")

    def triad_range(self) -> tuple[float, float]:
        return self.range("triad_bandwidth_gb_per_s")

    def block_read(self, block_bytes: int) -> float | None:
        """Random-order reads of blocks of this many bytes (one of read_blocks), or None."""
        reads = [s["random_block_read_gb_per_s"].get(str(block_bytes)) for s in self.samples]
        return max(reads) if reads and None not in reads else None


class ComputePeakAlongside(MeasuredAlongside):
    """The fp32 FMA and bf16 dot-product peaks around the calls of a compute-bound workload."""

    def __init__(self, build_dir: pathlib.Path, threads: int):
        # About 10 ms per trial and kind on a Zen 4 core. Best of three: the first trial of a
        # fresh process measured as low as half the peak (an idle vCPU waking up), later ones did
        # not.
        super().__init__(build_dir, threads,
                         ["--trials", "3", "--fma-iterations", "4000000", "--compute-only"])

    def peaks(self) -> dict:
        """The best and the range of the peaks measured around the calls, in the run header's
        keys."""
        measured = {}
        for key in ("fma_peak_fp32_gflop_per_s", "bf16_dot_peak_gflop_per_s"):
            if self.samples and self.samples[0][key] is not None:
                measured[key] = self.best(key)
                measured[key.replace("_gflop", "_range_gflop")] = self.range(key)
        return measured


def import_torch(threads: int):
    """torch, or None when it is not importable: it is optional, for comparison only."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    return torch


def make_inputs(workload: Workload, rng: np.random.Generator):
    import ml_dtypes

    dtype = np.float32 if workload.dtype == "float32" else ml_dtypes.bfloat16
    w = workload
    q = rng.standard_normal((w.batch, w.q_heads, w.q_len, w.head_dim), dtype=np.float32)
    k = rng.standard_normal((w.batch, w.kv_heads, w.kv_len, w.head_dim), dtype=np.float32)
    v = rng.standard_normal((w.batch, w.kv_heads, w.kv_len, w.head_dim), dtype=np.float32)
    return tuple(a.astype(dtype) for a in (q, k, v))


def to_torch(torch, array: np.ndarray):
    if array.dtype == np.float32:
        return torch.from_numpy(array)
    # bfloat16: reinterpret the bits, no conversion.
    return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)


def cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_workload(workload, tilelab, torch, peak, args, rng) -> tuple[dict, Callable]:
    """The workload's result, and our call (for print_ratios)."""
    q, k, v = make_inputs(workload, rng)
    options = dict(causal=workload.causal)
    if workload.fp32_probabilities:
        options["fp32_probabilities"] = True
    bias = None
    if workload.bias:
        shape = (workload.batch, workload.q_heads, workload.q_len, workload.kv_len)
        bias = options["bias"] = rng.standard_normal(shape, dtype=np.float32)
    implementation = tilelab.flash_attention_implementation(q, k, v, **options)
    kernel = tilelab.flash_attention_kernel(q, k, v, **options)
    ours = tilelab.flash_attention(q, k, v, **options)

    def ours_call():
        return tilelab.flash_attention(q, k, v, **options)

    torch_call = None
    if torch is not None:
        tq, tk, tv = (to_torch(torch, a) for a in (q, k, v))
        mask = None if bias is None else torch.from_numpy(bias)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        gqa = workload.q_heads != workload.kv_heads

        def torch_call():
            with torch.inference_mode():
                return sdpa(tq, tk, tv, attn_mask=mask, is_causal=workload.causal,
                            enable_gqa=gqa)

    calls = [ours_call] if torch_call is None else [ours_call, torch_call]
    alongside = (BandwidthAlongside(args.build_dir, args.threads) if workload.decode
                 else ComputePeakAlongside(args.build_dir, args.threads))
    medians = alternating_medians_between_probes(calls, alongside, args.warmup, args.repeats)
    ours_s = medians[0]
    result = {
        "workload": workload.name,
        "shape": dataclasses.asdict(workload),
        "implementation": implementation,
        "kernel": kernel,
        "ours_median_s": ours_s,
        "flop": workload.flops,
        "ours_gflop_per_s": workload.flops / ours_s * 1e-9,
    }
    if workload.decode:
        kv_bytes = workload.kv_bytes(q.dtype.itemsize)
        result["kv_bytes"] = kv_bytes
        result["ours_kv_gb_per_s"] = kv_bytes / ours_s * 1e-9
        triad = alongside.triad()
        result["triad_alongside_gb_per_s"] = triad
        result["triad_alongside_range_gb_per_s"] = alongside.triad_range()
        result["ours_fraction_of_triad"] = result["ours_kv_gb_per_s"] / triad
    else:
        result.update(fractions_of_compute_peak(result["ours_gflop_per_s"], workload, peak,
                                                alongside))
    if torch_call is not None:
        theirs = torch_call().float().numpy()
        result["torch_median_s"] = medians[1]
        result["torch_over_ours"] = result["torch_median_s"] / ours_s
        result["max_abs_difference_from_torch"] = float(
            np.max(np.abs(ours.astype(np.float32) - theirs)))
        if workload.decode:
            result["torch_kv_gb_per_s"] = result["kv_bytes"] / result["torch_median_s"] * 1e-9
        else:
            result["torch_gflop_per_s"] = workload.flops / result["torch_median_s"] * 1e-9
    return result, ours_call


def fractions_of_compute_peak(gflop_per_s: float, workload, peak: dict,
                              alongside: ComputePeakAlongside) -> dict:
    """A compute-bound rate against the peaks measured around its calls (the better sample):
    against the bf16 dot-product peak too when the kernel runs on them."""
    peaks = alongside.peaks()
    result = {"peaks_alongside": peaks,
              "ours_fraction_of_fma_peak": gflop_per_s / peaks["fma_peak_fp32_gflop_per_s"]}
    if uses_bf16_dot_products(workload, peak):
        result["ours_fraction_of_bf16_dot_peak"] = (gflop_per_s
                                                    / peaks["bf16_dot_peak_gflop_per_s"])
    return result


def format_fraction_of_compute_peak(result: dict) -> str:
    """'78.1% of 225 FMA' or '60.2% of 460 bf16 dot': the fraction and the peak measured around
    the calls (GFLOP/s)."""
    peaks = result["peaks_alongside"]
    if "ours_fraction_of_bf16_dot_peak" in result:
        return (f"{100 * result['ours_fraction_of_bf16_dot_peak']:.1f}% of "
                f"{peaks['bf16_dot_peak_gflop_per_s']:.0f} bf16 dot")
    return (f"{100 * result['ours_fraction_of_fma_peak']:.1f}% of "
            f"{peaks['fma_peak_fp32_gflop_per_s']:.0f} FMA")


def bf16_prefill_on_dot_products(dtype: str, peak: dict) -> bool:
    """Whether prefill kernels of `dtype` (with P rounded to bf16) run on bf16 dot products here:
    bf16 on a CPU that prefers them. Their rates are then judged against that peak."""
    return (dtype == "bfloat16" and peak.get("bf16_dot_peak_gflop_per_s") is not None
            and peak.get("bf16_kernels_on_dot_products", False))


def uses_bf16_dot_products(workload: Workload, peak: dict) -> bool:
    """Whether the kernel runs on bf16 dot products here (bf16 prefill, rounded P, a CPU that
    prefers them): its rate is then judged against their peak."""
    return (not workload.decode and not workload.fp32_probabilities
            and bf16_prefill_on_dot_products(workload.dtype, peak))


def format_row(result: dict) -> list[str]:
    workload = result["shape"]
    if workload["decode"]:
        ours_rate = f"{result['ours_kv_gb_per_s']:.1f} GB/s"
        fraction = (f"{100 * result['ours_fraction_of_triad']:.0f}% of "
                    f"{result['triad_alongside_gb_per_s']:.1f}")
        torch_rate = f"{result['torch_kv_gb_per_s']:.1f} GB/s" if "torch_kv_gb_per_s" in result \
            else "-"
    else:
        ours_rate = f"{result['ours_gflop_per_s']:.1f} GFLOP/s"
        fraction = format_fraction_of_compute_peak(result)
        torch_rate = f"{result['torch_gflop_per_s']:.1f} GFLOP/s" \
            if "torch_gflop_per_s" in result else "-"
    torch_ms = f"{1e3 * result['torch_median_s']:.2f}" if "torch_median_s" in result else "-"
    ratio = f"{result['torch_over_ours']:.2f}x" if "torch_over_ours" in result else "-"
    return [
        result["workload"],
        workload["dtype"],
        "causal" if workload["causal"] else "full",
        result["kernel"] or result["implementation"],
        f"{1e3 * result['ours_median_s']:.2f}",
        torch_ms,
        ratio,
        ours_rate,
        fraction,
        torch_rate,
    ]


def print_table(header: list[str], rows: list[list[str]], left_aligned: int) -> None:
    """Columns padded to their widest cell: the first `left_aligned` (text) left, numbers right."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        cells = [cell.ljust(w) if i < left_aligned else cell.rjust(w)
                 for i, (cell, w) in enumerate(zip(row, widths, strict=True))]
        print("  ".join(cells).rstrip(), flush=True)


def print_run_header(tilelab, torch, peak: dict, args: argparse.Namespace) -> None:
    """The machine, its peaks measured in this run, and the versions compared."""
    bf16_peak = peak.get("bf16_dot_peak_gflop_per_s")
    bf16_text = f"bf16 dot peak {bf16_peak:.0f} GFLOP/s" if bf16_peak else "no bf16 dot products"
    if bf16_peak:
        bf16_text += (" (bf16 kernels on them)" if peak["bf16_kernels_on_dot_products"]
                      else " (bf16 kernels on fp32 FMAs: tilelab.prefers_bf16_dot_products())")
    print(f"machine: {cpu_model()}, {args.threads} threads; fp32 FMA peak "
          f"{peak['fma_peak_fp32_gflop_per_s']:.0f} GFLOP/s ({peak['fma_isa']}), {bf16_text}, "
          f"triad {peak['triad_bandwidth_gb_per_s']:.1f} GB/s (tilelab_machine_peak, "
          f"{peak['statistic']})")
    torch_text = (f"torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()})"
                  if torch is not None else "torch not importable: no comparison")
    print(f"tilelab {tilelab.__version__}; {torch_text}; medians of {args.repeats} calls after "
          f"{args.warmup} warmup; torch/ours > 1 means tilelab is faster")


def start_benchmark(description: str, *, repeats: int, warmup: int, quick_repeats: int):
    """Parses the options, imports tilelab (on --threads threads) and torch (unless --no-torch),
    measures the machine's peaks and prints the run header: (args, tilelab, torch, peak)."""
    args = parse_benchmark_args(description, repeats=repeats, warmup=warmup,
                                quick_repeats=quick_repeats)
    tilelab = import_tilelab(args.build_dir)
    tilelab.set_num_threads(args.threads)
    peak = run_machine_peak(args.build_dir, args.threads)
    peak["bf16_kernels_on_dot_products"] = tilelab.prefers_bf16_dot_products()
    torch = None if args.no_torch else import_torch(args.threads)
    print_run_header(tilelab, torch, peak, args)
    return args, tilelab, torch, peak


def write_json_report(args: argparse.Namespace, schema: str, tilelab, torch, peak: dict,
                      results: list[dict]) -> None:
    """The run's results with its machine, peaks and versions, to --json when given."""
    if not args.json:
        return
    report = {
        "schema": schema,
        "schema_version": 1,
        "tilelab_version": tilelab.__version__,
        "torch_version": torch.__version__ if torch is not None else None,
        "cpu": cpu_model(),
        "threads": args.threads,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "statistic": "median",
        "machine_peak": peak,
        "results": results,
    }
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.json}")


def main() -> None:
    args, tilelab, torch, peak = start_benchmark(
        __doc__.split("\n\n")[0], repeats=10, warmup=2, quick_repeats=3)
    print("rates: GFLOP/s = 4·B·Hq·M·N·D (half for square causal) / time, against the fp32 FMA "
          "(bf16 kernels on dot products: the bf16 dot) peak measured around its calls; decode: "
          "GB/s of K and V read, against the triad measured around its calls (before and after: "
          "the better)\n")

    rng = np.random.default_rng(0)
    results, rows, ours_calls = [], [], []
    for workload in WORKLOADS:
        if args.filter not in workload.name:
            continue
        result, ours_call = run_workload(workload, tilelab, torch, peak, args, rng)
        results.append(result)
        ours_calls.append(ours_call)
        rows.append(format_row(result))
    header = ["workload", "dtype", "mask", "tilelab kernel", "ours ms", "torch ms",
              "torch/ours", "ours rate", "of peak", "torch rate"]
    print_table(header, rows, left_aligned=4)
    print_ratios(results, ours_calls, args)

    write_json_report(args, "tilelab.bench_flash", tilelab, torch, peak, results)


def print_ratios(results: list[dict], ours_calls: list[Callable],
                 args: argparse.Namespace) -> None:
    """Ratios between our own workloads of this run: bf16 against fp32 at the same shape, causal
    against full, bf16 dot products against fp32 probabilities. Each pair is timed again side by
    side, its two calls alternating: taken from the table, whose workloads ran minutes apart, a
    ratio would carry the machine's drift between them."""
    index = {(r["workload"], r["shape"]["dtype"], r["shape"]["causal"]): i
             for i, r in enumerate(results)}
    pairs = []  # (what the ratio says, with {ratio}; the faster call's index; the baseline's)
    for (name, dtype, causal), i in index.items():
        mask = "causal" if causal else "full"
        fp32 = index.get((name, "float32", causal))
        if dtype == "bfloat16" and fp32 is not None:
            pairs.append((f"{name} {mask}: bf16 {{ratio:.2f}}x faster than fp32", i, fp32))
        full = index.get((name, dtype, False))
        if causal and full is not None:
            pairs.append((f"{name} {dtype}: causal {{ratio:.2f}}x faster than full", i, full))
        exact = index.get((f"{name} fp32 P", dtype, causal))
        if exact is not None:
            pairs.append((f"{name} {dtype} {mask}: bf16 P {{ratio:.2f}}x faster than fp32 P", i,
                          exact))
    lines = []
    for text, faster, baseline in pairs:
        baseline_s, faster_s = alternating_medians(
            [ours_calls[baseline], ours_calls[faster]], args.warmup, args.repeats)
        lines.append(text.format(ratio=baseline_s / faster_s))
    print_ours_against_ours(lines)


def print_ours_against_ours(lines: list[str]) -> None:
    """Ratios between our own workloads measured in this run, one per line."""
    if lines:
        print("\nours against ours, each pair timed side by side (alternating):")
        for line in lines:
            print(f"  {line}")


if __name__ == "__main__":
    main()
