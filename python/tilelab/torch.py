"""tilelab.torch: tilelab's flash attention as a drop-in for
``torch.nn.functional.scaled_dot_product_attention`` on CPU tensors, with autograd and
``torch.compile`` support.

Importing this module imports torch; ``import tilelab`` alone never does.

The attention is two ``torch.library`` custom ops, ``tilelab::flash_attention`` (returns out and
the float32 log-sum-exp) and ``tilelab::flash_attention_backward`` (dq, dk, dv and the gradient of
a float mask), with fake kernels so ``torch.compile(fullgraph=True)`` traces through them and an
autograd formula that calls :func:`tilelab.flash_attention_backward`. Tensors reach tilelab
without a copy (read in place through DLPack) and its outputs come back as tensors over the same
memory.
"""

import math
import operator

import ml_dtypes
import numpy as np
import torch
from torch.nn.attention.bias import CausalBias, CausalVariant

import tilelab

__all__ = ["paged_attention", "reshape_and_cache_flash", "scaled_dot_product_attention"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_DTYPE_NAMES = "torch.float32, torch.float16 or torch.bfloat16"
_ALIGNMENTS = ("top_left", "bottom_right")


def _detached(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """The tensor as tilelab takes it: read in place through DLPack (any strides, bfloat16 and
    float8 included), which refuses a tensor that requires grad; None stays None."""
    return None if tensor is None else tensor.detach()


def _from_numpy(array: np.ndarray) -> torch.Tensor:
    """A tensor over a tilelab output array's memory (no copy). numpy has no bfloat16: those go
    through an int16 view."""
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
    window_left: int,
    window_right: int,
    softcap: float,
    alibi_slopes: torch.Tensor | None,
    sinks: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = tilelab.flash_attention(
        _detached(query),
        _detached(key),
        _detached(value),
        causal=is_causal,
        causal_alignment=causal_alignment,
        scale=scale,
        bias=_detached(bias),
        return_lse=True,
        sliding_window=(window_left, window_right),
        softcap=softcap,
        alibi_slopes=_detached(alibi_slopes),
        sinks=_detached(sinks),
    )
    return _from_numpy(out), _from_numpy(lse)


@_flash_attention.register_fake
def _flash_attention_fake(query, key, value, bias, is_causal, causal_alignment, scale, *options):
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
    window_left: int,
    window_right: int,
    softcap: float,
    alibi_slopes: torch.Tensor | None,
    sinks: torch.Tensor | None,
    compute_dsinks: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dbias, dsinks); dbias and dsinks are empty float32 tensors unless asked for."""
    grads = tilelab.flash_attention_backward(
        _detached(grad_out),
        _detached(query),
        _detached(key),
        _detached(value),
        _detached(out),
        _detached(lse),
        causal=is_causal,
        causal_alignment=causal_alignment,
        scale=scale,
        bias=_detached(bias),
        return_dbias=compute_dbias,
        sliding_window=(window_left, window_right),
        softcap=softcap,
        alibi_slopes=_detached(alibi_slopes),
        sinks=_detached(sinks),
        return_dsinks=compute_dsinks,
    )
    dq, dk, dv = (_from_numpy(grad) for grad in grads[:3])
    extra = [_from_numpy(grad) for grad in grads[3:]]
    dbias = extra.pop(0) if compute_dbias else torch.empty(0, dtype=torch.float32)
    dsinks = extra.pop(0) if compute_dsinks else torch.empty(0, dtype=torch.float32)
    return dq, dk, dv, dbias, dsinks


@_flash_attention_backward.register_fake
def _flash_attention_backward_fake(
    grad_out, query, key, value, out, lse, bias, compute_dbias, *options
):
    *_, sinks, compute_dsinks = options
    dq = query.new_empty(query.shape)
    dk = query.new_empty(key.shape)
    dv = query.new_empty(key.shape)
    dbias = query.new_empty(bias.shape if compute_dbias else 0, dtype=torch.float32)
    dsinks = query.new_empty(sinks.shape if compute_dsinks else 0, dtype=torch.float32)
    return dq, dk, dv, dbias, dsinks


def _setup_context(ctx, inputs, output):
    query, key, value, bias, is_causal, causal_alignment, scale, *score_options = inputs
    window_left, window_right, softcap, alibi_slopes, sinks = score_options
    if alibi_slopes is not None and alibi_slopes.requires_grad:
        # scaled_dot_product_attention refuses this before the op runs; this guards direct
        # calls of the op.
        raise ValueError("alibi_slopes: tilelab's backward gives the ALiBi slopes no gradient")
    out, lse = output
    ctx.save_for_backward(query, key, value, bias, out, lse, alibi_slopes, sinks)
    ctx.options = (is_causal, causal_alignment, scale, window_left, window_right, softcap)
    # lse serves the backward only; scaled_dot_product_attention never returns it.
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_out, _grad_lse):
    query, key, value, bias, out, lse, alibi_slopes, sinks = ctx.saved_tensors
    compute_dbias = bias is not None and ctx.needs_input_grad[3]
    compute_dsinks = sinks is not None and ctx.needs_input_grad[11]
    # Autograd may hand over an expanded or otherwise strided gradient (out.sum().backward() gives
    # a stride-0 one); the generated kernels read the head dim densely, and only they round bf16
    # P and dS like the forward, so the gradient is made contiguous rather than sent to the
    # reference implementation.
    dq, dk, dv, dbias, dsinks = _flash_attention_backward(
        grad_out.contiguous(),
        query,
        key,
        value,
        out,
        lse,
        bias,
        compute_dbias,
        *ctx.options,
        alibi_slopes,
        sinks,
        compute_dsinks,
    )
    return (
        dq,
        dk,
        dv,
        dbias if compute_dbias else None,
        *(None,) * 7,
        dsinks if compute_dsinks else None,
    )


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
        bias = torch.zeros(attn_mask.shape, dtype=torch.float32).masked_fill_(~attn_mask, -math.inf)
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
    sliding_window: tuple[int, int] | None = None,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` computed by tilelab (CPU tensors).

    Same call conventions as torch's: query ``[B, Hq, L, E]``, key and value ``[B, Hkv, S, E]``,
    result ``[B, Hq, L, E]`` of query's dtype; ``softmax(scale * query @ key^T + mask) @ value``
    with ``scale`` defaulting to ``1 / sqrt(E)``. Differentiable with respect to query, key,
    value, a float ``attn_mask`` and ``sinks`` (through
    :func:`tilelab.flash_attention_backward`), and traceable by ``torch.compile(fullgraph=True)``.

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
        sliding_window, softcap, alibi_slopes, sinks: tilelab's score options
            (docs/attention_options.md): ``sliding_window=(left, right)`` keeps key j for query
            i iff ``i - left <= j <= i + right`` (-1 = unbounded; positions follow the causal
            alignment), ``softcap > 0`` caps scores to ``softcap * tanh(s / softcap)``,
            ``alibi_slopes`` (float32 ``[Hq]``) adds ``slope_h * (j - i)``, ``sinks`` (float32
            ``[Hq]``) joins each row's softmax denominator. Differentiable with respect to
            query, key, value and ``sinks``; ``alibi_slopes`` that require grad are refused
            (ValueError: the slopes get no gradient). They do not combine with ``attn_mask``.

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

    window_left, window_right = _window(sliding_window)
    score_options = {
        name: value
        for name, value in (
            ("sliding_window", sliding_window),
            ("softcap", softcap or None),
            ("alibi_slopes", alibi_slopes),
            ("sinks", sinks),
        )
        if value is not None
    }
    for name in ("alibi_slopes", "sinks"):
        if name in score_options:
            _require_tensor(score_options[name], name)
    if torch.is_grad_enabled() and alibi_slopes is not None and alibi_slopes.requires_grad:
        raise ValueError(
            "alibi_slopes: expected a tensor that does not require grad (tilelab's backward gives "
            "the ALiBi slopes no gradient)"
        )
    out, _ = _flash_attention(
        query,
        key,
        value,
        bias,
        bool(is_causal),
        alignment,
        None if scale is None else float(scale),
        window_left,
        window_right,
        float(softcap),
        alibi_slopes,
        sinks,
    )
    return out


def _window(sliding_window) -> tuple[int, int]:
    """(left, right) from None or a pair of ints; tilelab checks the values."""
    if sliding_window is None:
        return -1, -1
    try:
        left, right = (operator.index(side) for side in sliding_window)
    except (TypeError, ValueError):
        raise TypeError(
            f"sliding_window: expected None or a pair of ints (left, right), got {sliding_window!r}"
        ) from None
    return left, right


def _refuse_gradients(name: str, what: str, *tensors) -> None:
    """tilelab has no backward for ``what``: refuse before computing when autograd would need
    one, instead of failing (or being wrong) in backward()."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise ValueError(
            f"{name}: {what} has no backward; pass tensors that do not require grad, or call it "
            "under torch.no_grad() or torch.inference_mode()"
        )


# --- serving attention over a paged KV cache ----------------------------------------------------

_CACHE_DTYPES = (*_DTYPES, torch.float8_e4m3fn, torch.float8_e5m2)


@torch.library.custom_op("tilelab::paged_attention", mutates_args=("out",))
def _paged_attention(
    out: torch.Tensor,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float | None,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    alibi_slopes: torch.Tensor | None,
    sinks: torch.Tensor | None,
    k_scale: float,
    v_scale: float,
    split_kv: int | None,
    fp32_probabilities: bool,
) -> None:
    # tilelab reads torch tensors in place through DLPack and writes out in place.
    tilelab.paged_attention(
        _detached(query),
        _detached(key_cache),
        _detached(value_cache),
        block_table,
        seq_lens,
        query_start_loc,
        scale=scale,
        causal=causal,
        sliding_window=(window_left, window_right),
        softcap=softcap,
        alibi_slopes=_detached(alibi_slopes),
        sinks=_detached(sinks),
        k_scale=k_scale,
        v_scale=v_scale,
        split_kv="auto" if split_kv is None else split_kv,
        fp32_probabilities=fp32_probabilities,
        out=_detached(out),
    )


@_paged_attention.register_fake
def _paged_attention_fake(out, *arguments):
    return None


@torch.library.custom_op(
    "tilelab::reshape_and_cache_flash", mutates_args=("key_cache", "value_cache")
)
def _reshape_and_cache_flash(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float,
    v_scale: float,
) -> None:
    tilelab.reshape_and_cache_flash(
        _detached(key),
        _detached(value),
        _detached(key_cache),
        _detached(value_cache),
        slot_mapping,
        k_scale,
        v_scale,
    )


@_reshape_and_cache_flash.register_fake
def _reshape_and_cache_flash_fake(key, value, key_cache, value_cache, *arguments):
    return None


def _require_cache_tensors(**tensors) -> None:
    for name, tensor in tensors.items():
        _require_tensor(tensor, name)
        if tensor.dtype not in _CACHE_DTYPES:
            raise TypeError(
                f"{name}: expected dtype {_DTYPE_NAMES}, torch.float8_e4m3fn or "
                f"torch.float8_e5m2, got {tensor.dtype}"
            )


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    *,
    scale: float | None = None,
    causal: bool = True,
    sliding_window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    split_kv: int | str = "auto",
    fp32_probabilities: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`tilelab.paged_attention` on CPU tensors, as the custom op
    ``tilelab::paged_attention`` (traceable by ``torch.compile(fullgraph=True)``).

    vLLM's layout: query ``[num_tokens, Hq, D]`` (float32, float16 or bfloat16), key_cache and
    value_cache ``[num_blocks, Hkv, block_size, D]`` (those dtypes or torch.float8_e4m3fn /
    torch.float8_e5m2 with ``k_scale`` / ``v_scale``), block_table int32
    ``[num_seqs, max_blocks_per_seq]``, seq_lens int32 ``[num_seqs]`` (context plus new tokens),
    query_start_loc int32 ``[num_seqs + 1]``. The semantics, options and errors are
    :func:`tilelab.paged_attention`'s (docs/paged_attention.md). Returns ``out`` (a new
    ``[num_tokens, Hq, D]`` tensor of query's dtype unless given); every tensor is read in place.

    Serving only: there is no backward, so tensors that require grad are refused (ValueError)
    unless autograd is off (torch.no_grad(), torch.inference_mode()).
    """
    _require_cache_tensors(query=query, key_cache=key_cache, value_cache=value_cache)
    for name, tensor in (
        ("block_table", block_table),
        ("seq_lens", seq_lens),
        ("query_start_loc", query_start_loc),
        ("alibi_slopes", alibi_slopes),
        ("sinks", sinks),
        ("out", out),
    ):
        if tensor is not None:
            _require_tensor(tensor, name)
    _refuse_gradients(
        "query",
        "tilelab.torch.paged_attention",
        query,
        key_cache,
        value_cache,
        alibi_slopes,
        sinks,
    )
    if split_kv == "auto":
        split_kv = None
    elif not isinstance(split_kv, int) or isinstance(split_kv, bool):
        raise TypeError(f"split_kv: expected 'auto' or an int >= 1, got {split_kv!r}")
    window_left, window_right = _window(sliding_window)
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype)
    _paged_attention(
        out,
        query,
        key_cache,
        value_cache,
        block_table,
        seq_lens,
        query_start_loc,
        None if scale is None else float(scale),
        bool(causal),
        window_left,
        window_right,
        float(softcap),
        alibi_slopes,
        sinks,
        float(k_scale),
        float(v_scale),
        split_kv,
        bool(fp32_probabilities),
    )
    return out


def reshape_and_cache_flash(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """:func:`tilelab.reshape_and_cache_flash` on CPU tensors, as the custom op
    ``tilelab::reshape_and_cache_flash`` (mutates key_cache and value_cache in place): token t's
    key and value ``[num_tokens, Hkv, D]`` go to slot ``slot_mapping[t]`` (int32; negative =
    skipped) of the caches ``[num_blocks, Hkv, block_size, D]``, quantized with round-to-nearest
    even and saturation when a cache is float8."""
    _require_cache_tensors(key=key, value=value, key_cache=key_cache, value_cache=value_cache)
    _require_tensor(slot_mapping, "slot_mapping")
    _reshape_and_cache_flash(
        key, value, key_cache, value_cache, slot_mapping, float(k_scale), float(v_scale)
    )
