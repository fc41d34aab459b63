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
