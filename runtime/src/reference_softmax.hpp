// Online-softmax pieces shared by the reference implementations (dense and block-sparse): a
// NaN-propagating max and an in-place vector exp (SLEEF).
#pragma once

#include <immintrin.h>
#include <sleef.h>

#include <cmath>
#include <cstdint>

namespace tilelab::detail {

// max that returns NaN when either argument is NaN (std::max returns its first argument then).
inline float nan_propagating_max(float a, float b) {
  return std::isnan(b) || b > a ? b : a;
}

// x[j] = exp(x[j]) for j < count. SSE2 is the x86-64 baseline, so the 4-lane SLEEF entry point is
// always available (SLEEF dispatches to SSE4 when present).
inline void exp_in_place(float* x, std::int64_t count) {
  std::int64_t j = 0;
  for (; j + 4 <= count; j += 4) _mm_storeu_ps(x + j, Sleef_expf4_u10(_mm_loadu_ps(x + j)));
  for (; j < count; ++j) x[j] = Sleef_expf_u10(x[j]);
}

}  // namespace tilelab::detail
