"""Bad inputs that used to crash, pass silently or raise unclear errors: each is a TypeError or
ValueError naming the argument, the value given and what is allowed. Python bools and ints are
exactly that: no truthy strings or None for a bool, no bool for an int or a float."""

import re

import numpy as np
import pytest
from attention_reference import random_qkv
from nki_reference import continuous_batch

import tilelab
import tilelab.nki as nki


@pytest.fixture
def qkv(rng):
    return random_qkv(rng, 1, 2, 2, 8, 12, 16, "float32")


def raises_naming(error_type, name, *also):
    pattern = rf"(?<![\w]){re.escape(name)}(?![\w])" + "".join(
        rf"(?=.*{re.escape(text)})" for text in also
    )
    return pytest.raises(error_type, match=pattern)


# --- set_num_threads ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [True, False, 2.0, "2", None])
def test_set_num_threads_takes_an_int_only(restore_num_threads, n):
    before = tilelab.num_threads()
    with raises_naming(TypeError, "n"):
        tilelab.set_num_threads(n)
    assert tilelab.num_threads() == before


@pytest.mark.parametrize("excess", [1, 100000, 2**40])
def test_set_num_threads_is_capped(restore_num_threads, qkv, excess):
    cap = tilelab._core.max_num_threads()
    assert cap >= 8
    n = cap + excess if excess < 2**31 else excess
    with raises_naming(ValueError, "n", str(cap), str(n)):
        tilelab.set_num_threads(n)
    tilelab.set_num_threads(np.int64(cap))
    assert tilelab.num_threads() == cap
    tilelab.flash_attention(*qkv)  # runs on that many threads


# --- flash_attention keyword arguments ---------------------------------------------------------


@pytest.mark.parametrize("causal", [None, "yes", "False", 1, 0, 1.0])
def test_causal_must_be_a_bool(qkv, causal):
    with raises_naming(TypeError, "causal", repr(causal)):
        tilelab.flash_attention(*qkv, causal=causal)


def test_numpy_bools_are_bools(qkv):
    out = tilelab.flash_attention(*qkv, causal=np.bool_(True), return_lse=np.True_)
    np.testing.assert_array_equal(out[0], tilelab.flash_attention(*qkv, causal=True))


@pytest.mark.parametrize("return_lse", [None, "yes", 1])
def test_return_lse_must_be_a_bool(qkv, return_lse):
    with raises_naming(TypeError, "return_lse"):
        tilelab.flash_attention(*qkv, return_lse=return_lse)


@pytest.mark.parametrize("alignment", [None, 0, b"top_left"])
def test_causal_alignment_must_be_a_string(qkv, alignment):
    with raises_naming(TypeError, "causal_alignment", "'top_left' or 'bottom_right'"):
        tilelab.flash_attention(*qkv, causal=True, causal_alignment=alignment)


@pytest.mark.parametrize("implementation", [None, 1])
def test_implementation_must_be_a_string(qkv, implementation):
    with raises_naming(TypeError, "implementation", "'automatic'"):
        tilelab.flash_attention(*qkv, implementation=implementation)


@pytest.mark.parametrize("scale", [1 + 2j, np.complex64(1), np.True_])
def test_scale_must_be_real(qkv, scale):
    with raises_naming(TypeError, "scale", "real number"):
        tilelab.flash_attention(*qkv, scale=scale)


@pytest.mark.parametrize("scale", [10**400, -(10**400), 1e39])
def test_scale_beyond_float_names_scale(qkv, scale):
    with raises_naming(ValueError, "scale", "finite"):
        tilelab.flash_attention(*qkv, scale=scale)


@pytest.mark.parametrize("scale", [2, np.int64(2), np.float32(0.5), 0.25])
def test_real_scales_are_accepted(qkv, scale):
    out = tilelab.flash_attention(*qkv, scale=scale)
    np.testing.assert_array_equal(out, tilelab.flash_attention(*qkv, scale=float(scale)))


@pytest.mark.parametrize("name", ["q", "k", "v", "bias"])
def test_zero_dimensional_arrays_name_the_argument(qkv, name):
    args = dict(zip("qkv", qkv, strict=True), bias=None)
    args[name] = np.array(1.0, np.float32)
    with raises_naming(ValueError, name):
        tilelab.flash_attention(args["q"], args["k"], args["v"], bias=args["bias"])


@pytest.mark.parametrize("name", ["q", "k", "v", "bias"])
def test_masked_arrays_are_rejected(qkv, name):
    args = dict(zip("qkv", qkv, strict=True), bias=np.zeros((1, 1, 8, 12), np.float32))
    args[name] = np.ma.masked_array(args[name], mask=np.zeros(args[name].shape, bool))
    with raises_naming(TypeError, name, "MaskedArray"):
        tilelab.flash_attention(args["q"], args["k"], args["v"], bias=args["bias"])


# --- tilelab.nki -------------------------------------------------------------------------------


def valid_call(rng):
    args = continuous_batch(
        rng,
        [(5, 20)],
        n_heads=4,
        n_kv_heads=2,
        head_dim=16,
        block_size=16,
        large_tile=512,
        dtype=np.float32,
    )
    args["mask"] = nki.reorder_context_mask(args["mask"], 512, 16)
    args["LARGE_TILE_SZ"] = 512
    return args


@pytest.mark.parametrize("mixed_precision", ["False", None, 0, 1])
def test_mixed_precision_must_be_a_bool(rng, mixed_precision):
    with raises_naming(TypeError, "mixed_precision"):
        nki.flash_paged_attention(**valid_call(rng), mixed_precision=mixed_precision)


@pytest.mark.parametrize("large_tile", ["abc", 512.9, 512.0, True, None])
def test_large_tile_size_must_be_an_int(rng, large_tile):
    args = valid_call(rng)
    args["LARGE_TILE_SZ"] = large_tile
    with raises_naming(TypeError, "LARGE_TILE_SZ"):
        nki.flash_paged_attention(**args)


@pytest.mark.parametrize("softmax_scale", [1 + 2j, 10**400])
def test_softmax_scale_must_be_a_real_float(rng, softmax_scale):
    error = TypeError if isinstance(softmax_scale, complex) else ValueError
    with raises_naming(error, "softmax_scale"):
        nki.flash_paged_attention(**valid_call(rng), softmax_scale=softmax_scale)


@pytest.mark.parametrize("name", ["block_tables", "mask"])
def test_zero_dimensional_index_arrays_name_the_argument(rng, name):
    args = valid_call(rng)
    args[name] = np.array(0, np.int32)
    with raises_naming(ValueError, name):
        nki.flash_paged_attention(**args)


@pytest.mark.parametrize("name", ["block_tables", "mask"])
def test_nki_masked_arrays_are_rejected(rng, name):
    args = valid_call(rng)
    args[name] = np.ma.masked_array(args[name], mask=np.zeros(args[name].shape, bool))
    with raises_naming(TypeError, name, "MaskedArray"):
        nki.flash_paged_attention(**args)


@pytest.mark.parametrize("value", [2**40, -(2**40), 2**63 - 1, 3])
def test_any_nonzero_integer_mask_value_attends(rng, value):
    args = valid_call(rng)
    expected = nki.flash_paged_attention(**args)
    args["mask"] = args["mask"].astype(np.int64) * value
    np.testing.assert_array_equal(nki.flash_paged_attention(**args), expected)


def test_reorder_context_mask_keeps_values_beyond_int32(rng):
    mask = (rng.random((7, 512 + 7)) < 0.5).astype(np.int64) * 2**40
    out = nki.reorder_context_mask(mask, 512, 16)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out != 0, nki.reorder_context_mask(mask != 0, 512, 16))
    assert set(np.unique(out)) <= {0, 2**40}
