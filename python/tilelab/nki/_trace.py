"""The NKI-language tracer: runs a kernel's Python body with concrete loop indices and turns each
nl/nisa call into instructions of the simulator's program builder (tilelab._core nki_*).

Tensors are HBM tensors (kernel arguments and ``nl.ndarray(..., buffer=nl.shared_hbm)``) and
SBUF/PSUM tiles: a partition dimension with any number of free dimensions, optionally an array
of such tiles (``nl.par_dim`` after leading block dimensions). Indexing yields an access pattern;
operations are deferred until their result is stored (``tile[...] = nl.exp(x)`` writes straight
into ``tile``) or used (then into a fresh tile allocated where the operation was called).

Allocation follows the compiler's rule of thumb: each declaration site (its source line and call
stack) owns up to two buffers that it hands out in turn, so a tile declared inside a loop is
double-buffered when the memory allows and single-buffered when it does not.
"""

from __future__ import annotations

import linecache
import math
import os
import sys
import weakref
from typing import Any

import ml_dtypes
import numpy as np

from .. import _core

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

#: Buffers a declaration site may rotate through (compiler multi-buffering).
SITE_BUFFERS = 2

# numpy dtype -> the simulator's dtype name.
_SIM_DTYPES = {
    np.dtype(np.float32): "fp32",
    np.dtype(ml_dtypes.bfloat16): "bf16",
    np.dtype(np.float16): "fp16",
    np.dtype(ml_dtypes.float8_e4m3fn): "fp8_e4m3",
    np.dtype(np.int32): "int32",
    np.dtype(np.uint8): "uint8",
    np.dtype(np.bool_): "uint8",
}


class NkiError(ValueError):
    """A kernel broke an NKI rule; the message names the rule, the values and file:line."""


def sim_dtype(dtype: Any, argument: str = "dtype") -> str:
    try:
        key = np.dtype(dtype)
    except TypeError:
        key = None
    if key not in _SIM_DTYPES:
        allowed = "float32, bfloat16, float16, float8_e4m3fn, int32, uint8, bool"
        shown = key.name if key is not None else repr(dtype)
        raise TypeError(f"{argument}: unsupported dtype {shown}; allowed: {allowed}")
    return _SIM_DTYPES[key]


_NP_DTYPES: dict[Any, np.dtype] = {}  # what kernels pass as a dtype -> its numpy dtype


def np_dtype(dtype: Any, argument: str = "dtype") -> np.dtype:
    try:
        return _NP_DTYPES[dtype]
    except (KeyError, TypeError):
        pass
    sim_dtype(dtype, argument)
    resolved = np.dtype(dtype)
    try:
        _NP_DTYPES[dtype] = resolved
    except TypeError:
        pass
    return resolved


# --- source locations ---------------------------------------------------------------------------


_IN_PACKAGE: dict[Any, bool] = {}  # code object -> defined in tilelab.nki


def _user_frames() -> tuple[tuple[str, int, str], ...]:
    """The call stack in user code, innermost first: (file, line, function) of every frame
    outside this package, up to the kernel's own frame."""
    frames = []
    frame = sys._getframe(1)
    entry = _current.entry_code if _current is not None else None
    in_package = _IN_PACKAGE.get
    while frame is not None:
        code = frame.f_code
        inside = in_package(code)
        if inside is None:
            inside = os.path.abspath(code.co_filename).startswith(_PACKAGE_DIR)
            _IN_PACKAGE[code] = inside
        if not inside:
            frames.append((code.co_filename, frame.f_lineno, code.co_name))
            if code is entry:
                break
        frame = frame.f_back
    return tuple(frames)


def where() -> str:
    """'file:line' of the innermost user frame, or of the deferred operation being emitted
    (for messages)."""
    frames = (_current.site_override if _current is not None else None) or _user_frames()
    if not frames:
        return "<unknown>"
    file, line, _ = frames[0]
    return f"{file}:{line}"


def fail(message: str, kind: type[Exception] = NkiError) -> Exception:
    """An exception of `kind` whose message starts with the user's file:line."""
    return kind(f"{where()}: {message}")


def unsupported(name: str) -> Exception:
    return NotImplementedError(f"{where()}: {name} is not supported by tilelab.nki yet")


def not_implemented_attribute(prefix: str, name: str) -> Any:
    """A module __getattr__'s answer for a name of the NKI API tilelab does not implement: a
    callable that raises NotImplementedError naming `prefix.name` and the kernel line when
    called (so that referring to it, e.g. as an op= argument, is not yet an error)."""
    if name.startswith("__"):
        raise AttributeError(name)

    def not_implemented(*args, **kwargs):
        raise unsupported(f"{prefix}.{name}")

    not_implemented.__name__ = name
    return not_implemented


# --- the tracer ---------------------------------------------------------------------------------


_current: Tracer | None = None


def tracer() -> Tracer:
    if _current is None:
        raise RuntimeError(
            "NKI language calls run only inside a kernel traced by tilelab.nki.simulate_kernel "
            "or tilelab.nki.profile_kernel"
        )
    return _current


class Tracer:
    def __init__(self, name: str, machine_source: str, machine_overrides: list[str]):
        self.builder = _core.nki_builder(machine_source, machine_overrides, name)
        self.machine = _core.nki_machine_facts(self.builder)
        self.entry_code = None  # the kernel function's code object
        self.hbm: dict[str, HbmTensor] = {}
        self.sites: dict[Any, _Site] = {}
        self.shared_outputs: dict[Any, HbmTensor] = {}
        self.pending: Deferred | None = None
        self.program_id: tuple[int, ...] = (0,)
        self.grid: tuple[int, ...] = (1,)
        # nl.device_print calls: (prefix, instruction index, tile access).
        self.prints: list[tuple[str, int, TileAccess]] = []
        self._source_ids: dict[Any, int] = {}
        self._source_frames: tuple | None = None
        # While a deferred operation is emitted: its call site, to which its instructions belong.
        self.site_override: tuple | None = None
        # While an operation with mask= is emitted: the mask its operand views are cut to.
        self.mask: Mask | None = None
        # Constant tiles the lowering needs (the ones vector of partition broadcasts), made once
        # per kernel as the compiler does, at a site of their own so they are never evicted.
        self.constants: dict[tuple, TileAccess] = {}
        _TILE_INDEX_CACHE.clear()  # bounded by one kernel's index patterns

    # -- sources
    def set_source(self, frames: tuple) -> None:
        """Instructions emitted next carry the user's source line `frames[0]`, called from
        the rest of `frames`."""
        if frames == self._source_frames:
            return
        self._source_frames = frames
        add_source = _core.nki_add_source
        caller = -1
        for file, line, function in reversed(frames):
            key = (file, line, function, caller)
            source = self._source_ids.get(key)
            if source is None:
                text = linecache.getline(file, line).strip()
                source = add_source(self.builder, file, line, function, text, caller)
                self._source_ids[key] = source
            caller = source
        _core.nki_set_source(self.builder, caller)

    # -- calls into the builder, with the user's file:line on errors
    def emit(self, function: str, *args) -> Any:
        frames = self.site_override or _user_frames()
        self.set_source(frames)
        try:
            return getattr(_core, function)(self.builder, *args)
        except (ValueError, TypeError) as error:
            kind = TypeError if type(error) is TypeError else NkiError
            location = f"{frames[0][0]}:{frames[0][1]}" if frames else "<unknown>"
            raise kind(f"{location}: {error}") from None

    def flush(self, keep: Deferred | None = None) -> None:
        """Materializes the pending deferred operation (its result was kept in a variable)."""
        pending = self.pending
        if pending is not None and pending is not keep:
            self.pending = None
            pending.materialize()

    # -- tiles
    def allocate(
        self, memory: str, partitions: int, free_elements: int, dtype: np.dtype, site: tuple
    ) -> tuple[int, _Site, int]:
        """A buffer for a tile declared at `site`: (buffer id, site, slot).

        A site double-buffers when memory allows (SITE_BUFFERS), hands its buffers out in turn,
        and never hands out a buffer whose tile is still referenced by the kernel while memory
        for another one exists. When memory runs out, the oldest such tile is evicted: using it
        afterwards is an error, never a silent read of the newer tile's data."""
        key = (site, memory, partitions, free_elements, dtype)
        entry = self.sites.get(key)
        if entry is None:
            entry = self.sites[key] = _Site()
        buffers, owners = entry.buffers, entry.owners
        if len(buffers) < SITE_BUFFERS:
            slot = self._new_buffer(entry, memory, partitions, free_elements, dtype, site)
            if slot is not None:
                return buffers[slot], entry, slot
        n = len(buffers)
        for i in range(1, n + 1):
            slot = (entry.next + i) % n
            owner = owners[slot]() if owners[slot] is not None else None
            if owner is None:
                entry.next = slot
                return buffers[slot], entry, slot
        slot = self._new_buffer(entry, memory, partitions, free_elements, dtype, site)
        if slot is not None:
            return buffers[slot], entry, slot
        slot = (entry.next + 1) % n
        owner = owners[slot]()
        if owner is not None:
            file, line, _ = site[0] if site else ("kernel", 0, "")
            owner.state["evicted_by"] = f"{file}:{line}"
        entry.next = slot
        return buffers[slot], entry, slot

    def _new_buffer(self, entry: _Site, memory, partitions, free_elements, dtype, site):
        """Allocates one more buffer for the site (required when it has none); its slot, or
        None when memory is full."""
        file, line, _ = site[0] if site else ("kernel", 0, "")
        name = f"{os.path.basename(file)}:{line}"
        args = (name, memory, partitions, free_elements, sim_dtype(dtype))
        tile = self.emit("nki_tile", *args, False)
        if tile < 0 and self._reclaim(memory, entry):
            tile = self.emit("nki_tile", *args, False)
        if tile < 0 and not entry.buffers:
            tile = self.emit("nki_tile", *args, True)  # fails, naming the live tiles
        if tile < 0:
            return None
        entry.buffers.append(tile)
        entry.owners.append(None)
        entry.next = len(entry.buffers) - 1
        return entry.next

    def _reclaim(self, memory: str, keep: _Site) -> bool:
        """Returns to the allocator the buffers of other declaration sites in `memory` none of
        whose tiles the kernel still references (the compiler frees a tile after its last use);
        a tile later placed at those addresses waits for their accesses. True if any."""
        released = False
        for (_, site_memory, *_), entry in self.sites.items():
            if site_memory != memory or entry is keep or not entry.buffers:
                continue
            if any(owner is not None and owner() is not None for owner in entry.owners):
                continue
            for buffer in entry.buffers:
                _core.nki_release_tile(self.builder, buffer)
            entry.buffers.clear()
            entry.owners.clear()
            entry.next = 0
            released = True
        return released

    def hbm_tensor(
        self, name: str, shape: tuple[int, ...], dtype: np.dtype, kind: str
    ) -> HbmTensor:
        if name in self.hbm:
            raise fail(f"an HBM tensor named '{name}' exists already")
        for extent in shape:
            if not isinstance(extent, (int, np.integer)) or extent < 1:
                raise fail(f"HBM tensor '{name}': shape {shape} must be positive integers")
        tensor_id = self.emit("nki_hbm_tensor", name, [int(s) for s in shape], sim_dtype(dtype))
        tensor = HbmTensor(self, name, tensor_id, tuple(int(s) for s in shape), dtype, kind)
        self.hbm[name] = tensor
        return tensor


class _Site:
    """The buffers of one tile declaration site and the tile each currently holds."""

    __slots__ = ("buffers", "next", "owners")

    def __init__(self):
        self.buffers: list[int] = []
        self.owners: list[weakref.ref | None] = []
        self.next = 0


# --- index expressions --------------------------------------------------------------------------


class Arange:
    """Values 0..n-1 along output axis `axis` of `ndim` (nl.arange, nl.mgrid)."""

    __slots__ = ("axis", "n", "ndim")

    def __init__(self, n: int, axis: int | None = None, ndim: int = 1):
        self.n, self.axis, self.ndim = n, axis, ndim


class IndexExpr:
    """start + step * arange: an affine index over one output axis."""

    __slots__ = ("arange", "start", "step")

    def __init__(self, start: int, step: int, arange: Arange):
        self.start, self.step, self.arange = start, step, arange

    @property
    def shape(self) -> tuple[int, ...]:
        a = self.arange
        if a.axis is None:
            return (a.n,)
        return tuple(a.n if i == a.axis else 1 for i in range(a.ndim))

    def __getitem__(self, key) -> IndexExpr:
        if not isinstance(key, tuple):
            key = (key,)
        if self.arange.ndim != 1 or self.arange.axis not in (None, 0):
            raise fail("only a 1-D nl.arange may be reshaped with [:, None] or [None, :]")
        axes = [i for i, k in enumerate(key) if isinstance(k, slice)]
        if len(axes) != 1 or any(k is not None and not isinstance(k, slice) for k in key):
            raise fail(f"an nl.arange index may be broadcast with None only, got {key!r}")
        return IndexExpr(self.start, self.step, Arange(self.arange.n, axes[0], len(key)))

    def _affine(self, other, sign: int = 1) -> IndexExpr | IndexSum:
        if isinstance(other, (int, np.integer)):
            return IndexExpr(self.start + sign * int(other), self.step, self.arange)
        if isinstance(other, IndexExpr | IndexSum):
            return IndexSum.of(self) + (other if sign > 0 else other * -1)
        raise fail(
            "index expressions add integers and other index expressions only",
            NotImplementedError,
        )

    def __add__(self, other):
        return self._affine(other)

    __radd__ = __add__

    def __sub__(self, other):
        return self._affine(other, -1)

    def __rsub__(self, other):
        return IndexExpr(int(other) - self.start, -self.step, self.arange)

    def __mul__(self, other):
        if isinstance(other, (int, np.integer)):
            return IndexExpr(self.start * int(other), self.step * int(other), self.arange)
        raise fail("index expressions may be multiplied by integers only", NotImplementedError)

    __rmul__ = __mul__

    def _mask(self, op: str, other) -> Mask:
        if not isinstance(other, (int, np.integer)):
            raise fail(
                f"mask expressions compare an index with an integer; {op} with "
                f"{type(other).__name__} is not supported by tilelab.nki yet",
                NotImplementedError,
            )
        if self.step <= 0:
            raise fail("mask expressions need a positive index step", NotImplementedError)
        # start + step * a OP bound, as a range of a.
        bound = int(other) - self.start
        lo, hi = 0, self.arange.n
        if op == "<":
            hi = -(-bound // self.step)
        elif op == "<=":
            hi = bound // self.step + 1
        elif op == ">":
            lo = bound // self.step + 1
        else:
            lo = -(-bound // self.step)
        return Mask({id(self.arange): (self.arange, max(lo, 0), min(hi, self.arange.n))})

    def __lt__(self, other):
        return self._mask("<", other)

    def __le__(self, other):
        return self._mask("<=", other)

    def __gt__(self, other):
        return self._mask(">", other)

    def __ge__(self, other):
        return self._mask(">=", other)


class IndexSum:
    """start + sum of step * arange over aranges of different output axes (e.g.
    `pool * i_row + i_window` of nl.mgrid expressions): each arange spans its own output axis, so
    one tensor dimension is read as several strided axes. Its range is checked when it indexes."""

    __slots__ = ("start", "terms")

    def __init__(self, start: int, terms: tuple[tuple[int, Arange], ...]):
        self.start, self.terms = start, terms

    @staticmethod
    def of(expr: IndexExpr) -> IndexSum:
        return IndexSum(expr.start, ((expr.step, expr.arange),))

    @property
    def shape(self) -> tuple[int, ...]:
        ndim = max(a.ndim for _, a in self.terms)
        return tuple(
            max((a.n for _, a in self.terms if a.axis == i), default=1) for i in range(ndim)
        )

    def __add__(self, other) -> IndexSum:
        if isinstance(other, (int, np.integer)):
            return IndexSum(self.start + int(other), self.terms)
        if isinstance(other, IndexExpr):
            other = IndexSum.of(other)
        if not isinstance(other, IndexSum):
            raise fail(
                "index expressions add integers and other index expressions only",
                NotImplementedError,
            )
        for _, a in other.terms:
            if a.axis is None or any(b is a or b.axis == a.axis for _, b in self.terms):
                raise fail(
                    "a sum of index expressions needs nl.arange / nl.mgrid terms on different "
                    "output axes (e.g. i_p[:, None] + i_f[None, :])",
                    NotImplementedError,
                )
        if any(a.axis is None for _, a in self.terms):
            raise fail(
                "a sum of index expressions needs each nl.arange on an explicit output axis "
                "(nl.mgrid, or [:, None] / [None, :])",
                NotImplementedError,
            )
        return IndexSum(self.start + other.start, self.terms + other.terms)

    __radd__ = __add__

    def __sub__(self, other) -> IndexSum:
        return self + (-int(other) if isinstance(other, (int, np.integer)) else other * -1)

    def __mul__(self, other) -> IndexSum:
        if not isinstance(other, (int, np.integer)):
            raise fail("index expressions may be multiplied by integers only", NotImplementedError)
        k = int(other)
        return IndexSum(self.start * k, tuple((step * k, a) for step, a in self.terms))

    __rmul__ = __mul__

    def _mask(self, *args):
        raise fail(
            "mask= with a sum of index expressions is not supported by tilelab.nki yet; "
            "compare each nl.arange on its own",
            NotImplementedError,
        )

    __lt__ = __le__ = __gt__ = __ge__ = _mask


class Mask:
    """A conjunction of index ranges (the affine predicates NKI allows in mask=): per nl.arange,
    the values [lo, hi) it may take. An operation with a mask acts on that sub-rectangle only;
    an empty one emits nothing, as the compiler does."""

    __slots__ = ("ranges",)

    def __init__(self, ranges: dict[int, tuple[Arange, int, int]]):
        self.ranges = ranges

    def __and__(self, other: Mask) -> Mask:
        if not isinstance(other, Mask):
            raise fail("masks combine with & only", TypeError)
        ranges = dict(self.ranges)
        for key, (a, lo, hi) in other.ranges.items():
            if key in ranges:
                _, lo0, hi0 = ranges[key]
                lo, hi = max(lo, lo0), min(hi, hi0)
            ranges[key] = (a, lo, hi)
        return Mask(ranges)

    __rand__ = __and__

    def __bool__(self) -> bool:
        raise fail("a mask is not a Python bool; pass it as mask=", TypeError)

    def axis_range(self, arange: Arange | None, axis: int, count: int) -> tuple[int, int] | None:
        """The kept range of an access axis made by `arange` (or, when the access does not say,
        at output position `axis` with the arange's extent)."""
        for a, lo, hi in self.ranges.values():
            if a is arange or (arange is None and a.axis == axis and a.n == count):
                return lo, hi
        return None


def as_mask(mask) -> Mask | None:
    if mask is None or isinstance(mask, Mask):
        return mask
    raise fail(f"mask: expected an index predicate such as (i_p < n), got {mask!r}", TypeError)


def _masked(
    offset: int,
    dims: list[tuple[int, int]],
    aranges: tuple,
    limits: tuple,
    what: str,
    first_axis: int = 0,
) -> tuple[int, list[tuple[int, int]]]:
    """(offset, dims) cut to the current mask's ranges (MaskedOutError when nothing is left), with
    the index range of every index-expression axis checked against its dim."""
    mask = _current.mask if _current is not None else None
    out = []
    for k, (count, stride) in enumerate(dims):
        limit = limits[k] if k < len(limits) else None
        if mask is not None:
            kept = mask.axis_range(aranges[k] if k < len(aranges) else None, first_axis + k, count)
            if kept is not None and count > 1:
                lo, hi = kept[0], min(kept[1], count)
                if hi <= lo:
                    raise MaskedOutError
                offset += lo * stride
                count = hi - lo
                if limit is not None:
                    limit = (limit[0] + lo * limit[1], limit[1], limit[2])
        if limit is not None:
            first, step, extent = limit
            last = first + step * (count - 1)
            if first < 0 or last >= extent:
                raise fail(
                    f"{what}: index expression covers {first}..{last}, out of range for a "
                    f"dimension of size {extent} (mask= may exclude the rest)",
                    IndexError,
                )
        out.append((count, stride))
    return offset, out


class MaskedOutError(Exception):
    """The mask leaves nothing: the instruction is not emitted."""


def arange(*args) -> IndexExpr:
    if len(args) == 1:
        start, stop = 0, args[0]
    elif len(args) == 2:
        start, stop = args
    else:
        raise fail(f"nl.arange takes (stop) or (start, stop), got {args!r}", TypeError)
    return IndexExpr(int(start), 1, Arange(int(stop) - int(start)))


class MGrid:
    """The result of nl.mgrid[0:a, 0:b]: .p (partition) and .x (first free) index expressions."""

    def __init__(self, exprs: tuple[IndexExpr, ...]):
        self.exprs = exprs

    def __iter__(self):
        return iter(self.exprs)

    def __getattr__(self, name: str):
        axes = {"p": 0, "x": 1, "y": 2, "z": 3}
        if name in axes and axes[name] < len(self.exprs):
            return self.exprs[axes[name]]
        raise AttributeError(name)


class _MGridFactory:
    def __getitem__(self, key) -> MGrid:
        if not isinstance(key, tuple):
            key = (key,)
        exprs = []
        for axis, k in enumerate(key):
            if not isinstance(k, slice) or (k.step not in (None, 1)):
                raise fail(f"nl.mgrid takes unit-step slices, got {k!r}", TypeError)
            start = 0 if k.start is None else int(k.start)
            exprs.append(IndexExpr(start, 1, Arange(int(k.stop) - start, axis, len(key))))
        return MGrid(tuple(exprs))


mgrid = _MGridFactory()


class DynSlice:
    """nl.ds(start, size)."""

    __slots__ = ("size", "start")

    def __init__(self, start: int, size: int):
        self.start, self.size = int(start), int(size)


# An axis of an access: (tensor dim, start, count, step, ordering key).
def _resolve(shape: tuple[int, ...], key, what: str) -> tuple[list[int], list[tuple]]:
    """Per tensor dim its fixed start (int) and the output axes [(dim, start, count, step,
    arange or None, limit)] in output order, for an index `key` of a tensor of `shape`. An
    index expression's axis has a limit (first index, index step, dim extent), checked when the
    access is used (after mask= has cut it); other indices are checked here."""
    if type(key) is not tuple:
        key = (key,)
    rank = len(shape)
    if Ellipsis in key:
        i = key.index(Ellipsis)
        key = key[:i] + (_ALL,) * (rank - (len(key) - 1)) + key[i + 1 :]
    if len(key) > rank:
        raise fail(f"{what}: {len(key)} indices for a tensor of rank {rank}", IndexError)
    if len(key) < rank:
        key = key + (_ALL,) * (rank - len(key))
    starts = [0] * rank
    axes = []
    explicit = True  # every axis comes from an index expression with an explicit output axis
    for dim in range(rank):
        k = key[dim]
        extent = shape[dim]
        kind = type(k)
        if kind is IndexExpr:
            # The range is checked when the access is used, after mask= has cut it.
            a = k.arange
            if k.step < 0:
                raise fail(f"{what}: negative index steps are not supported", NotImplementedError)
            starts[dim] = k.start
            if a.axis is None:
                explicit = False
            axes.append((a.axis, dim, k.start, a.n, k.step, a, (k.start, k.step, extent)))
            continue
        if kind is IndexSum:
            last = k.start + sum(step * (a.n - 1) for step, a in k.terms)
            if dim == 0 and len(k.terms) > 1:
                raise fail(
                    f"{what}: the partition index must be one nl.arange expression, not a sum",
                    NotImplementedError,
                )
            if any(step < 0 for step, _ in k.terms):
                raise fail(f"{what}: negative index steps are not supported", NotImplementedError)
            if not 0 <= k.start <= last < extent:
                raise fail(
                    f"{what}: index expression covers {k.start}..{last}, out of range for dim "
                    f"{dim} of size {extent}",
                    IndexError,
                )
            starts[dim] = k.start
            for i, (step, a) in enumerate(k.terms):
                axes.append((a.axis, dim, k.start if i == 0 else 0, a.n, step, a, None))
            continue
        if kind is DynSlice:
            k, kind = slice(k.start, k.start + k.size), slice
        if kind is slice:
            if k is _ALL:
                axes.append((None, dim, 0, extent, 1, None, None))
                explicit = False
                continue
            lo, hi, step = k.start, k.stop, k.step
            if (lo is not None and not 0 <= lo <= extent) or (
                hi is not None and not 0 <= hi <= extent
            ):
                raise fail(
                    f"{what}: slice {lo}:{hi} out of range for dim {dim} of size {extent}",
                    IndexError,
                )
            step = 1 if step is None else step
            if step <= 0:
                raise fail(f"{what}: slices need a positive step, got {k!r}", IndexError)
            lo = 0 if lo is None else lo
            hi = extent if hi is None else hi
            count = (hi - lo + step - 1) // step
            if count <= 0:
                raise fail(f"{what}: empty slice {k!r} on dim {dim}", IndexError)
            starts[dim] = lo
            axes.append((None, dim, lo, count, step, None, None))
            explicit = False
            continue
        if kind is int or isinstance(k, np.integer):
            k = int(k)
            if not 0 <= k < extent:
                raise fail(
                    f"{what}: index {k} out of range for dim {dim} of size {extent}", IndexError
                )
            starts[dim] = k
            continue
        raise fail(f"{what}: unsupported index {k!r} on dim {dim}", TypeError)
    if explicit and len(axes) > 1:
        axes.sort(key=_axis_order)
    return starts, [axis[1:] for axis in axes]


_ALL = slice(None)


def _axis_order(axis: tuple) -> int:
    return axis[0]


def merge_dims(dims: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(count, stride) dims, outermost first, with unit dims dropped and mergeable neighbours
    merged (outer stride == inner count * inner stride)."""
    out: list[tuple[int, int]] = []
    for count, stride in dims:
        if count == 1:
            continue
        if out and out[-1][1] == count * stride:
            out[-1] = (out[-1][0] * count, stride)
        else:
            out.append((count, stride))
    return out


# --- tensors ------------------------------------------------------------------------------------


class HbmTensor:
    """An HBM tensor: a kernel argument, an output or a private scratch tensor."""

    def __init__(
        self,
        tracer: Tracer,
        name: str,
        tensor_id: int,
        shape: tuple[int, ...],
        dtype: np.dtype,
        kind: str,
    ):
        self.tracer, self.name, self.id = tracer, name, tensor_id
        self.shape, self.dtype, self.kind = shape, np.dtype(dtype), kind
        self.strides = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
        self.offset = 0
        self.buffer = "shared_hbm" if kind != "private" else "hbm"

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def reshape(self, shape) -> HbmTensor:
        shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        if math.prod(shape) != math.prod(self.shape):
            raise fail(
                f"reshape of '{self.name}': {self.shape} has {math.prod(self.shape)} "
                f"elements, {shape} has {math.prod(shape)}"
            )
        view = object.__new__(HbmTensor)
        view.__dict__.update(self.__dict__)
        view.shape = shape
        view.strides = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
        return view

    def __getitem__(self, key) -> HbmAccess:
        key = key if isinstance(key, tuple) else (key,)
        indirect = [d for d, k in enumerate(key) if isinstance(k, (TileAccess, Tile, Deferred))]
        if indirect:
            return self._indirect(key, indirect)
        if len(key) < len(self.shape) and all(type(k) is int for k in key):
            return self._subtensor(key)
        starts, axes = _resolve(self.shape, key, f"'{self.name}'")
        offset = self.offset + sum(s * st for s, st in zip(starts, self.strides, strict=False))
        dims = [(count, step * self.strides[dim]) for dim, _, count, step, _, _ in axes]
        return HbmAccess(
            self, offset, dims, tuple(axis[4] for axis in axes), tuple(axis[5] for axis in axes)
        )

    def _subtensor(self, key: tuple[int, ...]) -> HbmTensor:
        """tensor[b, h]: the tensor of the remaining dimensions at those leading indices."""
        for dim, (k, extent) in enumerate(zip(key, self.shape, strict=False)):
            if not 0 <= k < extent:
                raise fail(
                    f"'{self.name}': index {k} out of range for dim {dim} of size {extent}",
                    IndexError,
                )
        view = object.__new__(HbmTensor)
        view.__dict__.update(self.__dict__)
        view.offset = self.offset + sum(k * st for k, st in zip(key, self.strides, strict=False))
        view.shape = self.shape[len(key) :]
        view.strides = self.strides[len(key) :]
        return view

    def _indirect(self, key: tuple, dims: list[int]) -> HbmAccess:
        """tensor[..., index_tile, cols]: row index[p] of dim `d` lands on partition p (a gather
        on the DMA engines with software descriptors)."""
        what = f"'{self.name}'"
        if len(dims) > 1:
            raise fail(f"{what}: one indirect index per access is supported", NotImplementedError)
        d = dims[0]
        index = as_access(key[d], f"{what} indirect index")
        if index.free_size != 1 or index.dtype != np.dtype(np.int32):
            raise fail(
                f"{what}: an indirect index is an int32 [P, 1] tile, got {index.dtype.name} of "
                f"shape {index.shape}"
            )
        starts, axes = _resolve(self.shape, (*key[:d], 0, *key[d + 1 :]), what)
        if any(axis[0] < d for axis in axes):
            raise fail(
                f"{what}: the indices before an indirect index must be integers",
                NotImplementedError,
            )
        cols = self.strides[d]
        base = self.offset + sum(s * st for s, st in zip(starts[:d], self.strides[:d], strict=True))
        col0 = sum(s * st for s, st in zip(starts[d + 1 :], self.strides[d + 1 :], strict=True))
        dims = [(count, step * self.strides[dim]) for dim, _, count, step, _, _ in axes]
        access = HbmAccess(
            self,
            col0,
            dims,
            (None, *(axis[4] for axis in axes)),
            (None, *(axis[5] for axis in axes)),
        )
        access.indirect = (index, base // cols, self.shape[d], cols)
        access.shape = (index.partitions, *(count for count, _ in dims))
        return access

    def __setitem__(self, key, value) -> None:
        from .language import store

        store(self[key], value)

    def __repr__(self) -> str:
        return f"HbmTensor('{self.name}', shape={self.shape}, dtype={self.dtype})"


class HbmAccess:
    """An access pattern into an HBM tensor: element offset and (count, stride) dims; the first
    dim becomes the partition dim of a tile it is loaded into."""

    def __init__(
        self,
        tensor: HbmTensor,
        offset: int,
        dims: list[tuple[int, int]],
        aranges: tuple = (),
        limits: tuple = (),
    ):
        self.tensor, self.offset, self.dims = tensor, offset, dims
        self.aranges, self.limits = aranges, limits
        self.shape = tuple(count for count, _ in dims) or (1,)
        # A gather: (index access, first row, rows, elements per row); offset and dims are then
        # the column offset and the column dims within a row.
        self.indirect: tuple | None = None

    def gather(self, what: str) -> tuple:
        """(row_offset, rows, cols, index view, col0) of a gather, cut to the current mask."""
        index, row_offset, rows, cols = self.indirect
        col0, dims = _masked(self.offset, self.dims, self.aranges[1:], self.limits[1:], what, 1)
        merged = merge_dims(dims)
        if len(merged) > 1 or (merged and merged[0][1] != 1):
            raise fail(
                f"{what}: the columns of a gathered row must be one contiguous run, got {merged}",
                NotImplementedError,
            )
        return row_offset, rows, cols, index.ref(), col0

    @property
    def dtype(self) -> np.dtype:
        return self.tensor.dtype

    def pattern(self, what: str) -> tuple:
        offset, dims = _masked(
            self.offset, self.dims or [(1, 1)], self.aranges, self.limits, f"'{self.tensor.name}'"
        )
        partitions, partition_stride = dims[0]
        free = merge_dims(dims[1:]) or [(1, 1)]
        if len(free) > 3:
            raise fail(
                f"{what}: an HBM access with {len(free)} free dimensions that do not "
                "merge (at most 3)",
                NotImplementedError,
            )
        return (self.tensor.id, offset, partition_stride, partitions, free)


class Tile:
    """An SBUF or PSUM tensor: `blocks` leading dims (an array of tiles), a partition dim and
    free dims. One builder buffer holds all blocks side by side on the free axis."""

    def __init__(
        self,
        tracer: Tracer,
        tile_id: int,
        memory: str,
        dtype: np.dtype,
        blocks: tuple[int, ...],
        partitions: int,
        free: tuple[int, ...],
    ):
        self.tracer, self.id, self.memory, self.dtype = tracer, tile_id, memory, np_dtype(dtype)
        self.blocks, self.partitions, self.free = blocks, partitions, free
        self.free_size = math.prod(free)
        self.free_strides = tuple(math.prod(free[i + 1 :]) for i in range(len(free)))
        self.pending_zero = False  # PSUM nl.zeros not yet materialized (a matmul overwrites)
        # Shared with reshaped views: "evicted_by" names the declaration that took the buffer.
        self.state: dict[str, Any] = {}

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.blocks, self.partitions, *self.free)

    @property
    def buffer(self) -> str:
        return self.memory

    def whole(self) -> TileAccess:
        """All of the tile: its declared shape, or for an array of tiles every block as one run."""
        if self.blocks:
            return TileAccess(
                self, 0, self.partitions, 0, [(math.prod(self.blocks) * self.free_size, 1)]
            )
        return self[...]

    def __getitem__(self, key) -> TileAccess:
        if not isinstance(key, tuple):
            if key is Ellipsis and not self.blocks:
                return TileAccess(
                    self,
                    0,
                    self.partitions,
                    0,
                    list(zip(self.free, self.free_strides, strict=True)),
                )
            key = (key,)
        cache_key = _cache_key(key)
        if cache_key is not None:
            cache_key = (self.blocks, self.partitions, self.free, cache_key)
            cached = _TILE_INDEX_CACHE.get(cache_key)
            if cached is not None:
                # The hot path of tracing: fill the slots directly, skipping __init__'s work.
                access = _new_access(TileAccess)
                access.tile = self
                access.just_updated = False
                (
                    access.p0,
                    access.partitions,
                    access.offset,
                    access.dims,
                    access.aranges,
                    access.limits,
                    access.shape,
                    access.free_size,
                    access.ref_tail,
                ) = cached
                return access
        nb = len(self.blocks)
        if nb:
            lead = key[:nb]
            if any(k is Ellipsis for k in lead) or len(key) < nb:
                raise fail(
                    f"a tile array of shape {self.shape} is indexed with its {nb} leading "
                    "block indices (integers) first",
                    IndexError,
                )
            block = 0
            for k, extent in zip(lead, self.blocks, strict=False):
                if not isinstance(k, (int, np.integer)):
                    raise fail(
                        f"block indices of a tile array must be integers, got {k!r}",
                        NotImplementedError,
                    )
                if not 0 <= int(k) < extent:
                    raise fail(f"block index {k} out of range for size {extent}", IndexError)
                block = block * extent + int(k)
            key = key[nb:]
            base = block * self.free_size
        else:
            base = 0
        starts, axes = _resolve((self.partitions, *self.free), key, "tile")
        access = _indexed_view(self, starts, axes, self.free_strides, base, 0)
        if cache_key is not None:
            unmasked = _current is None or _current.mask is None
            if unmasked and not access.limits and len(merge_dims(access.dims)) <= 2:
                access.ref_tail = access.ref()[1:]
            _TILE_INDEX_CACHE[cache_key] = (
                access.p0,
                access.partitions,
                access.offset,
                access.dims,
                access.aranges,
                access.limits,
                access.shape,
                access.free_size,
                access.ref_tail,
            )
        return access

    def __setitem__(self, key, value) -> None:
        assign(self[key], value)

    def __iadd__(self, other):
        accumulate(self.whole(), other, "add")
        return self

    def __isub__(self, other):
        accumulate(self.whole(), other, "subtract")
        return self

    def __imul__(self, other):
        accumulate(self.whole(), other, "multiply")
        return self

    def broadcast_to(self, shape) -> TileAccess:
        return self.whole().broadcast_to(shape)

    def reshape(self, shape) -> Tile:
        shape = tuple(int(s) for s in shape)
        if self.blocks or shape[0] != self.partitions or math.prod(shape[1:]) != self.free_size:
            raise fail(
                f"tile reshape from {self.shape} to {shape}: the partition dim must stay "
                "and the free size must match"
            )
        view = object.__new__(Tile)
        view.__dict__.update(self.__dict__)
        view.free = shape[1:]
        view.free_strides = tuple(math.prod(view.free[i + 1 :]) for i in range(len(view.free)))
        view.base = self  # the buffer stays the declared tile's while the view lives
        return view

    def __repr__(self) -> str:
        return f"Tile({self.memory}, shape={self.shape}, dtype={self.dtype})"


def _indexed_view(
    tile: Tile, starts: list[int], axes: list[tuple], free_strides, offset: int, p0: int
) -> TileAccess:
    """The access that `_resolve`'s (starts, axes) select from a [partitions, free...] region
    of `tile` at element `offset` and partition `p0`, whose free axes have `free_strides`."""
    strides = (0, *free_strides)
    offset += sum(s * st for s, st in zip(starts[1:], strides[1:], strict=True))
    partition_axes = [a for a in axes if a[0] == 0]
    if axes and axes[0][0] != 0 and partition_axes:
        raise fail(
            "the partition dimension must be the first dimension of a tile access",
            NotImplementedError,
        )
    if partition_axes and partition_axes[0][3] != 1:
        raise fail(
            f"partition dimension access with step {partition_axes[0][3]}: partitions cannot "
            "be strided",
            NkiError,
        )
    pcount = partition_axes[0][2] if partition_axes else 1
    dims = [(count, step * strides[dim]) for dim, _, count, step, _, _ in axes if dim != 0]
    partition = partition_axes[0] if partition_axes else (0, starts[0], 1, 1, None, None)
    aranges = (partition[4], *(axis[4] for axis in axes if axis[0] != 0))
    limits = (partition[5], *(axis[5] for axis in axes if axis[0] != 0))
    if all(limit is None for limit in limits):
        limits = ()  # nothing to check when the access is used
    return TileAccess(tile, p0 + starts[0], pcount, offset, dims, aranges, limits)


def access_values(access: TileAccess, tile_values: np.ndarray) -> np.ndarray:
    """The values of `access` (shape access.shape) from its tile's [partitions, free] values."""
    tile = access.tile
    rows = tile_values.reshape(tile.partitions, -1)[access.p0 : access.p0 + access.partitions]
    index = np.full((), access.offset, dtype=np.int64)
    for count, stride in access.dims:
        index = index[..., None] + np.arange(count, dtype=np.int64) * stride
    return rows[:, index.reshape(-1)].reshape(access.shape)


# Tile geometry and index key -> the access's (p0, partitions, offset, dims, aranges, limits),
# for keys of integers and slices (index expressions carry their nl.arange, which masks match
# by identity, so they are resolved every time). Accesses never modify their dims.
_TILE_INDEX_CACHE: dict[tuple, tuple] = {}
_new_access = object.__new__


def _cache_key(key: tuple) -> tuple | None:
    out = []
    for k in key:
        kind = type(k)
        if kind is int or k is Ellipsis:
            out.append(k)
        elif kind is slice:
            out.append((k.start, k.stop, k.step))
        else:
            return None
    return tuple(out)


def _row_slice(ref: tuple, first: int, count: int) -> tuple:
    """Elements [first, first + count) of a one-partition view (one or two free levels)."""
    if len(ref) == 6:
        tile, p0, partitions, offset, _, stride = ref
        return (tile, p0, partitions, offset + first * stride, count, stride)
    tile, p0, partitions, offset, _, outer_stride, inner_count, inner_stride = ref
    if first % inner_count or count % inner_count:
        raise fail(
            "broadcast_to: a partition broadcast of this access pattern is not supported",
            NotImplementedError,
        )
    return (
        tile,
        p0,
        partitions,
        offset + first // inner_count * outer_stride,
        count // inner_count,
        outer_stride,
        inner_count,
        inner_stride,
    )


class TileAccess:
    """Partitions [p0, p0 + partitions) and a free access pattern (offset, (count, stride)...)
    of a tile."""

    __slots__ = (
        "aranges",
        "dims",
        "free_size",
        "just_updated",
        "limits",
        "offset",
        "p0",
        "partitions",
        "ref_tail",
        "shape",
        "tile",
    )

    def __init__(
        self,
        tile: Tile,
        p0: int,
        partitions: int,
        offset: int,
        dims: list[tuple[int, int]],
        aranges: tuple = (),
        limits: tuple = (),
        shape: tuple | None = None,
    ):
        self.tile, self.p0, self.partitions = tile, p0, partitions
        self.offset, self.dims = offset, dims
        # Per output axis (partition first): its nl.arange and range limit, if any.
        self.aranges, self.limits = aranges, limits
        self.just_updated = False
        if shape is None:
            shape = (partitions, *(count for count, _ in dims))
        self.shape = shape
        self.free_size = math.prod(shape) // partitions if partitions else 0
        # ref() without its tile id, when it needs no mask or range check (set by the index
        # cache).
        self.ref_tail: tuple | None = None

    @property
    def dtype(self) -> np.dtype:
        return self.tile.dtype

    @property
    def memory(self) -> str:
        return self.tile.memory

    def ref(self) -> tuple:
        """The builder's tile view: one free level, or two (outer, inner); under a mask, its
        kept sub-rectangle."""
        if self.tile.state:
            raise fail(
                f"this tile's buffer was taken by a later tile declared at "
                f"{self.tile.state['evicted_by']} because memory ran out; keep fewer tiles of "
                "that declaration alive at once, or make them smaller"
            )
        if self.ref_tail is not None and (_current is None or _current.mask is None):
            return (self.tile.id, *self.ref_tail)
        p0, partitions = self.p0, self.partitions
        offset, dims = self.offset, self.dims
        if self.limits or (_current is not None and _current.mask is not None):
            skipped, ((partitions, _),) = _masked(
                0, [(partitions, 1)], self.aranges[:1], self.limits[:1], "tile"
            )
            p0 += skipped
            offset, dims = _masked(
                offset, dims, self.aranges[1:], self.limits[1:], "tile", first_axis=1
            )
        merged = merge_dims(dims)
        if len(merged) > 2:
            raise fail(
                f"a tile access of shape {self.shape} whose free dimensions merge into "
                f"{len(merged)} strided levels {merged} (at most 2) is not supported by "
                "tilelab.nki yet",
                NotImplementedError,
            )
        if len(merged) == 2:
            (outer_count, outer_stride), (inner_count, inner_stride) = merged
            return (
                self.tile.id,
                p0,
                partitions,
                offset,
                outer_count,
                outer_stride,
                inner_count,
                inner_stride,
            )
        count, stride = merged[0] if merged else (1, 1)
        return (self.tile.id, p0, partitions, offset, count, stride)

    def covers_tile(self) -> bool:
        return (
            self.p0 == 0
            and self.partitions == self.tile.partitions
            and self.offset == 0
            and self.free_size == self.tile.free_size * math.prod(self.tile.blocks)
        )

    def __getitem__(self, key) -> TileAccess:
        """A view of this view (e.g. `buffers[i, j][:, 0]`): indices into its shape."""
        if key == Ellipsis or key == (Ellipsis,):
            return self
        if self.limits or len(self.dims) != len(self.shape) - 1:
            raise fail(
                "indexing this tile view again is not supported (it has index-expression "
                "ranges to check or merged axes); index the tile once",
                NotImplementedError,
            )
        starts, axes = _resolve(self.shape, key, "tile view")
        if any(limit is not None for *_, limit in axes):
            raise fail(
                "index expressions into a tile view are not supported; index the tile once",
                NotImplementedError,
            )
        free_strides = tuple(stride for _, stride in self.dims)
        return _indexed_view(self.tile, starts, axes, free_strides, self.offset, self.p0)

    def __setitem__(self, key, value) -> None:
        assign(self[key], value)

    def broadcast_to(self, shape) -> TileAccess:
        """The access repeated along free axes of extent 1 (a stride-0 view, read as the
        instruction streams it). The partition dimension cannot be broadcast this way."""
        shape = tuple(int(s) for s in shape)
        if shape[0] != self.partitions:
            if self.partitions != 1:
                raise fail(
                    f"broadcast_to {shape} from {self.shape}: only a partition dimension of 1 "
                    "can be broadcast"
                )
            return self._broadcast_partitions(shape[0]).broadcast_to(shape)
        if len(self.dims) == len(self.shape) - 1 <= len(shape) - 1:
            free = list(self.dims)  # one (count, stride) per axis of the access's shape
        else:
            free = [d for d in self.dims if d[0] != 1]
        if len(free) > len(shape) - 1:
            raise fail(f"broadcast_to {shape} from {self.shape}: ranks do not match")
        # Existing axes align with the trailing target axes, as in numpy.
        free = [(1, 0)] * (len(shape) - 1 - len(free)) + free
        dims = []
        for (count, stride), want in zip(free, shape[1:], strict=True):
            if count == want:
                dims.append((count, stride))
            elif count == 1:
                dims.append((want, 0))
            else:
                raise fail(f"broadcast_to {shape} from {self.shape}: extent {count} is not 1")
        return TileAccess(self.tile, self.p0, self.partitions, self.offset, dims)

    def _broadcast_partitions(self, partitions: int) -> TileAccess:
        """[1, n] copied to [partitions, n] the way the compiler does it: a TensorE matmul of a
        ones vector (stationary [1, partitions], made once per kernel) with the row, in
        PSUM-bank-sized pieces, each copied to a new SBUF tile (an fp32 row that fits one bank
        may stay in PSUM)."""
        t = tracer()
        t.flush()
        n = self.free_size
        site = _user_frames()
        row = TileAccess(self.tile, self.p0, 1, self.offset, self.dims).ref()
        # TensorE multiplies floats: integer rows go through fp32 (exact below 2^24).
        pe_dtype = (
            self.dtype
            if self.dtype.kind == "f" or self.dtype.name == "bfloat16"
            else (np.dtype(np.float32))
        )
        if pe_dtype != self.dtype:
            as_float = new_tile((1, n), pe_dtype, "sbuf", site).whole()
            t.emit("nki_tensor_copy", as_float.ref(), row, "vector")
            row = as_float.ref()
        ones = t.constants.get(("ones", partitions, pe_dtype))
        if ones is None:
            ones = new_tile((1, partitions), pe_dtype, "sbuf", (("ones", 0, "constant"),)).whole()
            t.emit("nki_memset", ones.ref(), 1.0, "vector")
            t.constants["ones", partitions, pe_dtype] = ones
        piece = t.machine["psum_bank_bytes_per_partition"] // 4
        if self.dtype == np.float32 and n <= piece:
            # An fp32 row that fits one bank stays in PSUM, where the consumer reads it (the
            # Mamba tutorial's "p-dim broadcast + tensor_tensor"; one operand in PSUM is also
            # VectorE's fast case). While the broadcast is referenced, it holds that bank.
            bank = new_tile((partitions, n), np.float32, "psum", site).whole()
            t.emit("nki_matmul", bank.ref(), ones.ref(), row, False)
            return bank
        out = new_tile((partitions, n), self.dtype, "sbuf", site)
        for first in range(0, n, piece):
            count = min(piece, n - first)
            bank = new_tile((partitions, piece), np.float32, "psum", site)
            moving = _row_slice(row, first, count)
            t.emit("nki_matmul", bank[:, 0:count].ref(), ones.ref(), moving, False)
            t.emit(
                "nki_tensor_copy",
                out[:, first : first + count].ref(),
                bank[:, 0:count].ref(),
                "vector",
            )
        return out.whole()

    def __iadd__(self, other):
        accumulate(self, other, "add")
        self.just_updated = True
        return self

    def __isub__(self, other):
        accumulate(self, other, "subtract")
        self.just_updated = True
        return self

    def __imul__(self, other):
        accumulate(self, other, "multiply")
        self.just_updated = True
        return self


# Arithmetic operators of tiles and accesses are the nl functions (language.py binds them).


# --- deferred operations ------------------------------------------------------------------------


class Deferred:
    """An operation whose destination is not known yet: `emit(dst)` writes it into a TileAccess.
    `memory` is where a fresh result tile lives (psum for TensorE results)."""

    __slots__ = ("dtype", "emit_into", "mask", "memory", "name", "result", "shape", "site")

    def __init__(
        self,
        name: str,
        emit_into,
        shape: tuple[int, ...],
        dtype: np.dtype,
        memory: str = "sbuf",
        mask=None,
    ):
        t = tracer()
        t.flush()
        self.name, self.emit_into, self.shape = name, emit_into, tuple(shape)
        self.dtype, self.memory = np_dtype(dtype), memory
        self.mask = as_mask(mask)
        self.site = _user_frames()
        self.result: TileAccess | None = None  # the fresh tile it was materialized into
        t.pending = self

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def emit(self, dst: TileAccess) -> None:
        if self.result is not None:  # used already: copy its result
            assign(dst, self.result)
            return
        t = tracer()
        if t.pending is self:
            t.pending = None
        t.flush()
        if self.memory == "psum" and dst.memory != "psum":
            # TensorE writes PSUM only: the compiler goes through a PSUM tile and copies.
            assign(dst, self.materialize())
            return
        if self.memory != "psum":  # TensorE results handle a pending PSUM zero fill themselves
            prepare_write(dst)
        self.emit_at_site(dst)

    def emit_at_site(self, dst: TileAccess, **options) -> None:
        t = tracer()
        outer, t.site_override = t.site_override, self.site
        outer_mask, t.mask = t.mask, self.mask
        try:
            self.emit_into(dst, **options)
        except MaskedOutError:
            pass
        finally:
            t.site_override, t.mask = outer, outer_mask

    def materialize(self) -> TileAccess:
        """The result in a fresh tile allocated at the operation's site (once)."""
        if self.result is not None:
            return self.result
        t = tracer()
        if t.pending is self:
            t.pending = None
        t.flush()
        dst = new_tile(self.shape, self.dtype, self.memory, self.site).whole()
        self.emit_at_site(dst)
        self.result = dst
        return dst

    def __getitem__(self, key) -> TileAccess:
        return self.materialize().tile[key]

    def reshape(self, shape) -> Tile:
        return self.materialize().tile.reshape(shape)

    def broadcast_to(self, shape) -> TileAccess:
        return self.materialize().broadcast_to(shape)


def new_tile(
    shape: tuple[int, ...], dtype: np.dtype, memory: str, site: tuple, blocks: int = 0
) -> Tile:
    """A tile of `shape` (partition dim at index `blocks`) from the site's buffers."""
    t = tracer()
    dtype = np_dtype(dtype)
    if len(shape) <= blocks:
        raise fail(f"tile shape {shape} has no partition dimension")
    partitions = shape[blocks]
    if partitions > t.machine["partitions"]:
        raise fail(
            f"partition dimension {partitions} exceeds pmax = {t.machine['partitions']} "
            "(the partition dimension is the first dimension of a tile, or the one "
            "marked with nl.par_dim)"
        )
    free = shape[blocks + 1 :] or (1,)
    total = math.prod(shape[:blocks]) * math.prod(free)
    if memory == "psum" and dtype.itemsize * total > t.machine["psum_bank_bytes_per_partition"]:
        raise fail(
            f"a PSUM tile of shape {shape} {dtype.name} needs "
            f"{dtype.itemsize * total} B per partition; a PSUM tile must fit "
            f"one bank ({t.machine['psum_bank_bytes_per_partition']} B)"
        )
    tile_id, entry, slot = t.allocate(memory, partitions, total, dtype, site)
    tile = Tile(t, tile_id, memory, dtype, shape[:blocks], partitions, free)
    entry.owners[slot] = weakref.ref(tile)
    return tile


def as_access(value, what: str) -> TileAccess:
    """A tile operand: a TileAccess, a Tile (whole) or a deferred result (materialized)."""
    if isinstance(value, TileAccess):
        return value
    if isinstance(value, Tile):
        return value.whole()
    if isinstance(value, Deferred):
        return value.materialize()
    if isinstance(value, HbmTensor | HbmAccess):
        raise fail(
            f"{what}: an HBM tensor cannot be an operand of a compute instruction; "
            "nl.load it into SBUF first"
        )
    raise fail(f"{what}: expected a tile, got {type(value).__name__}", TypeError)


def prepare_write(dst: TileAccess) -> None:
    """Before a write that is not a matmul overwrite: a pending PSUM zero fill becomes real
    (over the whole tile, whatever mask the write has)."""
    tile = dst.tile
    if tile.pending_zero:
        tile.pending_zero = False
        t = tile.tracer
        outer, t.mask = t.mask, None
        try:
            t.emit("nki_memset", tile.whole().ref(), 0.0, "vector")
        finally:
            t.mask = outer


def materialize_zero(access: TileAccess) -> None:
    if access.tile.pending_zero:
        prepare_write(access)


def assign(dst: TileAccess, value) -> None:
    """dst[...] = value."""
    t = tracer()
    if (
        isinstance(value, TileAccess)
        and value.just_updated
        and value.tile is dst.tile
        and (value.offset, value.p0) == (dst.offset, dst.p0)
    ):
        value.just_updated = False  # the setitem of `tile[...] += x`: already written
        return
    if isinstance(value, Deferred):
        check_shape(dst, value.shape, value.name)
        value.emit(dst)
        return
    if isinstance(value, (int, float, np.integer, np.floating)):
        t.flush()
        prepare_write(dst)
        t.emit("nki_memset", dst.ref(), float(value), "vector")
        return
    src = as_access(value, "assignment")
    check_shape(dst, src.shape, "assignment")
    t.flush()
    materialize_zero(src)
    prepare_write(dst)
    t.emit("nki_tensor_copy", dst.ref(), src.ref(), "vector")


def check_shape(dst: TileAccess, shape: tuple[int, ...], what: str) -> None:
    if dst.partitions != shape[0] or dst.free_size != math.prod(shape[1:]):
        raise fail(
            f"{what}: result of shape {tuple(shape)} assigned to a tile region of shape {dst.shape}"
        )


def accumulate(dst: TileAccess, value, op: str) -> None:
    """dst op= value: a matmul accumulates in PSUM, anything else is a vector instruction."""
    from .language import _is_matmul

    t = tracer()
    if isinstance(value, Deferred) and _is_matmul(value) and op == "add" and value.result is None:
        check_shape(dst, value.shape, value.name)
        if t.pending is value:
            t.pending = None
        t.flush()
        value.emit_at_site(dst, accumulate=True)
        return
    if isinstance(value, (int, float, np.integer, np.floating)):
        t.flush()
        materialize_zero(dst)
        t.emit(
            "nki_tensor_scalar", dst.ref(), dst.ref(), op, float(value), "bypass", None, "vector"
        )
        return
    src = as_access(value, f"{op}=")
    check_shape(dst, src.shape, f"{op}=")
    t.flush()
    materialize_zero(dst)
    materialize_zero(src)
    t.emit("nki_tensor_tensor", dst.ref(), dst.ref(), src.ref(), op)
