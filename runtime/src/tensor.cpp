// TensorView: construction checks, element counts, contiguity, address ranges and descriptions.
#include "tilelab/tensor.hpp"

#include <algorithm>
#include <sstream>

#include "tilelab/error.hpp"

namespace tilelab {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::f16:
    case DType::bf16:
      return 2;
    case DType::f8e4m3fn:
    case DType::f8e5m2:
      return 1;
  }
  TILELAB_CHECK(false) << "unknown dtype " << static_cast<int>(dtype);
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "float32";
    case DType::f16:
      return "float16";
    case DType::bf16:
      return "bfloat16";
    case DType::i32:
      return "int32";
    case DType::f8e4m3fn:
      return "float8_e4m3fn";
    case DType::f8e5m2:
      return "float8_e5m2";
  }
  TILELAB_CHECK(false) << "unknown dtype " << static_cast<int>(dtype);
}

namespace {

std::string format_list(const std::int64_t* values, int count) {
  std::ostringstream text;
  text << '[';
  for (int i = 0; i < count; ++i) text << (i ? ", " : "") << values[i];
  text << ']';
  return text.str();
}

}  // namespace

TensorView::TensorView(void* data, DType dtype, std::initializer_list<std::int64_t> shape)
    : data_(data), dtype_(dtype) {
  const int rank = static_cast<int>(shape.size());
  TILELAB_REQUIRE(rank >= 1 && rank <= kMaxRank)
      << "shape: expected 1 to " << kMaxRank << " dimensions, got " << rank;
  rank_ = rank;
  std::copy(shape.begin(), shape.end(), shape_.begin());
  TILELAB_REQUIRE(std::all_of(shape.begin(), shape.end(), [](std::int64_t e) { return e >= 0; }))
      << "shape: expected non-negative extents, got " << format_list(shape_.data(), rank_);
  std::int64_t row_major_stride = 1;
  for (int i = rank_ - 1; i >= 0; --i) {
    strides_[i] = row_major_stride;
    row_major_stride *= std::max<std::int64_t>(shape_[i], 1);
  }
}

TensorView::TensorView(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                       std::initializer_list<std::int64_t> strides)
    : TensorView(data, dtype, shape) {
  TILELAB_REQUIRE(static_cast<int>(strides.size()) == rank_)
      << "strides: expected one stride per dimension (" << rank_ << "), got " << strides.size();
  std::copy(strides.begin(), strides.end(), strides_.begin());
}

TensorView::TensorView(void* data, DType dtype, int rank, const std::int64_t* shape,
                       const std::int64_t* strides)
    : data_(data), dtype_(dtype) {
  TILELAB_REQUIRE(rank >= 1 && rank <= kMaxRank)
      << "shape: expected 1 to " << kMaxRank << " dimensions, got " << rank;
  TILELAB_REQUIRE(shape != nullptr)
      << "shape: expected an array of " << rank << " extents, got null";
  TILELAB_REQUIRE(strides != nullptr)
      << "strides: expected an array of " << rank << " strides, got null";
  rank_ = rank;
  std::copy(shape, shape + rank, shape_.begin());
  std::copy(strides, strides + rank, strides_.begin());
  TILELAB_REQUIRE(std::all_of(shape, shape + rank, [](std::int64_t e) { return e >= 0; }))
      << "shape: expected non-negative extents, got " << format_list(shape_.data(), rank_);
}

std::int64_t TensorView::numel() const {
  // A default-constructed view (rank 0) describes no tensor at all, not a scalar.
  if (rank_ == 0) return 0;
  std::int64_t count = 1;
  for (int i = 0; i < rank_; ++i) count *= shape_[i];
  return count;
}

std::int64_t TensorView::element_offset(std::int64_t linear) const {
  std::int64_t offset = 0;
  for (int i = rank_ - 1; i >= 0; --i) {
    offset += linear % shape_[i] * strides_[i];
    linear /= shape_[i];
  }
  return offset;
}

bool TensorView::is_contiguous() const {
  if (numel() == 0) return true;  // nothing to address, so every layout is as good as row-major
  std::int64_t expected_stride = 1;
  for (int i = rank_ - 1; i >= 0; --i) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expected_stride) return false;
    expected_stride *= shape_[i];
  }
  return true;
}

std::array<std::uintptr_t, 2> TensorView::byte_range() const {
  const auto base = reinterpret_cast<std::uintptr_t>(data_);
  if (numel() == 0) return {base, base};
  // Offsets of the lowest and highest element, in elements; negative strides reach below data.
  std::int64_t lowest = 0, highest = 0;
  for (int i = 0; i < rank_; ++i) {
    const std::int64_t reach = (shape_[i] - 1) * strides_[i];
    (reach < 0 ? lowest : highest) += reach;
  }
  const auto element_bytes = static_cast<std::int64_t>(dtype_size(dtype_));
  return {base + static_cast<std::uintptr_t>(lowest * element_bytes),
          base + static_cast<std::uintptr_t>((highest + 1) * element_bytes)};
}

bool TensorView::overlaps(const TensorView& other) const {
  const auto [begin, end] = byte_range();
  const auto [other_begin, other_end] = other.byte_range();
  return begin < end && other_begin < other_end && begin < other_end && other_begin < end;
}

std::string TensorView::describe() const {
  std::ostringstream text;
  text << dtype_name(dtype_) << format_list(shape_.data(), rank_) << " strides "
       << format_list(strides_.data(), rank_);
  return text.str();
}

}  // namespace tilelab
