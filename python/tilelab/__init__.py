"""tilelab: CPU attention kernels generated with Halide, behind a checked API.

Arrays are numpy arrays of float32, float16 or bfloat16 (``ml_dtypes.bfloat16``), or any object
with ``__dlpack__`` (torch CPU tensors, ...) or the buffer protocol, read in place; results are
numpy arrays. ``tilelab.torch`` (imported separately) wraps attention for torch. Work runs on
tilelab's OpenMP pool (see :func:`set_num_threads`) with the GIL released, so Python threads may
call into tilelab concurrently.
"""

from __future__ import annotations

from typing import Literal, overload

import numpy as np

from . import _core
from . import nki as nki  # tilelab.nki: NKI-compatible flash paged attention
from . import sim as sim  # tilelab.sim: the simulator's exploration API
from ._version import __version__

__all__ = [
    "BlockSparseLayout",
    "__version__",
    "blocksparse_attention",
    "blocksparse_attention_kernels",
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_implementation",
    "flash_attention_kernel",
    "num_threads",
    "paged_attention",
    "prefers_bf16_dot_products",
    "reshape_and_cache_flash",
    "set_num_threads",
]

CausalAlignment = Literal["top_left", "bottom_right"]
Implementation = Literal["automatic", "generated", "reference"]

# Per-head CSR block layout for blocksparse_attention (constructors local_strided, from_dense and
# BlockSparseLayout(crow, col, block_size, causal=True)); docs/blocksparse.md describes it.
BlockSparseLayout = _core.BlockSparseLayout


@overload
def flash_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = ...,
    causal_alignment: CausalAlignment = ...,
    scale: float | None = ...,
    bias: np.ndarray | None = ...,
    return_lse: Literal[False] = ...,
    sliding_window: tuple[int, int] = ...,
    softcap: float = ...,
    alibi_slopes: np.ndarray | None = ...,
    sinks: np.ndarray | None = ...,
    k_scale: float = ...,
    v_scale: float = ...,
    fp32_probabilities: bool = ...,
    implementation: Implementation = ...,
) -> np.ndarray: ...
@overload
def flash_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = ...,
    causal_alignment: CausalAlignment = ...,
    scale: float | None = ...,
    bias: np.ndarray | None = ...,
    return_lse: Literal[True],
    sliding_window: tuple[int, int] = ...,
    softcap: float = ...,
    alibi_slopes: np.ndarray | None = ...,
    sinks: np.ndarray | None = ...,
    k_scale: float = ...,
    v_scale: float = ...,
    fp32_probabilities: bool = ...,
    implementation: Implementation = ...,
) -> tuple[np.ndarray, np.ndarray]: ...


def flash_attention(
    q,
    k,
    v,
    *,
    causal=False,
    causal_alignment="top_left",
    scale=None,
    bias=None,
    return_lse=False,
    sliding_window=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    sinks=None,
    k_scale=1.0,
    v_scale=1.0,
    fp32_probabilities=False,
    implementation="automatic",
):
    """Attention forward, ``softmax(scale * q @ k^T + bias, masked) @ v``, without an M x N buffer.

    Shapes and dtypes:
        q: ``[B, Hq, M, D]``; k, v: ``[B, Hkv, N, D]``. Hq must be a multiple of Hkv (GQA/MQA:
        query head h reads kv head ``h // (Hq // Hkv)``). M, N >= 1 and 1 <= D <= 256.
        q, k and v share one dtype: float32, float16 or ``ml_dtypes.bfloat16``; or k and v are
        both ``ml_dtypes.float8_e4m3fn`` or ``float8_e5m2`` (dequantized with k_scale and v_scale
        in registers). Accumulation is float32. Any strides are accepted; arrays whose strides
        are non-negative whole elements are read in place, others (negative or odd byte strides,
        misaligned or byte-swapped data) are copied first.

    Args:
        causal: mask keys after each query's diagonal.
        causal_alignment: where the diagonal sits when M != N (the two agree when M == N).
            ``"top_left"``: query i sees keys ``j <= i`` (PyTorch SDPA ``is_causal``, FA Triton).
            ``"bottom_right"``: query i sees keys ``j <= i + (N - M)`` (FlashAttention-2 >= 2.1,
            vLLM, llama.cpp), i.e. the last query sees every key.
        scale: multiplies ``q @ k^T`` before the softmax; default ``1 / sqrt(D)``; must be finite.
        bias: float32 additive bias broadcastable to ``[B, Hq, M, N]``, of shape
            ``[B|1, Hq|1, M|1, N]`` (rank 4).
        return_lse: also return the float32 ``[B, Hq, M]`` natural-log sum-exp of each row's
            scaled, biased, masked scores.
        sliding_window, softcap, alibi_slopes, sinks: the score options of
            docs/attention_options.md (as :func:`paged_attention`); the query's absolute position
            i is its row plus ``N - M`` (bottom_right) or plus 0 (top_left), causal or not. Not
            combinable with ``bias`` yet. Calls with score options or fp8 k/v run on the paged
            kernel: ``implementation="generated"`` refuses them.
        k_scale, v_scale: dequantization scales of fp8 k and v (1.0 otherwise).
        fp32_probabilities: bfloat16 q on CPUs whose bf16 dot products outrun their fp32 FMAs
            (:func:`prefers_bf16_dot_products`: AMD Zen 4 and later, about twice as fast): the
            generated prefill kernels and the paged kernel (decode, fp8 k/v, score options) round
            the probabilities P to bfloat16 before ``P @ v`` (FlashAttention's mixed precision),
            so that ``q @ k^T`` and ``P @ v`` run on bf16 dot products; True keeps P in float32.
            The bf16 products are exact in float32 either way and the softmax denominator sums
            float32 P. On other CPUs (Intel's, those without AVX-512 BF16), other dtypes and the
            reference, P stays float32 on fp32 FMAs whatever this says; fp8 k/v on any CPU with
            AVX-512 BF16 run on bf16 dot products with P rounded.
        implementation: ``"automatic"`` (decode, M == 1 without a bias, on the paged kernel,
            which reads each K/V row once for a whole GQA group; otherwise the generated kernel
            when it covers the call, else the reference), ``"generated"`` (ValueError when it
            does not cover the call) or ``"reference"``.

    Returns:
        ``out`` — a new C-contiguous ``[B, Hq, M, D]`` array of q's dtype — or ``(out, lse)`` when
        ``return_lse``. A fully masked query row (possible with bottom-right alignment when M > N,
        or with a bias of -inf on every key) gives out 0 and lse -inf, never NaN.

    Masking and non-finite values (the same for every ``implementation``):
        Only the mask masks a key: causal masking and a bias of exactly ``-inf``, whatever
        ``q @ k^T`` is (NaN included). Every other score follows IEEE arithmetic, as PyTorch does:
        NaN or +inf among a row's scores (from q, k, bias, or ``q @ k^T`` overflowing float32)
        gives that row out NaN and lse NaN; a score of -inf (``q @ k^T`` overflowing to -inf)
        contributes ``exp(-inf) = 0``, so a row whose unmasked scores are all -inf is NaN too
        (0 / 0). Large finite scores such as -1e30 are ordinary scores.

    Raises:
        TypeError: an argument is not an array (a ``numpy.ma.MaskedArray`` neither: its mask
            would be ignored), is in memory the CPU cannot read (a CUDA tensor) or has a wrong
            dtype; ``causal``, ``return_lse`` or ``fp32_probabilities`` is not a bool;
            ``scale`` is not a real number; ``causal_alignment`` or ``implementation`` is not a
            str (the message names the argument).
        ValueError: a wrong rank or shape, Hq not a multiple of Hkv, a non-finite scale, an unknown
            ``causal_alignment`` or ``implementation`` (the message names the argument).
    """
    return _core.flash_attention(
        q,
        k,
        v,
        causal=causal,
        causal_alignment=causal_alignment,
        scale=scale,
        bias=bias,
        return_lse=return_lse,
        sliding_window=sliding_window,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        sinks=sinks,
        k_scale=k_scale,
        v_scale=v_scale,
        fp32_probabilities=fp32_probabilities,
        implementation=implementation,
    )


@overload
def flash_attention_backward(
    dout: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    out: np.ndarray,
    lse: np.ndarray,
    *,
    causal: bool = ...,
    causal_alignment: CausalAlignment = ...,
    scale: float | None = ...,
    bias: np.ndarray | None = ...,
    return_dbias: Literal[False] = ...,
    sliding_window: tuple[int, int] = ...,
    softcap: float = ...,
    alibi_slopes: np.ndarray | None = ...,
    sinks: np.ndarray | None = ...,
    return_dsinks: Literal[False] = ...,
    fp32_probabilities: bool = ...,
    implementation: Implementation = ...,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
@overload
def flash_attention_backward(
    dout: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    out: np.ndarray,
    lse: np.ndarray,
    *,
    causal: bool = ...,
    causal_alignment: CausalAlignment = ...,
    scale: float | None = ...,
    bias: np.ndarray | None = ...,
    return_dbias: bool = ...,
    sliding_window: tuple[int, int] = ...,
    softcap: float = ...,
    alibi_slopes: np.ndarray | None = ...,
    sinks: np.ndarray | None = ...,
    return_dsinks: bool = ...,
    fp32_probabilities: bool = ...,
    implementation: Implementation = ...,
) -> tuple[np.ndarray, ...]: ...


def flash_attention_backward(
    dout,
    q,
    k,
    v,
    out,
    lse,
    *,
    causal=False,
    causal_alignment="top_left",
    scale=None,
    bias=None,
    return_dbias=False,
    sliding_window=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    sinks=None,
    return_dsinks=False,
    fp32_probabilities=False,
    implementation="automatic",
):
    """Gradients of :func:`flash_attention` with respect to q, k, v (and the bias or the sinks).

    ``out`` and ``lse`` are what ``flash_attention(q, k, v, ..., return_lse=True)`` returned for
    the same arguments; the probabilities are recomputed from them (FlashAttention-2), so no
    M x N buffer is kept. ``dout`` is the gradient of the loss with respect to ``out``.

    Shapes and dtypes:
        dout, q and out: ``[B, Hq, M, D]``; k, v: ``[B, Hkv, N, D]``; lse: float32 ``[B, Hq, M]``.
        dout, q, k, v and out share one dtype (float32, float16 or ``ml_dtypes.bfloat16``; not
        fp8); accumulation is float32. Strides as for :func:`flash_attention`.

    Args:
        causal, causal_alignment, scale, bias, sliding_window, softcap, alibi_slopes, sinks,
            implementation: as for :func:`flash_attention`, and they must be the values the
            forward was called with. With a softcap the gradient passes through its derivative
            ``1 - tanh^2``; ALiBi adds a constant per (query, key), so it changes P only (the
            slopes get no gradient); the window masks as in the forward.
        return_dbias: also return the gradient with respect to ``bias``: float32, of the bias's
            own shape ``[B|1, Hq|1, M|1, N]`` (summed over its broadcast dimensions). Needs a bias.
        return_dsinks: also return the gradient with respect to ``sinks``: float32 ``[Hq]``,
            ``-sum over (b, i) of exp(sink - lse) * rowsum(dout * out)``. Needs sinks.
        fp32_probabilities: bfloat16 on CPUs whose bf16 dot products outrun their fp32 FMAs
            (:func:`prefers_bf16_dot_products`): the generated kernel rounds P and dS to bfloat16
            before ``dV = P^T dO``, ``dK = dS^T Q`` and ``dQ = dS K`` (FlashAttention's mixed
            precision), so that all five products run on bf16 dot products; True keeps P and dS in
            float32 for those three. ``q @ k^T`` and ``dO @ V^T`` are exact products either way.
            On other CPUs, other dtypes and the reference they stay float32 (fp32 FMAs).

    Returns:
        ``(dq, dk, dv)``, then ``dbias`` and ``dsinks`` when asked for: new C-contiguous arrays,
        dq of q's shape, dk and dv of k's shape, all of q's dtype. With GQA/MQA, dk and dv of a kv
        head sum over the query heads that read it. Masked (query, key) pairs contribute nothing;
        a fully masked row gives zero gradients. NaN and inf in the inputs propagate; with score
        options, as in the forward, NaN or inf in a masked key, value or row reaches no gradient.
        The results are the same bits for every thread count and every run.

    Raises:
        TypeError: an argument is not an array or has a wrong dtype (the message names it).
        ValueError: a wrong rank or shape (e.g. lse not ``[B, Hq, M]``, dout not the shape of q),
            ``return_dbias`` without a bias, ``return_dsinks`` without sinks, or any error
            :func:`flash_attention` would raise.
    """
    return _core.flash_attention_backward(
        dout,
        q,
        k,
        v,
        out,
        lse,
        causal=causal,
        causal_alignment=causal_alignment,
        scale=scale,
        bias=bias,
        return_dbias=return_dbias,
        sliding_window=sliding_window,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        sinks=sinks,
        return_dsinks=return_dsinks,
        fp32_probabilities=fp32_probabilities,
        implementation=implementation,
    )


def flash_attention_implementation(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = False,
    causal_alignment: CausalAlignment = "top_left",
    scale: float | None = None,
    bias: np.ndarray | None = None,
    return_lse: bool = False,
    sliding_window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    fp32_probabilities: bool = False,
) -> str:
    """Which implementation :func:`flash_attention` would run for these arguments with
    ``implementation="automatic"``: ``"generated"``, ``"reference"``, or ``"paged"`` (fp8 k/v;
    score options on decode-sized calls, with non-finite values in v, or bf16 with
    ``fp32_probabilities``; decode, M == 1 without a bias). Validates like
    :func:`flash_attention` and raises the same errors; reads v for non-finite values when there
    are score options, computes nothing."""
    return _core.flash_attention_implementation(
        q,
        k,
        v,
        causal=causal,
        causal_alignment=causal_alignment,
        scale=scale,
        bias=bias,
        return_lse=return_lse,
        sliding_window=sliding_window,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        sinks=sinks,
        k_scale=k_scale,
        v_scale=v_scale,
        fp32_probabilities=fp32_probabilities,
    )


def flash_attention_kernel(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = False,
    causal_alignment: CausalAlignment = "top_left",
    scale: float | None = None,
    bias: np.ndarray | None = None,
    return_lse: bool = False,
    sliding_window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    fp32_probabilities: bool = False,
) -> str | None:
    """The name of the generated kernel :func:`flash_attention` would run for these arguments
    with ``implementation="automatic"`` (for instance ``"flash_fwd_bf16_fp32_probabilities_tall"``,
    whose lowered statement and assembly ``ninja <name>_listings`` writes to
    ``listings/<name>.stmt`` and ``.s`` in the build's ``generators`` directory), or None when the
    call runs on the paged kernel or the reference (see :func:`flash_attention_implementation`).
    The choice may depend on :func:`num_threads`. Validates like :func:`flash_attention` and
    raises the same errors; computes nothing."""
    return _core.flash_attention_kernel(
        q,
        k,
        v,
        causal=causal,
        causal_alignment=causal_alignment,
        scale=scale,
        bias=bias,
        return_lse=return_lse,
        sliding_window=sliding_window,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        sinks=sinks,
        k_scale=k_scale,
        v_scale=v_scale,
        fp32_probabilities=fp32_probabilities,
    )


def blocksparse_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    layout: BlockSparseLayout,
    *,
    cu_seqlens_q: np.ndarray,
    cu_seqlens_k: np.ndarray,
    scale: float | None = None,
    out: np.ndarray | None = None,
    fp32_probabilities: bool = False,
    implementation: Implementation = "automatic",
) -> np.ndarray:
    """Block-sparse attention over packed variable-length sequences; only the layout's blocks are
    read and computed.

    Shapes and dtypes:
        q: ``[total_q, Hq, D]``; k, v: ``[total_k, Hkv, D]`` (sequences packed along dim 0). Hq
        must be a multiple of Hkv (query head h reads kv head ``h // (Hq // Hkv)``);
        1 <= D <= 256. q, k and v share one dtype: float32, float16 or ``ml_dtypes.bfloat16``;
        accumulation is float32.
        cu_seqlens_q, cu_seqlens_k: integer arrays ``[num_seqs + 1]`` (values int32): 0 first,
        non-decreasing, last ``total_q`` (``total_k``). Sequence s has queries
        ``q[cu_seqlens_q[s]:cu_seqlens_q[s+1]]`` and keys ``k[cu_seqlens_k[s]:cu_seqlens_k[s+1]]``,
        with q_len <= k_len.

    Semantics:
        A sequence's keys are positions ``0 .. k_len-1``; its queries are its last q_len
        positions (bottom-right alignment; q_len 1 is decode). Query position i sees key position
        j iff block ``(i // block_size, j // block_size)`` is kept in the layout head of the query
        head and, for a causal layout, ``j <= i``. The layout has Hq heads (query head h uses
        head h), Hkv heads (it uses its kv head's) or 1, and must cover the longest sequence
        (``layout.max_seqlen >= k_len``). A query that sees no key gives 0; NaN and inf propagate
        as in :func:`flash_attention`. Blocks absent from the layout are never read. See
        docs/blocksparse.md.

    Args:
        layout: a :class:`BlockSparseLayout`.
        scale: multiplies ``q @ k^T`` before the softmax; default ``1 / sqrt(D)``; must be finite.
        out: when given, a writeable ``[total_q, Hq, D]`` array of q's dtype that tilelab can
            write in place (it is returned); default a new C-contiguous array.
        fp32_probabilities: bfloat16: keep P in float32 instead of rounding it to bfloat16 for
            bf16 dot products (as in :func:`flash_attention`).
        implementation: ``"automatic"``, ``"generated"`` (ValueError when no generated kernel
            covers the call) or ``"reference"``.

    Raises:
        TypeError: an argument is not a numpy array or has a wrong dtype (the message names it).
        ValueError: a wrong rank or shape, bad cu_seqlens (first not 0, decreasing, last not the
            total, different lengths, q_len > k_len), a layout with a wrong head count or too
            short for a sequence, a non-finite scale (the message names the argument).
    """
    return _core.blocksparse_attention(
        q,
        k,
        v,
        layout,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        scale=scale,
        out=out,
        fp32_probabilities=fp32_probabilities,
        implementation=implementation,
    )


def blocksparse_attention_kernels(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    layout: BlockSparseLayout,
    *,
    cu_seqlens_q: np.ndarray,
    cu_seqlens_k: np.ndarray,
    scale: float | None = None,
    fp32_probabilities: bool = False,
    implementation: Implementation = "automatic",
) -> list[str]:
    """The names of the generated kernels :func:`blocksparse_attention` would run for these
    arguments (``implementation`` included), sorted: one per kind of task the call's sequences
    make (decode, or prefill in 32- or 64-row tasks), for instance
    ``["blocksparse_bf16_decode", "blocksparse_bf16_prefill_fp32_probabilities_tall"]``. ``ninja
    <name>_listings`` writes a kernel's lowered statement and assembly to ``listings/<name>.stmt``
    and ``.s`` in the build's ``generators`` directory. With ``"automatic"``, ``["paged"]`` when
    the call is decode (one query per sequence), which runs on the paged kernel's streamed
    micro-kernels on CPUs with AVX2, FMA and F16C (docs/blocksparse.md); ``"generated"`` names
    the generated decode kernels instead. Empty when the call runs on the reference (always with
    ``"reference"``). The choice may depend on :func:`num_threads`. Validates like
    :func:`blocksparse_attention` and raises the same errors (also ValueError for
    ``"generated"`` on a call no generated kernel covers); computes nothing."""
    return _core.blocksparse_attention_kernels(
        q,
        k,
        v,
        layout,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        scale=scale,
        fp32_probabilities=fp32_probabilities,
        implementation=implementation,
    )


def paged_attention(
    query: np.ndarray,
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    block_table: np.ndarray,
    seq_lens: np.ndarray,
    query_start_loc: np.ndarray,
    *,
    scale: float | None = None,
    causal: bool = True,
    sliding_window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    split_kv: int | Literal["auto"] = "auto",
    fp32_probabilities: bool = False,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Attention over a paged KV cache (vLLM's layout): variable-length sequences, prefill and
    decode mixed in one batch. docs/paged_attention.md has the full contract.

    Shapes and dtypes:
        query: ``[num_tokens, Hq, D]`` (sequences packed along dim 0), float32, float16 or
        ``ml_dtypes.bfloat16``; 1 <= D <= 512.
        key_cache, value_cache: ``[num_blocks, Hkv, block_size, D]``, the query's dtype or
        ``ml_dtypes.float8_e4m3fn`` / ``float8_e5m2`` (both the same); any block_size >= 1; Hq a
        multiple of Hkv (query head h reads kv head ``h // (Hq // Hkv)``).
        block_table: integer ``[num_seqs, max_blocks_per_seq]``; seq_lens: ``[num_seqs]`` (context
        plus new tokens); query_start_loc: ``[num_seqs + 1]`` (0 first, non-decreasing, last
        num_tokens). Values must fit int32.

    Semantics:
        Sequence s has query tokens ``query[query_start_loc[s]:query_start_loc[s+1]]`` at its last
        positions (``q_len <= seq_len``); its key at position j is in cache block
        ``block_table[s, j // block_size]`` at offset ``j % block_size``; only the first
        ``ceil(seq_len / block_size)`` entries of a row are read, each in ``[0, num_blocks)``.
        Scores ``s = scale * q.k`` (k dequantized with k_scale), then softcap, ALiBi, the causal
        mask and the sliding window, and sinks in the denominator, as documented once in
        docs/attention_options.md. NaN and inf propagate; a query that sees no key gives 0.

    Args:
        scale: multiplies ``q @ k^T``; default ``1 / sqrt(D)``; must be finite.
        causal: query position i sees keys ``j <= i`` (default); False: every key of its sequence.
        sliding_window: ``(left, right)``: key j visible iff ``i - left <= j <= i + right``; -1
            is unbounded.
        softcap: ``s = softcap * tanh(s / softcap)`` when > 0.
        alibi_slopes, sinks: float32 ``[Hq]`` or None.
        k_scale, v_scale: dequantization scales of fp8 caches (1.0 for other caches).
        split_kv: ``"auto"`` or a number of pieces >= 1 each work item's keys are split into
            (split-KV decoding); results do not depend on the thread count beyond fp32 summation
            order and are identical run to run.
        fp32_probabilities: bfloat16 on CPUs whose bf16 dot products outrun their fp32 FMAs
            (:func:`prefers_bf16_dot_products`): P is rounded to bfloat16 before P @ V unless
            this is True, both on the generated prefill kernels (sequences with at least 16 query
            rows per kv head) and on the paged kernel (decode and short queries, whose products
            then run on bf16 dot products); with an fp8 cache, on every CPU with AVX-512 BF16.
            Elsewhere P stays float32. As :func:`flash_attention`'s.
        out: a writeable ``[num_tokens, Hq, D]`` array of query's dtype written in place (and
            returned); default a new array.

    Raises:
        TypeError: an argument is not an array or has a wrong dtype or type (named).
        ValueError: wrong shapes, inconsistent lengths, block-table entries out of range, bad
            option values (named, with the value given and what is allowed).
    """
    return _core.paged_attention(
        query,
        key_cache,
        value_cache,
        block_table,
        seq_lens,
        query_start_loc,
        scale=scale,
        causal=causal,
        sliding_window=sliding_window,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        sinks=sinks,
        k_scale=k_scale,
        v_scale=v_scale,
        split_kv=split_kv,
        fp32_probabilities=fp32_probabilities,
        out=out,
    )


def reshape_and_cache_flash(
    key: np.ndarray,
    value: np.ndarray,
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    slot_mapping: np.ndarray,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Writes ``key[t]`` and ``value[t]`` (``[num_tokens, Hkv, D]``) into the paged caches
    ``[num_blocks, Hkv, block_size, D]`` at slot ``slot_mapping[t]`` (block ``slot //
    block_size``, offset ``slot % block_size``), in place. Negative slots are skipped; others
    must be ``< num_blocks * block_size``; the later of two tokens naming one slot wins.

    An fp8 cache (``ml_dtypes.float8_e4m3fn`` / ``float8_e5m2``) stores ``key / k_scale``
    (``value / v_scale``) rounded to nearest even; finite values beyond the format saturate to its
    largest finite value, NaN stays NaN, inf stays inf in e5m2 and becomes NaN in e4m3fn. Caches
    of the key's dtype store the values as they are (the scales must be 1.0).
    """
    _core.reshape_and_cache_flash(
        key, value, key_cache, value_cache, slot_mapping, k_scale=k_scale, v_scale=v_scale
    )


def set_num_threads(n: int) -> None:
    """Sets the number of threads every tilelab kernel uses: an int in ``[1, 8 x the processor
    count]``, else ValueError (TypeError for a non-int, bool included). The count is
    process-wide: tilelab's generated kernels and reference share one OpenMP pool."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"n: expected an int thread count, got {type(n).__name__} {n!r}")
    if not -(2**31) <= n < 2**31:  # beyond C int: the message the C++ check gives
        raise ValueError(f"n: expected a thread count in [1, {_core.max_num_threads()}], got {n}")
    _core.set_num_threads(int(n))


def num_threads() -> int:
    """The number of threads tilelab uses (OpenMP's default until :func:`set_num_threads`)."""
    return _core.num_threads()


def prefers_bf16_dot_products() -> bool:
    """Whether this CPU's bf16 dot products (AVX-512 BF16) outrun its fp32 FMAs (AMD Zen 4 and
    later), so that bfloat16 calls without ``fp32_probabilities`` round the probabilities P to
    bfloat16 and run on them. False on Intel's CPUs (their bf16 dot products run at half the FMA
    rate or less) and on CPUs without AVX-512 BF16: there P stays float32 on fp32 FMAs. Decided by
    the CPU's features and vendor, once per process."""
    return _core.prefers_bf16_dot_products()
