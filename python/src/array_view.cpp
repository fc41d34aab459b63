// Array arguments as numpy arrays (numpy itself, DLPack, the buffer protocol) and numpy arrays as
// tilelab::TensorView (see array_view.hpp).
#include "array_view.hpp"

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "dlpack.hpp"
#include "tilelab/error.hpp"

namespace tilelab::python {

namespace {

// The tilelab dtype of an ml_dtypes type (bfloat16, float8_e4m3fn, float8_e5m2). ml_dtypes
// registers them as user-defined numpy types of kind 'V', so kind and itemsize cannot tell them
// from other types; their registered names can. A name is a Python-level property (about a
// microsecond each, several per call), so it is read once per type number: numbers of registered
// types do not change within a process. Callers hold the GIL, which guards the map.
std::optional<DType> registered_float_dtype(const py::dtype& dtype) {
  constexpr int kFirstUserType = 256;  // NPY_USERDEF: numpy's own types are numbered below
  const int number = dtype.num();
  if (number < kFirstUserType) return std::nullopt;
  static std::unordered_map<int, std::optional<DType>> known;
  if (const auto found = known.find(number); found != known.end()) return found->second;
  const std::string name = py::str(dtype.attr("name")).cast<std::string>();
  const py::ssize_t itemsize = dtype.itemsize();
  std::optional<DType> result;
  if (itemsize == 2 && name == "bfloat16") result = DType::bf16;
  if (itemsize == 1 && name == "float8_e4m3fn") result = DType::f8e4m3fn;
  if (itemsize == 1 && name == "float8_e5m2") result = DType::f8e5m2;
  known.emplace(number, result);
  return result;
}

}  // namespace

std::optional<DType> attention_dtype(const py::dtype& dtype) {
  const char kind = dtype.kind();
  const py::ssize_t itemsize = dtype.itemsize();
  if (kind == 'f' && itemsize == 4) return DType::f32;
  if (kind == 'f' && itemsize == 2) return DType::f16;
  if (registered_float_dtype(dtype) == DType::bf16) return DType::bf16;
  return std::nullopt;
}

std::optional<DType> element_dtype(const py::dtype& dtype) {
  if (const std::optional<DType> attention = attention_dtype(dtype)) return attention;
  return registered_float_dtype(dtype);
}

namespace {

std::string python_type_name(const py::handle& object) {
  return py::str(py::type::handle_of(object).attr("__name__")).cast<std::string>();
}

// Strides the TensorView can express directly: non-negative whole elements.
bool strides_viewable(const py::array& array) {
  const py::ssize_t itemsize = array.itemsize();
  for (py::ssize_t i = 0; i < array.ndim(); ++i) {
    const py::ssize_t stride = array.strides(i);
    if (stride < 0 || stride % itemsize != 0) return false;
  }
  return true;
}

}  // namespace

void reject_masked_array(const py::handle& object, const char* name) {
  // A MaskedArray exists only once numpy.ma is imported; importing it here would add about 10 ms
  // to a process's first call.
  static py::handle masked_array_type;
  if (!masked_array_type) {
    PyObject* module = PyImport_GetModule(py::str("numpy.ma").ptr());  // never imports
    if (!module) {
      if (PyErr_Occurred()) throw py::error_already_set();
      return;
    }
    masked_array_type =
        py::object(py::reinterpret_steal<py::object>(module).attr("MaskedArray")).release();
  }
  if (py::isinstance(object, masked_array_type)) {
    throw Error(std::string(name) +
                    ": expected a numpy.ndarray, got a numpy.ma.MaskedArray (its mask would be "
                    "ignored; pass .filled(value) or .data)",
                ErrorKind::invalid_type);
  }
}

namespace {

// What an array argument may be, for the messages of require_*_array.
constexpr const char* kArrayKinds =
    "a numpy.ndarray (or an object with __dlpack__ or the buffer protocol)";

// The numpy (or ml_dtypes) dtype of a DLPack element type; tilelab::Error(invalid_type) naming
// `name` for vector types and codes numpy cannot hold.
py::dtype numpy_dtype_of(const dlpack::DLDataType& type, const char* name) {
  struct Entry {
    std::uint8_t code;
    std::uint8_t bits;
    const char* module;
    const char* attribute;
  };
  static constexpr Entry kEntries[] = {
      {dlpack::kDLFloat, 16, "numpy", "float16"},
      {dlpack::kDLFloat, 32, "numpy", "float32"},
      {dlpack::kDLFloat, 64, "numpy", "float64"},
      {dlpack::kDLBfloat, 16, "ml_dtypes", "bfloat16"},
      {dlpack::kDLInt, 8, "numpy", "int8"},
      {dlpack::kDLInt, 16, "numpy", "int16"},
      {dlpack::kDLInt, 32, "numpy", "int32"},
      {dlpack::kDLInt, 64, "numpy", "int64"},
      {dlpack::kDLUInt, 8, "numpy", "uint8"},
      {dlpack::kDLUInt, 16, "numpy", "uint16"},
      {dlpack::kDLUInt, 32, "numpy", "uint32"},
      {dlpack::kDLUInt, 64, "numpy", "uint64"},
      {dlpack::kDLBool, 8, "numpy", "bool_"},
      {dlpack::kDLComplex, 64, "numpy", "complex64"},
      {dlpack::kDLComplex, 128, "numpy", "complex128"},
      {dlpack::kDLFloat8_e3m4, 8, "ml_dtypes", "float8_e3m4"},
      {dlpack::kDLFloat8_e4m3, 8, "ml_dtypes", "float8_e4m3"},
      {dlpack::kDLFloat8_e4m3b11fnuz, 8, "ml_dtypes", "float8_e4m3b11fnuz"},
      {dlpack::kDLFloat8_e4m3fn, 8, "ml_dtypes", "float8_e4m3fn"},
      {dlpack::kDLFloat8_e4m3fnuz, 8, "ml_dtypes", "float8_e4m3fnuz"},
      {dlpack::kDLFloat8_e5m2, 8, "ml_dtypes", "float8_e5m2"},
      {dlpack::kDLFloat8_e5m2fnuz, 8, "ml_dtypes", "float8_e5m2fnuz"},
      {dlpack::kDLFloat8_e8m0fnu, 8, "ml_dtypes", "float8_e8m0fnu"},
  };
  if (type.lanes == 1) {
    for (const Entry& entry : kEntries) {
      if (entry.code == type.code && entry.bits == type.bits) {
        return py::dtype::from_args(py::module_::import(entry.module).attr(entry.attribute));
      }
    }
  }
  throw Error(std::string(name) + ": its DLPack element type (code " + std::to_string(type.code) +
                  ", " + std::to_string(type.bits) + " bits, " + std::to_string(type.lanes) +
                  " lanes) has no numpy or ml_dtypes equivalent",
              ErrorKind::invalid_type);
}

// Device types whose memory the CPU reads directly: CPU, CUDA host (pinned), ROCm host.
bool host_readable(std::int32_t device_type) {
  return device_type == dlpack::kDLCPU || device_type == 3 || device_type == 11;
}

std::string device_description(std::int32_t device_type) {
  switch (device_type) {
    case dlpack::kDLCUDA:
      return "CUDA";
    case 4:
      return "OpenCL";
    case 7:
      return "Vulkan";
    case 8:
      return "Metal";
    case 10:
      return "ROCm";
    case 13:
      return "CUDA managed";
    case 14:
      return "oneAPI";
    default:
      return "DLPack device type " + std::to_string(device_type);
  }
}

void require_host_device(std::int32_t device_type, const char* name) {
  if (!host_readable(device_type)) {
    throw Error(std::string(name) + ": expected an array in CPU memory, got one on the " +
                    device_description(device_type) + " device (copy it to the CPU first)",
                ErrorKind::invalid_type);
  }
}

// A numpy array over the memory of a consumed DLPack tensor. The array's base is a capsule that
// owns `managed` and calls the producer's deleter when numpy releases the array; it takes
// ownership before any check, so an error frees the tensor too.
template <typename Managed>
py::array wrap_managed_tensor(Managed* managed, bool read_only, const char* name) {
  const py::capsule owner(managed, [](void* pointer) {
    auto* tensor = static_cast<Managed*>(pointer);
    if (tensor->deleter != nullptr) tensor->deleter(tensor);
  });
  if constexpr (std::is_same_v<Managed, dlpack::DLManagedTensorVersioned>) {
    if (managed->version.major != 1) {
      throw Error(std::string(name) + ": its __dlpack__ returned DLPack version " +
                      std::to_string(managed->version.major) + "." +
                      std::to_string(managed->version.minor) + ", expected 1.x",
                  ErrorKind::invalid_type);
    }
  }
  const dlpack::DLTensor& tensor = managed->dl_tensor;
  require_host_device(tensor.device.device_type, name);
  const py::dtype dtype = numpy_dtype_of(tensor.dtype, name);
  const py::ssize_t itemsize = dtype.itemsize();
  std::vector<py::ssize_t> shape(static_cast<std::size_t>(tensor.ndim));
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t contiguous_stride = itemsize;
  for (std::int32_t i = tensor.ndim - 1; i >= 0; --i) {
    shape[i] = tensor.shape[i];
    strides[i] = tensor.strides != nullptr ? tensor.strides[i] * itemsize : contiguous_stride;
    contiguous_stride *= shape[i];
  }
  void* data = static_cast<char*>(tensor.data) + tensor.byte_offset;
  py::array result(dtype, shape, strides, data, owner);
  if (read_only) result.attr("setflags")(py::arg("write") = false);
  return result;
}

// Calls object.__dlpack__ (asking for a versioned capsule, falling back to the pre-1.0 call for
// producers without max_version) and consumes the capsule as the protocol says: take the
// tensor, rename the capsule "used_..." so the producer's capsule destructor leaves it alone.
py::array array_from_dlpack(const py::handle& object, const char* name) {
  try {
    if (py::hasattr(object, "__dlpack_device__")) {
      const py::tuple device = object.attr("__dlpack_device__")();
      require_host_device(device[0].cast<std::int32_t>(), name);
    }
    py::object capsule;
    try {
      capsule = object.attr("__dlpack__")(py::arg("max_version") = py::make_tuple(1, 1));
    } catch (const py::error_already_set& error) {
      if (!error.matches(PyExc_TypeError)) throw;
      capsule = object.attr("__dlpack__")();
    }
    if (!py::isinstance<py::capsule>(capsule)) {
      throw Error(std::string(name) + ": its __dlpack__ returned " +
                      py::str(py::type::handle_of(capsule).attr("__name__")).cast<std::string>() +
                      ", expected a PyCapsule",
                  ErrorKind::invalid_type);
    }
    PyObject* raw = capsule.ptr();
    if (PyCapsule_IsValid(raw, "dltensor_versioned") != 0) {
      auto* managed = static_cast<dlpack::DLManagedTensorVersioned*>(
          PyCapsule_GetPointer(raw, "dltensor_versioned"));
      if (PyCapsule_SetName(raw, "used_dltensor_versioned") != 0) throw py::error_already_set();
      return wrap_managed_tensor(managed, (managed->flags & dlpack::kFlagReadOnly) != 0, name);
    }
    if (PyCapsule_IsValid(raw, "dltensor") != 0) {
      auto* managed = static_cast<dlpack::DLManagedTensor*>(PyCapsule_GetPointer(raw, "dltensor"));
      if (PyCapsule_SetName(raw, "used_dltensor") != 0) throw py::error_already_set();
      return wrap_managed_tensor(managed, false, name);
    }
    const char* capsule_name = PyCapsule_GetName(raw);
    throw Error(std::string(name) + ": its __dlpack__ returned a capsule named '" +
                    (capsule_name != nullptr ? capsule_name : "") +
                    "', expected 'dltensor_versioned' or 'dltensor' (an unused tensor)",
                ErrorKind::invalid_type);
  } catch (const py::error_already_set& error) {
    // The producer refused (e.g. a tensor that requires grad, a conjugate view): say which
    // argument it was.
    const std::string producer_message =
        py::str(error.type().attr("__name__")).cast<std::string>() + ": " +
        py::str(error.value()).cast<std::string>();
    throw Error(std::string(name) + ": could not be read through __dlpack__: " + producer_message,
                ErrorKind::invalid_type);
  }
}

}  // namespace

std::optional<py::array> as_numpy_array(const py::handle& object, const char* name) {
  reject_masked_array(object, name);
  if (py::isinstance<py::array>(object)) return py::reinterpret_borrow<py::array>(object);
  if (py::hasattr(object, "__dlpack__")) return array_from_dlpack(object, name);
  if (PyObject_CheckBuffer(object.ptr()) != 0) {
    // Through a memoryview, numpy keeps the buffer's format and shape (bytes stay uint8 rather
    // than becoming a 0-d string array) and the array holds the buffer export alive.
    const py::object view =
        py::reinterpret_steal<py::object>(PyMemoryView_FromObject(object.ptr()));
    if (!view) throw py::error_already_set();
    static const py::handle asarray =
        py::object(py::module_::import("numpy").attr("asarray")).release();
    return py::reinterpret_steal<py::array>(asarray(view).release());
  }
  return std::nullopt;
}

py::array require_float32_array(const py::handle& object, const char* name, const char* what) {
  const std::optional<py::array> converted = as_numpy_array(object, name);
  if (!converted) {
    throw Error(std::string(name) + ": expected " + kArrayKinds + " of float32" + what + ", got " +
                    python_type_name(object),
                ErrorKind::invalid_type);
  }
  const py::array& array = *converted;
  if (attention_dtype(array.dtype()) != DType::f32) {
    throw Error(std::string(name) + ": expected dtype float32, got " +
                    py::str(array.dtype()).cast<std::string>(),
                ErrorKind::invalid_type);
  }
  return array;
}

py::array require_attention_array(const py::handle& object, const char* name) {
  const std::optional<py::array> converted = as_numpy_array(object, name);
  if (!converted) {
    throw Error(std::string(name) + ": expected " + kArrayKinds + " of " + kAttentionDtypes +
                    ", got " + python_type_name(object),
                ErrorKind::invalid_type);
  }
  const py::array& array = *converted;
  if (!attention_dtype(array.dtype())) {
    throw Error(std::string(name) + ": expected dtype " + kAttentionDtypes + ", got " +
                    py::str(array.dtype()).cast<std::string>(),
                ErrorKind::invalid_type);
  }
  return array;
}

py::array require_cache_array(const py::handle& object, const char* name) {
  const std::optional<py::array> converted = as_numpy_array(object, name);
  if (!converted) {
    throw Error(std::string(name) + ": expected " + kArrayKinds + " of " + kCacheDtypes + ", got " +
                    python_type_name(object),
                ErrorKind::invalid_type);
  }
  const py::array& array = *converted;
  if (!element_dtype(array.dtype())) {
    throw Error(std::string(name) + ": expected dtype " + kCacheDtypes + ", got " +
                    py::str(array.dtype()).cast<std::string>(),
                ErrorKind::invalid_type);
  }
  return array;
}

py::array_t<std::int32_t> require_int32_array(const py::handle& object, const char* name, int rank,
                                              const char* layout) {
  const std::optional<py::array> converted = as_numpy_array(object, name);
  if (!converted) {
    throw Error(std::string(name) + ": expected " + kArrayKinds + " of int32, got " +
                    python_type_name(object),
                ErrorKind::invalid_type);
  }
  const py::array& array = *converted;
  const char kind = array.dtype().kind();
  if (kind != 'i' && kind != 'u') {
    throw Error(std::string(name) + ": expected an integer dtype (int32), got " +
                    py::str(array.dtype()).cast<std::string>(),
                ErrorKind::invalid_type);
  }
  if (array.ndim() != rank) {
    throw Error(std::string(name) + ": expected rank " + std::to_string(rank) + " " + layout +
                ", got shape " + shape_string(array));
  }
  // Signed integers of up to 32 bits and unsigned ones of up to 16 always fit: no scan of the
  // values (block tables can be large, and this runs on every call).
  const py::ssize_t bytes = array.dtype().itemsize();
  const bool always_fits = kind == 'i' ? bytes <= 4 : bytes <= 2;
  if (!always_fits && array.size() > 0) {
    const py::object low = array.attr("min")(), high = array.attr("max")();
    // Compared as Python ints: uint64 values beyond int64 included.
    if (py::int_(low) < py::int_(INT32_MIN) || py::int_(high) > py::int_(INT32_MAX)) {
      throw Error(std::string(name) + ": expected values in the int32 range, got values in [" +
                  py::str(low).cast<std::string>() + ", " + py::str(high).cast<std::string>() +
                  "]");
    }
  }
  return py::array_t<std::int32_t, py::array::c_style | py::array::forcecast>::ensure(array);
}

TensorView view_int32(const py::array_t<std::int32_t>& array) {
  std::array<std::int64_t, TensorView::kMaxRank> shape{};
  for (py::ssize_t i = 0; i < array.ndim(); ++i) shape[i] = array.shape(i);
  std::array<std::int64_t, TensorView::kMaxRank> strides{};
  std::int64_t stride = 1;
  for (py::ssize_t i = array.ndim() - 1; i >= 0; --i) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return TensorView(const_cast<std::int32_t*>(array.data()), DType::i32,
                    static_cast<int>(array.ndim()), shape.data(), strides.data());
}

ArrayView view_array(const py::array& array, const char* name) {
  const py::ssize_t rank = array.ndim();
  if (rank < 1 || rank > TensorView::kMaxRank) {
    throw Error(std::string(name) + ": expected 1 to " + std::to_string(TensorView::kMaxRank) +
                " dimensions, got rank " + std::to_string(rank) + " with shape " +
                shape_string(array));
  }
  const std::optional<DType> dtype = element_dtype(array.dtype());
  TILELAB_CHECK(dtype.has_value()) << name << " reached view_array with an unchecked dtype";

  ArrayView result{array, {}, false};
  const bool native = array.dtype().attr("isnative").cast<bool>();
  const bool aligned = reinterpret_cast<std::uintptr_t>(array.data()) % array.itemsize() == 0;
  if (!native || !aligned || !strides_viewable(array)) {
    // astype always copies; order "C" and the native-order dtype make the copy viewable.
    py::object native_dtype = array.dtype().attr("newbyteorder")("=");
    result.owner = py::array(array.attr("astype")(native_dtype, py::arg("order") = "C"));
    result.copied = true;
  }

  const py::array& owner = result.owner;
  std::array<std::int64_t, TensorView::kMaxRank> shape{};
  std::array<std::int64_t, TensorView::kMaxRank> strides{};
  for (py::ssize_t i = 0; i < rank; ++i) {
    shape[i] = owner.shape(i);
    strides[i] = owner.strides(i) / owner.itemsize();
  }
  // TensorView is read-only by contract for inputs; the const_cast only fits its one pointer type.
  result.view = TensorView(const_cast<void*>(owner.data()), *dtype, static_cast<int>(rank),
                           shape.data(), strides.data());
  return result;
}

TensorView view_written_array(const py::array& array, const char* name) {
  if (!array.writeable()) {
    throw Error(std::string(name) + ": expected a writeable array, got a read-only one");
  }
  const ArrayView viewed = view_array(array, name);
  if (viewed.copied) {
    throw Error(std::string(name) +
                ": expected an array written in place (native byte order, aligned, non-negative "
                "strides in whole elements), got one with strides " +
                py::str(array.attr("strides")).cast<std::string>());
  }
  return viewed.view;
}

WrittenArray packed_output(const py::handle& out, const ArrayView& like, const char* like_name,
                           const char* layout) {
  WrittenArray result;
  if (out.is_none()) {
    // out takes the shape of `like`; every other check is the C++ validation's.
    const py::array& owner = like.owner;
    if (owner.ndim() != 3) {
      throw Error(std::string(like_name) + ": expected rank 3 " + layout + ", got shape " +
                  shape_string(owner));
    }
    result.array = new_array(owner.dtype(), {owner.shape(0), owner.shape(1), owner.shape(2)});
    result.view = view_output(result.array);
  } else {
    result.array = require_attention_array(out, "out");
    result.view = view_written_array(result.array, "out");
  }
  return result;
}

py::array new_array(const py::dtype& like, const std::vector<py::ssize_t>& shape) {
  return py::array(like, shape);
}

TensorView view_output(py::array& array) {
  const std::optional<DType> dtype = element_dtype(array.dtype());
  TILELAB_CHECK(dtype.has_value()) << "outputs are created with an attention dtype";
  std::array<std::int64_t, TensorView::kMaxRank> shape{};
  std::array<std::int64_t, TensorView::kMaxRank> strides{};
  for (py::ssize_t i = 0; i < array.ndim(); ++i) {
    shape[i] = array.shape(i);
    strides[i] = array.strides(i) / array.itemsize();
  }
  return TensorView(array.mutable_data(), *dtype, static_cast<int>(array.ndim()), shape.data(),
                    strides.data());
}

std::string shape_string(const py::array& array) {
  return py::str(py::tuple(array.attr("shape"))).cast<std::string>();
}

namespace {

// "str 'yes'", "NoneType None": the type and repr of a rejected argument (long reprs shortened).
std::string describe_value(const py::handle& value) {
  std::string repr = py::repr(value).cast<std::string>();
  if (repr.size() > 60)
    repr = repr.substr(0, 40) + "..." + " (" + std::to_string(repr.size()) + " characters)";
  return python_type_name(value) + " " + repr;
}

}  // namespace

bool parse_bool(const py::handle& value, const char* name) {
  if (PyBool_Check(value.ptr())) return value.ptr() == Py_True;
  static const py::handle numpy_bool =
      py::object(py::module_::import("numpy").attr("bool_")).release();
  if (py::isinstance(value, numpy_bool)) return value.attr("__bool__")().cast<bool>();
  throw Error(std::string(name) + ": expected a bool (True or False), got " + describe_value(value),
              ErrorKind::invalid_type);
}

std::string parse_choice(const py::handle& value, const char* name,
                         std::initializer_list<const char*> allowed) {
  std::string choices;
  std::size_t index = 0;
  for (const char* choice : allowed) {
    if (index > 0) choices += index + 1 == allowed.size() ? " or " : ", ";
    choices += std::string("'") + choice + "'";
    ++index;
  }
  if (!py::isinstance<py::str>(value)) {
    throw Error(std::string(name) + ": expected " + choices + ", got " + describe_value(value),
                ErrorKind::invalid_type);
  }
  const std::string text = value.cast<std::string>();
  for (const char* choice : allowed) {
    if (text == choice) return text;
  }
  throw Error(std::string(name) + ": expected " + choices + ", got '" + text + "'");
}

Implementation parse_implementation(const py::handle& value) {
  const std::string name =
      parse_choice(value, "implementation", {"automatic", "generated", "reference"});
  if (name == "automatic") return Implementation::automatic;
  return name == "generated" ? Implementation::generated : Implementation::reference;
}

namespace {

// A real number (Python or numpy int or float, not bool or complex) as float; None gives nullopt
// when `none_allowed`. Finiteness is left to the C++ validation.
std::optional<float> parse_real_number(const py::handle& value, const char* name,
                                       bool none_allowed) {
  if (none_allowed && value.is_none()) return std::nullopt;
  static const py::handle real = py::object(py::module_::import("numbers").attr("Real")).release();
  const bool is_bool = PyBool_Check(value.ptr()) ||
                       py::isinstance(value, py::module_::import("numpy").attr("bool_"));
  if (is_bool || !py::isinstance(value, real)) {
    throw Error(std::string(name) + ": expected a real number (int or float)" +
                    (none_allowed ? " or None" : "") + ", got " + describe_value(value),
                ErrorKind::invalid_type);
  }
  const double result = PyFloat_AsDouble(value.ptr());
  if (result == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();  // an int beyond double's range
    throw Error(std::string(name) + ": expected a finite value, got " + describe_value(value));
  }
  return static_cast<float>(result);
}

}  // namespace

std::optional<float> parse_optional_scale(const py::handle& value, const char* name) {
  return parse_real_number(value, name, true);
}

float parse_real(const py::handle& value, const char* name) {
  return *parse_real_number(value, name, false);
}

}  // namespace tilelab::python
