"""tilelab.nki: NKI on a laptop.

Two things live here:

- **Your own kernels, in the NKI language.** ``tilelab.nki.jit``, ``tilelab.nki.language``
  (``nl``) and ``tilelab.nki.isa`` (``nisa``) follow ``neuronxcc.nki``. A kernel is traced by
  running its Python body once per program id of its launch grid; every nl/nisa call emits
  instructions into the simulator's tile program. :func:`simulate_kernel` runs the program on
  numbers and returns the outputs; :func:`profile_kernel` also times it on a simulated NeuronCore
  and returns a :class:`tilelab.sim.Report` (engines, DMA, critical path, why engines waited).
  :func:`install_neuronxcc_alias` lets a kernel file written for ``neuronxcc`` run unmodified.
- **vLLM's NKI flash paged attention** as CPU code (:func:`flash_paged_attention`,
  :func:`reshape_and_cache`), generated from one Halide algorithm.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import sys
import types

import numpy as np

from .. import _core
from .. import sim as _sim
from . import _trace
from . import isa as isa
from . import language as language
from ._paged import (
    MASKED_SCORE,
    flash_paged_attention,
    reorder_context_mask,
    reshape_and_cache,
)
from ._trace import NkiError

__all__ = [
    "MASKED_SCORE",
    "NkiError",
    "TensorSpec",
    "flash_paged_attention",
    "install_neuronxcc_alias",
    "instances",
    "isa",
    "jit",
    "language",
    "profile_kernel",
    "reorder_context_mask",
    "reshape_and_cache",
    "simulate_kernel",
    "tensor",
]


class TensorSpec:
    """A kernel argument known by shape and dtype only, for timing-only runs
    (``profile_kernel(..., functional=False)``)."""

    def __init__(self, shape, dtype):
        self.shape = tuple(int(s) for s in shape)
        if any(s < 1 for s in self.shape):
            raise ValueError(f"shape: expected positive extents, got {shape}")
        self.dtype = _trace.np_dtype(dtype)

    def __repr__(self) -> str:
        return f"TensorSpec({self.shape}, {self.dtype.name})"


def tensor(shape, dtype) -> TensorSpec:
    """A shape-and-dtype-only kernel argument: ``tensor((4096, 8192), nl.bfloat16)``."""
    return TensorSpec(shape, dtype)


class Kernel:
    """A function decorated with :func:`jit`. ``kernel[g0, g1]`` launches it on an SPMD grid;
    calling it directly runs it functionally like :func:`simulate_kernel` with a grid of 1."""

    def __init__(self, func, **options):
        functools.update_wrapper(self, func)
        self.func = func
        self.options = options

    def __getitem__(self, grid) -> Launch:
        return Launch(self, grid)

    def __call__(self, *args, **kwargs):
        if _trace._current is not None:
            return self.func(*args, **kwargs)  # a helper kernel called from a traced kernel
        return simulate_kernel(Launch(self, 1), *args, **kwargs)


class Launch:
    """A kernel with its launch grid (instances run one after another on one NeuronCore)."""

    def __init__(self, kernel: Kernel, grid):
        grid = grid if isinstance(grid, tuple) else (grid,)
        if not grid or any(not isinstance(g, (int, np.integer)) or g < 1 for g in grid):
            raise ValueError(f"grid: expected positive integers, got {grid!r}")
        self.kernel, self.grid = kernel, tuple(int(g) for g in grid)

    def __call__(self, *args, **kwargs):
        """Runs the launch on numbers, like :func:`simulate_kernel`."""
        return simulate_kernel(self, *args, **kwargs)


def jit(func=None, **options):
    """Marks an NKI kernel (``@nki.jit`` or ``@nki.jit(mode=...)``; options are accepted and
    ignored: the kernel is always traced into the simulator)."""
    if func is None:
        return lambda f: Kernel(f, **options)
    return Kernel(func, **options)


def _launch(kernel) -> Launch:
    if isinstance(kernel, Launch):
        return kernel
    if isinstance(kernel, Kernel):
        return Launch(kernel, 1)
    if callable(kernel):
        return Launch(Kernel(kernel), 1)
    raise TypeError(
        f"kernel: expected an @nki.jit kernel (optionally kernel[grid]), got "
        f"{type(kernel).__name__}"
    )


def _is_array(value) -> bool:
    return isinstance(value, (np.ndarray, TensorSpec)) or hasattr(value, "__dlpack__")


class _Traced:
    """A traced launch: its tracer, (result, output tensors), the functional inputs, the
    kernel's arguments as traced (HBM tensors for arrays, defaults filled in) and the first
    instruction of each SPMD instance."""

    def __init__(self, tracer, outputs, inputs, arguments, instance_starts):
        self.tracer, self.outputs, self.inputs = tracer, outputs, inputs
        self.arguments, self.instance_starts = arguments, instance_starts


def _trace_kernel(launch: Launch, args, kwargs, machine, functional: bool) -> _Traced:
    func = launch.kernel.func
    try:
        bound = inspect.signature(func).bind(*args, **kwargs)
    except TypeError as error:
        raise TypeError(f"{func.__name__}: {error}") from None
    bound.apply_defaults()
    source, overrides = _sim._machine_spec("trn1" if machine is None else machine)
    tracer = _trace.Tracer(func.__name__, source, overrides)
    call = {}
    inputs: dict[str, np.ndarray] = {}
    if _trace._current is not None:
        raise RuntimeError("a kernel is being traced already (kernels do not nest)")
    _trace._current = tracer
    try:
        for name, value in bound.arguments.items():
            if not _is_array(value):
                call[name] = value
                continue
            if isinstance(value, TensorSpec):
                if functional:
                    raise ValueError(
                        f"{name}: a TensorSpec has no data; pass an array, or "
                        "profile with functional=False"
                    )
                shape, dtype = value.shape, value.dtype
            else:
                array = np.asarray(
                    _core._as_array(value, name) if not isinstance(value, np.ndarray) else value
                )
                shape, dtype = array.shape, array.dtype
                if functional:
                    inputs[name] = np.ascontiguousarray(array, dtype=np.float32).reshape(-1)
            dtype = _trace.np_dtype(dtype, name)
            call[name] = tracer.hbm_tensor(name, tuple(shape) or (1,), dtype, "input")
        tracer.entry_code = func.__code__
        result = None
        starts = []
        for program_id in itertools.product(*(range(g) for g in launch.grid)):
            tracer.program_id, tracer.grid = program_id, launch.grid
            starts.append(_core.nki_instruction_count(tracer.builder))
            result = func(**call)
            tracer.flush()
    finally:
        _trace._current = None
    outputs = result if isinstance(result, (tuple, list)) else (() if result is None else (result,))
    for output in outputs:
        if not isinstance(output, _trace.HbmTensor):
            raise TypeError(
                f"{func.__name__}: a kernel returns HBM tensors (nl.ndarray(..., "
                f"buffer=nl.shared_hbm)), got {type(output).__name__}"
            )
    return _Traced(tracer, (result, list(outputs)), inputs, call, starts)


def _read_outputs(traced: _Traced, program):
    result, outputs = traced.outputs
    names = [o.name for o in outputs]
    prints = traced.tracer.prints
    values, tiles = _core.nki_run_functional(
        program, traced.inputs, names, [(index, access.tile.id) for _, index, access in prints]
    )
    for (prefix, _, access), tile_values in zip(prints, tiles, strict=True):
        shown = _trace.access_values(access, tile_values).astype(access.dtype)
        print(prefix, shown)
    arrays = [values[o.name].reshape(o.shape).astype(o.dtype) for o in outputs]
    if isinstance(result, (tuple, list)):
        return type(result)(arrays)
    return None if result is None else arrays[0]


def simulate_kernel(kernel, *args, machine=None, **kwargs):
    """Runs an NKI kernel on numbers: ``simulate_kernel(kernel[grid], *args, **kwargs)`` returns
    its outputs as numpy arrays (the signature of ``neuronxcc.nki.simulate_kernel``).

    Arrays are numpy arrays (float32, float16, ml_dtypes.bfloat16, float8_e4m3fn, int32, uint8,
    bool) or objects with ``__dlpack__``; other arguments are passed to the kernel as they are.
    """
    launch = _launch(kernel)
    traced = _trace_kernel(launch, args, kwargs, machine, functional=True)
    program = _core.nki_finish(traced.tracer.builder)
    return _read_outputs(traced, program)


def profile_kernel(kernel, *args, machine="trn1", functional: bool = True, **kwargs):
    """Traces, runs and times an NKI kernel on a simulated NeuronCore: returns ``(outputs,
    report)`` with a :class:`tilelab.sim.Report`. With ``functional=False`` only shapes and
    dtypes are needed (arrays or :func:`tensor` specs) and outputs is None.

    ``machine``: a :class:`tilelab.sim.Machine`, a preset name ("trn1", "trn2") or a JSON path.
    """
    launch = _launch(kernel)
    traced = _trace_kernel(launch, args, kwargs, machine, functional)
    program = _core.nki_finish(traced.tracer.builder)
    outputs = _read_outputs(traced, program) if functional else None
    parameters = {"grid": ",".join(map(str, launch.grid))}
    if len(traced.instance_starts) > 1:
        parameters["instance_first_instructions"] = ",".join(map(str, traced.instance_starts))
    for name, value in traced.arguments.items():
        if isinstance(value, _trace.HbmTensor):
            shape = ",".join(map(str, value.shape))
            parameters[name] = f"{_trace.sim_dtype(value.dtype)}[{shape}]"
        else:
            parameters[name] = repr(value)
    handle = _core.nki_time_program(program, launch.kernel.func.__name__, parameters, False)
    return outputs, _sim.Report(handle)


def instances(report) -> list[dict]:
    """Per SPMD instance of a :func:`profile_kernel` run (they run one after another on one
    NeuronCore): its program id, first instruction, instruction count and the interval from its
    first instruction's start to its last one's end, in ns. One entry for a grid of 1."""
    timeline = report.timeline
    grid = tuple(int(g) for g in report.parameters.get("grid", "1").split(","))
    firsts = report.parameters.get("instance_first_instructions")
    starts = [int(i) for i in firsts.split(",")] if firsts else [0]
    bounds = [*starts, len(timeline)]
    out = []
    for program_id, first, end in zip(
        itertools.product(*(range(g) for g in grid)), bounds, bounds[1:], strict=False
    ):
        rows = timeline[first:end]
        out.append(
            {
                "program_id": program_id,
                "first_instruction": first,
                "instructions": end - first,
                "start_ns": float(rows["start_ns"].min()) if len(rows) else 0.0,
                "end_ns": float(rows["end_ns"].max()) if len(rows) else 0.0,
            }
        )
    return out


# --- neuronxcc aliases --------------------------------------------------------------------------


def install_neuronxcc_alias() -> None:
    """Registers ``neuronxcc``, ``neuronxcc.nki``, ``neuronxcc.nki.language`` and
    ``neuronxcc.nki.isa`` as aliases of tilelab.nki, so a kernel file written with
    ``from neuronxcc import nki`` / ``import neuronxcc.nki.language as nl`` runs unmodified.
    Refused when a real ``neuronxcc`` is imported already."""
    existing = sys.modules.get("neuronxcc")
    if existing is not None and not getattr(existing, "__tilelab_alias__", False):
        raise RuntimeError("install_neuronxcc_alias: the real neuronxcc is imported already")
    root = types.ModuleType("neuronxcc")
    root.__tilelab_alias__ = True
    root.__path__ = []
    nki_module = sys.modules[__name__]
    root.nki = nki_module
    sys.modules["neuronxcc"] = root
    sys.modules["neuronxcc.nki"] = nki_module
    sys.modules["neuronxcc.nki.language"] = language
    sys.modules["neuronxcc.nki.isa"] = isa
    typing_module = types.ModuleType("neuronxcc.nki.typing")
    typing_module.tensor = TensorSpec
    sys.modules["neuronxcc.nki.typing"] = typing_module
