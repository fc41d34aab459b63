// Conversions between fp32 and the 16-bit storage types (bf16, f16), and per-dtype element traits.
#pragma once

#include <bit>
#include <cstdint>

#include "tilelab/detail/bf16_rounding.hpp"
#include "tilelab/tensor.hpp"

namespace tilelab::detail {

// bf16 is the upper half of an fp32, so widening is a shift.
inline float bf16_bits_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

// Round to nearest, ties to even; NaN stays NaN (detail/bf16_rounding.hpp).
inline std::uint16_t float_to_bf16_bits(float value) {
  return static_cast<std::uint16_t>(round_fp32_bits_to_bf16(std::bit_cast<std::uint32_t>(value)) >>
                                    16);
}

// Widening is exact, done with bit operations (F. Giesen's half_to_float): libgcc's software
// conversion, used when F16C is not enabled at compile time, is a call per element.
inline float f16_bits_to_float(std::uint16_t bits) {
  constexpr std::uint32_t kShiftedExponent = 0x7c00u << 13;  // f16 exponent field, in fp32 place
  std::uint32_t magnitude = (bits & 0x7fffu) << 13;
  const std::uint32_t exponent = magnitude & kShiftedExponent;
  magnitude += (127u - 15u) << 23;  // rebias the exponent
  if (exponent == kShiftedExponent) {
    magnitude += (128u - 16u) << 23;  // Inf/NaN: exponent all ones
  } else if (exponent == 0) {
    // Subnormal: let the fp32 unit normalize it (value = (mantissa + 2^-14) - 2^-14).
    magnitude += 1u << 23;
    magnitude = std::bit_cast<std::uint32_t>(std::bit_cast<float>(magnitude) -
                                             std::bit_cast<float>(113u << 23));
  }
  return std::bit_cast<float>(magnitude | (static_cast<std::uint32_t>(bits & 0x8000u) << 16));
}

// Narrowing rounds to nearest even; GCC >= 12 has _Float16 on x86-64 (F16C when enabled,
// otherwise libgcc's correctly rounded software conversion).
inline std::uint16_t float_to_f16_bits(float value) {
  return std::bit_cast<std::uint16_t>(static_cast<_Float16>(value));
}

// Storage type and fp32 conversions for one element dtype, so kernels can be written once as a
// template over the dtype.
template <DType dtype>
struct ElementTraits;

template <>
struct ElementTraits<DType::f32> {
  using Storage = float;
  static float to_float(Storage value) { return value; }
  static Storage from_float(float value) { return value; }
};

template <>
struct ElementTraits<DType::bf16> {
  using Storage = std::uint16_t;
  static float to_float(Storage bits) { return bf16_bits_to_float(bits); }
  static Storage from_float(float value) { return float_to_bf16_bits(value); }
};

template <>
struct ElementTraits<DType::f16> {
  using Storage = std::uint16_t;
  static float to_float(Storage bits) { return f16_bits_to_float(bits); }
  static Storage from_float(float value) { return float_to_f16_bits(value); }
};

// Rounds `value` to `dtype` and back: the value a tensor of that dtype would hold.
inline float round_to_dtype(float value, DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return bf16_bits_to_float(float_to_bf16_bits(value));
    case DType::f16:
      return f16_bits_to_float(float_to_f16_bits(value));
    default:
      return value;
  }
}

}  // namespace tilelab::detail
