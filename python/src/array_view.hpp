// Array arguments as numpy arrays without copying (numpy arrays, objects with __dlpack__ such as
// torch or JAX CPU tensors, objects with the buffer protocol), and numpy arrays as
// tilelab::TensorView: dtype mapping, byte strides to element strides, and the contiguous copy
// made when a buffer cannot be viewed in place.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <initializer_list>
#include <optional>
#include <string>

#include "tilelab/attention.hpp"
#include "tilelab/tensor.hpp"

namespace tilelab::python {

namespace py = pybind11;

// The dtypes flash_attention accepts, as error messages spell them.
inline constexpr const char* kAttentionDtypes = "float32, float16 or bfloat16 (ml_dtypes.bfloat16)";

// The tilelab dtype of a numpy dtype among float32, float16 and bfloat16; nullopt otherwise.
std::optional<DType> attention_dtype(const py::dtype& dtype);

// tilelab::Error(invalid_type) naming `name` when `object` is a numpy.ma.MaskedArray: tilelab would
// read its data and silently ignore its mask.
void reject_masked_array(const py::handle& object, const char* name);

// `object` as a numpy array over the same memory, nullopt when it is no array:
// - a numpy.ndarray is returned as is (a numpy.ma.MaskedArray is refused, see above);
// - an object with `__dlpack__` is consumed through the DLPack protocol (a versioned capsule when
//   the producer offers one; the array's base owns the tensor and calls the producer's deleter).
//   Element types map to numpy's, bfloat16 and the float8 types to ml_dtypes'; a read-only tensor
//   gives a read-only array. tilelab::Error(invalid_type) naming `name` for memory the CPU cannot
//   read (a CUDA tensor), an element type numpy cannot hold, or a producer that refuses;
// - an object with the buffer protocol (memoryview, array.array, bytes) is viewed through a
//   memoryview, keeping its format and shape.
std::optional<py::array> as_numpy_array(const py::handle& object, const char* name);

// The dtypes a KV cache may have, as error messages spell them.
inline constexpr const char* kCacheDtypes =
    "float32, float16, bfloat16, float8_e4m3fn or float8_e5m2 (ml_dtypes)";

// The tilelab dtype of any numpy dtype a tensor argument may have: the attention dtypes and
// ml_dtypes' float8_e4m3fn and float8_e5m2; nullopt otherwise.
std::optional<DType> element_dtype(const py::dtype& dtype);

// `object` (any array as_numpy_array takes) as a numpy array of a cache dtype (kCacheDtypes);
// tilelab::Error(invalid_type) naming `name` otherwise.
py::array require_cache_array(const py::handle& object, const char* name);

// `object` as a C-contiguous int32 array of rank `rank`: any numpy integer dtype is accepted when
// every value fits int32. TypeError for a non-array or a non-integer dtype, ValueError for a wrong
// rank or out-of-range values; each names `name` (`layout` names the dims, e.g. "[num_seqs]").
py::array_t<std::int32_t> require_int32_array(const py::handle& object, const char* name, int rank,
                                              const char* layout);

// A TensorView of an array from require_int32_array.
TensorView view_int32(const py::array_t<std::int32_t>& array);

// `object` (any array as_numpy_array takes) as a numpy array of an attention dtype;
// tilelab::Error(invalid_type) naming `name` when it is no array or has another dtype.
py::array require_attention_array(const py::handle& object, const char* name);

// `object` (any array as_numpy_array takes) as a float32 numpy array; tilelab::Error(invalid_type)
// naming `name` otherwise, its message "expected a numpy.ndarray (...) of float32<what>" (e.g.
// " or None").
py::array require_float32_array(const py::handle& object, const char* name, const char* what);

// A TensorView over numpy memory, and the array that owns that memory (the caller's array when it
// was viewed in place, else a copy that must outlive every use of `view`).
struct ArrayView {
  py::array owner;
  TensorView view;
  bool copied = false;
};

// Views `array` in place when its strides are non-negative multiples of the item size, its data is
// aligned to the item size and in native byte order; otherwise views a C-contiguous native copy.
// tilelab::Error naming `name` when the rank is 0 or exceeds TensorView::kMaxRank.
ArrayView view_array(const py::array& array, const char* name);

// A TensorView over `array` itself, for an array tilelab writes (an `out` argument, a cache):
// tilelab::Error naming `name` when it is read-only or cannot be viewed in place (byte order,
// alignment, strides).
TensorView view_written_array(const py::array& array, const char* name);

// The `out` argument of a packed-token call (q or query [tokens, heads, D]): a new C-contiguous
// array with `like`'s shape and dtype when `out` is None (tilelab::Error naming `like_name` with
// `layout` unless `like` has rank 3), else `out` itself, viewed in place. The array is returned
// (it owns the view's memory).
struct WrittenArray {
  py::array array;
  TensorView view;
};
WrittenArray packed_output(const py::handle& out, const ArrayView& like, const char* like_name,
                           const char* layout);

// A C-contiguous array of `shape` with `like`'s dtype (bf16 outputs keep ml_dtypes' dtype object).
py::array new_array(const py::dtype& like, const std::vector<py::ssize_t>& shape);

// A writable TensorView of an array from new_array (always C-contiguous and aligned).
TensorView view_output(py::array& array);

// "(2, 8, 128, 64)", for error messages.
std::string shape_string(const py::array& array);

// Keyword arguments of the bindings, checked exactly (no truthiness, no float-like ints); each
// throws tilelab::Error naming `name`, with the value given and what is allowed.
// A Python or numpy bool.
bool parse_bool(const py::handle& value, const char* name);
// One of `allowed` (a str); TypeError for a non-str, ValueError for another string.
std::string parse_choice(const py::handle& value, const char* name,
                         std::initializer_list<const char*> allowed);
// 'automatic', 'generated' or 'reference' (the `implementation` argument of every kernel).
Implementation parse_implementation(const py::handle& value);
// None -> nullopt; a real number (Python or numpy int or float, not bool or complex) -> its value
// as float. Finiteness is left to the C++ validation (a double beyond float stays infinite).
std::optional<float> parse_optional_scale(const py::handle& value, const char* name);
// A real number (as parse_optional_scale, None refused).
float parse_real(const py::handle& value, const char* name);

}  // namespace tilelab::python
