"""tilelab.torch.scaled_dot_product_attention against torch's math SDPA in float64: forward and
gradients (query, key, value, float mask) for every dtype, causal alignments, GQA, ragged shapes,
bool and float masks, fully masked rows; gradcheck; refused arguments."""

import pytest

torch = pytest.importorskip("torch")

import math  # noqa: E402

import numpy as np  # noqa: E402
import torch.nn.functional as F  # noqa: E402, N812
from attention_reference import UNIT_ROUNDOFF, output_tolerance  # noqa: E402
from test_flash_attention_backward import gradient_tolerance  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.nn.attention.bias import (  # noqa: E402
    CausalBias,
    causal_lower_right,
    causal_upper_left,
)

import tilelab  # noqa: E402
import tilelab.torch as tt  # noqa: E402
from tilelab import _core  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# (batch, q_heads, kv_heads, L, S, E): S and L not multiples of any tile, Sq != Sk both ways.
SHAPES = {
    "L<S": (2, 4, 4, 9, 13, 16),
    "L>S": (1, 2, 2, 13, 9, 8),
    "single_query": (1, 2, 2, 1, 17, 32),
}


def random_qkv(batch, q_heads, kv_heads, q_len, kv_len, head_dim, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, q_heads, q_len, head_dim, generator=generator).to(dtype)
    k = torch.randn(batch, kv_heads, kv_len, head_dim, generator=generator).to(dtype)
    v = torch.randn(batch, kv_heads, kv_len, head_dim, generator=generator).to(dtype)
    return q, k, v


def is_float_mask(attn_mask):
    # A CausalBias is a tensor subclass too, but no mask values.
    return (torch.is_tensor(attn_mask) and not isinstance(attn_mask, CausalBias)
            and attn_mask.is_floating_point())


def run(function, q, k, v, dout, attn_mask=None, **options):
    """out and the gradients of (out * dout).sum() w.r.t. q, k, v and a float attn_mask."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    mask = attn_mask
    if is_float_mask(attn_mask):
        mask = attn_mask.detach().requires_grad_()
        leaves.append(mask)
    out = function(*leaves[:3], attn_mask=mask, **options)
    grads = torch.autograd.grad((out * dout).sum(), leaves)
    return out.detach(), grads


def reference(q, k, v, dout, attn_mask=None, **options):
    """torch's math SDPA in float64 on the same (rounded) values."""
    if is_float_mask(attn_mask):
        attn_mask = attn_mask.double()
    with sdpa_kernel(SDPBackend.MATH):
        return run(F.scaled_dot_product_attention, q.double(), k.double(), v.double(),
                   dout.double(), attn_mask, **options)


def check(q, k, v, dtype_name, attn_mask=None, seed=1, **options):
    generator = torch.Generator().manual_seed(seed)
    dout = torch.randn(q.shape, generator=generator).to(q.dtype)
    out, grads = run(tt.scaled_dot_product_attention, q, k, v, dout, attn_mask, **options)
    options.pop("causal_alignment", None)
    want_out, want_grads = reference(q, k, v, dout, attn_mask, **options)

    assert out.dtype == q.dtype and out.shape == q.shape and out.is_contiguous()
    assert torch.isfinite(out).all()
    kv_len = k.shape[2]
    error = (out.double() - want_out).abs().max().item()
    tolerance = output_tolerance(dtype_name, v.double().numpy(), kv_len)
    assert error <= tolerance, f"out: {error:.3g} > {tolerance:.3g}"

    expected = [g.numpy() for g in want_grads]
    tolerance = gradient_tolerance(dtype_name, expected, max(q.shape[2], kv_len))
    # dmask only with a float mask (the fourth leaf).
    for name, got, want, like in zip(("dq", "dk", "dv", "dmask"), grads, want_grads,
                                     (q, k, v, attn_mask), strict=False):
        assert got.shape == like.shape and got.dtype == like.dtype, name
        assert torch.isfinite(got).all(), name
        error = (got.double() - want).abs().max().item()
        assert error <= tolerance, f"{name}: {error:.3g} > {tolerance:.3g}"
    return out, grads


# torch warns of NaN for lower-right masks with L > S; its math backend gives 0 there, as we do.
LOWER_RIGHT_WARNING = "ignore:Lower right causal bias will produce NaNs:UserWarning"


@pytest.mark.filterwarnings(LOWER_RIGHT_WARNING)
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("mask", ["none", "is_causal", "upper_left", "lower_right"])
def test_matches_math_sdpa(dtype_name, shape, mask):
    q_len, kv_len = shape[3:5]
    q, k, v = random_qkv(*shape, DTYPES[dtype_name])
    options = {}
    if mask == "is_causal":
        options = dict(is_causal=True)
    elif mask == "upper_left":
        options = dict(attn_mask=causal_upper_left(q_len, kv_len))
    elif mask == "lower_right":  # fully masked rows when L > S: out and gradients 0
        options = dict(attn_mask=causal_lower_right(q_len, kv_len))
    check(q, k, v, dtype_name, **options)


@pytest.mark.filterwarnings(LOWER_RIGHT_WARNING)
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_causal_alignment_keyword_is_causal_lower_right(shape):
    q, k, v = random_qkv(*shape, torch.float32)
    out = tt.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom_right")
    same = tt.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(*shape[3:5]))
    torch.testing.assert_close(out, same, rtol=0, atol=0)
    check(q, k, v, "float32", is_causal=False, attn_mask=causal_lower_right(*shape[3:5]),
          causal_alignment="bottom_right")


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize(
    "mask_shape",
    [(2, 4, 9, 13), (9, 13), (4, 1, 13), (2, 1, 9, 1), (13,), (1, 1, 1, 1)],
    ids=["full", "LxS", "heads_keys", "batch_rows", "keys", "scalar"],
)
def test_float_mask_and_its_gradient(dtype_name, mask_shape):
    q, k, v = random_qkv(2, 4, 4, 9, 13, 16, DTYPES[dtype_name])
    mask = torch.randn(mask_shape, generator=torch.Generator().manual_seed(5))
    check(q, k, v, dtype_name, attn_mask=mask.to(q.dtype))


def test_float32_mask_of_a_half_query():
    # Any float mask dtype is taken (computed as float32); its gradient keeps the mask's dtype.
    q, k, v = random_qkv(1, 2, 2, 5, 7, 8, torch.float16)
    mask = torch.randn(5, 7, requires_grad=True)
    out = tt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.float().sum().backward()
    assert mask.grad.dtype == torch.float32 and mask.grad.shape == (5, 7)


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_bool_mask(dtype_name):
    q, k, v = random_qkv(2, 4, 4, 9, 13, 16, DTYPES[dtype_name])
    mask = torch.rand(2, 1, 9, 13, generator=torch.Generator().manual_seed(3)) < 0.6
    mask[..., 0] = True  # no fully masked rows here: those have their own test
    check(q, k, v, dtype_name, attn_mask=mask)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_fully_masked_rows_give_zero_like_math_sdpa(kind):
    # A row with no True (bool) or -inf on every key (float): output 0 and zero gradients, never
    # NaN; torch's math SDPA gives the same (its safe softmax).
    q, k, v = random_qkv(1, 2, 2, 6, 5, 8, torch.float32)
    keep = torch.ones(6, 5, dtype=torch.bool)
    keep[2] = False
    mask = keep if kind == "bool" else torch.zeros(6, 5).masked_fill(~keep, -math.inf)
    out, grads = check(q, k, v, "float32", attn_mask=mask)
    assert (out[:, :, 2] == 0).all()
    assert (grads[0][:, :, 2] == 0).all()
    if kind == "float":
        assert (grads[3][2] == 0).all()


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_grouped_query_attention(dtype_name):
    q, k, v = random_qkv(2, 6, 2, 9, 13, 16, DTYPES[dtype_name])
    check(q, k, v, dtype_name, enable_gqa=True)
    check(q, k, v, dtype_name, enable_gqa=True, is_causal=True)


def test_a_single_kv_head_broadcasts_without_enable_gqa():
    q, k, v = random_qkv(1, 4, 1, 7, 7, 8, torch.float32)
    check(q, k, v, "float32")


@pytest.mark.parametrize("scale", [0.3, 2])
def test_scale(scale):
    q, k, v = random_qkv(1, 2, 2, 7, 11, 8, torch.float32)
    check(q, k, v, "float32", scale=scale, is_causal=True)


def test_strided_inputs_are_read_in_place():
    # [B, L, H, E] storage, as attention layers produce it, viewed as [B, H, L, E].
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2)
               for t in random_qkv(2, 4, 4, 9, 13, 16, torch.bfloat16))
    assert not q.is_contiguous()
    for t in (q, k, v):
        array = _core._as_array(tt._detached(t))  # the view tilelab reads
        assert array.__array_interface__["data"][0] == t.data_ptr()
        assert array.strides == tuple(s * 2 for s in t.stride())
    check(q, k, v, "bfloat16", is_causal=True)

def test_a_strided_gradient_takes_the_generated_backward():
    """out.sum().backward() hands over a stride-0 gradient; the gradients are exactly those of
    tilelab.flash_attention_backward with a dense gradient of ones (the generated kernel, which
    rounds bf16 P and dS as the forward rounds P)."""
    q, k, v = (t.requires_grad_() for t in random_qkv(1, 4, 2, 40, 40, 32, torch.bfloat16))
    out = tt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    out.sum().backward()
    _, lse = tilelab.flash_attention(*(t.detach() for t in (q, k, v)), causal=True,
                                     return_lse=True)
    ones = torch.ones_like(out)
    expected = tilelab.flash_attention_backward(
        ones, q.detach(), k.detach(), v.detach(), out.detach(), lse, causal=True)
    for got, want in zip((q.grad, k.grad, v.grad), expected, strict=True):
        assert torch.equal(got.view(torch.int16), torch.from_numpy(want.view(np.int16)))


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_outputs_come_back_without_a_copy(dtype_name):
    q = torch.randn(1, 2, 3, 4).to(DTYPES[dtype_name])
    array = _core._as_array(tt._detached(q))  # the view tilelab reads
    assert array.__array_interface__["data"][0] == q.data_ptr()
    back = tt._from_numpy(array)
    assert back.data_ptr() == q.data_ptr() and back.dtype == q.dtype
    torch.testing.assert_close(back, q, rtol=0, atol=0)


def test_inputs_are_left_untouched_and_outputs_are_new():
    q, k, v = random_qkv(1, 2, 2, 5, 6, 8, torch.float32)
    before = [t.clone() for t in (q, k, v)]
    out = tt.scaled_dot_product_attention(q, k, v)
    for t, b in zip((q, k, v), before, strict=True):
        assert torch.equal(t, b)
    assert all(out.data_ptr() != t.data_ptr() for t in (q, k, v))


# --- gradcheck --------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:Input #\\d+ requires gradient and is not a double precision")
@pytest.mark.parametrize("options", [dict(), dict(is_causal=True), dict(enable_gqa=True)],
                         ids=["full", "causal", "gqa"])
def test_gradcheck_float32(options):
    # tilelab computes in float32 (no float64 kernels), so gradcheck runs on float32 inputs: eps
    # 1e-2 keeps the finite differences' rounding (fp32 roundoff / eps ~ 1e-5) and their
    # truncation (~eps^2 ~ 1e-4) well inside atol/rtol 5e-3, while a wrong formula (errors of
    # the size of the gradients, ~0.1 to 1) still fails.
    q, k, v = random_qkv(1, 2, 1 if options.get("enable_gqa") else 2, 4, 5, 4, torch.float32)
    mask = torch.randn(1, 2, 4, 5) if not options.get("is_causal") else None
    inputs = [t.requires_grad_() for t in (q, k, v)]
    if mask is not None:
        inputs.append(mask.requires_grad_())

    def function(q, k, v, mask=None):
        return tt.scaled_dot_product_attention(q, k, v, attn_mask=mask, **options)

    assert torch.autograd.gradcheck(function, inputs, eps=1e-2, atol=5e-3, rtol=5e-3)


# --- refused arguments -------------------------------------------------------------------------


def arguments():
    q, k, v = random_qkv(1, 2, 2, 3, 4, 8, torch.float32)
    return dict(query=q, key=k, value=v)


def test_dropout_is_refused():
    with pytest.raises(ValueError, match=r"^dropout_p: .*no dropout; expected 0.0, got 0.1"):
        tt.scaled_dot_product_attention(**arguments(), dropout_p=0.1)
    tt.scaled_dot_product_attention(**arguments(), dropout_p=0.0)


@pytest.mark.parametrize("name", ["query", "key", "value"])
@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (lambda t: t.numpy(), TypeError, "expected a torch.Tensor, got ndarray"),
        (lambda t: t.to("meta"), TypeError, "expected a CPU tensor, got one on device 'meta'"),
        (lambda t: t.double(), TypeError, "expected dtype torch.float32, .*got torch.float64"),
        (lambda t: t.to(torch.int32), TypeError, "expected dtype .*got torch.int32"),
        (lambda t: t[0], ValueError, "expected rank 4"),
        (lambda t: t[:, :, :0], ValueError, "expected non-empty dimensions"),
    ],
    ids=["numpy", "meta", "float64", "int32", "rank3", "empty"],
)
def test_bad_tensors_are_named(name, change, error, message):
    args = arguments()
    args[name] = change(args[name])
    with pytest.raises(error, match=f"^{name}: {message}"):
        tt.scaled_dot_product_attention(**args)


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (dict(key=torch.zeros(1, 2, 4, 8, dtype=torch.float16)), TypeError,
         "^key: expected query's dtype torch.float32, got torch.float16"),
        (dict(key=torch.zeros(2, 2, 4, 8)), ValueError, r"^key: expected shape \[1, Hkv, S, 8\]"),
        (dict(key=torch.zeros(1, 2, 4, 4)), ValueError, r"^key: expected shape \[1, Hkv, S, 8\]"),
        (dict(value=torch.zeros(1, 2, 4, 6)), ValueError, r"^value: expected key's shape"),
        (dict(key=torch.zeros(1, 3, 4, 8), value=torch.zeros(1, 3, 4, 8), enable_gqa=True),
         ValueError, r"^key: with enable_gqa its heads \(3\) must divide query's \(2\)"),
        (dict(key=torch.zeros(1, 4, 4, 8), value=torch.zeros(1, 4, 4, 8)), ValueError,
         r"^key: expected query's number of heads \(2\) or 1, got 4"),
        (dict(attn_mask=torch.zeros(3, 4), is_causal=True), ValueError,
         "^attn_mask: expected None with is_causal=True"),
        (dict(attn_mask=torch.zeros(3, 4, dtype=torch.int32)), TypeError,
         "^attn_mask: expected a bool or floating-point tensor, got torch.int32"),
        (dict(attn_mask=torch.zeros(3, 5)), ValueError,
         r"^attn_mask: expected a shape broadcastable to .* = \(1, 2, 3, 4\), got \(3, 5\)"),
        (dict(attn_mask=torch.zeros(1, 1, 1, 3, 4)), ValueError,
         "^attn_mask: expected rank 1 to 4"),
        (dict(attn_mask=torch.zeros(3, 4).to("meta")), TypeError,
         "^attn_mask: expected a CPU tensor"),
        (dict(attn_mask=[[0.0]]), TypeError, "^attn_mask: expected a torch.Tensor, got list"),
        (dict(attn_mask=causal_lower_right(3, 5)), ValueError,
         r"^attn_mask: a CausalBias for \(L, S\) = \(3, 5\), expected \(3, 4\)"),
        (dict(attn_mask=causal_lower_right(3, 4), causal_alignment="top_left"), ValueError,
         "^causal_alignment: 'top_left' disagrees with attn_mask, a bottom_right CausalBias"),
        (dict(attn_mask=causal_upper_left(3, 4), is_causal=True), ValueError,
         "^attn_mask: a CausalBias together with is_causal=True"),
        (dict(is_causal=True, causal_alignment="bottom-right"), ValueError,
         "^causal_alignment: expected 'top_left' or 'bottom_right', got 'bottom-right'"),
        (dict(scale=math.inf), ValueError, "^scale: expected a finite value"),
    ],
)
def test_bad_arguments_are_named(change, error, message):
    with pytest.raises(error, match=message):
        tt.scaled_dot_product_attention(**{**arguments(), **change})


def test_results_are_torch_tensors_like_torch_sdpa():
    args = arguments()
    out = tt.scaled_dot_product_attention(**args)
    want = F.scaled_dot_product_attention(**args)
    assert type(out) is torch.Tensor and out.shape == want.shape and out.dtype == want.dtype
    tolerance = 64 * UNIT_ROUNDOFF["float32"]
    np.testing.assert_allclose(out.numpy(), want.numpy(), atol=tolerance, rtol=tolerance)
