// Test tensors: owned storage of any dtype and memory layout, filled with deterministic values
// that are exactly representable in their dtype.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "dtype_convert.hpp"
#include "tilelab/tensor.hpp"

namespace tilelab_test {

// splitmix64: small, fast and identical on every platform (unlike std:: distributions).
class Random {
 public:
  explicit Random(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-52 - 1.0; }
  // Uniform integer in [0, count).
  std::size_t below(std::size_t count) { return static_cast<std::size_t>(next() % count); }

 private:
  std::uint64_t state_;
};

// Memory layout of a HostTensor: `memory_order` lists dims from outermost to innermost in memory
// (identity = row-major); `pad` extra elements follow every run of the innermost memory dim, and
// `inner_step` spaces consecutive innermost elements (1 = unit stride).
struct Layout {
  std::vector<int> memory_order;  // empty: row-major
  std::int64_t pad = 0;
  std::int64_t inner_step = 1;
};

class HostTensor {
 public:
  HostTensor(tilelab::DType dtype, std::vector<std::int64_t> shape, const Layout& layout = {})
      : dtype_(dtype), shape_(std::move(shape)), strides_(shape_.size()) {
    const int rank = static_cast<int>(shape_.size());
    std::vector<int> order = layout.memory_order;
    if (order.empty()) {
      order.resize(rank);
      std::iota(order.begin(), order.end(), 0);
    }
    std::int64_t stride = layout.inner_step;
    for (int position = rank - 1; position >= 0; --position) {
      const int dim = order[position];
      strides_[dim] = stride;
      stride *= std::max<std::int64_t>(shape_[dim], 1);
      if (position == rank - 1) stride += layout.pad;
    }
    const std::size_t element_bytes = tilelab::dtype_size(dtype);
    // Storage of floats keeps every dtype aligned; one spare element past the last stride.
    storage_.assign((static_cast<std::size_t>(stride) * element_bytes + 3) / 4 + 1, 0.0f);
  }

  tilelab::TensorView view() const {
    return tilelab::TensorView(const_cast<float*>(storage_.data()), dtype_,
                               static_cast<int>(shape_.size()), shape_.data(), strides_.data());
  }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  std::int64_t numel() const {
    return std::accumulate(shape_.begin(), shape_.end(), std::int64_t{1}, std::multiplies<>());
  }

  // Every storage slot (including padding) set to `bits_pattern` bytes; sentinels for
  // "nothing was written".
  void fill_bytes(unsigned char byte) {
    std::memset(storage_.data(), byte, storage_.size() * sizeof(float));
  }
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> copy(storage_.size() * sizeof(float));
    std::memcpy(copy.data(), storage_.data(), copy.size());
    return copy;
  }

  // Value at a row-major linear index of the logical shape, as float.
  float get(std::int64_t linear) const { return load(offset_of(linear)); }
  void set(std::int64_t linear, float value) { store(offset_of(linear), value); }

  // Each element uniform in [-amplitude, amplitude), rounded to the dtype.
  void fill_uniform(Random& random, double amplitude) {
    for (std::int64_t i = 0; i < numel(); ++i) {
      set(i, static_cast<float>(amplitude * random.uniform()));
    }
  }

 private:
  std::int64_t offset_of(std::int64_t linear) const {
    std::int64_t offset = 0;
    for (int dim = static_cast<int>(shape_.size()) - 1; dim >= 0; --dim) {
      offset += (linear % shape_[dim]) * strides_[dim];
      linear /= shape_[dim];
    }
    return offset;
  }
  float load(std::int64_t offset) const {
    const void* base = storage_.data();
    switch (dtype_) {
      case tilelab::DType::f32:
        return static_cast<const float*>(base)[offset];
      case tilelab::DType::f16:
        return tilelab::detail::f16_bits_to_float(static_cast<const std::uint16_t*>(base)[offset]);
      case tilelab::DType::bf16:
        return tilelab::detail::bf16_bits_to_float(static_cast<const std::uint16_t*>(base)[offset]);
      case tilelab::DType::i32:
        return static_cast<float>(static_cast<const std::int32_t*>(base)[offset]);
      case tilelab::DType::f8e4m3fn:
        return tilelab::detail::f8e4m3fn_bits_to_float(
            static_cast<const std::uint8_t*>(base)[offset]);
      case tilelab::DType::f8e5m2:
        return tilelab::detail::f8e5m2_bits_to_float(
            static_cast<const std::uint8_t*>(base)[offset]);
    }
    return NAN;
  }
  void store(std::int64_t offset, float value) {
    void* base = storage_.data();
    switch (dtype_) {
      case tilelab::DType::f32:
        static_cast<float*>(base)[offset] = value;
        return;
      case tilelab::DType::f16:
        static_cast<std::uint16_t*>(base)[offset] = tilelab::detail::float_to_f16_bits(value);
        return;
      case tilelab::DType::bf16:
        static_cast<std::uint16_t*>(base)[offset] = tilelab::detail::float_to_bf16_bits(value);
        return;
      case tilelab::DType::i32:
        static_cast<std::int32_t*>(base)[offset] = static_cast<std::int32_t>(value);
        return;
      case tilelab::DType::f8e4m3fn:
        static_cast<std::uint8_t*>(base)[offset] = tilelab::detail::float_to_f8e4m3fn_bits(value);
        return;
      case tilelab::DType::f8e5m2:
        static_cast<std::uint8_t*>(base)[offset] = tilelab::detail::float_to_f8e5m2_bits(value);
        return;
    }
  }

  tilelab::DType dtype_;
  std::vector<std::int64_t> shape_;
  std::vector<std::int64_t> strides_;
  std::vector<float> storage_;
};

// Copies of a view with one property changed, for tests that break one argument at a time.
namespace view_parts {
struct Parts {
  void* data;
  tilelab::DType dtype;
  std::vector<std::int64_t> shape, strides;
  explicit Parts(const tilelab::TensorView& view) : data(view.data()), dtype(view.dtype()) {
    for (int i = 0; i < view.rank(); ++i) {
      shape.push_back(view.dim(i));
      strides.push_back(view.stride(i));
    }
  }
  tilelab::TensorView view() const {
    return tilelab::TensorView(data, dtype, static_cast<int>(shape.size()), shape.data(),
                               strides.data());
  }
};
}  // namespace view_parts

// `view`'s memory as a row-major tensor of `shape`.
inline tilelab::TensorView with_shape(const tilelab::TensorView& view,
                                      std::vector<std::int64_t> shape) {
  view_parts::Parts parts(view);
  parts.strides.assign(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i)
    parts.strides[i] = parts.strides[i + 1] * shape[i + 1];
  parts.shape = std::move(shape);
  return parts.view();
}

inline tilelab::TensorView with_dtype(const tilelab::TensorView& view, tilelab::DType dtype) {
  view_parts::Parts parts(view);
  parts.dtype = dtype;
  return parts.view();
}

inline tilelab::TensorView with_data(const tilelab::TensorView& view, void* data) {
  view_parts::Parts parts(view);
  parts.data = data;
  return parts.view();
}

inline tilelab::TensorView with_stride(const tilelab::TensorView& view, int dim,
                                       std::int64_t stride) {
  view_parts::Parts parts(view);
  parts.strides[dim] = stride;
  return parts.view();
}

}  // namespace tilelab_test
