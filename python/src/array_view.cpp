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

py::array require_attention_array(const py::handle& object, const char* name) {
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
  if (rank > TensorView::kMaxRank) {
    throw Error(std::string(name) + ": expected at most " + std::to_string(TensorView::kMaxRank) +
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

}  // namespace tilelab::python
