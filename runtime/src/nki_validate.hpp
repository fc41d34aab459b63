// Argument checks shared by the tilelab::nki entry points (nki.hpp): each throws tilelab::Error
// naming the argument, with what was given and what is allowed.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <string>

#include "tilelab/error.hpp"
#include "tilelab/tensor.hpp"

namespace tilelab::nki::arguments {

inline std::string shape_of(const TensorView& view) {
  std::ostringstream text;
  text << "[";
  for (int i = 0; i < view.rank(); ++i) text << (i ? ", " : "") << view.dim(i);
  text << "]";
  return text.str();
}

// `view` has rank `rank` and, where `expected` is >= 0, those extents; `layout` names the dims.
inline void require_shape(const TensorView& view, const char* name, const char* layout,
                          std::initializer_list<std::int64_t> expected) {
  TILELAB_REQUIRE(view.rank() == static_cast<int>(expected.size()))
      << name << ": expected rank " << expected.size() << " " << layout << ", got rank "
      << view.rank() << " with shape " << shape_of(view);
  int i = 0;
  for (std::int64_t extent : expected) {
    TILELAB_REQUIRE(extent < 0 || view.dim(i) == extent)
        << name << ": expected shape " << layout << " with dim " << i << " = " << extent
        << ", got shape " << shape_of(view);
    ++i;
  }
  for (int d = 0; d < view.rank(); ++d) {
    TILELAB_REQUIRE(view.stride(d) >= 0 || view.dim(d) <= 1)
        << name << ": expected non-negative strides, got " << view.describe();
  }
}

inline void require_dtype(const TensorView& view, const char* name, DType dtype) {
  TILELAB_REQUIRE_TYPE(view.dtype() == dtype)
      << name << ": expected dtype " << dtype_name(dtype) << ", got " << dtype_name(view.dtype());
}

}  // namespace tilelab::nki::arguments
