"""Property-based tests of tilelab.flash_attention against the fp64 numpy reference: random
(ragged) shapes, dtypes, GQA ratios, causal alignments, bias broadcast shapes and memory layouts
(transposed, strided, reversed and offset views), through every implementation. Bounded: a fixed
number of small examples, derandomized so failures reproduce."""

import numpy as np
from attention_reference import (
    DTYPES,
    assert_attention_close,
    assert_lse_close,
    reference_attention,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilelab

PROPERTY_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)

BIAS_PATTERNS = ["none", "full", "heads_keys", "rows_keys", "keys", "batch_keys"]


def bias_shape(pattern, batch, q_heads, q_len, kv_len):
    return {
        "full": (batch, q_heads, q_len, kv_len),
        "heads_keys": (1, q_heads, 1, kv_len),
        "rows_keys": (batch, 1, q_len, kv_len),
        "keys": (1, 1, 1, kv_len),
        "batch_keys": (batch, 1, 1, kv_len),
    }[pattern]


def laid_out(array, layout):
    """`array`'s values in another memory layout: the same logical [B, H, L, D] tensor."""
    if layout == "contiguous":
        return array
    if layout == "transposed":  # stored [B, L, H, D], the usual projection output
        return np.ascontiguousarray(array.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    if layout == "strided":  # every other element of a larger buffer, innermost included
        big = np.zeros(tuple(2 * n for n in array.shape), dtype=array.dtype)
        big[::2, ::2, ::2, ::2] = array
        return big[::2, ::2, ::2, ::2]
    if layout == "reversed":  # negative strides: copied before the call
        return np.ascontiguousarray(array[:, :, ::-1])[:, :, ::-1]
    if layout == "padded_rows":  # rows padded in memory, head dim contiguous
        big = np.zeros((*array.shape[:3], array.shape[3] + 5), dtype=array.dtype)
        big[..., : array.shape[3]] = array
        return big[..., : array.shape[3]]
    raise AssertionError(layout)


LAYOUTS = ["contiguous", "transposed", "strided", "reversed", "padded_rows"]


@st.composite
def attention_cases(draw):
    batch = draw(st.integers(1, 2))
    kv_heads = draw(st.integers(1, 3))
    group = draw(st.sampled_from([1, 2, 4]))
    q_len = draw(st.integers(1, 40))
    kv_len = draw(st.integers(1, 80))
    head_dim = draw(st.one_of(st.integers(1, 72), st.sampled_from([128, 256])))
    return dict(
        shape=(batch, kv_heads * group, kv_heads, q_len, kv_len, head_dim),
        dtype=draw(st.sampled_from(sorted(DTYPES))),
        mask=draw(st.sampled_from(["none", "top_left", "bottom_right"])),
        bias=draw(st.sampled_from(BIAS_PATTERNS)),
        layouts=[draw(st.sampled_from(LAYOUTS)) for _ in "qkv"],
        scale=draw(st.one_of(st.none(), st.floats(0.125, 2.0, width=32))),
        implementation=draw(st.sampled_from(["automatic", "generated", "reference"])),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


@PROPERTY_SETTINGS
@given(case=attention_cases())
def test_flash_attention_matches_the_fp64_reference(case):
    batch, q_heads, kv_heads, q_len, kv_len, head_dim = case["shape"]
    rng = np.random.default_rng(case["seed"])
    dtype = DTYPES[case["dtype"]]

    def normal(*shape):
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype)

    q = normal(batch, q_heads, q_len, head_dim)
    k = normal(batch, kv_heads, kv_len, head_dim)
    v = normal(batch, kv_heads, kv_len, head_dim)
    options = {}
    if case["mask"] != "none":
        options = dict(causal=True, causal_alignment=case["mask"])
    if case["bias"] != "none":
        shape = bias_shape(case["bias"], batch, q_heads, q_len, kv_len)
        options["bias"] = rng.standard_normal(shape, dtype=np.float32)
    if case["scale"] is not None:
        # A multiple of the default 1 / sqrt(D): the reference's tolerances assume scores of that
        # order.
        options["scale"] = case["scale"] / np.sqrt(head_dim)
    arrays = zip((q, k, v), case["layouts"], strict=True)
    q_in, k_in, v_in = (laid_out(array, layout) for array, layout in arrays)

    implementation = case["implementation"]
    if implementation == "generated":
        # Outside the generated kernels' coverage (e.g. a strided head dim) that is an error.
        covered = tilelab.flash_attention_implementation(q_in, k_in, v_in, **options)
        implementation = "generated" if covered == "generated" else "reference"
    out, lse = tilelab.flash_attention(
        q_in, k_in, v_in, return_lse=True, implementation=implementation, **options
    )
    expected_out, expected_lse = reference_attention(q, k, v, **options)
    assert out.dtype == dtype and out.flags.c_contiguous
    assert_attention_close(out, expected_out, case["dtype"], v, kv_len)
    assert_lse_close(lse, expected_lse, head_dim, kv_len)
