// Contiguous rows of a cache or tensor widened to fp32 (exact), and fp32 rows rounded to a
// 16- or 32-bit dtype, vectorized for AVX2 (+ F16C for the 8-bit floats) with x86-64 baseline
// fallbacks picked at load time.
#pragma once

#include <cstdint>
#include <cstring>

#include "dtype_convert.hpp"

namespace tilelab::detail {

void widen_bf16(const std::uint16_t* src, std::int64_t count, float* dst);
void widen_f16(const std::uint16_t* src, std::int64_t count, float* dst);
void widen_f8e4m3fn(const std::uint8_t* src, std::int64_t count, float* dst);
void widen_f8e5m2(const std::uint8_t* src, std::int64_t count, float* dst);

template <DType dtype>
void widen_contiguous(const typename ElementTraits<dtype>::Storage* src, std::int64_t count,
                      float* dst) {
  if constexpr (dtype == DType::f32) {
    std::memcpy(dst, src, count * sizeof(float));
  } else if constexpr (dtype == DType::bf16) {
    widen_bf16(src, count, dst);
  } else if constexpr (dtype == DType::f16) {
    widen_f16(src, count, dst);
  } else if constexpr (dtype == DType::f8e4m3fn) {
    widen_f8e4m3fn(src, count, dst);
  } else {
    static_assert(dtype == DType::f8e5m2);
    widen_f8e5m2(src, count, dst);
  }
}

// dst[d] = scale · src[d] rounded to bf16 (nearest even) or kept fp32, for d < count.
void scale_to_bf16(const float* src, std::int64_t count, float scale, std::uint16_t* dst);
void scale_to_f32(const float* src, std::int64_t count, float scale, float* dst);

}  // namespace tilelab::detail
