// Numpy arrays as tilelab::TensorView (see array_view.hpp).
#include "array_view.hpp"

#include <array>
#include <cstdint>
#include <string>

#include "tilelab/error.hpp"

namespace tilelab::python {

std::optional<DType> attention_dtype(const py::dtype& dtype) {
  const char kind = dtype.kind();
  const py::ssize_t itemsize = dtype.itemsize();
  if (kind == 'f' && itemsize == 4) return DType::f32;
  if (kind == 'f' && itemsize == 2) return DType::f16;
  // ml_dtypes registers bfloat16 as a custom dtype of kind 'V', so kind and itemsize alone cannot
  // tell it from any other 2-byte void type; its registered name can.
  if (itemsize == 2 && py::str(dtype.attr("name")).cast<std::string>() == "bfloat16") {
    return DType::bf16;
  }
  return std::nullopt;
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
  static const py::handle masked_array_type =
      py::object(py::module_::import("numpy.ma").attr("MaskedArray")).release();
  if (py::isinstance(object, masked_array_type)) {
    throw Error(std::string(name) +
                    ": expected a numpy.ndarray, got a numpy.ma.MaskedArray (its mask would be "
                    "ignored; pass .filled(value) or .data)",
                ErrorKind::invalid_type);
  }
}

py::array require_float32_array(const py::handle& object, const char* name, const char* what) {
  reject_masked_array(object, name);
  if (!py::isinstance<py::array>(object)) {
    throw Error(std::string(name) + ": expected a numpy.ndarray of float32" + what + ", got " +
                    python_type_name(object),
                ErrorKind::invalid_type);
  }
  py::array array = py::reinterpret_borrow<py::array>(object);
  if (attention_dtype(array.dtype()) != DType::f32) {
    throw Error(std::string(name) + ": expected dtype float32, got " +
                    py::str(array.dtype()).cast<std::string>(),
                ErrorKind::invalid_type);
  }
  return array;
}

py::array require_attention_array(const py::handle& object, const char* name) {
  reject_masked_array(object, name);
  if (!py::isinstance<py::array>(object)) {
    throw Error(std::string(name) + ": expected a numpy.ndarray of " + kAttentionDtypes + ", got " +
                    python_type_name(object),
                ErrorKind::invalid_type);
  }
  py::array array = py::reinterpret_borrow<py::array>(object);
  if (!attention_dtype(array.dtype())) {
    throw Error(std::string(name) + ": expected dtype " + kAttentionDtypes + ", got " +
                    py::str(array.dtype()).cast<std::string>(),
                ErrorKind::invalid_type);
  }
  return array;
}

ArrayView view_array(const py::array& array, const char* name) {
  const py::ssize_t rank = array.ndim();
  if (rank < 1 || rank > TensorView::kMaxRank) {
    throw Error(std::string(name) + ": expected 1 to " + std::to_string(TensorView::kMaxRank) +
                " dimensions, got rank " + std::to_string(rank) + " with shape " +
                shape_string(array));
  }
  const std::optional<DType> dtype = attention_dtype(array.dtype());
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

py::array new_array(const py::dtype& like, const std::vector<py::ssize_t>& shape) {
  return py::array(like, shape);
}

TensorView view_output(py::array& array) {
  const std::optional<DType> dtype = attention_dtype(array.dtype());
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

std::optional<float> parse_optional_scale(const py::handle& value, const char* name) {
  if (value.is_none()) return std::nullopt;
  static const py::handle real = py::object(py::module_::import("numbers").attr("Real")).release();
  const bool is_bool = PyBool_Check(value.ptr()) ||
                       py::isinstance(value, py::module_::import("numpy").attr("bool_"));
  if (is_bool || !py::isinstance(value, real)) {
    throw Error(std::string(name) + ": expected a real number (int or float) or None, got " +
                    describe_value(value),
                ErrorKind::invalid_type);
  }
  const double result = PyFloat_AsDouble(value.ptr());
  if (result == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();  // an int beyond double's range
    throw Error(std::string(name) + ": expected a finite value, got " + describe_value(value));
  }
  return static_cast<float>(result);
}

}  // namespace tilelab::python
