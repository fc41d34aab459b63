"""The compute functions release the GIL: Python threads can run them concurrently, and each call
gives what it gives alone (no timing asserted)."""

import threading
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import pytest
from attention_reference import assert_attention_close, random_qkv, reference_attention

import tilelab


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_concurrent_calls_from_python_threads(rng, dtype_name):
    problems = [random_qkv(rng, 1, 4, 2, 256, 256, 64, dtype_name) for _ in range(2)]
    start_together = threading.Barrier(len(problems))

    def run(problem):
        start_together.wait()
        return [tilelab.flash_attention(*problem, causal=True) for _ in range(3)]

    with ThreadPoolExecutor(max_workers=len(problems)) as pool:
        results = list(pool.map(run, problems))

    for (q, k, v), outs in zip(problems, results, strict=True):
        reference_out, _ = reference_attention(q, k, v, causal=True)
        for out in outs:
            assert_attention_close(out, reference_out, dtype_name, v, k.shape[2])


def backward_call(rng):
    q, k, v = random_qkv(rng, 1, 4, 2, 200, 300, 64, "float32")
    dout = rng.standard_normal(q.shape, dtype=np.float32)
    out, lse = tilelab.flash_attention(q, k, v, causal=True, return_lse=True)
    return lambda: tilelab.flash_attention_backward(dout, q, k, v, out, lse, causal=True)


def paged_call(rng):
    # Two prefills with context and two decodes; blocks in a shuffled order.
    block_size, seq_lens, q_lens = 16, [300, 150, 700, 90], [120, 150, 1, 1]
    blocks = [-(-n // block_size) for n in seq_lens]
    order = rng.permutation(sum(blocks)).astype(np.int32)
    table = np.zeros((len(seq_lens), max(blocks)), np.int32)
    for s, first in enumerate(np.cumsum([0, *blocks[:-1]])):
        table[s, : blocks[s]] = order[first : first + blocks[s]]
    shape = (sum(blocks), 2, block_size, 64)
    key_cache, value_cache = (
        rng.standard_normal(shape, dtype=np.float32).astype(ml_dtypes.bfloat16) for _ in range(2)
    )
    query = rng.standard_normal((sum(q_lens), 8, 64), dtype=np.float32).astype(ml_dtypes.bfloat16)
    lens = np.array(seq_lens, np.int32)
    starts = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    return lambda: tilelab.paged_attention(query, key_cache, value_cache, table, lens, starts)


def blocksparse_call(rng):
    # Prefill rows read head-major copies of K and V, made per call.
    q_lens = k_lens = [500, 300]
    cu = np.array([0, *np.cumsum(q_lens)], np.int32)
    q = rng.standard_normal((sum(q_lens), 8, 64), dtype=np.float32)
    k, v = (rng.standard_normal((sum(k_lens), 2, 64), dtype=np.float32) for _ in range(2))
    layout = tilelab.BlockSparseLayout.local_strided(8, 512, 32, 4, 4)
    return lambda: tilelab.blocksparse_attention(
        q, k, v, layout, cu_seqlens_q=cu, cu_seqlens_k=cu
    )


# Per-thread scratch, the Halide error message and the OpenMP teams must not leak between
# concurrent calls: each concurrent result equals, bit for bit, the same call made alone (whose
# accuracy the function's own tests check).
@pytest.mark.parametrize(
    "make_call",
    [backward_call, paged_call, blocksparse_call],
    ids=["flash_attention_backward", "paged_attention", "blocksparse_attention"],
)
def test_concurrent_calls_equal_calls_made_alone(rng, make_call):
    calls = [make_call(rng) for _ in range(2)]
    alone = [call() for call in calls]
    start_together = threading.Barrier(len(calls))

    def run(call):
        start_together.wait()
        return [call() for _ in range(3)]

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        results = list(pool.map(run, calls))

    for expected, outs in zip(alone, results, strict=True):
        for out in outs:
            for got, want in zip(
                out if isinstance(out, tuple) else (out,),
                expected if isinstance(expected, tuple) else (expected,),
                strict=True,
            ):
                np.testing.assert_array_equal(got, want)
