"""NKI-language kernels of examples/nki/ timed on the simulated trn1, beside the latencies AWS
published for them on trn1 (../shared/nki/calibration.md: the matmul tutorial's table, the
nki-samples SD-attention test thresholds, the Mamba tutorial's profiles), and the trace speed
of the flash paged attention kernel on the default batch.

    PYTHONPATH=build/python python bench/nki/published_vs_simulated.py
"""

import pathlib
import sys
import time

import ml_dtypes
import numpy as np

import tilelab.nki as nki
from tilelab import sim
from tilelab.nki import language as nl

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "nki"


def main() -> None:
    nki.install_neuronxcc_alias()
    sys.path.insert(0, str(EXAMPLES))
    import flash_paged_attention
    import mamba
    import matmul
    import sd_attention

    bf16 = ml_dtypes.bfloat16
    rows = []
    lhs_t, rhs = nki.tensor((8192, 4096), bf16), nki.tensor((8192, 8192), bf16)
    for name, kernel, published in [
        ("matmul tiled 4096x8192x8192 bf16", matmul.matmul_tiled, 51800),
        ("matmul hoist_load", matmul.matmul_hoist_load, 42960),
        ("matmul block_free", matmul.matmul_block_free, 22070),
        ("matmul fully_optimized", matmul.matmul_fully_optimized, 6970),
    ]:
        _, report = nki.profile_kernel(kernel, lhs_t, rhs, functional=False)
        rows.append((name, report.total_time_ns / 1e3, f"{published}"))
    # nki-samples test thresholds (the latest commit's, then the first's).
    for d, dtype, label, published in [
        (128, bf16, "bf16", "<= 536 (480)"),
        (128, "float32", "fp32", "<= 675 (600)"),
        (64, "float16", "fp16", "<= 600 (520)"),
    ]:
        spec = [nki.tensor(shape, dtype) for shape in [(1, d, 4096), (1, 4096, d), (1, 4096, d)]]
        _, report = nki.profile_kernel(
            sd_attention.fused_self_attention[1], *spec, functional=False
        )
        rows.append((f"SD attention 4096 d{d} {label}", report.total_time_ns / 1e3, published))
    # The Mamba tutorial's figures: v1 and v2 at batch 1, 4096 channels, 16 states and seq_len
    # 512; v3 at seq_len 8192 (where v2 spills SBUF on the device; the simulator does not model
    # spilling, so v2 is not timed there).
    for name, kernel, seq_len, published in [
        ("Mamba v1 seq 512", mamba.mamba_v1, 512, "2340"),
        ("Mamba v2 seq 512", mamba.mamba_v2, 512, "1610"),
        ("Mamba v3 seq 8192", mamba.mamba_v3, 8192, "27800"),
    ]:
        channels, states = 4096, 16
        spec = [
            nki.tensor(shape, "float32")
            for shape in [
                (1, channels, seq_len),
                (1, channels, seq_len),
                (channels, states),
                (1, states, seq_len),
                (1, states, seq_len),
            ]
        ]
        _, report = nki.profile_kernel(kernel, *spec, functional=False)
        rows.append((name, report.total_time_ns / 1e3, published))
    print(f"{'kernel (trn1)':40s} {'simulated us':>14s} {'published us':>16s}")
    for name, simulated, published in rows:
        print(f"{name:40s} {simulated:14.1f} {published:>16s}")

    reference = sim.simulate_paged_attention_batch()
    p = reference.parameters
    seq_q, blocks = int(p["query_len"]), int(p["num_active_blocks"])
    heads, kv_heads, d, block = (
        int(p[k]) for k in ("num_heads", "num_kv_heads", "head_dim", "block_size")
    )
    specs = [
        nki.tensor(s, t)
        for s, t in [
            ((1, heads, d, seq_q), bf16),
            ((1, kv_heads, d, seq_q), bf16),
            ((1, kv_heads, seq_q, d), bf16),
            ((2, blocks + 1, kv_heads, block, d), bf16),
            ((blocks,), nl.int32),
            ((seq_q, blocks * block + seq_q), nl.uint8),
        ]
    ]
    start = time.perf_counter()
    _, report = nki.profile_kernel(
        flash_paged_attention.flash_paged_attention, *specs, functional=False
    )
    seconds = time.perf_counter() - start
    print(
        f"\nflash paged attention, default batch: {report.instruction_count:.0f} instructions "
        f"traced and timed in {seconds:.2f} s ({report.instruction_count / seconds / 1e3:.0f} k "
        f"instructions/s); simulated {report.total_time_ns / 1e3:.1f} us vs the C++ kernel's "
        f"{reference.total_time_ns / 1e3:.1f} us"
    )
    # The same on numbers: traced, run functionally and timed.
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(spec.shape).astype(spec.dtype) for spec in specs[:4]]
    block_table = rng.permutation(blocks).astype(np.int32)
    mask = np.ones(specs[5].shape, np.uint8)
    start = time.perf_counter()
    nki.profile_kernel(flash_paged_attention.flash_paged_attention, *arrays, block_table, mask)
    print(f"the same on numbers (functional + timed): {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
