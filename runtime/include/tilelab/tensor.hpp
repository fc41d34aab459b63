// TensorView: a non-owning view of a strided tensor (pointer, dtype, shape, strides in elements).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace tilelab {

// f8e4m3fn and f8e5m2 are the OCP 8-bit floats (ml_dtypes.float8_e4m3fn: no inf, NaN at
// S.1111.111, largest 448; ml_dtypes.float8_e5m2: IEEE-like with inf, largest 57344), accepted
// as K/V cache storage.
enum class DType { f32, f16, bf16, i32, f8e4m3fn, f8e5m2 };

// Bytes per element of `dtype`.
std::size_t dtype_size(DType dtype);
// "float32", "float16", "bfloat16", "int32", "float8_e4m3fn", "float8_e5m2" (numpy/ml_dtypes
// names).
const char* dtype_name(DType dtype);

// A view of memory the caller owns; tilelab never frees or keeps it past the call that receives it.
// Strides are in elements (not bytes) and may be any values, negative ones included; each
// operation validates what it accepts (flash_attention: non-negative). Up to kMaxRank dimensions,
// outermost first (row-major order of the shape).
class TensorView {
 public:
  static constexpr int kMaxRank = 6;

  TensorView() = default;
  // A contiguous (row-major) view.
  TensorView(void* data, DType dtype, std::initializer_list<std::int64_t> shape);
  // A strided view; `strides` has one entry per dimension, in elements.
  TensorView(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
             std::initializer_list<std::int64_t> strides);
  // Same, from arrays of `rank` entries (for bindings that know the rank at run time).
  TensorView(void* data, DType dtype, int rank, const std::int64_t* shape,
             const std::int64_t* strides);

  void* data() const { return data_; }
  DType dtype() const { return dtype_; }
  int rank() const { return rank_; }
  std::int64_t dim(int i) const { return shape_.at(i); }
  std::int64_t stride(int i) const { return strides_.at(i); }
  std::int64_t numel() const;
  // The offset, in elements from data(), of the element at row-major index `linear`.
  std::int64_t element_offset(std::int64_t linear) const;
  // True when strides are exactly row-major for the shape (dims of extent 1 are ignored).
  bool is_contiguous() const;
  // [lowest, highest) byte addresses the view can touch; empty views give an empty range.
  std::array<std::uintptr_t, 2> byte_range() const;
  // Whether the byte ranges of this view and `other` intersect (empty views overlap nothing).
  bool overlaps(const TensorView& other) const;
  // "float32[2, 8, 128, 64] strides [65536, 8192, 64, 1]", for error messages.
  std::string describe() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::f32;
  int rank_ = 0;
  std::array<std::int64_t, kMaxRank> shape_{};
  std::array<std::int64_t, kMaxRank> strides_{};
};

}  // namespace tilelab
