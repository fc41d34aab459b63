"""tilelab.nki: vLLM's NKI flash paged attention kernel (prefix prefill with a paged KV cache,
block tables, continuous batching through a mask) with the same layouts and numerics, run as CPU
code generated from one Halide algorithm with either of two schedules.

Arrays are numpy arrays or any object with ``__dlpack__`` or the buffer protocol (torch CPU
tensors, memoryviews), read in place; attention tensors are float32 or bfloat16
(``ml_dtypes.bfloat16``). Work runs on tilelab's OpenMP pool with the GIL released.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from .. import _core

__all__ = [
    "MASKED_SCORE",
    "flash_paged_attention",
    "reorder_context_mask",
    "reshape_and_cache",
]

#: The score of a masked (query, key) pair, as in the NKI kernel (finite: a fully masked row
#: averages V over every key instead of giving 0).
MASKED_SCORE = -9984.0

Schedule = Literal["cpu", "tile"]


def _as_numpy(array, name: str):
    """An object with __dlpack__ or the buffer protocol as a numpy array over its memory (as
    every attention tensor is taken); anything else unchanged, for _require_int_array to judge."""
    converted = _core._as_array(array, name)
    return array if converted is None else converted


def _require_int_array(array, name: str, *, allow_bool: bool = False) -> None:
    if isinstance(array, np.ma.MaskedArray):
        raise TypeError(
            f"{name}: expected a numpy.ndarray, got a numpy.ma.MaskedArray (its mask would be "
            "ignored; pass .filled(value) or .data)"
        )
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray, got {type(array).__name__}")
    kinds = "biu" if allow_bool else "iu"
    if array.dtype.kind not in kinds:
        allowed = "bool or integer" if allow_bool else "integer"
        raise TypeError(f"{name}: expected a {allowed} array, got dtype {array.dtype}")
    if array.ndim == 0:
        raise ValueError(f"{name}: expected an array of rank >= 1, got a 0-d array")


def _fits_int32(array: np.ndarray) -> bool:
    if array.dtype.kind not in "iu" or not array.size:
        return True
    return -(2**31) <= int(array.min()) and int(array.max()) < 2**31


def _as_int32(array, name: str) -> np.ndarray:
    """An integer index array (block tables, slot mappings) as C-contiguous int32."""
    array = _as_numpy(array, name)
    _require_int_array(array, name)
    if not _fits_int32(array):
        low, high = int(array.min()), int(array.max())
        raise ValueError(f"{name}: expected values that fit int32, got [{low}, {high}]")
    return np.ascontiguousarray(array, dtype=np.int32)


def _mask_as_int32(mask) -> np.ndarray:
    """A bool or integer mask (nonzero = attend) as C-contiguous int32 with the same zeros."""
    mask = _as_numpy(mask, "mask")
    _require_int_array(mask, "mask", allow_bool=True)
    if not _fits_int32(mask):
        mask = mask != 0
    return np.ascontiguousarray(mask, dtype=np.int32)


def _require_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}")
    return int(value)


def flash_paged_attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    kv_cache: np.ndarray,
    block_tables: np.ndarray,
    mask: np.ndarray,
    softmax_scale: float | None = None,
    mixed_precision: bool = True,
    LARGE_TILE_SZ: int = 2048,  # noqa: N803 (the NKI kernel's name)
    *,
    schedule: Schedule = "cpu",
    skip_masked_tiles: bool = True,
) -> np.ndarray:
    """Flash paged attention forward, as vLLM's NKI kernel ``flash_paged_attention``.

    Layouts (batch is 1: requests are concatenated along the sequence):
        query ``(1, n_heads, d, seq_q)``, key ``(1, n_kv_heads, d, seq_q)``,
        value ``(1, n_kv_heads, seq_q, d)``, kv_cache ``(2, num_blocks, n_kv_heads, block_size, d)``
        (0 keys, 1 values), block_tables ``(num_active_blocks,)`` integers (prior-context token
        t is in cache block ``block_tables[t // block_size]`` at ``t % block_size``), mask
        ``(seq_q, num_active_blocks * block_size + seq_q)`` bool (True = attend) or integers of any
        width (nonzero = attend), its context columns already reordered with
        :func:`reorder_context_mask`. Returns a new ``(1, n_heads, seq_q, d)`` array of query's
        dtype.

    Semantics: for query i of head h (kv head ``h // (n_heads // n_kv_heads)``), softmax over the
    prior context followed by the new tokens of ``softmax_scale * q·k`` where the mask is set and
    ``-9984.0`` where it is not (so a fully masked padding row averages V), times V. As in the NKI
    kernel, blocks of ``min(seq_q, 512)`` new-token columns wholly right of a 128-row query
    tile's first row are never computed (they score -9984): causal masks never see this. NaN in
    a row's query or in a key it attends to (or q·k overflowing to +inf) makes that row NaN, as
    IEEE arithmetic does; masked keys never contribute.

    Args:
        softmax_scale: multiplies q; default ``1 / sqrt(d)``.
        mixed_precision: bf16 tensor-engine operands (q·scale, K, V and P rounded to nearest
            even) with float32 accumulation and softmax statistics, output rounded to bf16. False:
            float32 throughout (the NKI kernel computes in the input dtype: the same for float32
            inputs; for bfloat16 inputs tilelab keeps the statistics in float32).
        LARGE_TILE_SZ: prior-context tokens per large tile: a multiple of 512 in [512, 8192] and
            of block_size, with LARGE_TILE_SZ / block_size a power of two.
        schedule: ``"cpu"`` (tuned for x86) or ``"tile"`` (the NeuronCore tiling); the same
            algorithm and rounding points.
        skip_masked_tiles: the cpu schedule leaves out a (32-row query block, large tile) pair
            whose scores are all masked when that provably changes no output bit (every row of
            the block sees a key and the scores and values are small enough that the left-out
            exp(-9984 - max) terms are exactly 0); otherwise it computes the pair. False computes
            every pair, as the NKI kernel does (the same output, for comparisons and benchmarks).
            The tile schedule always computes every pair.

    Constraints (the NKI kernel's): d <= 128; seq_q a multiple of 128 (of 512 above 512, of 2048
    above 4096); block_size a power of two <= 256; ``num_active_blocks * block_size`` a positive
    multiple of LARGE_TILE_SZ; block table entries in ``[0, num_blocks)``; all attention tensors
    share one dtype.

    Raises:
        TypeError: an argument is not a numpy array or has a wrong dtype.
        ValueError: a violated constraint; the message names the argument and the reason.
    """
    return _core.nki.flash_paged_attention(
        query,
        key,
        value,
        kv_cache,
        _as_int32(block_tables, "block_tables"),
        _mask_as_int32(mask),
        softmax_scale=softmax_scale,
        mixed_precision=mixed_precision,
        LARGE_TILE_SZ=_require_int(LARGE_TILE_SZ, "LARGE_TILE_SZ"),
        schedule=schedule,
        skip_masked_tiles=skip_masked_tiles,
    )


def reorder_context_mask(mask: np.ndarray, LARGE_TILE_SZ: int, block_size: int) -> np.ndarray:  # noqa: N803
    """The mask with its context columns in the order the kernel consumes them (new array, same
    dtype as ``mask``).

    ``mask`` is ``(seq_q, context_len + seq_q)``. Within each group of ``128 * tiled_block_size``
    context columns, column ``tb * 128 + p`` takes original column ``p * tiled_block_size + tb``
    (``tiled_block_size = LARGE_TILE_SZ // max(128, LARGE_TILE_SZ // block_size)``): one
    128-partition KV load puts a piece of a block on each partition and the tensor engine
    consumes a column of partitions at a time. The new tokens' columns are unchanged.
    ValueError when context_len is not a multiple of LARGE_TILE_SZ or the sizes do not tile.
    """
    mask = _as_numpy(mask, "mask")
    _require_int_array(mask, "mask", allow_bool=True)
    LARGE_TILE_SZ = _require_int(LARGE_TILE_SZ, "LARGE_TILE_SZ")  # noqa: N806
    block_size = _require_int(block_size, "block_size")
    if not _fits_int32(mask):
        # Values beyond int32 (still valid: nonzero = attend) keep their values: the column
        # order is found on an int32 array of column numbers and applied to the mask.
        columns = np.broadcast_to(np.arange(mask.shape[-1], dtype=np.int32), mask.shape)
        order = _core.nki.reorder_context_mask(
            np.ascontiguousarray(columns), LARGE_TILE_SZ, block_size
        )
        return mask[:, order[0]]
    reordered = _core.nki.reorder_context_mask(_mask_as_int32(mask), LARGE_TILE_SZ, block_size)
    return reordered.astype(mask.dtype, copy=False)


def reshape_and_cache(
    key: np.ndarray, value: np.ndarray, kv_cache: np.ndarray, slot_mapping: np.ndarray
) -> None:
    """Writes ``key[t]`` and ``value[t]`` (``(num_tokens, n_kv_heads, d)``) into ``kv_cache``
    (``(2, num_blocks, n_kv_heads, block_size, d)``, updated in place) at slot
    ``slot_mapping[t]``: block ``slot // block_size``, offset ``slot % block_size``. Negative slots
    (vLLM's padding slot -1) are skipped; a repeated slot keeps the later token. key, value and
    kv_cache share one dtype (float32, float16 or bfloat16); kv_cache must be writable with
    non-negative element strides. ValueError for slots ``>= num_blocks * block_size``."""
    _core.nki.reshape_and_cache(key, value, kv_cache, _as_int32(slot_mapping, "slot_mapping"))
