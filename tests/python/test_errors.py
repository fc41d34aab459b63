"""Bad inputs raise TypeError (wrong kind of thing) or ValueError (wrong value), naming the
argument."""

import re

import ml_dtypes
import numpy as np
import pytest
from attention_reference import random_qkv

import tilelab


@pytest.fixture
def qkv(rng):
    return random_qkv(rng, 2, 4, 2, 8, 12, 16, "float32")


def raises_naming(error_type, name):
    return pytest.raises(error_type, match=rf"(?<![\w]){re.escape(name)}(?![\w])")


def test_wrong_rank_q(qkv):
    q, k, v = qkv
    with raises_naming(ValueError, "q"):
        tilelab.flash_attention(q[0], k, v)


@pytest.mark.parametrize("name", ["k", "v"])
def test_wrong_rank_kv(qkv, name):
    args = dict(zip("qkv", qkv, strict=True))
    args[name] = args[name][0]
    with raises_naming(ValueError, name):
        tilelab.flash_attention(args["q"], args["k"], args["v"])


def test_head_dim_mismatch(rng, qkv):
    q, _, v = qkv
    k = rng.standard_normal((2, 2, 12, 8), dtype=np.float32)
    with raises_naming(ValueError, "k"):
        tilelab.flash_attention(q, k, v)


def test_kv_length_mismatch(qkv):
    q, k, v = qkv
    with raises_naming(ValueError, "v"):
        tilelab.flash_attention(q, k, v[:, :, :-1])


def test_batch_mismatch(qkv):
    q, k, v = qkv
    with raises_naming(ValueError, "k"):
        tilelab.flash_attention(q, k[:1], v[:1])


def test_query_heads_not_a_multiple_of_kv_heads(rng):
    q, k, v = random_qkv(rng, 1, 6, 4, 8, 8, 16, "float32")
    with raises_naming(ValueError, "k"):
        tilelab.flash_attention(q, k, v)


@pytest.mark.parametrize("head_dim", [0, 257])
def test_head_dim_out_of_range(rng, head_dim):
    q, k, v = random_qkv(rng, 1, 1, 1, 4, 4, head_dim, "float32")
    with raises_naming(ValueError, "q"):
        tilelab.flash_attention(q, k, v)


def test_empty_query(rng):
    q, k, v = random_qkv(rng, 1, 1, 1, 0, 4, 8, "float32")
    with raises_naming(ValueError, "q"):
        tilelab.flash_attention(q, k, v)


@pytest.mark.parametrize("name", ["k", "v"])
def test_mixed_dtypes(qkv, name):
    args = dict(zip("qkv", qkv, strict=True))
    args[name] = args[name].astype(np.float16)
    with raises_naming(TypeError, name):
        tilelab.flash_attention(args["q"], args["k"], args["v"])


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int64, np.uint16, np.complex64])
@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_unsupported_dtype(qkv, name, dtype):
    args = dict(zip("qkv", qkv, strict=True))
    args[name] = args[name].astype(dtype)
    with raises_naming(TypeError, name) as info:
        tilelab.flash_attention(args["q"], args["k"], args["v"])
    assert "float32" in str(info.value) and "bfloat16" in str(info.value)


@pytest.mark.parametrize("name", ["q", "k", "v"])
@pytest.mark.parametrize(
    "convert", [lambda a: a.tolist(), lambda a: None, lambda a: 1.0], ids=["list", "none", "float"]
)
def test_non_arrays(qkv, name, convert):
    args = dict(zip("qkv", qkv, strict=True))
    args[name] = convert(args[name])
    with raises_naming(TypeError, name):
        tilelab.flash_attention(args["q"], args["k"], args["v"])


@pytest.mark.parametrize("alignment", ["bottom-right", "topleft", "", "TOP_LEFT"])
def test_bad_causal_alignment(qkv, alignment):
    with raises_naming(ValueError, "causal_alignment"):
        tilelab.flash_attention(*qkv, causal=True, causal_alignment=alignment)


def test_bad_implementation(qkv):
    with raises_naming(ValueError, "implementation"):
        tilelab.flash_attention(*qkv, implementation="fastest")


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32])
def test_bias_wrong_dtype(qkv, dtype):
    bias = np.zeros((2, 4, 8, 12), dtype=dtype)
    with raises_naming(TypeError, "bias"):
        tilelab.flash_attention(*qkv, bias=bias)


def test_bias_not_an_array(qkv):
    with raises_naming(TypeError, "bias"):
        tilelab.flash_attention(*qkv, bias=np.zeros((2, 4, 8, 12)).tolist())


@pytest.mark.parametrize(
    "shape",
    [(2, 4, 8, 13), (3, 4, 8, 12), (2, 2, 8, 12), (2, 4, 7, 12), (8, 12), (4, 8, 12),
     (1, 2, 4, 8, 12), (2, 4, 8, 1)],
)
def test_bias_wrong_shape(qkv, shape):
    bias = np.zeros(shape, dtype=np.float32)
    with raises_naming(ValueError, "bias"):
        tilelab.flash_attention(*qkv, bias=bias)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf"), 1e300])
def test_non_finite_scale(qkv, scale):
    with raises_naming(ValueError, "scale"):
        tilelab.flash_attention(*qkv, scale=scale)


@pytest.mark.parametrize("scale", ["0.5", [0.5], True])
def test_scale_wrong_type(qkv, scale):
    with raises_naming(TypeError, "scale"):
        tilelab.flash_attention(*qkv, scale=scale)


def test_generated_outside_coverage_is_a_value_error(rng):
    # The reference covers everything; the generated kernels need innermost stride 1 (and are
    # absent in a build without Halide), so this call is outside what they cover either way.
    q, k, v = (a[..., ::2] for a in random_qkv(rng, 1, 2, 2, 8, 8, 32, "float32"))
    with raises_naming(ValueError, "implementation"):
        tilelab.flash_attention(q, k, v, implementation="generated")


@pytest.mark.parametrize("query", ["flash_attention_implementation", "flash_attention_kernel"])
def test_implementation_queries_validate(qkv, query):
    q, k, v = qkv
    with raises_naming(ValueError, "q"):
        getattr(tilelab, query)(q[0], k, v)
    with raises_naming(ValueError, "causal_alignment"):
        getattr(tilelab, query)(q, k, v, causal=True, causal_alignment="bottom")


def test_positional_options_are_rejected(qkv):
    with pytest.raises(TypeError):
        tilelab.flash_attention(*qkv, True)


@pytest.mark.parametrize(
    "dtype",
    [np.dtype("V2"), np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.int4)],
    ids=["void2", "float8_e4m3fn", "int4"],
)
def test_other_custom_dtypes_are_not_taken_for_bfloat16(qkv, dtype):
    q = np.zeros(qkv[0].shape, dtype=dtype)
    with raises_naming(TypeError, "q"):
        tilelab.flash_attention(q, *qkv[1:])
