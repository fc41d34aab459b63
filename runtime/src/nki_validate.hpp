// Argument checks shared by the tilelab::nki entry points (nki.hpp): each throws tilelab::Error
// naming the argument, with what was given and what is allowed.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <string>

#include "tilelab/detail/argument_checks.hpp"
#include "tilelab/error.hpp"
#include "tilelab/tensor.hpp"

namespace tilelab::nki::arguments {

using detail::require_shape;
using detail::shape_of;

inline void require_dtype(const TensorView& view, const char* name, DType dtype) {
  TILELAB_REQUIRE_TYPE(view.dtype() == dtype)
      << name << ": expected dtype " << dtype_name(dtype) << ", got " << dtype_name(view.dtype());
}

}  // namespace tilelab::nki::arguments
