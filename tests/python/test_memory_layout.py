"""Strided, non-contiguous and unusual numpy layouts: correct results, zero-copy where possible,
fresh outputs, inputs left untouched."""

import numpy as np
import pytest
from attention_reference import (
    DTYPES,
    assert_attention_close,
    random_qkv,
    reference_attention,
)

import tilelab
from tilelab import _core


def check(q, k, v, dtype_name="float32", **options):
    out = tilelab.flash_attention(q, k, v, **options)
    reference_out, _ = reference_attention(q, k, v, **options)
    assert_attention_close(out, reference_out, dtype_name, v, k.shape[2])


def odd_byte_strides(array):
    """The same values in a buffer whose innermost byte stride is itemsize + 1: not a whole number
    of elements, so tilelab must copy."""
    itemsize = array.dtype.itemsize
    stride = itemsize + 1
    buffer = np.zeros(array.size * stride, dtype=np.uint8)
    strides = [stride * int(np.prod(array.shape[i + 1 :])) for i in range(array.ndim)]
    view = np.ndarray(array.shape, dtype=array.dtype, buffer=buffer, strides=strides)
    view[...] = array
    return view


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_transposed_views_are_read_in_place(rng, dtype_name):
    # Stored [B, M, H, D] as attention layers produce them, viewed as [B, H, M, D].
    q, k, v = (
        a.transpose(0, 2, 1, 3).copy().transpose(0, 2, 1, 3)
        for a in random_qkv(rng, 2, 4, 2, 24, 40, 32, dtype_name)
    )
    assert not q.flags.c_contiguous
    assert all(_core._views_in_place(a) for a in (q, k, v))
    check(q, k, v, dtype_name, causal=True)


def test_innermost_stride_two(rng):
    q, k, v = (a[..., ::2] for a in random_qkv(rng, 1, 2, 2, 10, 30, 64, "float32"))
    assert q.strides[-1] == 8
    assert _core._views_in_place(q)
    check(q, k, v)


def test_fortran_order(rng):
    q, k, v = (np.asfortranarray(a) for a in random_qkv(rng, 2, 2, 1, 10, 12, 16, "float32"))
    check(q, k, v, causal=True, causal_alignment="bottom_right")


def test_negative_strides_are_copied(rng):
    q, k, v = (a[:, :, ::-1] for a in random_qkv(rng, 1, 2, 2, 9, 17, 16, "float32"))
    assert not _core._views_in_place(q)
    check(q, k, v, causal=True)


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_byte_strides_not_whole_elements_are_copied(rng, dtype_name):
    q, k, v = (odd_byte_strides(a) for a in random_qkv(rng, 1, 2, 1, 6, 11, 8, dtype_name))
    assert not _core._views_in_place(q)
    check(q, k, v, dtype_name)


def test_broadcast_kv_with_zero_strides(rng):
    q, k, v = random_qkv(rng, 2, 4, 1, 8, 16, 32, "float32")
    k_shared = np.broadcast_to(k[:1], k.shape)  # batch stride 0
    v_shared = np.broadcast_to(v[:1], v.shape)
    assert k_shared.strides[0] == 0
    assert _core._views_in_place(k_shared)
    check(q, k_shared, v_shared)


def test_byte_swapped_and_misaligned_inputs_are_copied(rng):
    q, k, v = random_qkv(rng, 1, 2, 2, 5, 9, 8, "float32")
    q_swapped = q.astype(">f4")
    raw = np.zeros(k.nbytes + 1, dtype=np.uint8)
    k_misaligned = np.ndarray(k.shape, dtype=np.float32, buffer=raw, offset=1)
    k_misaligned[...] = k
    assert not _core._views_in_place(q_swapped)
    assert not _core._views_in_place(k_misaligned)
    check(q_swapped, k_misaligned, v)


def test_read_only_inputs(rng):
    q, k, v = random_qkv(rng, 1, 2, 2, 5, 9, 8, "float32")
    for a in (q, k, v):
        a.flags.writeable = False
    check(q, k, v)


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_output_is_a_fresh_contiguous_array(rng, dtype_name):
    q, k, v = random_qkv(rng, 1, 2, 2, 16, 16, 32, dtype_name)
    assert all(_core._views_in_place(a) for a in (q, k, v))
    out, lse = tilelab.flash_attention(q, k, v, return_lse=True)
    again = tilelab.flash_attention(q, k, v)
    for array in (out, lse):
        assert array.flags.c_contiguous and array.flags.owndata and array.flags.writeable
        assert not any(np.shares_memory(array, a) for a in (q, k, v))
    assert not np.shares_memory(out, again)
    assert not np.shares_memory(out, lse)
    assert out.dtype == DTYPES[dtype_name]
    assert lse.shape == (1, 2, 16) and lse.dtype == np.float32


def test_inputs_are_not_modified(rng):
    q, k, v = random_qkv(rng, 1, 2, 1, 12, 12, 16, "float32")
    bias = rng.standard_normal((1, 1, 12, 12), dtype=np.float32)
    copies = [a.copy() for a in (q, k, v, bias)]
    tilelab.flash_attention(q, k, v, bias=bias, causal=True, return_lse=True)
    for before, after in zip(copies, (q, k, v, bias), strict=True):
        np.testing.assert_array_equal(before, after)
