"""tilelab.torch: tilelab's flash attention as a drop-in for
``torch.nn.functional.scaled_dot_product_attention`` on CPU tensors, with autograd and
``torch.compile`` support.

Importing this module imports torch; ``import tilelab`` alone never does.

The attention is two ``torch.library`` custom ops, ``tilelab::flash_attention`` (returns out and
the float32 log-sum-exp) and ``tilelab::flash_attention_backward`` (dq, dk, dv and the gradient of
a float mask), with fake kernels so ``torch.compile(fullgraph=True)`` traces through them and an
autograd formula that calls :func:`tilelab.flash_attention_backward`. Tensors reach tilelab
without a copy (numpy views of their memory, bfloat16 as ``ml_dtypes.bfloat16``) and its outputs
come back as tensors over the same memory.
"""

import math

import ml_dtypes
import numpy as np
import torch
from torch.nn.attention.bias import CausalBias, CausalVariant

import tilelab

__all__ = ["scaled_dot_product_attention"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_DTYPE_NAMES = "torch.float32, torch.float16 or torch.bfloat16"
_ALIGNMENTS = ("top_left", "bottom_right")


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy array over the tensor's memory, same strides (no copy). numpy has no bfloat16:
    those go through an int16 view to ``ml_dtypes.bfloat16``."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def _from_numpy(array: np.ndarray) -> torch.Tensor:
    """A tensor over the array's memory (no copy); the inverse of :func:`_to_numpy`."""
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


# --- the custom ops ------------------------------------------------------------------------------


@torch.library.custom_op("tilelab::flash_attention", mutates_args=())
def _flash_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    bias: torch.Tensor | None,
    is_causal: bool,
    causal_alignment: str,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = tilelab.flash_attention(
        _to_numpy(query),
        _to_numpy(key),
        _to_numpy(value),
        causal=is_causal,
        causal_alignment=causal_alignment,
        scale=scale,
        bias=None if bias is None else _to_numpy(bias),
        return_lse=True,
    )
    return _from_numpy(out), _from_numpy(lse)


@_flash_attention.register_fake
def _flash_attention_fake(query, key, value, bias, is_causal, causal_alignment, scale):
    # tilelab's outputs are new C-contiguous arrays: out like query, lse float32 [B, H, M].
    out = query.new_empty(query.shape)
    lse = query.new_empty(query.shape[:3], dtype=torch.float32)
    return out, lse


@torch.library.custom_op("tilelab::flash_attention_backward", mutates_args=())
def _flash_attention_backward(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    bias: torch.Tensor | None,
    compute_dbias: bool,
    is_causal: bool,
    causal_alignment: str,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dbias); dbias is an empty float32 tensor unless compute_dbias."""
    grads = tilelab.flash_attention_backward(
        _to_numpy(grad_out),
        _to_numpy(query),
        _to_numpy(key),
        _to_numpy(value),
        _to_numpy(out),
        _to_numpy(lse),
        causal=is_causal,
        causal_alignment=causal_alignment,
        scale=scale,
        bias=None if bias is None else _to_numpy(bias),
        return_dbias=compute_dbias,
    )
    dq, dk, dv = (_from_numpy(grad) for grad in grads[:3])
    dbias = _from_numpy(grads[3]) if compute_dbias else torch.empty(0, dtype=torch.float32)
    return dq, dk, dv, dbias


@_flash_attention_backward.register_fake
def _flash_attention_backward_fake(
    grad_out, query, key, value, out, lse, bias, compute_dbias, is_causal, causal_alignment, scale
):
    dq = query.new_empty(query.shape)
    dk = query.new_empty(key.shape)
    dv = query.new_empty(key.shape)
    if compute_dbias:
        dbias = query.new_empty(bias.shape, dtype=torch.float32)
    else:
        dbias = query.new_empty(0, dtype=torch.float32)
    return dq, dk, dv, dbias


def _setup_context(ctx, inputs, output):
    query, key, value, bias, is_causal, causal_alignment, scale = inputs
    out, lse = output
    ctx.save_for_backward(query, key, value, bias, out, lse)
    ctx.options = (is_causal, causal_alignment, scale)
    # lse serves the backward only; scaled_dot_product_attention never returns it.
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_out, _grad_lse):
    query, key, value, bias, out, lse = ctx.saved_tensors
    compute_dbias = bias is not None and ctx.needs_input_grad[3]
    dq, dk, dv, dbias = _flash_attention_backward(
        grad_out, query, key, value, out, lse, bias, compute_dbias, *ctx.options
    )
    return dq, dk, dv, dbias if compute_dbias else None, None, None, None


_flash_attention.register_autograd(_backward, setup_context=_setup_context)


# --- the public function -------------------------------------------------------------------------


def _require_tensor(tensor, name: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise TypeError(
            f"{name}: expected a CPU tensor, got one on device '{tensor.device}' (tilelab runs on "
            "the CPU: move it with .cpu())"
        )


def _require_attention_tensor(tensor, name: str) -> None:
    _require_tensor(tensor, name)
    if tensor.dtype not in _DTYPES:
        raise TypeError(f"{name}: expected dtype {_DTYPE_NAMES}, got {tensor.dtype}")
    if tensor.dim() != 4:
        raise ValueError(
            f"{name}: expected rank 4 [batch, heads, sequence, head_dim], got shape "
            f"{tuple(tensor.shape)}"
        )
    if any(size == 0 for size in tensor.shape):
        raise ValueError(f"{name}: expected non-empty dimensions, got shape {tuple(tensor.shape)}")


def _mask_as_bias(attn_mask, shape: tuple[int, int, int, int]) -> torch.Tensor:
    """A bool or float attn_mask broadcastable to ``shape`` = (B, Hq, L, S) as tilelab's float32
    bias ``[B|1, Hq|1, L|1, S]``: views where possible (padding the rank, expanding a last
    dimension of 1 with stride 0); a copy only for a bool mask or a float dtype other than
    float32. Autograd follows the conversion, so a float mask's gradient has its own shape."""
    _require_tensor(attn_mask, "attn_mask")
    if attn_mask.dtype == torch.bool:
        # True = attend. A row with no True is fully masked: out 0 (see the module's docs).
        bias = torch.zeros(attn_mask.shape, dtype=torch.float32).masked_fill_(
            ~attn_mask, -math.inf
        )
    elif attn_mask.is_floating_point():
        bias = attn_mask.to(torch.float32)
    else:
        raise TypeError(
            f"attn_mask: expected a bool or floating-point tensor, got {attn_mask.dtype}"
        )
    if not 1 <= bias.dim() <= 4:
        raise ValueError(
            f"attn_mask: expected rank 1 to 4, broadcastable to {shape}, got shape "
            f"{tuple(attn_mask.shape)}"
        )
    bias = bias[(None,) * (4 - bias.dim())]
    if any(size not in (1, want) for size, want in zip(bias.shape, shape, strict=True)):
        raise ValueError(
            f"attn_mask: expected a shape broadcastable to (batch, q_heads, L, S) = {shape}, got "
            f"{tuple(attn_mask.shape)}"
        )
    if bias.shape[3] != shape[3]:
        bias = bias.expand(*bias.shape[:3], shape[3])
    return bias


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | CausalBias | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    causal_alignment: str | None = None,
) -> torch.Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` computed by tilelab (CPU tensors).

    Same call conventions as torch's: query ``[B, Hq, L, E]``, key and value ``[B, Hkv, S, E]``,
    result ``[B, Hq, L, E]`` of query's dtype; ``softmax(scale * query @ key^T + mask) @ value``
    with ``scale`` defaulting to ``1 / sqrt(E)``. Differentiable with respect to query, key,
    value and a float ``attn_mask`` (through :func:`tilelab.flash_attention_backward`), and
    traceable by ``torch.compile(fullgraph=True)``.

    Args:
        attn_mask: broadcastable to ``[B, Hq, L, S]`` (rank 1 to 4). A bool mask: True = attend.
            A float mask: added to the scores (any float dtype; computed as float32). A
            ``torch.nn.attention.bias.CausalBias`` (``causal_upper_left`` /
            ``causal_lower_right``): causal masking with that alignment.
        dropout_p: must be 0.0; tilelab has no attention dropout (ValueError otherwise).
        is_causal: causal mask, top-left aligned as in torch (query i sees keys ``j <= i``);
            not together with ``attn_mask`` (as in torch).
        scale: multiplies ``query @ key^T``; default ``1 / sqrt(E)``.
        enable_gqa: Hq may be a multiple of Hkv; query head h reads kv head ``h // (Hq // Hkv)``
            (torch's ``repeat_interleave``). Without it Hkv must equal Hq or be 1 (broadcast),
            as in torch.
        causal_alignment: tilelab's extension: ``"top_left"`` (the default, torch's) or
            ``"bottom_right"`` (query i sees keys ``j <= i + S - L``, FlashAttention-2 / vLLM).
            Applies with ``is_causal``; must agree with a CausalBias mask.

    Fully masked rows (a bool mask with no True in a row, a float mask of -inf on every key, or
    bottom-right alignment with L > S): output 0 and zero gradients, never NaN, as torch's math
    and flash CPU backends give.

    Memory: tensors of any strides are read in place (tilelab takes any non-negative element
    strides), and the outputs are new contiguous tensors over tilelab's arrays, so nothing is
    copied but a bool mask (made a float32 0/-inf bias) or a float mask of another dtype than
    float32 (converted).

    Raises:
        TypeError: an argument is not a tensor, not on the CPU, or of an unsupported dtype
            (query, key and value: float32, float16 or bfloat16, all the same).
        ValueError: dropout_p != 0, a wrong rank or shape, heads that do not divide, an
            attn_mask together with is_causal, an unknown causal_alignment.
    """
    if dropout_p != 0.0:
        raise ValueError(
            f"dropout_p: tilelab's attention has no dropout; expected 0.0, got {dropout_p!r}"
        )
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        _require_attention_tensor(tensor, name)
    for name, tensor in (("key", key), ("value", value)):
        if tensor.dtype != query.dtype:
            raise TypeError(
                f"{name}: expected query's dtype {query.dtype}, got {tensor.dtype} (tilelab takes "
                "one dtype for query, key and value)"
            )
    batch, q_heads, q_len, head_dim = query.shape
    _, kv_heads, kv_len, _ = key.shape
    if key.shape[0] != batch or key.shape[3] != head_dim:
        raise ValueError(
            f"key: expected shape [{batch}, Hkv, S, {head_dim}] (query's batch and head_dim), "
            f"got {tuple(key.shape)}"
        )
    if value.shape != key.shape:
        raise ValueError(
            f"value: expected key's shape {tuple(key.shape)}, got {tuple(value.shape)} (tilelab "
            "needs value's head_dim equal to query's)"
        )
    if enable_gqa:
        if q_heads % kv_heads != 0:
            raise ValueError(
                f"key: with enable_gqa its heads ({kv_heads}) must divide query's ({q_heads})"
            )
    elif kv_heads not in (q_heads, 1):
        raise ValueError(
            f"key: expected query's number of heads ({q_heads}) or 1, got {kv_heads} (pass "
            "enable_gqa=True for grouped-query attention)"
        )

    if causal_alignment is not None and causal_alignment not in _ALIGNMENTS:
        raise ValueError(
            f"causal_alignment: expected 'top_left' or 'bottom_right', got {causal_alignment!r}"
        )
    alignment = causal_alignment or "top_left"
    bias = None
    if isinstance(attn_mask, CausalBias):
        if is_causal:
            raise ValueError("attn_mask: a CausalBias together with is_causal=True")
        if (attn_mask.seq_len_q, attn_mask.seq_len_kv) != (q_len, kv_len):
            raise ValueError(
                f"attn_mask: a CausalBias for (L, S) = ({attn_mask.seq_len_q}, "
                f"{attn_mask.seq_len_kv}), expected ({q_len}, {kv_len})"
            )
        mask_alignment = (
            "top_left" if attn_mask.variant == CausalVariant.UPPER_LEFT else "bottom_right"
        )
        if causal_alignment not in (None, mask_alignment):
            raise ValueError(
                f"causal_alignment: {causal_alignment!r} disagrees with attn_mask, a "
                f"{mask_alignment} CausalBias"
            )
        is_causal, alignment = True, mask_alignment
    elif attn_mask is not None:
        if is_causal:
            raise ValueError(
                "attn_mask: expected None with is_causal=True (as in torch); add the causal mask "
                "to attn_mask instead"
            )
        bias = _mask_as_bias(attn_mask, (batch, q_heads, q_len, kv_len))

    out, _ = _flash_attention(
        query,
        key,
        value,
        bias,
        bool(is_causal),
        alignment,
        None if scale is None else float(scale),
    )
    return out
