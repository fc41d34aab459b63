// Classes of fp32 values read from their bits: for code compiled with fast-math flags (the
// generated kernels: Halide assumes no NaN and no inf, so float comparisons with them fold away,
// while integer comparisons of the bits stay). Plain C++, instantiated with Halide::Expr (bits from
// reinterpret<uint32_t>) or std::uint32_t.
#pragma once

#include <cstdint>

namespace tilelab::detail {

inline constexpr std::uint32_t kFp32PlusInfinityBits = 0x7f800000u;
inline constexpr std::uint32_t kFp32MinusInfinityBits = 0xff800000u;
inline constexpr std::uint32_t kFp32QuietNanBits = 0x7fc00000u;

// NaN of either sign: exponent all ones, mantissa nonzero.
template <typename U32>
auto fp32_bits_is_nan(const U32& bits) {
  return (bits & U32(0x7fffffffu)) > U32(kFp32PlusInfinityBits);
}

// Neither NaN nor ±inf: exponent not all ones.
template <typename U32>
auto fp32_bits_is_finite(const U32& bits) {
  return (bits & U32(kFp32PlusInfinityBits)) != U32(kFp32PlusInfinityBits);
}

// +0 or -0.
template <typename U32>
auto fp32_bits_is_zero(const U32& bits) {
  return (bits & U32(0x7fffffffu)) == U32(0u);
}

}  // namespace tilelab::detail
