// A rank-4 tensor addressed by element strides, for the reference implementations (forward and
// backward). Storage is const-qualified for inputs.
#pragma once

#include <cstdint>

#include "tilelab/tensor.hpp"

namespace tilelab::detail {

// With `broadcast`, extent-1 dims get stride 0, so that a broadcast operand (the bias) is indexed
// with the full [B, Hq, M, N] index.
template <typename Storage>
struct Strided4 {
  Storage* data;
  std::int64_t stride[4];

  Strided4(const TensorView& view, bool broadcast) : data(static_cast<Storage*>(view.data())) {
    for (int i = 0; i < 4; ++i) {
      stride[i] = (broadcast && view.dim(i) == 1) ? 0 : view.stride(i);
    }
  }
  std::int64_t row_offset(std::int64_t i0, std::int64_t i1, std::int64_t i2) const {
    return i0 * stride[0] + i1 * stride[1] + i2 * stride[2];
  }
  Storage* row(std::int64_t i0, std::int64_t i1, std::int64_t i2) const {
    return data + row_offset(i0, i1, i2);
  }
  Storage& at(std::int64_t i0, std::int64_t i1, std::int64_t i2, std::int64_t i3) const {
    return row(i0, i1, i2)[i3 * stride[3]];
  }
};

}  // namespace tilelab::detail
