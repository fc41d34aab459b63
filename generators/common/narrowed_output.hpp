// Outputs narrowed from fp32 to the caller's element type, shared by the attention generators.
#pragma once

#include <cstdint>

#include "Halide.h"
#include "tilelab/detail/fp32_classes.hpp"

namespace tilelab::generators {

// `value` (fp32) as `type`. Halide's fp16 emulation, on targets without F16C (the x86-64
// baseline), rounds NaN to inf: there a NaN is selected from the bits instead (fast-math would
// fold a float comparison with NaN away). Elsewhere, and for other types, a plain cast.
inline Halide::Expr narrowed_output(const Halide::Type& type, const Halide::Expr& value,
                                    const Halide::Target& target) {
  using namespace Halide;
  if (type != Float(16) || target.has_feature(Target::F16C)) return cast(type, value);
  constexpr std::uint16_t kFp16QuietNanBits = 0x7e00;
  Expr bits = select(detail::fp32_bits_is_nan(reinterpret<uint32_t>(value)),
                     Expr(kFp16QuietNanBits), reinterpret<uint16_t>(cast(Float(16), value)));
  return reinterpret(Float(16), bits);
}

}  // namespace tilelab::generators
