"""tilelab.sim: explore schedules of the NKI-style flash paged attention kernel on the simulated
NeuronCore-like tile machine, from Python or a notebook.

- :class:`Machine`: a machine description (``Machine.preset("trn1")``), fields readable and
  overridable (``m.dma_bytes_per_ns_per_engine = 20``).
- :class:`PagedAttentionSchedule`: the kernel's knobs, validated when built.
- :func:`simulate`: any registered kernel (:func:`kernels`) with its ``tilelab sim`` parameters
  -> :class:`Report`.
- :func:`simulate_paged_attention_batch`: simulate a batch described by its request lengths
  (timing only, fast) -> :class:`Report`.
- :func:`simulate_flash_paged_attention`: the arguments of
  :func:`tilelab.nki.flash_paged_attention` (NKI-layout arrays) plus machine and schedule; runs the
  tile program on the numbers and returns ``(report, output)``.
- :func:`sweep`: many configurations of any kernel in parallel (OpenMP, GIL released; or on any
  ``concurrent.futures`` executor, e.g. a Dask cluster) -> a :class:`SweepResult`
  (``.to_pandas()`` for a DataFrame).

Times are in ns, sizes in bytes (per partition where the name says so), rates in GB/s.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from . import _core
from .nki._paged import _as_int32, _as_numpy

__all__ = [
    "Machine",
    "PagedAttentionSchedule",
    "Report",
    "SweepPoint",
    "SweepResult",
    "default_batch",
    "kernels",
    "program_limits",
    "set_program_limits",
    "simulate",
    "simulate_flash_paged_attention",
    "simulate_paged_attention_batch",
    "sweep",
]

_SCHEDULE_SCHEMA = "tilelab.paged_attention_schedule"
_SCHEDULE_SCHEMA_VERSION = 1
# Machine fields that describe the machine rather than configure it.
_MACHINE_READ_ONLY = ("name", "description", "source_of_key")


def _type_name(value: object) -> str:
    return type(value).__name__


def _shown(value: object, limit: int = 60) -> str:
    """repr(value) for an error message, cut to about `limit` characters."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**limit else "a huge int"
    return text if len(text) <= limit else text[:limit] + "..."


# --- Machine ---------------------------------------------------------------------------------


class Machine:
    """A NeuronCore-like machine: a preset or JSON file plus ``key=value`` overrides.

    Every number the simulator uses is an attribute named as in the machine JSON (units in the
    names: ``dma_bytes_per_ns_per_engine``, ``sbuf_bytes_per_partition``, ...); the attributes
    come from the machine's own key table (:attr:`fields`). The machine is parsed once;
    assigning a field changes it in place after validation (ValueError naming the key when out
    of range or inconsistent with the others; the machine is then unchanged):

        m = Machine.preset("trn1")
        m.dma_bytes_per_ns_per_engine = 20.0
        faster = m.with_overrides(tensor_clock_ghz=3.0)   # a changed copy
    """

    __slots__ = ("_machine", "_overrides", "_source")

    def __init__(self, source: str, overrides: Mapping[str, Any] | None = None):
        """Prefer :meth:`preset` and :meth:`from_json`. ``source`` is a preset name or a path."""
        if not isinstance(source, str):
            raise TypeError(
                f"source: expected a preset name or path (str), got {_type_name(source)}"
            )
        object.__setattr__(self, "_source", source)
        object.__setattr__(self, "_overrides", {})
        object.__setattr__(self, "_machine", _core.SimMachine.load(source, []))
        self._apply(dict(overrides or {}))

    @staticmethod
    def presets() -> list[str]:
        """The built-in preset names (``["trn1", "trn2"]``)."""
        return list(_core.sim_machine_presets())

    @classmethod
    def preset(cls, name: str) -> Machine:
        """A built-in machine: ``"trn1"`` (NeuronCore-v2) or ``"trn2"`` (NeuronCore-v3)."""
        names = cls.presets()
        if name not in names:
            allowed = ", ".join(repr(n) for n in names)
            raise ValueError(f"name: expected one of {allowed}, got {name!r}")
        return cls(name)

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> Machine:
        """A machine from a JSON file (schema ``tilelab.machine``; see sim/machines/)."""
        path = os.path.abspath(os.fspath(path))
        if not os.path.isfile(path):
            raise ValueError(f"path: no machine JSON file at '{path}'")
        return cls(path)

    def _apply(self, changes: Mapping[str, Any]) -> None:
        for key, value in changes.items():
            if key in _MACHINE_READ_ONLY:
                raise ValueError(f"{key}: describes the machine and cannot be overridden")
            if key not in _MACHINE_FIELDS:
                raise AttributeError(f"Machine has no field {key!r}")
            if isinstance(value, np.generic):
                value = value.item()
            self._machine.set(key, value)
            self._overrides[key] = value

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _MACHINE_FIELDS:
            raise AttributeError(f"Machine has no field {name!r}")
        self._apply({name: value})

    def with_overrides(self, **values: Any) -> Machine:
        """A copy with these fields changed (this machine is left as it is)."""
        copy = object.__new__(Machine)
        object.__setattr__(copy, "_source", self._source)
        object.__setattr__(copy, "_overrides", dict(self._overrides))
        object.__setattr__(copy, "_machine", self._machine.copy())
        copy._apply(values)
        return copy

    @property
    def name(self) -> str:
        """The machine's name (from its JSON)."""
        return self._machine.name

    @property
    def description(self) -> str:
        return self._machine.description

    @property
    def source(self) -> str:
        """The preset name or JSON path this machine was loaded from."""
        return self._source

    @property
    def overrides(self) -> dict[str, Any]:
        """The fields changed from the preset or file."""
        return dict(self._overrides)

    @property
    def fields(self) -> list[str]:
        """Names of every field (attribute) of the machine."""
        return ["name", "description", *_MACHINE_FIELDS]

    def to_dict(self) -> dict[str, Any]:
        """Every field and its value (``source_of_key`` maps each key to where its number comes
        from)."""
        return {
            "name": self.name,
            "description": self.description,
            **{key: self._machine.get(key) for key in _MACHINE_FIELDS},
            "source_of_key": dict(self._machine.source_of_key),
        }

    def _spec(self) -> tuple[str, tuple[str, ...]]:
        return self._source, tuple(f"{k}={json.dumps(v)}" for k, v in self._overrides.items())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Machine) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(self._spec())

    def __repr__(self) -> str:
        if not self._overrides:
            return f"Machine({self.name!r})"
        changed = ", ".join(f"{k}={v!r}" for k, v in self._overrides.items())
        return f"Machine({self.name!r}, {changed})"


def _machine_field_property(name: str, kind: str, low: float, high: float) -> property:
    def get(self: Machine) -> Any:
        return self._machine.get(name)

    def set_(self: Machine, value: Any) -> None:
        self._apply({name: value})

    allowed = "" if kind in ("boolean", "curve") else f" in [{low:g}, {high:g}]"
    return property(get, set_, doc=f"{kind}{allowed} (machine JSON key {name!r})")


_MACHINE_FIELDS: tuple[str, ...] = tuple(name for name, *_ in _core.SimMachine.fields())
for _name, _kind, _low, _high in _core.SimMachine.fields():
    setattr(Machine, _name, _machine_field_property(_name, _kind, _low, _high))


def _as_machine(machine: Machine | str | os.PathLike | None, argument: str = "machine") -> Machine:
    if machine is None:
        return Machine.preset("trn1")
    if isinstance(machine, Machine):
        return machine
    if isinstance(machine, (str, os.PathLike)):
        text = os.fspath(machine)
        return Machine.preset(text) if text in Machine.presets() else Machine.from_json(text)
    raise TypeError(
        f"{argument}: expected a Machine, a preset name or a JSON path, got {_type_name(machine)}"
    )


# --- PagedAttentionSchedule ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PagedAttentionSchedule:
    """The tiling of the flash paged attention kernel (the shared schedule description of
    schedules/paged/schedule.hpp, read by the CPU kernels and the simulator).

    Fields (named as in vLLM's NKI kernel where it has them):
        partition_tile: B_P_SIZE, query rows per tile = SBUF partitions (128).
        free_tile: B_F_SIZE, score columns per matmul = one PSUM bank of fp32 (512).
        large_tile_size: LARGE_TILE_SZ, prior-context tokens per large tile (one K/V gather, one
            softmax merge): a multiple of free_tile in [512, 8192].
        block_size: tokens per KV-cache block, a power of two <= 256 dividing large_tile_size.
        mixed_precision: bf16 tensor-engine inputs with fp32 accumulation.
        transpose: ``"pe"`` (identity matmul) or ``"dma"`` (DMA transpose, NeuronCore-v3 only).
        kv_buffers: K/V large-tile buffers in SBUF (1 serializes gather and compute, 2 double
            buffers, up to 4).

    Construction validates; ValueError names the field, the value and the constraint. Derived
    values (``block_size_tiling_factor``, ``tiled_block_size``, ...) are attributes.
    """

    partition_tile: int = 128
    free_tile: int = 512
    large_tile_size: int = 2048
    block_size: int = 32
    mixed_precision: bool = True
    transpose: Literal["pe", "dma"] = "pe"
    kv_buffers: int = 2
    _derived: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("partition_tile", "free_tile", "large_tile_size", "block_size", "kv_buffers"):
            value = getattr(self, name)
            if isinstance(value, np.integer):
                object.__setattr__(self, name, int(value))
            elif isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name}: expected an int, got {_type_name(value)}")
        if isinstance(self.mixed_precision, np.bool_):
            object.__setattr__(self, "mixed_precision", bool(self.mixed_precision))
        if not isinstance(self.mixed_precision, bool):
            raise TypeError(
                f"mixed_precision: expected a bool, got {_type_name(self.mixed_precision)}"
            )
        if self.transpose not in ("pe", "dma"):
            raise ValueError(f"transpose: expected 'pe' or 'dma', got {self.transpose!r}")
        normalized = json.loads(_core.sim_schedule(json.dumps(self._payload())))
        object.__setattr__(self, "_derived", normalized["derived"])

    def _payload(self) -> dict[str, Any]:
        return {
            "schema": _SCHEDULE_SCHEMA,
            "schema_version": _SCHEDULE_SCHEMA_VERSION,
            **self.to_dict(),
        }

    @property
    def num_blocks_per_large_tile(self) -> int:
        """Cache blocks per large tile: large_tile_size / block_size."""
        return self._derived["num_blocks_per_large_tile"]

    @property
    def block_size_tiling_factor(self) -> int:
        """Pieces each block is cut into so one vectorized K/V load spans partition_tile
        partitions (1 when a large tile has at least partition_tile blocks)."""
        return self._derived["block_size_tiling_factor"]

    @property
    def tiled_block_size(self) -> int:
        """Tokens each partition holds per load: block_size / block_size_tiling_factor."""
        return self._derived["tiled_block_size"]

    @property
    def loads_per_large_tile(self) -> int:
        """128-partition loads per large tile, for K and for V each."""
        return self._derived["loads_per_large_tile"]

    @property
    def reduction_tile(self) -> int:
        """Score columns whose exp-sums are reduced together (the kernel's REDUCTION_TILE)."""
        return self._derived["reduction_tile"]

    def replace(self, **changes: Any) -> PagedAttentionSchedule:
        """A copy with these fields changed (validated)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The fields (not the derived values)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}

    def to_json(self) -> str:
        """JSON text of schema ``tilelab.paged_attention_schedule`` (derived values included under
        "derived", ignored when read back)."""
        return _core.sim_schedule(json.dumps(self._payload()))

    @classmethod
    def from_json(cls, text: str | os.PathLike) -> PagedAttentionSchedule:
        """Parses :meth:`to_json` text (or a file path ending in .json). Unknown keys, a wrong
        schema and wrong value types are ValueErrors naming the key."""
        if not isinstance(text, (str, os.PathLike)):
            raise TypeError(f"text: expected JSON text or a .json path, got {_type_name(text)}")
        path = os.fspath(text).strip()
        if path.endswith(".json") and not path.startswith("{"):
            if not os.path.isfile(path):
                raise ValueError(f"text: no schedule JSON file at '{os.path.abspath(path)}'")
            with open(path, encoding="utf-8") as file:
                text = file.read()
        normalized = json.loads(_core.sim_schedule(text))
        return cls(**{f.name: normalized[f.name] for f in dataclasses.fields(cls) if f.init})


def _schedule_fields() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(PagedAttentionSchedule) if f.init)


# --- Report ----------------------------------------------------------------------------------


class Report:
    """The report of one simulated run.

    Every summary field is an attribute (``report.total_time_ns``,
    ``report.dma_utilization_percent``, ``report.tensor_active_time_percent``,
    ``report.dma_gather_average_bytes_per_partition``, ...;
    :attr:`summary_fields` lists them, the same keys as :func:`sweep`'s columns). The nested
    report (schema ``tilelab.sim_report``, docs/sim_report.schema.json) is :meth:`to_json`;
    :attr:`timeline` has one row per instruction; :meth:`to_parquet` writes the instruction and
    DMA-piece tables as Parquet files (docs/profile_tables.md).
    """

    __slots__ = ("_handle", "_json", "_summary", "_timeline")

    def __init__(self, handle: Any):
        """Reports come from the simulate functions; do not build one directly."""
        self._handle = handle
        self._summary = dict(_core.sim_summary(handle))
        self._json: dict | None = None
        self._timeline: np.ndarray | None = None

    @staticmethod
    def metric_units() -> dict[str, str]:
        """Unit of every summary field ("ns", "percent", "bytes", "GB/s", "count", ...)."""
        return dict(_METRICS)

    @property
    def summary_fields(self) -> list[str]:
        """Names of the summary fields (attributes, :meth:`to_dict` keys)."""
        return list(self._summary)

    @property
    def kernel(self) -> str:
        return self.to_json()["kernel"]

    @property
    def machine(self) -> str:
        """The machine's name."""
        return self.to_json()["machine"]

    @property
    def parameters(self) -> dict[str, str]:
        """The kernel parameters of the run, named as `tilelab sim paged-attention` names them."""
        return dict(self.to_json()["parameters"])

    @property
    def engines(self) -> list[dict[str, Any]]:
        """Per engine: active time, instructions, idle time and its blame (what it waited on)."""
        return self.to_json()["engines"]

    @property
    def idle_blame(self) -> dict[str, list[dict[str, Any]]]:
        """Engine name -> idle time attributed to what it waited on (largest first)."""
        return {engine["name"]: engine["idle_blame"] for engine in self.engines}

    @property
    def critical_path(self) -> list[dict[str, Any]]:
        """Critical path segments (unit, start_ns, end_ns, contributed_ns, first_instruction)."""
        return self.to_json()["critical_path"]["segments"]

    @property
    def by_line(self) -> list[dict[str, Any]]:
        """Per kernel source line (kernels written in the NKI language, tilelab.nki), in source
        order: file, line, function, text, instructions, busy_ns per engine queue, DMA transfers
        and bytes, critical_path_ns (its share of the critical path) and idle_blamed_ns (idle time
        of the queues that waited on it). Empty for kernels without source lines."""
        return self.to_json()["by_line"]

    @property
    def dma_by_kind(self) -> list[dict[str, Any]]:
        """Per DMA opcode: transfers, bytes, bytes per partition, achieved GB/s, utilization."""
        return self.to_json()["dma"]["by_kind"]

    def to_dict(self) -> dict[str, float]:
        """The summary fields as a flat dict (one number each)."""
        return dict(self._summary)

    def to_json(self) -> dict[str, Any]:
        """The full nested report (schema ``tilelab.sim_report``)."""
        if self._json is None:
            self._json = json.loads(_core.sim_report_json(self._handle))
        return self._json

    def to_dataframe(self):
        """The summary as a one-row pandas DataFrame (ImportError when pandas is missing)."""
        try:
            import pandas
        except ImportError as error:
            raise ImportError("Report.to_dataframe needs pandas (pip install pandas)") from error
        return pandas.DataFrame([self._summary])

    @property
    def timeline(self) -> np.ndarray:
        """One row per instruction in program order, a numpy structured array with fields
        ``instruction``, ``unit`` ("dma" for DMA transfers, else the engine), ``engine`` (the
        engine queue that issues it), ``opcode``, ``start_ns``, ``issue_end_ns``, ``end_ns``,
        ``transfer_start_ns`` (DMA: first byte moves), ``is_dma``, ``dma_queue`` (-1 for compute),
        ``dma_bytes``, ``wait_reason`` (what bound the start: none, dependency, port, dma_engine,
        hbm, dma_trigger), ``wait_on`` (the instruction waited on, -1 if none) and
        ``on_critical_path``."""
        if self._timeline is None:
            self._timeline = _make_timeline(_core.sim_timeline(self._handle))
        return self._timeline

    def save_html(
        self,
        path: str | os.PathLike,
        *,
        compare: Mapping[str, Report] | None = None,
        title: str | None = None,
        label: str | None = None,
    ) -> None:
        """Writes the self-contained HTML report (inline SVG charts: engine and DMA-engine
        timeline, DMA bandwidth, bytes-per-partition histogram, SBUF/PSUM occupancy).
        ``compare`` maps a label to another report shown beside this one (``label``)."""
        comparisons = []
        for name, other in (compare or {}).items():
            if not isinstance(other, Report):
                raise TypeError(f"compare[{name!r}]: expected a Report, got {_type_name(other)}")
            comparisons.append((str(name), other._handle))
        _core.sim_save_html(self._handle, os.fspath(path), comparisons, title or "", label or "")

    def save_trace(self, path: str | os.PathLike, *, max_events: int = 500_000) -> None:
        """Writes a Chrome/Perfetto trace (one track per engine and DMA queue)."""
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
            raise ValueError(f"max_events: expected a positive int, got {max_events!r}")
        _core.sim_save_trace(self._handle, os.fspath(path), max_events)

    def save_json(self, path: str | os.PathLike) -> None:
        """Writes the nested report as JSON (schema ``tilelab.sim_report``)."""
        with open(os.fspath(path), "w", encoding="utf-8") as file:
            json.dump(self.to_json(), file, indent=2)
            file.write("\n")

    def to_parquet(self, directory: str | os.PathLike) -> tuple[str, str]:
        """Writes the profile tables as Parquet files into ``directory`` (created when missing;
        files of the same name are replaced) and returns their paths:

        - ``Instruction.parquet``: one row per instruction, in program order (the
          :attr:`timeline` fields plus the DMA transfer's partitions, bytes per partition,
          source and destination memory, HBM bytes and source location);
        - ``DmaPacket.parquet``: one row per DMA piece, the share of one transfer that one DMA
          engine moves (engine, queue, times, bytes, partitions, the instruction it belongs to).

        Column names follow the tables of Neuron's profiler (Neuron Explorer's
        ``Instruction.parquet`` and ``DmaPacket.parquet``) where it has an equivalent; times are
        float64 ns. docs/profile_tables.md lists every column with its type and unit; each
        file's metadata names the kernel, machine and parameters (``tilelab.*`` keys). Every
        report of the simulate functions keeps its DMA pieces, so nothing is simulated again.

        Needs pyarrow (ImportError naming it otherwise). ``directory`` naming a file is a
        NotADirectoryError, one that cannot be written an OSError; both name ``directory``.
        """
        pyarrow, parquet = _import_pyarrow("Report.to_parquet")
        target = _output_directory(directory)
        # Which run the tables describe, in each file's key-value metadata.
        run = {
            "tilelab.kernel": self.kernel,
            "tilelab.machine": self.machine,
            "tilelab.parameters": json.dumps(self.parameters, sort_keys=True),
        }
        tables = {
            name: table.replace_schema_metadata(run)
            for name, table in _profile_tables(pyarrow, self._handle).items()
        }
        paths = []
        for name, table in tables.items():
            path = os.path.join(target, f"{name}.parquet")
            try:
                with open(path, "wb") as file:
                    parquet.write_table(table, file)
            except OSError as error:
                raise OSError(
                    error.errno, f"directory: cannot write '{path}': {error.strerror or error}"
                ) from error
            paths.append(path)
        return paths[0], paths[1]

    def __str__(self) -> str:
        return _core.sim_report_text(self._handle)

    def __repr__(self) -> str:
        return (
            f"<Report {self.kernel} on {self.machine}: {self.total_time_ns / 1e3:.1f} us, "
            f"DMA utilization {self.dma_utilization_percent:.1f}%, "
            f"TensorE {self.tensor_active_time_percent:.1f}% active>"
        )


def _metric_property(name: str, unit: str) -> property:
    def get(self: Report) -> float:
        return self._summary[name]

    return property(get, doc=f"{name} [{unit}] (flat summary, sim/analysis.hpp)")


# One read-only property per flat-summary metric, declared with its unit in sim/analysis.cpp.
_METRICS: tuple[tuple[str, str], ...] = tuple(_core.sim_metrics())
for _name, _unit in _METRICS:
    setattr(Report, _name, _metric_property(_name, _unit))


_TIMELINE_DTYPE = np.dtype(
    [
        ("instruction", np.uint32),
        ("unit", "U6"),
        ("engine", "U6"),
        ("opcode", "U16"),
        ("start_ns", np.float64),
        ("issue_end_ns", np.float64),
        ("end_ns", np.float64),
        ("transfer_start_ns", np.float64),
        ("is_dma", np.bool_),
        ("dma_queue", np.int16),
        ("dma_bytes", np.uint64),
        ("wait_reason", "U11"),
        ("wait_on", np.int64),
        ("on_critical_path", np.bool_),
    ]
)


def _make_timeline(columns: dict) -> np.ndarray:
    n = len(columns["start_ns"])
    table = np.empty(n, dtype=_TIMELINE_DTYPE)
    engines = np.array(columns["engine_names"])
    table["instruction"] = np.arange(n)
    table["engine"] = engines[columns["engine"]]
    is_dma = columns["is_dma"].astype(bool)
    table["unit"] = np.where(is_dma, "dma", table["engine"])
    table["opcode"] = np.array(columns["opcode_names"])[columns["opcode"]]
    for name in (
        "start_ns",
        "issue_end_ns",
        "end_ns",
        "transfer_start_ns",
        "dma_queue",
        "dma_bytes",
        "wait_on",
    ):
        table[name] = columns[name]
    table["is_dma"] = is_dma
    table["wait_reason"] = np.array(columns["wait_reason_names"])[columns["wait_reason"]]
    table["on_critical_path"] = columns["on_critical_path"].astype(bool)
    return table


# --- profile tables (Report.to_parquet) ------------------------------------------------------


def _import_pyarrow(feature: str):
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.parquet
    except ImportError as error:
        raise ImportError(f"{feature} needs pyarrow (pip install pyarrow)") from error
    return pyarrow, pyarrow.parquet


def _output_directory(directory: Any) -> str:
    """`directory` as an absolute path, created when missing."""
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(
            f"directory: expected a path (str or os.PathLike), got {_type_name(directory)}"
        )
    path = os.path.abspath(os.fspath(directory))
    if os.path.exists(path) and not os.path.isdir(path):
        raise NotADirectoryError(f"directory: '{path}' is a file; expected a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise OSError(
            error.errno, f"directory: cannot create '{path}': {error.strerror or error}"
        ) from error
    return path


def _rank_within(keys: np.ndarray) -> np.ndarray:
    """Per element, how many earlier elements have the same key (0, 1, 2, ... per key)."""
    n = len(keys)
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    first = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if n else np.zeros(0, int)
    group_start = np.repeat(first, np.diff(np.r_[first, n]))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - group_start
    return rank


def _profile_tables(pa, handle) -> dict[str, Any]:
    """The Instruction and DmaPacket tables (pyarrow) of a run; docs/profile_tables.md."""
    columns = _core.sim_timeline(handle)
    n = len(columns["start_ns"])
    is_dma = columns["is_dma"].astype(bool)
    compute = ~is_dma

    def names(table_key: str, codes: np.ndarray, null: np.ndarray | None = None):
        """Categorical codes -> a string column (null where `null`)."""
        indices = pa.array(codes.astype(np.int32), mask=null)
        return pa.compute.take(pa.array(list(columns[table_key]), pa.string()), indices)

    def nullable(values: np.ndarray, null: np.ndarray, type_) -> Any:
        return pa.array(values, type=type_, mask=null)

    start, issue_end, end = columns["start_ns"], columns["issue_end_ns"], columns["end_ns"]
    transfer_start = columns["transfer_start_ns"]
    dma_bytes = columns["dma_bytes"].astype(np.int64)
    memory_names = list(columns["memory_names"])
    source_is_hbm = is_dma & (columns["dma_source"] == memory_names.index("hbm"))
    dest_is_hbm = is_dma & (columns["dma_destination"] == memory_names.index("hbm"))
    wait_on = columns["wait_on"]
    instruction_engines = np.array(columns["engine_names"])[columns["engine"]]
    instruction = pa.table(
        {
            "id": pa.array(np.arange(n, dtype=np.int64)),
            "engine": names("engine_names", columns["engine"]),
            "timeline_track": pa.array(np.where(is_dma, "dma", instruction_engines)),
            "pc": pa.array(_rank_within(columns["engine"])),
            "opcode": names("opcode_names", columns["opcode"]),
            "start_ts": pa.array(start),
            "end_ts": pa.array(end),
            "duration_ns": pa.array(end - start),
            "issue_end_ts": pa.array(issue_end),
            "wait_reason": names("wait_reason_names", columns["wait_reason"]),
            "wait_on": nullable(wait_on, wait_on < 0, pa.int64()),
            "on_critical_path": pa.array(columns["on_critical_path"].astype(bool)),
            "is_dma": pa.array(is_dma),
            "queue_idx": nullable(columns["dma_queue"], compute, pa.int64()),
            "transfer_bytes": nullable(dma_bytes, compute, pa.int64()),
            "partitions": nullable(columns["dma_partitions"], compute, pa.int64()),
            "bytes_per_partition": nullable(
                columns["dma_bytes_per_partition"].astype(np.int64), compute, pa.int64()
            ),
            "source": names("memory_names", columns["dma_source"], columns["dma_source"] < 0),
            "dest": names(
                "memory_names", columns["dma_destination"], columns["dma_destination"] < 0
            ),
            "dma_trigger_start_ts": nullable(transfer_start, compute, pa.float64()),
            "dma_trigger_end_ts": nullable(end, compute, pa.float64()),
            "dma_wait_time_ns": nullable(transfer_start - issue_end, compute, pa.float64()),
            "hbm_read_bytes": pa.array(np.where(source_is_hbm, dma_bytes, 0)),
            "hbm_write_bytes": pa.array(np.where(dest_is_hbm, dma_bytes, 0)),
            # No built-in kernel records the source line of its instructions yet.
            "nki_source_location": pa.nulls(n, pa.string()),
        }
    )

    pieces = _core.sim_dma_pieces(handle)
    owner = pieces["instruction"].astype(np.int64)
    piece_start, piece_end = pieces["start_ns"], pieces["end_ns"]
    piece_bytes = pieces["bytes"].astype(np.int64)
    per_partition = columns["dma_bytes_per_partition"].astype(np.int64)[owner]
    duration = piece_end - piece_start
    with np.errstate(divide="ignore", invalid="ignore"):
        throughput = np.where(duration > 0, piece_bytes / duration * 1e9, np.nan)
    dma_packet = pa.table(
        {
            "id": pa.array(np.arange(len(owner), dtype=np.int64)),
            "instruction_id": pa.array(owner),
            "packet_idx": pa.array(_rank_within(owner)),
            "engine_idx": pa.array(pieces["dma_engine"]),
            "queue_idx": pa.array(pieces["queue"]),
            "opcode": names("opcode_names", columns["opcode"][owner]),
            "start_ts": pa.array(piece_start),
            "end_ts": pa.array(piece_end),
            "duration_ns": pa.array(duration),
            "transfer_bytes": pa.array(piece_bytes),
            "partitions": pa.array(
                np.where(per_partition > 0, piece_bytes // np.maximum(per_partition, 1), 0)
            ),
            "bytes_per_partition": pa.array(per_partition),
            "throughput": pa.array(throughput),
            "source": names(
                "memory_names", columns["dma_source"][owner], columns["dma_source"][owner] < 0
            ),
            "dest": names(
                "memory_names",
                columns["dma_destination"][owner],
                columns["dma_destination"][owner] < 0,
            ),
            "nki_source_location": pa.nulls(len(owner), pa.string()),
        }
    )
    return {"Instruction": instruction, "DmaPacket": dma_packet}


# --- simulation entries ----------------------------------------------------------------------


def kernels() -> dict[str, dict[str, Any]]:
    """The registered kernels by name: ``description``, ``default_machine`` and ``parameters``
    (name -> ``{"default": str, "help": str}``), as ``tilelab sim --list`` shows them."""
    out = {}
    for kernel in _core.sim_kernels():
        out[kernel["name"]] = {
            "description": kernel["description"],
            "default_machine": kernel["default_machine"],
            "parameters": {
                name: {"default": default, "help": help_text}
                for name, default, help_text in kernel["parameters"]
            },
        }
    return out


def _parameter_text(name: str, value: Any) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (int, float, str)):
        return str(value)
    raise TypeError(
        f"params[{name!r}]: expected a str, int, float or bool, got {_type_name(value)}"
    )


def _kernel_parameters(params: Mapping[str, Any] | None) -> dict[str, str]:
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise TypeError(f"params: expected a dict of parameter values, got {_type_name(params)}")
    return {str(name): _parameter_text(str(name), value) for name, value in params.items()}


def _machine_spec(machine: Machine | str | os.PathLike | None) -> tuple[str, list[str]]:
    """("", []) selects the kernel's default machine."""
    if machine is None:
        return "", []
    source, overrides = _as_machine(machine)._spec()
    return source, list(overrides)


def simulate(
    kernel: str,
    params: Mapping[str, Any] | None = None,
    machine: Machine | str | os.PathLike | None = None,
) -> Report:
    """Builds and times any registered kernel (:func:`kernels`), as ``tilelab sim KERNEL
    KEY=VALUE ...`` does: ``params`` maps the kernel's parameter names to values (bools become
    ``true``/``false``, the rest ``str()``); unset ones take their defaults. ``machine``: a
    :class:`Machine`, a preset name or a JSON path; None: the kernel's default machine.

    ValueError names the kernel, the parameter or the machine key that does not fit.
    """
    if not isinstance(kernel, str):
        raise TypeError(f"kernel: expected a kernel name (str), got {_type_name(kernel)}")
    source, overrides = _machine_spec(machine)
    return Report(_core.sim_simulate_kernel(kernel, _kernel_parameters(params), source, overrides))


def default_batch() -> tuple[list[tuple[int, int]], list[int]]:
    """The default batch of `tilelab sim paged-attention`: ``(prefill, decode)`` with prefill
    ``(query_len, context_len)`` pairs and decode context lengths (one new token each)."""
    requests = _core.sim_default_requests()
    prefill = [(q, c) for q, c in requests if q > 1]
    decode = [c for q, c in requests if q == 1]
    return prefill, decode


def _requests(prefill, decode) -> list[tuple[int, int]]:
    if prefill is None and decode is None:
        prefill, decode = default_batch()
    requests = []
    for i, pair in enumerate(prefill or ()):
        try:
            query_len, context_len = pair
        except (TypeError, ValueError):
            raise TypeError(
                f"prefill[{i}]: expected a (query_len, context_len) pair, got {pair!r}"
            ) from None
        requests.append((_int(query_len, f"prefill[{i}]"), _int(context_len, f"prefill[{i}]")))
    for i, context_len in enumerate(decode or ()):
        requests.append((1, _int(context_len, f"decode[{i}]")))
    if not requests:
        raise ValueError("prefill, decode: expected at least one request, got none")
    return requests


def _int(value: Any, name: str) -> int:
    """An int (or numpy integer) that fits int64, the simulator's integers; bools and floats are
    not ints."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, got {_type_name(value)} {_shown(value)}")
    value = int(value)
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"{name}: expected an int in [-2**63, 2**63), got {_shown(value)}")
    return value


def _bool(value: Any, name: str) -> bool:
    """A bool (or numpy bool): not a truthy value such as "False" or 1."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool, got {_type_name(value)} {_shown(value)}")
    return bool(value)


def _scale(value: Any) -> float | None:
    """softmax_scale: None (1/sqrt(head_dim)) or a real number that fits a float; whether it is
    usable (finite) is checked where the CPU kernel checks it."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        raise TypeError(f"softmax_scale: expected a float or None, got {_type_name(value)}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(
            f"softmax_scale: expected a finite value, got {_shown(value)} (beyond the float range)"
        ) from None


def _tiling_factor(value: Any) -> int:
    """None / "auto" -> 0 (the schedule's own factor); a power of two is checked by the kernel."""
    if value is None or value == "auto":
        return 0
    factor = _int(value, "tiling_factor")
    if factor < 1:
        raise ValueError(f"tiling_factor: expected 'auto' or a power of two >= 1, got {factor}")
    return factor


def _resolve_schedule(
    schedule: PagedAttentionSchedule | None, **fields: Any
) -> PagedAttentionSchedule:
    if schedule is None:
        return PagedAttentionSchedule(**{k: v for k, v in fields.items() if v is not None})
    if not isinstance(schedule, PagedAttentionSchedule):
        raise TypeError(f"schedule: expected a PagedAttentionSchedule, got {_type_name(schedule)}")
    for name, value in fields.items():
        if value is not None and value != getattr(schedule, name):
            raise ValueError(
                f"{name}: {value!r} disagrees with schedule.{name} = {getattr(schedule, name)!r};"
                " give one or the other"
            )
    return schedule


def _point(
    schedule_payload: Mapping[str, Any],
    *,
    prefill=None,
    decode=None,
    num_heads: int = 32,
    num_kv_heads: int = 8,
    head_dim: int = 128,
    dtype: str = "bf16",
    tiling_factor: int | str | None = None,
    seed: int = 1,
    softmax_scale: float | None = None,
) -> dict[str, Any]:
    if dtype not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"dtype: expected 'bf16', 'fp16' or 'fp32', got {dtype!r}")
    return {
        "schedule_json": json.dumps(dict(schedule_payload)),
        "requests": _requests(prefill, decode),
        "num_heads": _int(num_heads, "num_heads"),
        "num_kv_heads": _int(num_kv_heads, "num_kv_heads"),
        "head_dim": _int(head_dim, "head_dim"),
        "dtype": dtype,
        "tiling_factor": _tiling_factor(tiling_factor),
        "seed": _int(seed, "seed"),
        "softmax_scale": _scale(softmax_scale),
    }


def simulate_paged_attention_batch(
    *,
    prefill: Sequence[tuple[int, int]] | None = None,
    decode: Sequence[int] | None = None,
    num_heads: int = 32,
    num_kv_heads: int = 8,
    head_dim: int = 128,
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16",
    schedule: PagedAttentionSchedule | None = None,
    machine: Machine | str | None = None,
    tiling_factor: int | Literal["auto"] | None = None,
    seed: int = 1,
    softmax_scale: float | None = None,
) -> Report:
    """Simulates the flash paged attention kernel on a continuous batch (timing only: no data).

    The batch is given by its requests, as `tilelab sim paged-attention` takes them: ``prefill``
    ``(query_len, context_len)`` pairs and ``decode`` context lengths (one new token each); both
    None: the default batch (:func:`default_batch`: 4 prefill + 12 decode requests, 512 query
    rows, 16384 context tokens). Queries are concatenated and padded to whole 128-row tiles; each
    request's context sits in its own cache blocks (placement shuffled by ``seed``), the block
    table padded to whole large tiles.

    Args:
        num_heads, num_kv_heads, head_dim: query heads, kv heads (the kernel's grid; num_heads a
            multiple), d <= 128.
        dtype: of query, key, value, kv_cache and output.
        schedule: the kernel's tiling (default :class:`PagedAttentionSchedule()`).
        machine: a :class:`Machine`, a preset name or a machine JSON path (default "trn1").
        tiling_factor: pieces each cache block is cut into for the vectorized K/V gather. None or
            "auto": the schedule's ``block_size_tiling_factor``; a power of two forces it (1 turns
            the block-size tiling trick off). Simulator-only for now.
        softmax_scale: default 1/sqrt(head_dim).

    Returns a :class:`Report`. ValueError names the argument or schedule field that does not fit
    (e.g. head_dim > 128, a transpose the machine lacks).
    """
    resolved = _resolve_schedule(schedule)
    point = _point(
        resolved._payload(),
        prefill=prefill,
        decode=decode,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        tiling_factor=tiling_factor,
        seed=seed,
        softmax_scale=softmax_scale,
    )
    source, overrides = _as_machine(machine)._spec()
    return Report(_core.sim_simulate(source, list(overrides), point, True))


_DTYPE_NAMES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def simulate_flash_paged_attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    kv_cache: np.ndarray,
    block_tables: np.ndarray,
    mask: np.ndarray,
    softmax_scale: float | None = None,
    mixed_precision: bool | None = None,
    LARGE_TILE_SZ: int | None = None,  # noqa: N803 (the NKI kernel's name)
    *,
    machine: Machine | str | None = None,
    schedule: PagedAttentionSchedule | None = None,
    tiling_factor: int | Literal["auto"] | None = None,
) -> tuple[Report, np.ndarray]:
    """Runs the tile program of :func:`tilelab.nki.flash_paged_attention` on the simulator, on
    these numbers (functional mode), and times it. Returns ``(report, output)``.

    The arrays are those of :func:`tilelab.nki.flash_paged_attention`: query
    ``(1, n_heads, d, seq_q)``, key ``(1, n_kv_heads, d, seq_q)``, value
    ``(1, n_kv_heads, seq_q, d)``, kv_cache ``(2, num_blocks, n_kv_heads, block_size, d)``,
    block_tables ``(num_active_blocks,)`` integers, mask ``(seq_q, num_active_blocks * block_size
    + seq_q)`` bool or integers (nonzero = attend) with its context columns reordered by
    :func:`tilelab.nki.reorder_context_mask`. Attention tensors share one dtype: float32, float16
    or ``ml_dtypes.bfloat16``; the output ``(1, n_heads, seq_q, d)`` has that dtype.

    ``mixed_precision`` and ``LARGE_TILE_SZ`` default to the schedule's (or True and 2048 without
    one); when both a schedule and one of them are given they must agree. The schedule's
    block_size must equal kv_cache's dimension 3 (default: taken from kv_cache). ``machine`` and
    ``tiling_factor`` as in :func:`simulate_paged_attention_batch`; with a forced tiling_factor
    the mask is still given in the NKI order and reordered for the forced layout here.

    The functional executor interprets every instruction: use small shapes (seconds for a
    few thousand context tokens).
    """
    # Objects with __dlpack__ or the buffer protocol (torch tensors, ...) as numpy views.
    query, key, value, kv_cache, block_tables, mask = (
        _as_numpy(array, name)
        for array, name in (
            (query, "query"),
            (key, "key"),
            (value, "value"),
            (kv_cache, "kv_cache"),
            (block_tables, "block_tables"),
            (mask, "mask"),
        )
    )
    arrays = {"query": query, "key": key, "value": value, "kv_cache": kv_cache}
    for name, array in arrays.items():
        if not isinstance(array, np.ndarray):
            raise TypeError(f"{name}: expected a numpy.ndarray, got {_type_name(array)}")
    dtype_name = _DTYPE_NAMES.get(query.dtype.name)
    if dtype_name is None:
        raise TypeError(f"query: expected dtype float32, float16 or bfloat16, got {query.dtype}")
    for name, array in arrays.items():
        if array.dtype != query.dtype:
            raise TypeError(f"{name}: expected dtype {query.dtype} (query's), got {array.dtype}")
    for name, array in (("block_tables", block_tables), ("mask", mask)):
        if not isinstance(array, np.ndarray):
            raise TypeError(f"{name}: expected a numpy.ndarray, got {_type_name(array)}")
        if array.dtype.kind not in ("biu" if name == "mask" else "iu"):
            raise TypeError(f"{name}: expected an integer array, got dtype {array.dtype}")
    if kv_cache.ndim != 5:
        raise ValueError(
            "kv_cache: expected shape (2, num_blocks, n_kv_heads, block_size, d), got "
            f"{kv_cache.shape}"
        )
    if LARGE_TILE_SZ is not None:
        LARGE_TILE_SZ = _int(LARGE_TILE_SZ, "LARGE_TILE_SZ")  # noqa: N806
    if mixed_precision is not None:
        mixed_precision = _bool(mixed_precision, "mixed_precision")
    scale = _scale(softmax_scale)
    if schedule is None:
        schedule = PagedAttentionSchedule(
            large_tile_size=2048 if LARGE_TILE_SZ is None else LARGE_TILE_SZ,
            block_size=int(kv_cache.shape[3]),
            mixed_precision=True if mixed_precision is None else mixed_precision,
        )
    else:
        schedule = _resolve_schedule(
            schedule, large_tile_size=LARGE_TILE_SZ, mixed_precision=mixed_precision
        )
    source, overrides = _as_machine(machine)._spec()

    def floats(array: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(array, dtype=np.float32)

    handle, output = _core.sim_simulate_arrays(
        source,
        list(overrides),
        json.dumps(schedule._payload()),
        floats(query),
        floats(key),
        floats(value),
        floats(kv_cache),
        # Entries beyond int32 are rejected, not wrapped (the CPU kernel's conversion).
        _as_int32(block_tables, "block_tables"),
        np.ascontiguousarray(mask != 0, dtype=np.int32),
        dtype_name,
        scale,
        _tiling_factor(tiling_factor),
    )
    return Report(handle), output.astype(query.dtype)


# --- program size limits ---------------------------------------------------------------------


def program_limits() -> dict[str, int]:
    """The limits every simulated program is built within: ``max_instructions`` and
    ``max_buffer_elements`` (elements of all its HBM tensors and tiles). A larger program is a
    ValueError naming the limit, raised while building, before memory runs out."""
    max_instructions, max_buffer_elements = _core.sim_program_limits()
    return {"max_instructions": max_instructions, "max_buffer_elements": max_buffer_elements}


def set_program_limits(
    *, max_instructions: int | None = None, max_buffer_elements: int | None = None
) -> dict[str, int]:
    """Raises (or lowers) the program size limits of every later simulation in this process
    (``tilelab sim --max-instructions N --max-buffer-elements N``); None keeps a limit. Returns
    the previous limits, so that ``set_program_limits(**previous)`` restores them."""
    previous = program_limits()
    limits = dict(previous)
    for name, value in (
        ("max_instructions", max_instructions),
        ("max_buffer_elements", max_buffer_elements),
    ):
        if value is not None:
            value = _int(value, name)
            if not 1 <= value < 2**64:
                raise ValueError(f"{name}: expected an int in [1, 2**64), got {value}")
            limits[name] = value
    _core.sim_set_program_limits(limits["max_instructions"], limits["max_buffer_elements"])
    return previous


# --- sweep -----------------------------------------------------------------------------------

_PROBLEM_KEYS = (
    "prefill",
    "decode",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "dtype",
    "tiling_factor",
    "seed",
    "softmax_scale",
)


def _column_value(value: Any) -> Any:
    if isinstance(value, Machine):
        return value.name if not value.overrides else repr(value)
    if isinstance(value, PagedAttentionSchedule):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return str(value)
    return value


class _NoProgress:
    """The progress display of a sweep that shows none."""

    def update(self, count: int) -> None:
        pass

    def close(self) -> None:
        pass


class _CounterProgress:
    """Without tqdm: a one-line counter on stderr (\\r), under the same rules as the bar."""

    def __init__(self, total: int, delay: float):
        self.total, self.delay, self.done = total, delay, 0
        self.start = time.perf_counter()
        self.shown = False

    def update(self, count: int) -> None:
        self.done += count
        elapsed = time.perf_counter() - self.start
        if elapsed < self.delay:
            return
        rate = self.done / elapsed if elapsed > 0 else 0.0
        sys.stderr.write(f"\rsweep: {self.done}/{self.total} points, {rate:.0f} points/s")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()


# How long a sweep with progress=None runs before its progress appears.
_PROGRESS_DELAY_SECONDS = 2.0


def _progress_bar(total: int, progress: bool | None):
    """The progress display of a sweep of `total` points: a tqdm.auto bar (a widget in notebooks
    with ipywidgets, text on stderr elsewhere), or a one-line counter on stderr when tqdm is not
    installed. Shown from the start when `progress` is True, never when False, and when None
    once the sweep has run for 2 s (tqdm's ``delay``)."""
    if progress is False:
        return _NoProgress()
    delay = 0.0 if progress else _PROGRESS_DELAY_SECONDS
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _CounterProgress(total, delay)
    return tqdm(
        total=total,
        desc="sweep",
        unit=" points",
        delay=delay,
        file=sys.stderr,
        bar_format="{desc}: {n_fmt}/{total_fmt} points |{bar}| {elapsed}<{remaining}, {rate_fmt}",
    )


@dataclasses.dataclass(frozen=True, eq=False)
class SweepPoint(Mapping):
    """One point of a :func:`sweep`: the grid values that define it (``settings``), whether it
    was simulated (``valid``; else ``error`` says why) and the :class:`Report` summary fields
    (``metrics``; NaN when invalid). Reading it as a mapping gives the flat row:
    ``point["block_size"]``, ``point["valid"]``, ``point["total_time_ns"]``."""

    settings: dict[str, Any]
    valid: bool
    error: str | None
    metrics: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        """The flat row: settings, ``valid``, ``error``, then the metrics."""
        return {**self.settings, "valid": self.valid, "error": self.error, **self.metrics}

    def __getitem__(self, key: str) -> Any:
        if key in self.settings:
            return self.settings[key]
        if key == "valid":
            return self.valid
        if key == "error":
            return self.error
        return self.metrics[key]

    def __iter__(self):
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())


class SweepResult(list):
    """The points of a :func:`sweep` (a list of :class:`SweepPoint`, in grid order)."""

    def to_pandas(self):
        """One row per point (:meth:`SweepPoint.to_dict`) as a pandas DataFrame; ImportError
        when pandas is not installed."""
        try:
            import pandas
        except ImportError as error:
            raise ImportError("SweepResult.to_pandas needs pandas (pip install pandas)") from error
        return pandas.DataFrame([point.to_dict() for point in self])

    to_dataframe = to_pandas


def _sweep_chunk(
    kernel: str | None,
    machine_specs: list[tuple[str, list[str]]],
    points: list[Any],
    program_limits: tuple[int, int],
) -> list[dict[str, float] | str]:
    """Simulates `points` (paged-attention point dicts when `kernel` is None, else (parameters,
    machine index) pairs of `kernel`) on tilelab's threads: per point its summary dict or the
    reason it is invalid. Module-level, with plain arguments only, so that an executor can pickle
    it and run it in another process; `program_limits` carries the caller's limits
    (set_program_limits) there, so that a point is valid exactly when it is locally."""
    previous = tuple(_core.sim_program_limits())
    if previous != tuple(program_limits):
        _core.sim_set_program_limits(*program_limits)
    try:
        if kernel is None:
            return _core.sim_sweep(machine_specs, points)
        return _core.sim_sweep_kernel(kernel, machine_specs, points)
    finally:
        if previous != tuple(program_limits):
            _core.sim_set_program_limits(*previous)


# Executor tasks hold at most this many points, and a sweep makes about this many tasks before
# they grow: small sweeps spread one point per task over the workers, large ones amortize the
# per-task cost (pickling, scheduling, loading the machines).
_EXECUTOR_MAX_CHUNK = 64
_EXECUTOR_TASKS = 256


def _check_executor(executor: Any) -> None:
    if executor is not None and not isinstance(executor, concurrent.futures.Executor):
        hint = ""
        if isinstance(executor, type) and issubclass(executor, concurrent.futures.Executor):
            hint = f" (the class {executor.__name__}; pass an instance)"
        elif hasattr(executor, "get_executor"):
            hint = " (for a dask.distributed Client pass client.get_executor())"
        raise TypeError(
            "executor: expected a concurrent.futures.Executor or None, got "
            f"{_type_name(executor)}{hint}"
        )
    if isinstance(executor, concurrent.futures.ProcessPoolExecutor):
        # A forked worker inherits OpenMP's thread pool in a state it cannot use, and its first
        # parallel loop never returns; refusing is better than hanging.
        context = getattr(executor, "_mp_context", None)
        if context is not None and context.get_start_method() == "fork":
            raise ValueError(
                "executor: a ProcessPoolExecutor with the 'fork' start method hangs in the "
                "simulator's OpenMP loops; create it with "
                "mp_context=multiprocessing.get_context('spawn') (or 'forkserver')"
            )


def _run_locally(run, points, meter) -> list[Any]:
    results: list[Any] = []
    # Each call shares its points out over the threads and runs points that differ only in their
    # seed once, so calls hold many points; they double while a call takes under a second.
    chunk = 64 * _core.num_threads()
    begin = 0
    while begin < len(points):
        started = time.perf_counter()
        part = run(points[begin : begin + chunk])
        results.extend(part)
        meter.update(len(part))
        begin += chunk
        if time.perf_counter() - started < 1.0:
            chunk *= 2
    return results


def _run_on_executor(executor, kernel, machine_specs, limits, points, meter) -> list[Any]:
    size = max(1, min(_EXECUTOR_MAX_CHUNK, math.ceil(len(points) / _EXECUTOR_TASKS)))
    futures = {}
    for begin in range(0, len(points), size):
        chunk = points[begin : begin + size]
        futures[executor.submit(_sweep_chunk, kernel, machine_specs, chunk, limits)] = begin
    parts: dict[int, list[Any]] = {}
    try:
        for future in concurrent.futures.as_completed(futures):
            begin = futures[future]
            part = future.result()  # a task's exception is raised here, with its message
            expected = min(size, len(points) - begin)
            if len(part) != expected:
                raise RuntimeError(
                    f"executor: a task returned {len(part)} results for {expected} points"
                )
            parts[begin] = part
            meter.update(len(part))
    finally:
        for future in futures:
            future.cancel()
    return [result for begin in sorted(parts) for result in parts[begin]]


def _run_points(
    kernel: str | None,
    machine_specs: list[tuple[str, list[str]]],
    rows: list[dict[str, Any]],
    points: list[Any],
    progress: bool | None,
    executor: concurrent.futures.Executor | None,
) -> SweepResult:
    """Runs `points` in chunks (here, or as tasks of `executor`) and pairs each result with its
    row of grid values, in grid order."""
    limits = tuple(_core.sim_program_limits())
    meter = _progress_bar(len(points), progress)
    try:
        if executor is None:
            results = _run_locally(
                lambda chunk: _sweep_chunk(kernel, machine_specs, chunk, limits), points, meter
            )
        else:
            results = _run_on_executor(executor, kernel, machine_specs, limits, points, meter)
    finally:
        meter.close()
    metric_names = next((list(r) for r in results if isinstance(r, dict)), [])
    out = SweepResult()
    for row, result in zip(rows, results, strict=True):
        valid = isinstance(result, dict)
        metrics = {k: result[k] if valid else math.nan for k in metric_names}
        out.append(SweepPoint(row, valid, None if valid else result, metrics))
    return out


class _MachineTable:
    """The distinct machines of a sweep, each loaded once in C++ and referred to by index."""

    def __init__(self) -> None:
        self.specs: list[tuple[str, list[str]]] = []
        self._index: dict[tuple[str, tuple[str, ...]], int] = {}

    def index(self, base: Machine, chosen: Mapping[str, Any]) -> int:
        machine = _as_machine(chosen.get("machine", base), "grid['machine']")
        overrides = {k[len("machine.") :]: v for k, v in chosen.items() if k.startswith("machine.")}
        if overrides:
            machine = machine.with_overrides(**overrides)
        spec = machine._spec()
        if spec not in self._index:
            self._index[spec] = len(self.specs)
            self.specs.append((spec[0], list(spec[1])))
        return self._index[spec]


def _check_keys(base: Mapping[str, Any], grid: Mapping[str, list], allowed: set[str]) -> None:
    for key in base:
        if key not in allowed:
            raise ValueError(f"base: unknown key {key!r}; allowed: {', '.join(sorted(allowed))}")
    for key, values in grid.items():
        if key not in allowed | {"machine"} and not key.startswith("machine."):
            raise ValueError(
                f"grid: unknown key {key!r}; allowed: {', '.join(sorted(allowed))}, 'machine', "
                "'machine.<field>'"
            )
        if not values:
            raise ValueError(f"grid[{key!r}]: expected at least one value, got none")


def _grid_points(base: dict[str, Any], grid: dict[str, list[Any]]):
    """The Cartesian product of ``grid`` in its key order: per point, the chosen values, the
    settings (``base`` updated with the chosen non-machine values) and its row of grid values."""
    keys = list(grid)
    for combination in itertools.product(*(grid[key] for key in keys)):
        chosen = dict(zip(keys, combination, strict=True))
        settings = {**base, **{k: v for k, v in chosen.items() if not k.startswith("machine")}}
        yield chosen, settings, {key: _column_value(value) for key, value in chosen.items()}


def _sweep_kernel(kernel, base, grid, machine, progress, executor) -> SweepResult:
    known = kernels()
    if kernel not in known:
        raise ValueError(f"kernel: unknown kernel {kernel!r}; known: {', '.join(sorted(known))}")
    _check_keys(base, grid, set(known[kernel]["parameters"]))
    base_machine = _as_machine(machine if machine is not None else known[kernel]["default_machine"])
    machines = _MachineTable()
    points, rows = [], []
    for chosen, settings, row in _grid_points(base, grid):
        points.append((_kernel_parameters(settings), machines.index(base_machine, chosen)))
        rows.append(row)
    return _run_points(kernel, machines.specs, rows, points, progress, executor)


def sweep(
    base: Mapping[str, Any] | None = None,
    grid: Mapping[str, Iterable[Any]] | None = None,
    *,
    kernel: str | None = None,
    machine: Machine | str | None = None,
    progress: bool | None = None,
    executor: concurrent.futures.Executor | None = None,
) -> SweepResult:
    """Simulates every combination of ``grid`` over ``base`` in parallel; returns a
    :class:`SweepResult` (one :class:`SweepPoint` per combination; ``.to_pandas()`` for a
    DataFrame).

    ``kernel`` None: the flash paged attention batch. ``base`` holds keyword arguments of
    :func:`simulate_paged_attention_batch` (``prefill``, ``decode``, ``num_heads``,
    ``num_kv_heads``, ``head_dim``, ``dtype``, ``tiling_factor``, ``seed``, ``softmax_scale``,
    ``schedule``) and, flat, any :class:`PagedAttentionSchedule` field (``block_size=16``).
    ``kernel`` a registered kernel name (:func:`kernels`): ``base`` and ``grid`` hold its
    parameters, as :func:`simulate` takes them. ``grid`` maps any of those names, ``"machine"``
    (Machines or preset names) or ``"machine.<field>"`` (a machine override, e.g.
    ``"machine.dma_bytes_per_ns_per_engine"``) to the values to try; points are the Cartesian
    product in the grid's key order.

    Points run on tilelab's OpenMP threads (:func:`tilelab.set_num_threads`) with the GIL
    released, timing only. A point whose parameters are invalid is not simulated: ``valid`` is
    False, ``error`` the reason and its metrics NaN.

    ``executor``: any :class:`concurrent.futures.Executor` (a ``ProcessPoolExecutor``, a
    ``ThreadPoolExecutor``, a Dask cluster's ``client.get_executor()``, ...) runs the points as
    tasks of a few points each (a module-level function with plain, picklable arguments; each
    task uses its worker's tilelab threads). The result is the local run's, in grid order,
    invalid points included; the program size limits (:func:`set_program_limits`) go with every
    task. An exception raised in a task is raised here and the tasks not yet started are
    cancelled. Workers must import this tilelab, and a machine given as a JSON path must be
    readable at that path on the workers. A ``ProcessPoolExecutor`` must use the "spawn" or
    "forkserver" start method (ValueError for "fork", Linux's default before Python 3.14:
    OpenMP's thread pool does not survive ``fork``).

    ``progress``: a ``tqdm.auto`` bar (a widget in notebooks, text on stderr elsewhere) that
    counts points as their chunks or tasks finish; without tqdm, a one-line counter on stderr.
    True shows it from the start, False never, None once the sweep has run for 2 s.
    """
    _check_executor(executor)
    base = dict(base or {})
    grid = {key: list(values) for key, values in (grid or {}).items()}
    if kernel is not None:
        return _sweep_kernel(kernel, base, grid, machine, progress, executor)
    schedule_fields = _schedule_fields()
    allowed = set(_PROBLEM_KEYS) | set(schedule_fields) | {"schedule"}
    _check_keys(base, grid, allowed)

    base_machine = _as_machine(machine)
    base_schedule = base.pop("schedule", None) or PagedAttentionSchedule()
    if not isinstance(base_schedule, PagedAttentionSchedule):
        raise TypeError(
            f"base['schedule']: expected a PagedAttentionSchedule, got {_type_name(base_schedule)}"
        )

    machines = _MachineTable()
    points, rows = [], []
    for chosen, settings, row in _grid_points(base, grid):
        machine_index = machines.index(base_machine, chosen)
        schedule = settings.pop("schedule", base_schedule)
        if not isinstance(schedule, PagedAttentionSchedule):
            raise TypeError(
                f"grid['schedule']: expected PagedAttentionSchedules, got {_type_name(schedule)}"
            )
        payload = schedule._payload()
        for name in schedule_fields:
            if name in settings:
                value = settings.pop(name)
                payload[name] = value.item() if isinstance(value, np.generic) else value
        point = _point(payload, **settings)
        point["machine"] = machine_index
        points.append(point)
        rows.append(row)
    return _run_points(None, machines.specs, rows, points, progress, executor)
