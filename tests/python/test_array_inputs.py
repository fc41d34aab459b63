"""Arrays from any library: numpy arrays, objects with __dlpack__ and objects with the buffer
protocol are read in place (same memory, no copy), outputs are numpy arrays, and what cannot be
read (other devices, element types numpy cannot hold, producers that refuse) is a TypeError
naming the argument. torch tensors are covered in tests/python/torch/; here the DLPack producers
are numpy itself and a ctypes producer that can export any element type, device and flags."""

import array
import ctypes
import gc

import ml_dtypes
import numpy as np
import pytest
from attention_reference import random_qkv

import tilelab
from tilelab import _core

# --- a DLPack producer in ctypes (the ABI of dmlc/dlpack's dlpack.h) -----------------------------


class DLDevice(ctypes.Structure):
    _fields_ = (("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32))


class DLDataType(ctypes.Structure):
    _fields_ = (("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16))


class DLTensor(ctypes.Structure):
    _fields_ = (
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    )


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = (
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", DELETER),
)


class DLPackVersion(ctypes.Structure):
    _fields_ = (("major", ctypes.c_uint32), ("minor", ctypes.c_uint32))


class DLManagedTensorVersioned(ctypes.Structure):
    pass


VERSIONED_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = (
    ("version", DLPackVersion),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", VERSIONED_DELETER),
    ("flags", ctypes.c_uint64),
    ("dl_tensor", DLTensor),
)

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
_VERSIONED_NAME = b"dltensor_versioned"
_LEGACY_NAME = b"dltensor"

FLOAT, BFLOAT, FLOAT8_E4M3FN, FLOAT8_E5M2, OPAQUE, BOOL = 2, 4, 10, 12, 3, 6
CPU, CUDA = 1, 2


class Producer:
    """Exports `array`'s memory (its shape and element strides, from `offset` bytes before its
    first element) through DLPack as element type (code, bits, lanes) on `device_type`; counts
    the deleter's calls. `versioned`: a DLPack 1.x capsule when the consumer asks for one.
    `max_version_keyword`: False makes __dlpack__ a pre-1.0 producer without that keyword."""

    def __init__(self, array, *, code=None, bits=None, lanes=1, device_type=CPU, versioned=True,
                 read_only=False, offset=0, max_version_keyword=True):
        self.array = array
        self.code = FLOAT if code is None else code
        self.bits = array.dtype.itemsize * 8 if bits is None else bits
        self.lanes = lanes
        self.device_type = device_type
        self.versioned = versioned
        self.read_only = read_only
        self.offset = offset
        self.deleted = 0
        self.exported = 0
        self._exports = []
        if not max_version_keyword:
            self.__dlpack__ = lambda stream=None: self._export(False)

    def __dlpack_device__(self):
        return (self.device_type, 0)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return self._export(self.versioned and max_version is not None and max_version[0] >= 1)

    def _export(self, versioned):
        self.exported += 1
        itemsize = self.array.dtype.itemsize
        shape = (ctypes.c_int64 * self.array.ndim)(*self.array.shape)
        strides = (ctypes.c_int64 * self.array.ndim)(*(s // itemsize for s in self.array.strides))
        tensor = DLTensor(
            data=self.array.__array_interface__["data"][0] - self.offset,
            device=DLDevice(self.device_type, 0),
            ndim=self.array.ndim,
            dtype=DLDataType(self.code, self.bits, self.lanes),
            shape=shape,
            strides=strides,
            byte_offset=self.offset,
        )

        def delete(_):
            self.deleted += 1

        if versioned:
            deleter = VERSIONED_DELETER(delete)
            managed = DLManagedTensorVersioned(
                version=DLPackVersion(1, 1), deleter=deleter, flags=int(self.read_only),
                dl_tensor=tensor,
            )
            name = _VERSIONED_NAME
        else:
            deleter = DELETER(delete)
            managed = DLManagedTensor(dl_tensor=tensor, deleter=deleter)
            name = _LEGACY_NAME
        # Every export's structs live as long as the producer (a consumer may outlive the call).
        self._exports.append((shape, strides, deleter, managed))
        return _capsule_new(ctypes.addressof(managed), name, None)


class NumpyExporter:
    """An object with only numpy's own __dlpack__ / __dlpack_device__ (no __array__)."""

    def __init__(self, array):
        self._array = array
        self.__dlpack__ = array.__dlpack__
        self.__dlpack_device__ = array.__dlpack_device__


def address(array):
    return array.__array_interface__["data"][0]


# --- numpy's own DLPack export -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_numpy_dlpack_is_read_in_place(rng, dtype):
    q, k, v = random_qkv(rng, 2, 4, 2, 9, 13, 16, dtype)
    viewed = _core._as_array(NumpyExporter(q))
    assert isinstance(viewed, np.ndarray) and address(viewed) == address(q)
    assert viewed.dtype == q.dtype and viewed.shape == q.shape and viewed.strides == q.strides
    out = tilelab.flash_attention(NumpyExporter(q), NumpyExporter(k), NumpyExporter(v), causal=True)
    assert type(out) is np.ndarray
    np.testing.assert_array_equal(out, tilelab.flash_attention(q, k, v, causal=True))


def test_numpy_dlpack_of_a_strided_view(rng):
    q = random_qkv(rng, 1, 2, 2, 8, 8, 32, "float32")[0]
    strided = q.transpose(0, 2, 1, 3).copy().transpose(0, 2, 1, 3)[..., ::2]
    viewed = _core._as_array(NumpyExporter(strided))
    assert address(viewed) == address(strided) and viewed.strides == strided.strides
    assert _core._views_in_place(NumpyExporter(strided))


def test_backward_takes_dlpack_arrays(rng):
    q, k, v = random_qkv(rng, 1, 2, 1, 6, 7, 8, "float32")
    bias = rng.standard_normal((1, 2, 6, 7)).astype(np.float32)
    out, lse = tilelab.flash_attention(q, k, v, bias=bias, return_lse=True)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    expected = tilelab.flash_attention_backward(dout, q, k, v, out, lse, bias=bias,
                                                return_dbias=True)
    wrapped = [NumpyExporter(a) for a in (dout, q, k, v, out, lse)]
    got = tilelab.flash_attention_backward(*wrapped, bias=NumpyExporter(bias), return_dbias=True)
    for a, b in zip(got, expected, strict=True):
        assert type(a) is np.ndarray
        np.testing.assert_array_equal(a, b)


# --- the DLPack consumer: element types, versions, ownership -------------------------------------


def test_bfloat16_through_dlpack(rng):
    q, k, v = random_qkv(rng, 1, 2, 2, 5, 9, 8, "bfloat16")
    producers = [Producer(a.view(np.uint16), code=BFLOAT, bits=16) for a in (q, k, v)]
    viewed = _core._as_array(producers[0])
    assert viewed.dtype == ml_dtypes.bfloat16 and address(viewed) == address(q)
    np.testing.assert_array_equal(viewed, q)
    out = tilelab.flash_attention(*producers)
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out, tilelab.flash_attention(q, k, v))


@pytest.mark.parametrize(
    ("code", "dtype"),
    [(FLOAT8_E4M3FN, ml_dtypes.float8_e4m3fn), (FLOAT8_E5M2, ml_dtypes.float8_e5m2)],
)
def test_float8_through_dlpack(code, dtype):
    values = np.array([0.5, -1.0, 2.0, 448.0 if code == FLOAT8_E4M3FN else 57344.0], dtype=dtype)
    viewed = _core._as_array(Producer(values.view(np.uint8), code=code, bits=8))
    assert viewed.dtype == dtype and address(viewed) == address(values)
    np.testing.assert_array_equal(viewed, values)
    # Not an attention dtype: the error names the argument and the dtype.
    q = np.zeros((1, 1, 2, 2), dtype)
    k = np.zeros((1, 1, 2, 2), np.float32)
    with pytest.raises(TypeError, match=rf"^q: expected dtype float32.*got {dtype.__name__}"):
        tilelab.flash_attention(Producer(q.view(np.uint8), code=code, bits=8), k, k)


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
def test_the_consumer_owns_the_tensor_until_the_array_dies(versioned):
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    producer = Producer(values, versioned=versioned)
    viewed = _core._as_array(producer)
    assert producer.exported == 1 and producer.deleted == 0
    np.testing.assert_array_equal(viewed, values)
    del viewed
    gc.collect()
    assert producer.deleted == 1


def test_a_producer_without_max_version_gets_the_pre_1_0_call():
    values = np.ones((2, 2), np.float32)
    producer = Producer(values, max_version_keyword=False)
    viewed = _core._as_array(producer)
    assert address(viewed) == address(values)
    del viewed
    gc.collect()
    assert producer.deleted == 1


def test_byte_offset_is_honoured():
    values = np.arange(12, dtype=np.float32)
    viewed = _core._as_array(Producer(values[4:], offset=16))
    assert address(viewed) == address(values) + 16
    np.testing.assert_array_equal(viewed, values[4:])


def test_read_only_tensors_stay_read_only():
    values = np.ones((2, 2), np.float32)
    viewed = _core._as_array(Producer(values, read_only=True))
    assert not viewed.flags.writeable
    assert _core._as_array(Producer(values)).flags.writeable


def test_outputs_written_in_place_into_dlpack_memory(rng):
    # reshape_and_cache updates kv_cache in place: through DLPack that is the producer's memory.
    kv_cache = np.zeros((2, 3, 1, 4, 8), np.float32)
    key = rng.standard_normal((2, 1, 8)).astype(np.float32)
    value = rng.standard_normal((2, 1, 8)).astype(np.float32)
    tilelab.nki.reshape_and_cache(Producer(key), Producer(value), Producer(kv_cache),
                                  np.array([5, 0]))
    np.testing.assert_array_equal(kv_cache[0, 1, :, 1], key[0])
    np.testing.assert_array_equal(kv_cache[1, 0, :, 0], value[1])
    with pytest.raises(ValueError, match="kv_cache: expected a writable array"):
        tilelab.nki.reshape_and_cache(key, value, Producer(kv_cache, read_only=True),
                                      np.array([5, 0]))


# --- what the consumer refuses, naming the argument ----------------------------------------------


@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_another_device_is_refused(name):
    args = dict(zip("qkv", (np.zeros((1, 1, 2, 4), np.float32),) * 3, strict=True))
    producer = Producer(args[name], device_type=CUDA)
    args[name] = producer
    with pytest.raises(TypeError, match=rf"^{name}: expected an array in CPU memory.*CUDA"):
        tilelab.flash_attention(**args)
    assert producer.exported == 0  # refused from __dlpack_device__, before any export


def test_a_tensor_whose_own_device_is_not_the_cpu_is_refused_and_freed():
    producer = Producer(np.zeros((1, 1, 2, 4), np.float32))
    producer.__dlpack_device__ = lambda: (CPU, 0)
    producer.device_type = 8  # the capsule says Metal
    with pytest.raises(TypeError, match=r"^bias: expected an array in CPU memory.*Metal"):
        _core._as_array(producer, "bias")
    gc.collect()
    assert producer.exported == 1 and producer.deleted == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [(dict(code=OPAQUE, bits=64), "code 3, 64 bits, 1 lanes"),
     (dict(lanes=4), "code 2, 32 bits, 4 lanes"),
     (dict(code=BFLOAT, bits=32), "code 4, 32 bits")],
)
def test_element_types_numpy_cannot_hold_are_refused_and_freed(options, message):
    producer = Producer(np.zeros((1, 1, 2, 4), np.float32), **options)
    with pytest.raises(TypeError, match=rf"^k: its DLPack element type \({message}"):
        tilelab.flash_attention(np.zeros((1, 1, 2, 4), np.float32), producer,
                                np.zeros((1, 1, 2, 4), np.float32))
    gc.collect()
    assert producer.deleted == 1


def test_a_refusing_producer_is_named():
    class Refuses:
        def __dlpack__(self, **_):
            raise RuntimeError("cannot export tensors that require gradient")

    with pytest.raises(TypeError, match=r"^v: could not be read through __dlpack__.*gradient"):
        tilelab.flash_attention(*(np.zeros((1, 1, 2, 4), np.float32),) * 2, Refuses())


def test_a_used_capsule_is_refused():
    values = np.zeros((1, 1, 2, 4), np.float32)
    capsule = values.__dlpack__()
    np.from_dlpack(type("Once", (), {"__dlpack__": lambda self, **_: capsule,
                                     "__dlpack_device__": lambda self: (CPU, 0)})())

    class Reuses:
        def __dlpack__(self, **_):
            return capsule

    used = r"^q: its __dlpack__ returned a capsule named 'used_dltensor"
    with pytest.raises(TypeError, match=used):
        tilelab.flash_attention(Reuses(), values, values)


# --- the buffer protocol -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_memoryview_inputs(rng, dtype):
    q, k, v = random_qkv(rng, 1, 2, 1, 7, 5, 8, dtype)
    viewed = _core._as_array(memoryview(q))
    assert address(viewed) == address(q) and viewed.shape == q.shape and viewed.dtype == q.dtype
    out = tilelab.flash_attention(memoryview(q), memoryview(k), memoryview(v))
    assert type(out) is np.ndarray
    np.testing.assert_array_equal(out, tilelab.flash_attention(q, k, v))


def test_memoryview_of_a_strided_view(rng):
    q = random_qkv(rng, 1, 2, 1, 7, 5, 8, "float32")[0][..., ::2]
    viewed = _core._as_array(memoryview(q))
    assert address(viewed) == address(q) and viewed.strides == q.strides


def test_array_array_and_cast_memoryviews():
    floats = array.array("f", [1.0, 2.0, 3.0, 4.0])
    viewed = _core._as_array(floats)
    assert viewed.dtype == np.float32 and address(viewed) == floats.buffer_info()[0]
    shaped = _core._as_array(memoryview(floats).cast("B").cast("f", (1, 1, 2, 2)))
    assert shaped.shape == (1, 1, 2, 2) and address(shaped) == floats.buffer_info()[0]
    out = tilelab.flash_attention(shaped, shaped, shaped)
    np.testing.assert_array_equal(out, tilelab.flash_attention(*(np.array(shaped),) * 3))
    # A 1-d array.array reaches the rank check, which names the argument.
    with pytest.raises(ValueError, match=r"^q: expected rank 4"):
        tilelab.flash_attention(floats, shaped, shaped)


def test_buffers_of_other_element_types_are_named():
    q = np.zeros((1, 1, 2, 4), np.float32)
    with pytest.raises(TypeError, match=r"^k: expected dtype float32.*got uint8"):
        tilelab.flash_attention(q, bytes(32), q)
    with pytest.raises(TypeError, match=r"^bias: expected dtype float32, got float64"):
        tilelab.flash_attention(q, q, q, bias=array.array("d", [0.0] * 8))


def test_non_arrays_are_still_refused():
    assert _core._as_array([1.0, 2.0]) is None
    assert _core._as_array(1.0) is None
    with pytest.raises(TypeError, match=r"^q: expected a numpy.ndarray \(or an object with "
                                        r"__dlpack__ or the buffer protocol\).*got list"):
        tilelab.flash_attention([[[[1.0]]]], np.zeros((1, 1, 1, 1), np.float32),
                                np.zeros((1, 1, 1, 1), np.float32))


# --- integer arguments of tilelab.nki --------------------------------------------------------


def test_nki_index_arrays_from_buffers_and_dlpack(rng):
    kv_cache = np.zeros((2, 3, 1, 4, 8), np.float32)
    key = rng.standard_normal((2, 1, 8)).astype(np.float32)
    value = rng.standard_normal((2, 1, 8)).astype(np.float32)
    tilelab.nki.reshape_and_cache(key, value, kv_cache, array.array("q", [5, 0]))
    np.testing.assert_array_equal(kv_cache[0, 1, :, 1], key[0])
    mask = rng.random((128, 1024 + 128)) < 0.5
    want = tilelab.nki.reorder_context_mask(mask, 512, 32)
    got = tilelab.nki.reorder_context_mask(Producer(mask, code=BOOL, bits=8), 512, 32)
    np.testing.assert_array_equal(got, want)
    not_integers = r"^slot_mapping: expected .*integer array, got dtype float64"
    with pytest.raises(TypeError, match=not_integers):
        tilelab.nki.reshape_and_cache(key, value, kv_cache, array.array("d", [5.0, 0.0]))


def test_paged_and_simulator_arrays_from_dlpack(rng):
    # paged_attention's int32 index arrays and the functional simulator's tensors, through
    # DLPack-only objects: the same results as from numpy arrays.
    key_cache = rng.standard_normal((3, 1, 4, 8)).astype(np.float32)
    query = rng.standard_normal((3, 2, 8)).astype(np.float32)
    indices = (np.array([[2, 0], [1, -1]], np.int32), np.array([6, 2], np.int32),
               np.array([0, 2, 3], np.int32))
    want = tilelab.paged_attention(query, key_cache, key_cache, *indices)
    got = tilelab.paged_attention(NumpyExporter(query), key_cache, key_cache,
                                  *(NumpyExporter(a) for a in indices))
    np.testing.assert_array_equal(got, want)

    from tilelab import sim

    seq_q, d = 128, 16
    kv_cache = rng.standard_normal((2, 4, 1, 128, d)).astype(np.float32)
    arrays = dict(query=rng.standard_normal((1, 1, d, seq_q)).astype(np.float32),
                  key=rng.standard_normal((1, 1, d, seq_q)).astype(np.float32),
                  value=rng.standard_normal((1, 1, seq_q, d)).astype(np.float32),
                  kv_cache=kv_cache, block_tables=np.array([3, 1, 0, 2, 3, 1, 0, 2], np.int32),
                  mask=np.tril(np.ones((seq_q, 1024 + seq_q), np.int32), k=1024))
    options = dict(LARGE_TILE_SZ=1024, mixed_precision=False)
    _, want = sim.simulate_flash_paged_attention(**arrays, **options)
    _, got = sim.simulate_flash_paged_attention(
        **{name: NumpyExporter(a) for name, a in arrays.items()}, **options)
    np.testing.assert_array_equal(got, want)
