"""tilelab.nki.language (``nl``): the NKI language, traced into the simulator's tile programs.

Names follow ``neuronxcc.nki.language``. An operation that tilelab does not implement raises
NotImplementedError naming it and the kernel's file:line when it is called.
"""

from __future__ import annotations

import builtins
import itertools
import math
from typing import Any

import ml_dtypes
import numpy as np

from . import _trace
from ._trace import (
    Deferred,
    DynSlice,
    HbmAccess,
    HbmTensor,
    IndexExpr,
    NkiError,
    Tile,
    TileAccess,
    as_access,
    fail,
    materialize_zero,
    mgrid,
    new_tile,
    tracer,
    unsupported,
)

__all__ = [
    "affine_range",
    "arange",
    "bfloat16",
    "bool_",
    "ds",
    "float8_e4m3",
    "float16",
    "float32",
    "hbm",
    "int32",
    "load",
    "mgrid",
    "ndarray",
    "par_dim",
    "private_hbm",
    "program_id",
    "psum",
    "sbuf",
    "sequential_range",
    "shared_hbm",
    "static_range",
    "store",
    "tile_size",
    "uint8",
    "zeros",
]

# --- dtypes and buffers -------------------------------------------------------------------------

float32 = np.float32
bfloat16 = ml_dtypes.bfloat16
float16 = np.float16
float8_e4m3 = ml_dtypes.float8_e4m3fn
int32 = np.int32
uint8 = np.uint8
bool_ = np.bool_
tfloat32 = np.float32  # stored as fp32 on the simulated machine


class _Buffer:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"nl.{self.name}"


sbuf = _Buffer("sbuf")
psum = _Buffer("psum")
hbm = _Buffer("hbm")
private_hbm = hbm
shared_hbm = _Buffer("shared_hbm")


class par_dim:  # noqa: N801 - the NKI name
    """Marks the partition dimension of a tile array's shape: (blocks..., par_dim(P), free...)."""

    def __init__(self, size: int):
        self.size = int(size)

    def __index__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"par_dim({self.size})"


class _TileSize:
    pmax = 128
    psum_fmax = 512
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512


tile_size = _TileSize()

# --- loops and the SPMD grid --------------------------------------------------------------------


def affine_range(*args):
    return builtins.range(*args)


def sequential_range(*args):
    return builtins.range(*args)


def static_range(*args):
    return builtins.range(*args)


def program_id(axis: int) -> int:
    t = tracer()
    if not 0 <= axis < len(t.grid):
        raise fail(f"program_id({axis}): the launch grid has {len(t.grid)} dimension(s)")
    return t.program_id[axis]


def num_programs(axes: int | None = None) -> int | tuple[int, ...]:
    t = tracer()
    return t.grid if axes is None else t.grid[axes]


def program_ndim() -> int:
    return len(tracer().grid)


def arange(*args) -> IndexExpr:
    return _trace.arange(*args)


def ds(start: int, size: int) -> DynSlice:
    return DynSlice(start, size)


# --- allocation ---------------------------------------------------------------------------------


def _split_shape(shape) -> tuple[tuple[int, ...], int]:
    """(shape with par_dim resolved, index of the partition dim)."""
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    if all(type(s) is int for s in shape):
        return tuple(shape), 0
    marked = [i for i, s in enumerate(shape) if isinstance(s, par_dim)]
    if len(marked) > 1:
        raise fail(f"shape {shape}: at most one par_dim")
    plain = tuple(int(s) for s in shape)
    return plain, (marked[0] if marked else 0)


def ndarray(shape, dtype, *, buffer=sbuf, name: str = "", **kwargs) -> Tile | HbmTensor:
    if kwargs:
        raise unsupported(f"nl.ndarray({', '.join(kwargs)}=...)")
    t = tracer()
    t.flush()
    dtype = _trace.np_dtype(dtype)
    plain, blocks = _split_shape(shape)
    if buffer in (shared_hbm, hbm):
        kind = "output" if buffer is shared_hbm else "private"
        site = _trace._user_frames()
        key = (site, plain, dtype, kind)
        existing = t.shared_outputs.get(key)
        if existing is not None and kind == "output":
            return existing  # SPMD instances share one output
        tensor_name = name or f"{kind}{len(t.shared_outputs)}"
        tensor = t.hbm_tensor(tensor_name, plain, dtype, kind)
        t.shared_outputs[key] = tensor
        return tensor
    if buffer not in (sbuf, psum):
        raise fail(
            f"nl.ndarray: buffer must be nl.sbuf, nl.psum, nl.hbm or nl.shared_hbm, got {buffer!r}",
            TypeError,
        )
    return new_tile(plain, dtype, buffer.name, _trace._user_frames(), blocks)


def zeros(
    shape, dtype, *, buffer=sbuf, name: str = "", lazy_initialization: bool = False, **kwargs
) -> Tile:
    """lazy_initialization=True (undocumented in NKI; vLLM writes such buffers before reading
    them) emits no fill: the tile is uninitialized, and a functional run reads NaN from any
    element read before it is written."""
    if lazy_initialization:
        return ndarray(shape, dtype, buffer=buffer, name=name, **kwargs)
    return full(shape, 0.0, dtype, buffer=buffer, name=name, **kwargs)


def ones(shape, dtype, *, buffer=sbuf, name: str = "", **kwargs) -> Tile:
    return full(shape, 1.0, dtype, buffer=buffer, name=name, **kwargs)


def full(shape, fill_value, dtype, *, buffer=sbuf, name: str = "", **kwargs) -> Tile:
    tile = ndarray(shape, dtype, buffer=buffer, name=name, **kwargs)
    if isinstance(tile, HbmTensor):
        raise fail(
            "nl.zeros/nl.full in HBM are not supported; allocate with nl.ndarray",
            NotImplementedError,
        )
    if tile.memory == "psum" and fill_value == 0:
        tile.pending_zero = True  # the first matmul into it overwrites instead of accumulating
    else:
        tracer().emit("nki_memset", tile.whole().ref(), float(fill_value), "vector")
    return tile


# --- data movement ------------------------------------------------------------------------------


def _no_mask(mask, op: str) -> None:
    if mask is not None:
        raise unsupported(f"{op}(mask=...)")


def load(src, *, mask=None, dtype=None, **kwargs) -> Deferred:
    tracer()  # outside a traced kernel: RuntimeError
    if kwargs:
        raise unsupported(f"nl.load({', '.join(kwargs)}=...)")
    if isinstance(src, HbmTensor):
        src = src[...]
    if not isinstance(src, HbmAccess):
        raise fail(
            f"nl.load: src must be an HBM tensor (indexed), got {type(src).__name__}", TypeError
        )
    t = tracer()
    if len(src.shape) < 1 or src.shape[0] > t.machine["partitions"]:
        raise fail(
            f"nl.load: the first (partition) dimension of the access is {src.shape[0]}, "
            f"more than pmax = {t.machine['partitions']}"
        )

    def emit(dst: TileAccess) -> None:
        if src.indirect is not None:
            row_offset, rows, cols, index, col0 = src.gather("nl.load")
            tracer().emit(
                "nki_dma_gather", dst.ref(), src.tensor.id, row_offset, rows, cols, index, col0
            )
        else:
            tracer().emit("nki_dma", dst.ref(), src.pattern("nl.load"), "sync", -1)

    shape = src.shape if len(src.shape) > 1 else (src.shape[0], 1)
    return Deferred("nl.load", emit, shape, src.dtype if dtype is None else dtype, mask=mask)


def load_transpose2d(src, *, mask=None, dtype=None, **kwargs) -> Deferred:
    """src[rows, cols] loaded as [cols, rows] (cols on partitions). On NeuronCore-v2 this is a
    DMA whose partitions each gather one element per row: far less efficient than a plain load,
    as the NKI performance guide warns, and modelled as exactly that access pattern."""
    tracer()
    if isinstance(src, HbmTensor):
        src = src[...]
    if not isinstance(src, HbmAccess) or src.indirect is not None or len(src.dims) != 2:
        raise fail("nl.load_transpose2d: src must be a 2-D HBM access", TypeError)
    flipped = HbmAccess(
        src.tensor,
        src.offset,
        [src.dims[1], src.dims[0]],
        tuple(reversed(src.aranges)) if src.aranges else (),
        tuple(reversed(src.limits)) if src.limits else (),
    )
    return load(flipped, mask=mask, dtype=dtype, **kwargs)


def store(dst, value, *, mask=None, **kwargs) -> None:
    tracer()  # outside a traced kernel: RuntimeError
    if kwargs:
        raise unsupported(f"nl.store({', '.join(kwargs)}=...)")
    if isinstance(dst, HbmTensor):
        dst = dst[...]
    if not isinstance(dst, HbmAccess):
        raise fail(
            f"nl.store: dst must be an HBM tensor (indexed), got {type(dst).__name__}", TypeError
        )
    if dst.indirect is not None:
        raise unsupported("nl.store to an indirect (scattered) destination")
    if dst.tensor.kind == "input":
        raise fail(
            f"nl.store: '{dst.tensor.name}' is a kernel input; kernels write only the HBM "
            "tensors they allocate (nl.ndarray(..., buffer=nl.shared_hbm))"
        )
    src = as_access(value, "nl.store value")
    if src.memory == "psum":  # the compiler copies PSUM to SBUF first
        src = _copy_into_new(src, src.dtype)
    if src.partitions != dst.shape[0] or src.free_size != math.prod(dst.shape[1:]):
        raise fail(
            f"nl.store: value of shape {src.shape} does not match the destination's "
            f"shape {dst.shape}"
        )
    t = tracer()
    t.flush()
    materialize_zero(src)
    outer, t.mask = t.mask, _trace.as_mask(mask)
    try:
        t.emit("nki_dma", dst.pattern("nl.store"), src.ref(), "sync", -1)
    except _trace.MaskedOutError:
        pass
    finally:
        t.mask = outer


def _copy_into_new(src: TileAccess, dtype) -> TileAccess:
    dst = new_tile(src.shape, dtype, "sbuf", _trace._user_frames()).whole()
    materialize_zero(src)
    tracer().emit("nki_tensor_copy", dst.ref(), src.ref(), "vector")
    return dst


def copy(src, *, dtype=None, mask=None, **kwargs) -> Deferred:
    if kwargs:
        raise unsupported(f"nl.copy({', '.join(kwargs)}=...)")
    src = as_access(src, "nl.copy")

    def emit(dst: TileAccess) -> None:
        materialize_zero(src)
        tracer().emit("nki_tensor_copy", dst.ref(), src.ref(), "vector")

    return Deferred("nl.copy", emit, src.shape, src.dtype if dtype is None else dtype, mask=mask)


# --- TensorE ------------------------------------------------------------------------------------


def _is_matmul(value: Deferred) -> bool:
    return value.name in ("nl.matmul", "nisa.nc_matmul")


def _matmul(name: str, stationary: TileAccess, moving: TileAccess) -> Deferred:
    t = tracer()
    if stationary.partitions != moving.partitions:
        raise fail(
            f"{name}: the contraction (partition) sizes differ: stationary "
            f"{stationary.shape}, moving {moving.shape}"
        )
    if stationary.partitions > t.machine["matmul_max_contraction"]:
        raise fail(
            f"{name}: contraction size {stationary.partitions} exceeds "
            f"{t.machine['matmul_max_contraction']} (pmax)"
        )
    if stationary.free_size > t.machine["matmul_max_stationary_free"]:
        raise fail(
            f"{name}: stationary free size {stationary.free_size} exceeds "
            f"gemm_stationary_fmax = {t.machine['matmul_max_stationary_free']}"
        )
    if moving.free_size > t.machine["matmul_max_moving_free"]:
        raise fail(
            f"{name}: moving free size {moving.free_size} exceeds gemm_moving_fmax = "
            f"{t.machine['matmul_max_moving_free']}"
        )

    def emit(dst: TileAccess, accumulate: bool = False) -> None:
        if dst.memory != "psum":
            raise fail(f"{name}: the result is written to PSUM; assign it to a PSUM tile")
        tile = dst.tile
        if tile.pending_zero:
            if dst.covers_tile():
                tile.pending_zero = False
                accumulate = False
            else:
                _trace.prepare_write(dst)
        tracer().emit("nki_matmul", dst.ref(), stationary.ref(), moving.ref(), accumulate)

    return Deferred(name, emit, (stationary.free_size, moving.free_size), np.float32, "psum")


def matmul(x, y, *, transpose_x: bool = False, mask=None, **kwargs) -> Deferred:
    _no_mask(mask, "nl.matmul")
    if kwargs:
        raise unsupported(f"nl.matmul({', '.join(kwargs)}=...)")
    x = as_access(x, "nl.matmul x")
    y = as_access(y, "nl.matmul y")
    if not transpose_x:
        # x is [M, K]: the compiler transposes it on TensorE (through PSUM) into SBUF first.
        xt = _trace.as_access(transpose(x), "nl.matmul x")
        x = _copy_into_new(xt, x.dtype)
    return _matmul("nl.matmul", x, y)


def transpose(x, *, dtype=None, mask=None, **kwargs) -> Deferred:
    _no_mask(mask, "nl.transpose")
    if kwargs:
        raise unsupported(f"nl.transpose({', '.join(kwargs)}=...)")
    src = as_access(x, "nl.transpose")
    if src.memory != "sbuf":
        raise fail("nl.transpose: the input must be in SBUF (TensorE reads SBUF only)")
    integer = src.dtype.kind in "iu"
    if integer:
        # TensorE moves floats: integers go through fp32 (exact below 2^24) and come out as
        # fp32 in PSUM; assigning the result to an integer tile converts back.
        src = _copy_into_new(src, np.float32)

    def emit(dst: TileAccess) -> None:
        _trace.prepare_write(dst)
        tracer().emit("nki_pe_transpose", dst.ref(), src.ref())

    # NeuronCore-v2's PE array writes a transpose to PSUM in fp32 only.
    out_dtype = src.dtype if dtype is None or integer else _trace.np_dtype(dtype)
    if out_dtype.itemsize == 2 and not tracer().machine["pe_transpose_16bit_output_supported"]:
        out_dtype = np.dtype(np.float32)
    return Deferred("nl.transpose", emit, (src.free_size, src.partitions), out_dtype, "psum")


# --- element-wise and reductions ----------------------------------------------------------------

_ALU = {
    "add": "add",
    "subtract": "subtract",
    "multiply": "multiply",
    "divide": "divide",
    "true_divide": "divide",
    "maximum": "max",
    "minimum": "min",
    "max": "max",
    "min": "min",
    "amax": "max",  # np.max under numpy 1.x
    "amin": "min",
}


def alu_name(op, what: str) -> str:
    """The builder's ALU op for np.add / nl.add / 'add' and the like."""
    name = op if isinstance(op, str) else getattr(op, "__name__", None)
    if name in _ALU:
        return _ALU[name]
    raise fail(
        f"{what}: op {op!r} is not supported; allowed: np.add, np.subtract, np.multiply, "
        "np.divide, np.maximum, np.minimum (or the nl functions)",
        NotImplementedError,
    )


def _is_scalar(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating))


def _promote(a: np.dtype, b: np.dtype) -> np.dtype:
    """NKI's promotion of two tile dtypes (float beats int, the wider float wins, fp16 with bf16
    gives fp32)."""
    if a == b:
        return a
    floats = [
        d
        for d in (a, b)
        if d.kind == "f" or d in (np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e4m3fn))
    ]
    if len(floats) == 1:
        return floats[0]
    if len(floats) == 2:
        if a.itemsize != b.itemsize:
            return a if a.itemsize > b.itemsize else b
        return np.dtype(np.float32)
    return a if a.itemsize >= b.itemsize else b


def _binary(name: str, op: str, x, y, dtype, mask=None) -> Deferred:
    if _is_scalar(x) and _is_scalar(y):
        raise fail(f"nl.{name}: at least one operand must be a tile", TypeError)
    reverse = _is_scalar(x)
    if reverse:
        x, y = y, x
    a = as_access(x, f"nl.{name}")
    if _is_scalar(y):
        if reverse and op in ("subtract", "divide"):
            # s - a = (a * -1) + s; s / a needs a reciprocal first.
            if op == "subtract":
                return _tensor_scalar(
                    f"nl.{name}", a, "multiply", -1.0, "add", float(y), dtype, mask=mask
                )
            raise unsupported(f"nl.{name}(scalar, tile)")
        return _tensor_scalar(f"nl.{name}", a, op, float(y), "bypass", None, dtype, mask=mask)
    b = as_access(y, f"nl.{name}")
    if reverse:
        a, b = b, a
    if b.free_size == 1 and a.free_size > 1 and b.partitions == a.partitions:
        return _tensor_scalar(f"nl.{name}", a, op, b, "bypass", None, dtype, mask=mask)
    if a.free_size == 1 and b.free_size > 1 and op in ("add", "multiply", "max", "min"):
        return _tensor_scalar(f"nl.{name}", b, op, a, "bypass", None, dtype, mask=mask)
    if a.shape != b.shape and (a.partitions != b.partitions or a.free_size != b.free_size):
        raise fail(f"nl.{name}: operand shapes {a.shape} and {b.shape} differ")
    out_dtype = _promote(a.dtype, b.dtype) if dtype is None else dtype

    def emit(dst: TileAccess) -> None:
        materialize_zero(a)
        materialize_zero(b)
        tracer().emit("nki_tensor_tensor", dst.ref(), a.ref(), b.ref(), op)

    return Deferred(f"nl.{name}", emit, a.shape, out_dtype, mask=mask)


def _scalar_operand(s):
    if s is None or _is_scalar(s):
        return None if s is None else float(s)
    access = as_access(s, "scalar operand")
    if access.free_size != 1:
        raise fail(f"a scalar operand must be a number or a [P, 1] tile, got shape {access.shape}")
    return access


def _tensor_scalar(
    name: str, a: TileAccess, op0: str, s0, op1: str, s1, dtype, engine: str = "vector", mask=None
) -> Deferred:
    s0, s1 = _scalar_operand(s0), _scalar_operand(s1)

    def emit(dst: TileAccess) -> None:
        for s in (a, s0, s1):
            if isinstance(s, TileAccess):
                materialize_zero(s)
        tracer().emit(
            "nki_tensor_scalar",
            dst.ref(),
            a.ref(),
            op0,
            s0.ref() if isinstance(s0, TileAccess) else s0,
            op1,
            s1.ref() if isinstance(s1, TileAccess) else s1,
            engine,
        )

    return Deferred(name, emit, a.shape, a.dtype if dtype is None else dtype, mask=mask)


def add(x, y, *, dtype=None, mask=None, **kwargs) -> Deferred:
    return _binary("add", "add", x, y, dtype, mask=mask)


def subtract(x, y, *, dtype=None, mask=None, **kwargs) -> Deferred:
    return _binary("subtract", "subtract", x, y, dtype, mask=mask)


def multiply(x, y, *, dtype=None, mask=None, **kwargs) -> Deferred:
    return _binary("multiply", "multiply", x, y, dtype, mask=mask)


def divide(x, y, *, dtype=None, mask=None, **kwargs) -> Deferred:
    return _binary("divide", "divide", x, y, dtype, mask=mask)


def maximum(x, y, *, dtype=None, mask=None, **kwargs) -> Deferred:
    return _binary("maximum", "max", x, y, dtype, mask=mask)


def minimum(x, y, *, dtype=None, mask=None, **kwargs) -> Deferred:
    return _binary("minimum", "min", x, y, dtype, mask=mask)


def negative(x, *, dtype=None, mask=None, **kwargs) -> Deferred:
    a = as_access(x, "nl.negative")
    return _tensor_scalar("nl.negative", a, "multiply", -1.0, "bypass", None, dtype, mask=mask)


def _activation(name: str, func: str):
    def unary(x, *, dtype=None, mask=None, **kwargs) -> Deferred:
        if kwargs:
            raise unsupported(f"nl.{name}({', '.join(kwargs)}=...)")
        src = as_access(x, f"nl.{name}")

        def emit(dst: TileAccess) -> None:
            materialize_zero(src)
            tracer().emit("nki_activation", dst.ref(), src.ref(), func, 1.0, None, None)

        return Deferred(
            f"nl.{name}", emit, src.shape, src.dtype if dtype is None else dtype, mask=mask
        )

    unary.__name__ = name
    unary.__qualname__ = name
    unary.activation = func
    return unary


exp = _activation("exp", "exp")
log = _activation("log", "log")
tanh = _activation("tanh", "tanh")
sigmoid = _activation("sigmoid", "sigmoid")
relu = _activation("relu", "relu")
square = _activation("square", "square")
sqrt = _activation("sqrt", "sqrt")
rsqrt = _activation("rsqrt", "rsqrt")
reciprocal = _activation("reciprocal", "reciprocal")
abs = _activation("abs", "abs")
identity = _activation("identity", "copy")


def _divide_in_place(dst: TileAccess, n: int) -> None:
    """dst *= 1 / n on VectorE: a sum becomes a mean."""
    tracer().emit(
        "nki_tensor_scalar", dst.ref(), dst.ref(), "multiply", 1.0 / n, "bypass", None, "vector"
    )


def _reduce(name: str, op: str, negate: bool = False, mean: bool = False):
    def reduce(x, axis, *, dtype=None, keepdims: bool = False, mask=None, **kwargs) -> Deferred:
        if kwargs:
            raise unsupported(f"nl.{name}({', '.join(kwargs)}=...)")
        src = as_access(x, f"nl.{name}")
        axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
        free_axes = tuple(range(1, len(src.shape)))
        reduced = tuple(sorted({int(a) % len(src.shape) for a in axes}))
        if not reduced or reduced[0] == 0 or len(reduced) != len(axes):
            raise fail(
                f"nl.{name}: axis={axis} must name distinct free axes of a tile of shape "
                f"{src.shape} (reductions run along the free dimension, axes 1..)",
                NotImplementedError if reduced and reduced[0] == 0 else NkiError,
            )
        if reduced != free_axes:
            return _partial_reduce(name, op, src, reduced, dtype, keepdims, mean, mask)
        n = src.free_size

        def emit(dst: TileAccess) -> None:
            materialize_zero(src)
            tracer().emit("nki_tensor_reduce", dst.ref(), src.ref(), op, negate)
            if mean:
                _divide_in_place(dst, n)

        shape = (src.partitions,) + ((1,) * len(free_axes) if keepdims else (1,))
        return Deferred(f"nl.{name}", emit, shape, src.dtype if dtype is None else dtype, mask=mask)

    reduce.__name__ = name
    return reduce


# More pieces than this make a partial reduction a long chain of small instructions.
_PARTIAL_REDUCE_MAX_PIECES = 1024


def _partial_reduce(
    name: str, op: str, src: TileAccess, reduced: tuple[int, ...], dtype, keepdims, mean, mask
) -> Deferred:
    """A reduction over some free axes: one VectorE tensor_tensor per element of the reduced
    axes, combining strided views of the kept axes (the kept axes' pattern is read once per
    reduced index)."""
    if len(src.dims) != len(src.shape) - 1:
        raise fail(
            f"nl.{name}: a partial reduction of this access (shape {src.shape}) is not "
            "supported by tilelab.nki yet",
            NotImplementedError,
        )
    kept = [i for i in range(1, len(src.shape)) if i not in reduced]
    pieces = math.prod(src.shape[i] for i in reduced)
    if pieces > _PARTIAL_REDUCE_MAX_PIECES:
        raise fail(
            f"nl.{name}: reducing axes {reduced} of shape {src.shape} takes {pieces} "
            f"instructions, more than {_PARTIAL_REDUCE_MAX_PIECES}; order the axes so that "
            "the reduced ones are the innermost and reduce all of them",
            NotImplementedError,
        )
    kept_dims = [src.dims[i - 1] for i in kept]
    aranges = (src.aranges[0], *(src.aranges[i] for i in kept)) if src.aranges else ()
    limits = (src.limits[0], *(src.limits[i] for i in kept)) if src.limits else ()
    views = []
    for index in itertools.product(*(range(src.shape[i]) for i in reduced)):
        offset = src.offset + builtins.sum(
            k * src.dims[i - 1][1] for k, i in zip(index, reduced, strict=True)
        )
        views.append(
            TileAccess(src.tile, src.p0, src.partitions, offset, kept_dims, aranges, limits)
        )

    def emit(dst: TileAccess) -> None:
        materialize_zero(src)
        t = tracer()
        if len(views) == 1:
            t.emit("nki_tensor_copy", dst.ref(), views[0].ref(), "vector")
        else:
            t.emit("nki_tensor_tensor", dst.ref(), views[0].ref(), views[1].ref(), op)
        for view in views[2:]:
            t.emit("nki_tensor_tensor", dst.ref(), dst.ref(), view.ref(), op)
        if mean:
            _divide_in_place(dst, pieces)

    shape = tuple(
        1 if i in reduced else extent
        for i, extent in enumerate(src.shape)
        if keepdims or i not in reduced
    )
    return Deferred(f"nl.{name}", emit, shape, src.dtype if dtype is None else dtype, mask=mask)


max = _reduce("max", "max")
min = _reduce("min", "min")
sum = _reduce("sum", "add")
mean = _reduce("mean", "add", mean=True)


def where(condition, x, y, *, dtype=None, mask=None, **kwargs) -> Deferred:
    cond = as_access(condition, "nl.where condition")
    a = as_access(x, "nl.where x")
    other = float(y) if _is_scalar(y) else as_access(y, "nl.where y")

    def emit(dst: TileAccess) -> None:
        tracer().emit(
            "nki_select",
            dst.ref(),
            cond.ref(),
            a.ref(),
            other if isinstance(other, float) else other.ref(),
        )

    return Deferred("nl.where", emit, a.shape, a.dtype if dtype is None else dtype, mask=mask)


def device_print(prefix: str, x, **kwargs) -> None:
    """Prints `prefix` and the tile's values as they are at this point of the kernel, when the
    kernel runs on numbers (simulate_kernel, profile_kernel with functional=True); a timing-only
    run prints nothing. Takes no time on the simulated machine."""
    if kwargs:
        raise unsupported(f"nl.device_print({', '.join(kwargs)}=...)")
    t = tracer()
    access = as_access(x, "nl.device_print")
    t.flush()
    materialize_zero(access)
    t.prints.append((str(prefix), _core_instruction_count(t), access))


def _core_instruction_count(t) -> int:
    from .. import _core

    return _core.nki_instruction_count(t.builder)


# --- operators on tiles -------------------------------------------------------------------------


def _operators(cls) -> None:
    cls.__add__ = lambda self, other: add(self, other)
    cls.__radd__ = lambda self, other: add(other, self)
    cls.__sub__ = lambda self, other: subtract(self, other)
    cls.__rsub__ = lambda self, other: subtract(other, self)
    cls.__mul__ = lambda self, other: multiply(self, other)
    cls.__rmul__ = lambda self, other: multiply(other, self)
    cls.__truediv__ = lambda self, other: divide(self, other)
    cls.__neg__ = lambda self: negative(self)


for _cls in (Tile, TileAccess, Deferred):
    _operators(_cls)


def __getattr__(name: str) -> Any:
    """Any other name of neuronxcc.nki.language: an operation tilelab does not implement yet."""
    return _trace.not_implemented_attribute("nl", name)
