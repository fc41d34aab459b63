"""flash_attention releases the GIL: Python threads can run it concurrently (no timing asserted)."""

import threading
from concurrent.futures import ThreadPoolExecutor

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
