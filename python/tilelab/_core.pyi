# Type stubs of the compiled tilelab._core; tests/python/test_api.py checks they match the module.
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
) -> str: ...
def set_num_threads(n: int) -> None: ...
def num_threads() -> int: ...
def version() -> str: ...
def _views_in_place(array: np.ndarray) -> bool: ...

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
    ) -> np.ndarray: ...
    @staticmethod
    def reorder_context_mask(mask: np.ndarray, LARGE_TILE_SZ: int, block_size: int) -> np.ndarray: ...
    @staticmethod
    def reshape_and_cache(
        key: np.ndarray, value: np.ndarray, kv_cache: np.ndarray, slot_mapping: np.ndarray
    ) -> None: ...

nki: _NkiModule
