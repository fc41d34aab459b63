# Type stubs of the compiled tilelab._core; tests/python/test_api.py checks them against the module
# and against pybind11-stubgen's output (which types arrays and run handles only as typing.Any).
import numpy as np

def flash_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = False,
    causal_alignment: str = "top_left",
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
    implementation: str = "automatic",
) -> np.ndarray | tuple[np.ndarray, np.ndarray]: ...
def flash_attention_implementation(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = False,
    causal_alignment: str = "top_left",
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
) -> str: ...
def flash_attention_kernel(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = False,
    causal_alignment: str = "top_left",
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
) -> str | None: ...
def flash_attention_backward(
    dout: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    out: np.ndarray,
    lse: np.ndarray,
    *,
    causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    bias: np.ndarray | None = None,
    return_dbias: bool = False,
    sliding_window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
    return_dsinks: bool = False,
    fp32_probabilities: bool = False,
    implementation: str = "automatic",
) -> tuple[np.ndarray, ...]: ...
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
    implementation: str = "automatic",
) -> np.ndarray: ...
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
    implementation: str = "automatic",
) -> list[str]: ...
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
    split_kv: int | str = "auto",
    fp32_probabilities: bool = False,
    out: np.ndarray | None = None,
) -> np.ndarray: ...
def reshape_and_cache_flash(
    key: np.ndarray,
    value: np.ndarray,
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    slot_mapping: np.ndarray,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None: ...

class BlockSparseLayout:
    def __init__(
        self, crow: np.ndarray, col: np.ndarray, block_size: int, causal: bool = True
    ) -> None: ...
    @staticmethod
    def local_strided(
        n_heads: int,
        max_seqlen: int,
        block_size: int,
        local_blocks: int,
        vert_stride: int,
        homo_head: bool = False,
        head_sliding_step: int | None = None,
    ) -> BlockSparseLayout: ...
    @staticmethod
    def from_dense(
        block_mask: np.ndarray, block_size: int, causal: bool = True
    ) -> BlockSparseLayout: ...
    def to_dense(self) -> np.ndarray: ...
    def token_mask(self, seqlen: int, head: int | None = None) -> np.ndarray: ...
    @property
    def crow(self) -> np.ndarray: ...
    @property
    def col(self) -> np.ndarray: ...
    @property
    def n_heads(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def num_row_blocks(self) -> int: ...
    @property
    def max_seqlen(self) -> int: ...
    @property
    def nnz_max(self) -> int: ...
    @property
    def causal(self) -> bool: ...
    @property
    def density(self) -> float: ...

def set_num_threads(n: int) -> None: ...
def num_threads() -> int: ...
def max_num_threads() -> int: ...
def prefers_bf16_dot_products() -> bool: ...
def version() -> str: ...
def _views_in_place(array: np.ndarray) -> bool: ...
def _as_array(array: object, name: str = "array") -> np.ndarray | None: ...
def _raise_error(kind: str) -> None: ...

# Submodules are stubbed as a namespace class and a module attribute of that type; the test
# checks each submodule's functions like the top-level ones.
class _NkiModule:
    @staticmethod
    def flash_paged_attention(
        query: np.ndarray,
        key: np.ndarray,
        value: np.ndarray,
        kv_cache: np.ndarray,
        block_tables: np.ndarray,
        mask: np.ndarray,
        *,
        softmax_scale: float | None = None,
        mixed_precision: bool = True,
        LARGE_TILE_SZ: int = 2048,
        schedule: str = "cpu",
        skip_masked_tiles: bool = True,
    ) -> np.ndarray: ...
    @staticmethod
    def reorder_context_mask(
        mask: np.ndarray, LARGE_TILE_SZ: int, block_size: int
    ) -> np.ndarray: ...
    @staticmethod
    def reshape_and_cache(
        key: np.ndarray, value: np.ndarray, kv_cache: np.ndarray, slot_mapping: np.ndarray
    ) -> None: ...

nki: _NkiModule

def sim_default_requests() -> list[tuple[int, int]]: ...
def sim_machine_presets() -> list[str]: ...

class SimMachine:
    @staticmethod
    def load(source: str, overrides: list[str]) -> SimMachine: ...
    @staticmethod
    def fields() -> list[tuple[str, str, float, float]]: ...
    def get(self, name: str) -> object: ...
    def set(self, name: str, value: object) -> None: ...
    def copy(self) -> SimMachine: ...
    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def source_of_key(self) -> dict[str, str]: ...

def sim_schedule(json: str) -> str: ...
def sim_program_limits() -> tuple[int, int]: ...
def sim_set_program_limits(max_instructions: int, max_buffer_elements: int) -> None: ...
def sim_simulate(
    machine_source: str, machine_overrides: list[str], point: dict, record_dma_pieces: bool = True
) -> object: ...
def sim_metrics() -> list[tuple[str, str]]: ...
def sim_kernels() -> list[dict]: ...
def sim_simulate_kernel(
    kernel: str,
    parameters: dict[str, str],
    machine_source: str,
    machine_overrides: list[str],
    record_dma_pieces: bool = True,
) -> object: ...
def sim_simulate_arrays(
    machine_source: str,
    machine_overrides: list[str],
    schedule_json: str,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    kv_cache: np.ndarray,
    block_tables: np.ndarray,
    mask: np.ndarray,
    dtype: str,
    softmax_scale: float | None,
    tiling_factor: int,
) -> tuple[object, np.ndarray]: ...
def sim_sweep(machines: list[tuple[str, list[str]]], points: list[dict]) -> list[dict | str]: ...
def sim_sweep_kernel(kernel: str, machines: list, points: list) -> list[dict | str]: ...
def sim_summary(handle: object) -> dict[str, float]: ...
def sim_report_json(handle: object) -> str: ...
def sim_report_text(handle: object) -> str: ...
def sim_timeline(handle: object) -> dict: ...
def sim_dma_pieces(handle: object) -> dict: ...
def sim_save_html(
    handle: object,
    path: str,
    comparisons: list[tuple[str, object]],
    title: str,
    baseline_label: str,
) -> None: ...
def sim_save_trace(handle: object, path: str, max_events: int) -> None: ...

# --- the NKI-language tracer's program builder (python/tilelab/nki/_trace.py) ---
# A tile view is (tile, p0, partitions, offset, count, stride) or, with two free levels,
# (tile, p0, partitions, offset, outer_count, outer_stride, inner_count, inner_stride); an HBM
# access pattern is (tensor, offset, partition_stride, partitions, [(count, stride), ...]).

def nki_builder(machine_source: str, machine_overrides: list[str], name: str) -> object: ...
def nki_machine_facts(builder: object) -> dict[str, object]: ...
def nki_hbm_tensor(builder: object, name: str, shape: list[int], dtype: str) -> int: ...
def nki_tile(
    builder: object,
    name: str,
    memory: str,
    partitions: int,
    free_elements: int,
    dtype: str,
    required: bool,
) -> int: ...
def nki_release_tile(builder: object, tile: int) -> None: ...
def nki_dma_transpose(builder: object, dst: tuple, src: tuple, trigger: str, queue: int) -> None: ...
def nki_dma(builder: object, dst: tuple, src: tuple, trigger: str, queue: int) -> None: ...
def nki_dma_gather(
    builder: object,
    dst: tuple,
    tensor: int,
    row_offset: int,
    rows: int,
    cols: int,
    index: tuple,
    col0: int,
) -> None: ...
def nki_matmul(
    builder: object, dst: tuple, stationary: tuple, moving: tuple, accumulate: bool
) -> None: ...
def nki_pe_transpose(builder: object, dst: tuple, src: tuple) -> None: ...
def nki_activation(
    builder: object,
    dst: tuple,
    src: tuple,
    func: str,
    scale: float | tuple | None,
    bias: tuple | None,
    reduce_result: tuple | None,
) -> None: ...
def nki_tensor_tensor(builder: object, dst: tuple, a: tuple, b: tuple, op: str) -> None: ...
def nki_tensor_tensor_scan(
    builder: object,
    dst: tuple,
    a: tuple,
    b: tuple,
    initial: float | tuple,
    op0: str,
    op1: str,
    reverse0: bool,
    reverse1: bool,
) -> None: ...
def nki_tensor_scalar(
    builder: object,
    dst: tuple,
    src: tuple,
    op0: str,
    scalar0: float | tuple | None,
    op1: str,
    scalar1: float | tuple | None,
    engine: str,
) -> None: ...
def nki_tensor_reduce(builder: object, dst: tuple, src: tuple, op: str, negate: bool) -> None: ...
def nki_bn_stats(builder: object, dst: tuple, src: tuple) -> None: ...
def nki_bn_aggr(builder: object, dst: tuple, src: tuple) -> None: ...
def nki_tensor_copy(builder: object, dst: tuple, src: tuple, engine: str) -> None: ...
def nki_select(
    builder: object, dst: tuple, condition: tuple, x: tuple, y: float | tuple
) -> None: ...
def nki_memset(builder: object, dst: tuple, value: float, engine: str) -> None: ...
def nki_iota(
    builder: object, dst: tuple, base: int, partition_step: int, free_step: int
) -> None: ...
def nki_add_source(
    builder: object, file: str, line: int, function: str, text: str, caller: int
) -> int: ...
def nki_set_source(builder: object, source: int) -> None: ...
def nki_instruction_count(builder: object) -> int: ...
def nki_finish(builder: object) -> object: ...
def nki_run_functional(
    program: object,
    inputs: dict[str, np.ndarray],
    outputs: list[str],
    snapshots: list[tuple[int, int]],
) -> tuple[dict[str, np.ndarray], list[np.ndarray]]: ...
def nki_time_program(
    program: object, kernel: str, parameters: dict[str, str], record_dma_pieces: bool
) -> object: ...
