"""torch CPU tensors passed straight to tilelab's array APIs: read in place through DLPack (same
data pointer, bfloat16 and float8 included), outputs are numpy, in-place outputs land in the
tensor; what DLPack cannot hand over is a TypeError naming the argument."""

import pytest

torch = pytest.importorskip("torch")

import gc  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import tilelab  # noqa: E402
from tilelab import _core  # noqa: E402

NUMPY_DTYPES = {
    torch.float32: np.dtype(np.float32),
    torch.float16: np.dtype(np.float16),
    torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
    torch.float8_e4m3fn: np.dtype(ml_dtypes.float8_e4m3fn),
    torch.float8_e5m2: np.dtype(ml_dtypes.float8_e5m2),
    torch.int32: np.dtype(np.int32),
    torch.bool: np.dtype(np.bool_),
}


def address(array):
    return array.__array_interface__["data"][0]


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=str)
def test_tensors_are_viewed_not_copied(dtype):
    tensor = torch.arange(24).reshape(2, 3, 4).to(dtype)
    array = _core._as_array(tensor)
    assert address(array) == tensor.data_ptr()
    assert array.dtype == NUMPY_DTYPES[dtype] and array.shape == tuple(tensor.shape)
    expected = tensor.float().numpy() if dtype.is_floating_point else tensor.numpy()
    np.testing.assert_array_equal(array.astype(expected.dtype), expected)


def test_strided_and_offset_tensors_keep_their_layout():
    base = torch.randn(4, 6, 8)
    tensor = base.transpose(0, 1)[1:, :, ::2]
    array = _core._as_array(tensor)
    assert address(array) == tensor.data_ptr()
    assert array.strides == tuple(4 * s for s in tensor.stride())
    np.testing.assert_array_equal(array, tensor.numpy())


def test_the_array_keeps_the_tensor_memory_alive():
    tensor = torch.full((1000,), 3.0)
    array = _core._as_array(tensor)
    del tensor
    gc.collect()
    torch.full((1000,), 7.0)  # would likely reuse the block if it had been freed
    assert (array == 3.0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_flash_attention_on_tensors_returns_numpy(dtype):
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 9, 16, generator=generator).to(dtype) for _ in range(3))
    k, v = k[:, :2], v[:, :2]
    bias = torch.randn(1, 1, 9, 9, generator=generator)
    out, lse = tilelab.flash_attention(q, k, v, bias=bias, causal=True, return_lse=True)
    assert type(out) is np.ndarray and out.dtype == NUMPY_DTYPES[dtype]
    numpy_args = [_core._as_array(t).copy() for t in (q, k, v)]
    want, want_lse = tilelab.flash_attention(*numpy_args, bias=bias.numpy(), causal=True,
                                             return_lse=True)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(lse, want_lse)
    # Tensors and numpy arrays mix freely.
    grads = tilelab.flash_attention_backward(torch.ones_like(q), q, k, v, out,
                                             torch.from_numpy(lse), bias=bias, causal=True,
                                             return_dbias=True)
    assert all(type(g) is np.ndarray for g in grads)


def test_strided_tensors_are_read_in_place():
    q, k, v = (torch.randn(1, 9, 2, 8).transpose(1, 2) for _ in range(3))
    assert all(_core._views_in_place(t) for t in (q, k, v))
    np.testing.assert_array_equal(
        tilelab.flash_attention(q, k, v),
        tilelab.flash_attention(*(t.contiguous().numpy() for t in (q, k, v))),
    )


def test_reshape_and_cache_writes_into_the_tensor():
    kv_cache = torch.zeros(2, 3, 1, 4, 8)
    key, value = torch.randn(2, 1, 8), torch.randn(2, 1, 8)
    tilelab.nki.reshape_and_cache(key, value, kv_cache, np.array([5, 0]))
    assert torch.equal(kv_cache[0, 1, :, 1], key[0]) and torch.equal(kv_cache[1, 0, :, 0], value[1])


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_index_arrays_may_be_tensors(index_dtype):
    # block_table, seq_lens and query_start_loc through DLPack too (int64 is narrowed, checked).
    rng = np.random.default_rng(0)
    key_cache = rng.standard_normal((3, 1, 4, 8), dtype=np.float32)
    query = rng.standard_normal((3, 2, 8), dtype=np.float32)
    indices = (np.array([[2, 0], [1, -1]]), np.array([6, 2]), np.array([0, 2, 3]))
    want = tilelab.paged_attention(query, key_cache, key_cache,
                                   *(a.astype(np.int32) for a in indices))
    got = tilelab.paged_attention(torch.from_numpy(query), key_cache, key_cache,
                                  *(torch.from_numpy(a).to(index_dtype) for a in indices))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (torch.zeros(1, 1, 2, 4, requires_grad=True),
         r"^k: could not be read through __dlpack__: BufferError: .*require gradient"),
        (torch.zeros(1, 1, 2, 4, device="meta"), "^k: could not be read through __dlpack__: "),
        (torch.zeros(1, 1, 2, 4, dtype=torch.float64), "^k: expected dtype float32.*got float64"),
        (torch.zeros(1, 1, 2, 4, dtype=torch.int16), "^k: expected dtype float32.*got int16"),
        (torch.zeros(1, 1, 2, 4, dtype=torch.complex64).conj(),
         "^k: could not be read through __dlpack__: .*conjugate"),
    ],
    ids=["requires_grad", "meta", "float64", "int16", "conjugate"],
)
def test_unreadable_tensors_are_named(tensor, message):
    q = torch.zeros(1, 1, 2, 4)
    with pytest.raises(TypeError, match=message):
        tilelab.flash_attention(q, tensor, q)


def test_import_tilelab_does_not_import_torch():
    code = "import sys, tilelab, tilelab.nki, tilelab.sim; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
    code = "import sys, tilelab.torch; sys.exit('torch' not in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
