"""tilelab.nki.isa (``nisa``): NKI instructions, each on the engine the NKI documentation names
and timed with its cost formula (sim/cost.cpp).

Names follow ``neuronxcc.nki.isa``. An instruction tilelab does not implement raises
NotImplementedError naming it and the kernel's file:line when it is called.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from . import _trace
from . import language as nl
from ._trace import Deferred, TileAccess, as_access, fail, materialize_zero, tracer, unsupported


class nc_version(enum.IntEnum):  # noqa: N801 - the NKI name
    gen2 = 2
    gen3 = 3


class engine(enum.Enum):  # noqa: N801 - the NKI name
    unknown = "unknown"
    tensor = "tensor"
    vector = "vector"
    scalar = "scalar"
    gpsimd = "gpsimd"


class dge_mode(enum.Enum):  # noqa: N801 - the NKI name
    unknown = "unknown"
    swdge = "swdge"
    hwdge = "hwdge"
    none = "none"


tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
unknown_engine = engine.unknown


def get_nc_version() -> nc_version:
    """The NeuronCore generation of the machine the kernel is traced for (trn1: gen2,
    trn2: gen3)."""
    return nc_version(tracer().machine["nc_version"])


def _engine_name(value, default: str, allowed: tuple[str, ...], what: str) -> str:
    name = (
        default
        if value in (None, engine.unknown)
        else (value.value if isinstance(value, engine) else str(value))
    )
    if name not in allowed:
        raise fail(f"{what}: engine {name} cannot run it; allowed: {', '.join(allowed)}")
    return name


def nc_matmul(
    stationary,
    moving,
    *,
    is_stationary_onezero: bool = False,
    is_moving_onezero: bool = False,
    mask=None,
    **kwargs,
) -> Deferred:
    """PSUM[M, N] = stationary[K, M]^T @ moving[K, N] on TensorE."""
    nl._no_mask(mask, "nisa.nc_matmul")
    if kwargs:
        raise unsupported(f"nisa.nc_matmul({', '.join(kwargs)}=...)")
    return nl._matmul(
        "nisa.nc_matmul",
        as_access(stationary, "nisa.nc_matmul stationary"),
        as_access(moving, "nisa.nc_matmul moving"),
    )


def nc_transpose(data, *, engine=None, mask=None, dtype=None, **kwargs) -> Deferred:
    """data[P, F] -> [F, P]: through the PE array into PSUM (the vector-engine 32x32 transpose
    is not modelled)."""
    nl._no_mask(mask, "nisa.nc_transpose")
    _engine_name(engine, "tensor", ("tensor",), "nisa.nc_transpose")
    return nl.transpose(data, dtype=dtype, **kwargs)


def dma_transpose(src, *, axes=None, dge_mode=None, mask=None, dtype=None, **kwargs) -> Deferred:
    """A 2-D transpose on the DMA engines: src [P, F] (an SBUF tile or an HBM access) becomes
    [F, P] in SBUF. NeuronCore-v3 and later only (the machine's dma_transpose_supported); costed
    at the documented fraction of DMA throughput (90% from HBM, 50% SBUF to SBUF)."""
    if kwargs:
        raise unsupported(f"nisa.dma_transpose({', '.join(kwargs)}=...)")
    nl._no_mask(mask, "nisa.dma_transpose")
    if axes is not None and tuple(axes) != (1, 0):
        raise unsupported(f"nisa.dma_transpose(axes={tuple(axes)!r}); only 2-D (1, 0)")
    if dge_mode is not None and getattr(dge_mode, "name", dge_mode) not in ("unknown", "hwdge"):
        raise fail(f"nisa.dma_transpose: dge_mode {dge_mode!r} not allowed; unknown or hwdge")
    if isinstance(src, _trace.HbmTensor):
        src = src[...]
    if isinstance(src, _trace.HbmAccess):
        if src.indirect is not None or len(src.shape) != 2:
            raise fail(f"nisa.dma_transpose: src must be a 2-D access, got shape {src.shape}")
        shape, source_dtype = src.shape, src.dtype

        def source() -> tuple:
            return src.pattern("nisa.dma_transpose")
    else:
        access = as_access(src, "nisa.dma_transpose src")
        if access.memory != "sbuf" or len(access.shape) != 2:
            raise fail(
                f"nisa.dma_transpose: src must be a 2-D SBUF tile or HBM access, got "
                f"{access.memory} shape {access.shape}"
            )
        shape, source_dtype = access.shape, access.dtype

        def source() -> tuple:
            materialize_zero(access)
            return access.ref()

    if dtype is not None and _trace.np_dtype(dtype) != source_dtype:
        raise fail("nisa.dma_transpose: the DMA transpose does not convert dtypes", TypeError)

    def emit(dst: TileAccess) -> None:
        tracer().emit("nki_dma_transpose", dst.ref(), source(), "sync", -1)

    return Deferred("nisa.dma_transpose", emit, (shape[1], shape[0]), source_dtype)


def activation(
    op,
    data,
    *,
    bias=None,
    scale=1.0,
    reduce_op=None,
    reduce_res=None,
    dtype=None,
    mask=None,
    **kwargs,
) -> Deferred:
    """op(data * scale + bias) on ScalarE; scale is a number or a [P, 1] tile, bias a [P, 1]
    tile; with reduce_res, the free-axis sum of the result is written to that [P, 1] tile."""
    if kwargs:
        raise unsupported(f"nisa.activation({', '.join(kwargs)}=...)")
    func = _activation_name(op)
    src = as_access(data, "nisa.activation data")
    bias_access = None if bias is None else as_access(bias, "nisa.activation bias")
    scale_operand = (
        float(scale) if nl._is_scalar(scale) else as_access(scale, "nisa.activation scale")
    )
    reduce_access = None
    if reduce_res is not None:
        if reduce_op is not None and nl.alu_name(reduce_op, "nisa.activation reduce_op") != "add":
            raise unsupported("nisa.activation(reduce_op other than np.add)")
        reduce_access = as_access(reduce_res, "nisa.activation reduce_res")

    def emit(dst: TileAccess) -> None:
        for operand in (src, bias_access, scale_operand, reduce_access):
            if isinstance(operand, TileAccess):
                materialize_zero(operand)
        tracer().emit(
            "nki_activation",
            dst.ref(),
            src.ref(),
            func,
            scale_operand if isinstance(scale_operand, float) else scale_operand.ref(),
            None if bias_access is None else bias_access.ref(),
            None if reduce_access is None else reduce_access.ref(),
        )

    return Deferred(
        "nisa.activation", emit, src.shape, src.dtype if dtype is None else dtype, mask=mask
    )


def activation_reduce(
    op, data, *, reduce_op, reduce_res, bias=None, scale=1.0, dtype=None, mask=None, **kwargs
) -> Deferred:
    return activation(
        op,
        data,
        bias=bias,
        scale=scale,
        reduce_op=reduce_op,
        reduce_res=reduce_res,
        dtype=dtype,
        mask=mask,
        **kwargs,
    )


_ACTIVATIONS = {
    "exp": "exp",
    "log": "log",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
    "relu": "relu",
    "square": "square",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "reciprocal": "reciprocal",
    "abs": "abs",
    "absolute": "abs",
    "copy": "copy",
    "identity": "copy",
}


def _activation_name(op) -> str:
    name = getattr(op, "activation", None) or getattr(op, "__name__", None) or str(op)
    if name in _ACTIVATIONS:
        return _ACTIVATIONS[name]
    raise fail(
        f"nisa.activation: op {op!r} is not supported; allowed: {', '.join(sorted(_ACTIVATIONS))}",
        NotImplementedError,
    )


def tensor_tensor(data1, data2, op, *, dtype=None, mask=None, engine=None, **kwargs) -> Deferred:
    _engine_name(engine, "vector", ("vector",), "nisa.tensor_tensor")
    a = as_access(data1, "nisa.tensor_tensor data1")
    b = as_access(data2, "nisa.tensor_tensor data2")
    if a.partitions != b.partitions or a.free_size != b.free_size:
        raise fail(f"nisa.tensor_tensor: operand shapes {a.shape} and {b.shape} differ")
    alu = nl.alu_name(op, "nisa.tensor_tensor")

    def emit(dst: TileAccess) -> None:
        materialize_zero(a)
        materialize_zero(b)
        tracer().emit("nki_tensor_tensor", dst.ref(), a.ref(), b.ref(), alu)

    return Deferred(
        "nisa.tensor_tensor",
        emit,
        a.shape,
        nl._promote(a.dtype, b.dtype) if dtype is None else dtype,
        mask=mask,
    )


def tensor_tensor_scan(
    data0,
    data1,
    initial,
    op0,
    op1,
    reverse0: bool = False,
    reverse1: bool = False,
    *,
    dtype=None,
    mask=None,
    **kwargs,
) -> Deferred:
    """Per partition, r[:, i] = op1(op0(data0[:, i], r[:, i-1]), data1[:, i]) with
    r[:, -1] = initial (a number or a [P, 1] tile), in fp32 on VectorE."""
    if kwargs:
        raise unsupported(f"nisa.tensor_tensor_scan({', '.join(kwargs)}=...)")
    a = as_access(data0, "nisa.tensor_tensor_scan data0")
    b = as_access(data1, "nisa.tensor_tensor_scan data1")
    if a.partitions != b.partitions or a.free_size != b.free_size:
        raise fail(f"nisa.tensor_tensor_scan: operand shapes {a.shape} and {b.shape} differ")
    alu0 = nl.alu_name(op0, "nisa.tensor_tensor_scan op0")
    alu1 = nl.alu_name(op1, "nisa.tensor_tensor_scan op1")
    start = nl._scalar_operand(initial)

    def emit(dst: TileAccess) -> None:
        for operand in (a, b, start):
            if isinstance(operand, TileAccess):
                materialize_zero(operand)
        tracer().emit(
            "nki_tensor_tensor_scan",
            dst.ref(),
            a.ref(),
            b.ref(),
            start.ref() if isinstance(start, TileAccess) else start,
            alu0,
            alu1,
            bool(reverse0),
            bool(reverse1),
        )

    return Deferred(
        "nisa.tensor_tensor_scan",
        emit,
        a.shape,
        nl._promote(a.dtype, b.dtype) if dtype is None else dtype,
        mask=mask,
    )


def tensor_scalar(
    data,
    op0,
    operand0,
    *,
    reverse0: bool = False,
    op1=None,
    operand1=None,
    reverse1: bool = False,
    dtype=None,
    mask=None,
    engine=None,
    **kwargs,
) -> Deferred:
    """(data op0 operand0) op1 operand1; operands are numbers or [P, 1] tiles."""
    if kwargs:
        raise unsupported(f"nisa.tensor_scalar({', '.join(kwargs)}=...)")
    if reverse0 or reverse1:
        raise unsupported("nisa.tensor_scalar(reverse0/reverse1=True)")
    name = _engine_name(engine, "vector", ("vector", "scalar", "gpsimd"), "nisa.tensor_scalar")
    src = as_access(data, "nisa.tensor_scalar data")
    alu0 = nl.alu_name(op0, "nisa.tensor_scalar op0")
    alu1 = "bypass" if op1 is None else nl.alu_name(op1, "nisa.tensor_scalar op1")
    return nl._tensor_scalar(
        "nisa.tensor_scalar", src, alu0, operand0, alu1, operand1, dtype, name, mask=mask
    )


def tensor_reduce(
    op, data, axis, *, negate: bool = False, keepdims: bool = False, dtype=None, mask=None, **kwargs
) -> Deferred:
    alu = nl.alu_name(op, "nisa.tensor_reduce")
    if alu not in ("add", "max", "min"):
        raise unsupported(f"nisa.tensor_reduce(op={op!r})")
    return nl._reduce("tensor_reduce", alu, negate)(
        data, axis, dtype=dtype, keepdims=keepdims, mask=mask
    )


def _vector_statistics(name: str, width: int, data, mask, dtype, kwargs) -> Deferred:
    """A VectorE statistics instruction writing `width` fp32-computed values per partition."""
    if kwargs:
        raise unsupported(f"nisa.{name}({', '.join(kwargs)}=...)")
    src = as_access(data, f"nisa.{name} data")

    def emit(dst: TileAccess) -> None:
        materialize_zero(src)
        tracer().emit(f"nki_{name}", dst.ref(), src.ref())

    return Deferred(
        f"nisa.{name}",
        emit,
        (src.partitions, width),
        src.dtype if dtype is None else dtype,
        mask=mask,
    )


def bn_stats(data, *, mask=None, dtype=None, **kwargs) -> Deferred:
    """[P, 6] per partition: count, mean and variance x count of data's even elements, then of
    its odd ones (fp32 on VectorE; data at most nl.tile_size.bn_stats_fmax wide)."""
    return _vector_statistics("bn_stats", 6, data, mask, dtype, kwargs)


def bn_aggr(data, *, mask=None, dtype=None, **kwargs) -> Deferred:
    """[P, 2] per partition: the mean and (population) variance of everything the bn_stats
    groups in data (a multiple of 3 elements) describe."""
    return _vector_statistics("bn_aggr", 2, data, mask, dtype, kwargs)


def tensor_copy(src, *, dtype=None, mask=None, engine=None, **kwargs) -> Deferred:
    name = _engine_name(engine, "vector", ("vector", "scalar", "gpsimd"), "nisa.tensor_copy")
    access = as_access(src, "nisa.tensor_copy")

    def emit(dst: TileAccess) -> None:
        materialize_zero(access)
        tracer().emit("nki_tensor_copy", dst.ref(), access.ref(), name)

    return Deferred(
        "nisa.tensor_copy", emit, access.shape, access.dtype if dtype is None else dtype, mask=mask
    )


def memset(shape, value, dtype, *, mask=None, engine=None, **kwargs) -> Deferred:
    name = _engine_name(engine, "vector", ("vector", "gpsimd"), "nisa.memset")
    shape = tuple(int(s) for s in shape)

    def emit(dst: TileAccess) -> None:
        tracer().emit("nki_memset", dst.ref(), float(value), name)

    return Deferred("nisa.memset", emit, shape, _trace.np_dtype(dtype), mask=mask)


def iota(expr, dtype, *, mask=None, **kwargs) -> Deferred:
    """The values of an index expression as a tile, on GpSimd: an integer (a [1, 1] tile) or
    start + step * nl.arange(n) along one output axis (axis 0: one value per partition, any
    other axis: along the free dimension; e.g. nl.arange(8)[None, None, :] gives [1, 1, 8])."""
    if kwargs:
        raise unsupported(f"nisa.iota({', '.join(kwargs)}=...)")
    tracer()
    if isinstance(expr, (int, np.integer)):
        base, partition_step, free_step, shape = int(expr), 0, 0, (1, 1)
    elif isinstance(expr, _trace.IndexExpr):
        arange = expr.arange
        axis = arange.axis or 0
        ndim = max(arange.ndim, 2)
        shape = tuple(arange.n if i == axis else 1 for i in range(ndim))
        base = expr.start
        partition_step, free_step = (expr.step, 0) if axis == 0 else (0, expr.step)
    else:
        raise fail(
            f"nisa.iota: expected an integer or an nl.arange expression, got {type(expr).__name__}",
            TypeError,
        )

    def emit(dst: TileAccess) -> None:
        tracer().emit("nki_iota", dst.ref(), base, partition_step, free_step)

    return Deferred("nisa.iota", emit, shape, _trace.np_dtype(dtype), mask=mask)


def __getattr__(name: str) -> Any:
    """Any other name of neuronxcc.nki.isa: an instruction tilelab does not implement yet."""
    return _trace.not_implemented_attribute("nisa", name)
