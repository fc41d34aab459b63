// fp32 -> bf16 rounding, written once for the runtime's conversions, the simulator's functional
// model and the generated kernels (which instantiate it with Halide::Expr). Plain C++.
#pragma once

#include <cstdint>

namespace tilelab::detail {

// Rounds the bits of an fp32 to the nearest bf16, ties to even (what ml_dtypes, PyTorch and the
// tensor engines do), and returns them as fp32 bits with the low 16 bits zero. A NaN stays a
// quiet NaN with its sign: rounding its payload could otherwise carry it into an infinity.
// `select(condition, a, b)` picks a where condition holds (a ternary, or Halide::select).
template <typename U32, typename Select>
U32 round_fp32_bits_to_bf16(const U32& bits, const Select& select) {
  const U32 upper = U32(0xffff0000u);
  const U32 rounded = (bits + (U32(0x7fffu) + ((bits >> 16) & U32(1u)))) & upper;
  const U32 quiet_nan = (bits | U32(0x00400000u)) & upper;
  return select((bits & U32(0x7fffffffu)) > U32(0x7f800000u), quiet_nan, rounded);
}

inline std::uint32_t round_fp32_bits_to_bf16(std::uint32_t bits) {
  return round_fp32_bits_to_bf16(
      bits, [](bool is_nan, std::uint32_t a, std::uint32_t b) { return is_nan ? a : b; });
}

}  // namespace tilelab::detail
