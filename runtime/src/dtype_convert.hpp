// Conversions between fp32 and the 16-bit storage types (bf16, f16), and per-dtype element traits.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <optional>

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

// The OCP 8-bit floats. Widening is exact and branch-free (vectorizes): the magnitude bits, moved
// to the top of an fp32's exponent field, read as a float 2^(127 - bias) too small, normals and
// subnormals alike; one multiply by that power of two restores it.
inline float f8e4m3fn_bits_to_float(std::uint8_t bits) {
  const std::uint32_t magnitude = bits & 0x7fu;
  const std::uint32_t value =
      std::bit_cast<std::uint32_t>(std::bit_cast<float>(magnitude << 20) * 0x1p120f);  // bias 7
  // S.1111.111 is NaN (there is no inf); a mask rather than a branch keeps loops vectorized.
  const std::uint32_t nan = 0u - static_cast<std::uint32_t>(magnitude == 0x7fu);
  return std::bit_cast<float>(((value & ~nan) | (0x7fc00000u & nan)) |
                              (static_cast<std::uint32_t>(bits & 0x80u) << 24));
}

inline float f8e5m2_bits_to_float(std::uint8_t bits) {
  const std::uint32_t magnitude = bits & 0x7fu;
  const std::uint32_t value =
      std::bit_cast<std::uint32_t>(std::bit_cast<float>(magnitude << 21) * 0x1p112f);  // bias 15
  // Exponent field all ones: inf (mantissa 0) or NaN, kept as such.
  const std::uint32_t special = 0u - static_cast<std::uint32_t>(magnitude >= 0x7cu);
  const std::uint32_t special_value = 0x7f800000u | ((magnitude & 0x3u) << 21);
  return std::bit_cast<float>(((value & ~special) | (special_value & special)) |
                              (static_cast<std::uint32_t>(bits & 0x80u) << 24));
}

// fp32 to an 8-bit float with `mantissa_bits` and exponent `bias`, rounded to nearest even. Finite
// values beyond `largest` saturate to ±largest (vLLM's SATFINITE cache writes); NaN gives
// `nan_bits`, ±inf gives `inf_bits` (with the sign) or, for a format without inf, `nan_bits`.
inline std::uint8_t float_to_f8_bits(float value, int mantissa_bits, int bias, float largest,
                                     std::uint8_t largest_bits, std::uint8_t nan_bits,
                                     std::optional<std::uint8_t> inf_bits) {
  const std::uint8_t sign = std::signbit(value) ? 0x80u : 0x00u;
  if (std::isnan(value)) return nan_bits;
  const float magnitude = std::fabs(value);
  if (std::isinf(magnitude))
    return inf_bits ? static_cast<std::uint8_t>(sign | *inf_bits) : nan_bits;
  const int min_exponent = 1 - bias;
  const int exponent =
      magnitude == 0.0f ? min_exponent : std::max(std::ilogb(magnitude), min_exponent);
  const float quantum = std::ldexp(1.0f, exponent - mantissa_bits);
  const float rounded = std::nearbyint(magnitude / quantum) * quantum;  // ties to even
  if (rounded > largest) return static_cast<std::uint8_t>(sign | largest_bits);
  if (rounded < std::ldexp(1.0f, min_exponent)) {  // subnormal or zero
    return static_cast<std::uint8_t>(
        sign |
        static_cast<std::uint32_t>(rounded / std::ldexp(1.0f, min_exponent - mantissa_bits)));
  }
  const int rounded_exponent = std::ilogb(rounded);
  const auto fraction = static_cast<std::uint32_t>((std::ldexp(rounded, -rounded_exponent) - 1.0f) *
                                                   static_cast<float>(1 << mantissa_bits));
  return static_cast<std::uint8_t>(
      sign | (static_cast<std::uint32_t>(rounded_exponent + bias) << mantissa_bits) | fraction);
}

inline std::uint8_t float_to_f8e4m3fn_bits(float value) {
  return float_to_f8_bits(value, 3, 7, 448.0f, 0x7e, 0x7f, std::nullopt);
}

inline std::uint8_t float_to_f8e5m2_bits(float value) {
  return float_to_f8_bits(value, 2, 15, 57344.0f, 0x7b, 0x7e, std::uint8_t{0x7c});
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
struct ElementTraits<DType::f8e4m3fn> {
  using Storage = std::uint8_t;
  static float to_float(Storage bits) { return f8e4m3fn_bits_to_float(bits); }
  static Storage from_float(float value) { return float_to_f8e4m3fn_bits(value); }
};

template <>
struct ElementTraits<DType::f8e5m2> {
  using Storage = std::uint8_t;
  static float to_float(Storage bits) { return f8e5m2_bits_to_float(bits); }
  static Storage from_float(float value) { return float_to_f8e5m2_bits(value); }
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
