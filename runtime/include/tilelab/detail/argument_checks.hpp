// Shape checks shared by the runtime's entry points and the Python bindings: each throws
// tilelab::Error naming the argument, with what was given and what is allowed.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <string>

#include "tilelab/error.hpp"
#include "tilelab/tensor.hpp"

namespace tilelab::detail {

// "[2, 3, 4]".
inline std::string shape_of(const TensorView& view) {
  std::ostringstream text;
  text << "[";
  for (int i = 0; i < view.rank(); ++i) text << (i ? ", " : "") << view.dim(i);
  text << "]";
  return text.str();
}

// `view` has rank expected.size(), dim i equal to expected[i] wherever that is >= 0, and
// non-negative strides; `layout` names the dims for the message (e.g. "[1, n_heads, d, seq_q]").
inline void require_shape(const TensorView& view, const char* name, const char* layout,
                          std::initializer_list<std::int64_t> expected) {
  TILELAB_REQUIRE(view.rank() == static_cast<int>(expected.size()))
      << name << ": expected shape " << layout << " (rank " << expected.size() << "), got shape "
      << shape_of(view) << " (rank " << view.rank() << ")";
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

}  // namespace tilelab::detail
