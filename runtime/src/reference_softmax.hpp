// Online-softmax pieces shared by the CPU implementations (dense and block-sparse references, the
// paged kernel): a NaN-propagating max, in-place vector exp and soft-capping (SLEEF; the paged
// kernel's exp on AVX-512 is a polynomial fused with the block sum), the merge of one block of a
// row's scores (or of a partial state) into the row's running state, and the normalization of a
// finished row.
#pragma once

#include <immintrin.h>
#include <sleef.h>

#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>

#include "cpu_features.hpp"
#include "tilelab/detail/exp_nonpositive.hpp"

namespace tilelab::detail {

// max that returns NaN when either argument is NaN (std::max returns its first argument then).
inline float nan_propagating_max(float a, float b) {
  return std::isnan(b) || b > a ? b : a;
}

// The nan_propagating_max of s[0, count) (-inf when count is 0): lane maxima and a separate NaN
// test in SSE (x86-64's baseline; the compiler leaves the scalar form's NaN test unvectorized).
inline float block_max_of(const float* s, std::int64_t count) {
  const __m128 lowest = _mm_set1_ps(-std::numeric_limits<float>::infinity());
  __m128 max0 = lowest, max1 = lowest, nan = _mm_setzero_ps();
  std::int64_t j = 0;
  for (; j + 8 <= count; j += 8) {
    const __m128 x0 = _mm_loadu_ps(s + j), x1 = _mm_loadu_ps(s + j + 4);
    max0 = _mm_max_ps(max0, x0);
    max1 = _mm_max_ps(max1, x1);
    nan = _mm_or_ps(nan, _mm_cmpunord_ps(x0, x1));
  }
  float lanes[8];
  _mm_storeu_ps(lanes, max0);
  _mm_storeu_ps(lanes + 4, max1);
  float result = -std::numeric_limits<float>::infinity();
  for (const float m : lanes) result = nan_propagating_max(result, m);
  if (_mm_movemask_ps(nan) != 0) return std::numeric_limits<float>::quiet_NaN();
  for (; j < count; ++j) result = nan_propagating_max(result, s[j]);
  return result;
}

// Σ s[0, count) in eight interleaved partial sums (vectorizes; the order is fixed, so the result
// does not vary from call to call).
inline float block_sum_of(const float* s, std::int64_t count) {
  constexpr int kLanes = 8;
  float lane_sum[kLanes] = {};
  std::int64_t j = 0;
  for (; j + kLanes <= count; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) lane_sum[l] += s[j + l];
  }
  float sum = ((lane_sum[0] + lane_sum[4]) + (lane_sum[1] + lane_sum[5])) +
              ((lane_sum[2] + lane_sum[6]) + (lane_sum[3] + lane_sum[7]));
  for (; j < count; ++j) sum += s[j];
  return sum;
}

// SLEEF's AVX2 and AVX-512 exp, declared here because sleef.h declares them only when the whole
// translation unit is compiled for AVX (AVX-512); only the functions below call them, after
// checking the CPU.
extern "C" __m256 Sleef_expf8_u10avx2(__m256);
extern "C" __m512 Sleef_expf16_u10avx512f(__m512);

// x[j] = exp(x[j] - shift) in 16 lanes of SLEEF's AVX-512 entry point (see exp_shifted_in_place).
__attribute__((target("avx512f"))) inline void exp_shifted_in_place_avx512(float* x,
                                                                           std::int64_t count,
                                                                           float shift) {
  const __m512 by = _mm512_set1_ps(shift);
  std::int64_t j = 0;
  for (; j + 16 <= count; j += 16) {
    _mm512_storeu_ps(x + j, Sleef_expf16_u10avx512f(_mm512_sub_ps(_mm512_loadu_ps(x + j), by)));
  }
  if (j < count) {
    const auto lanes = static_cast<__mmask16>((1u << (count - j)) - 1u);
    _mm512_mask_storeu_ps(
        x + j, lanes,
        Sleef_expf16_u10avx512f(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, x + j), by)));
  }
}

// 8 lanes of SLEEF's AVX2 entry point, for CPUs that have AVX2 and FMA (see exp_shifted_in_place).
__attribute__((target("avx2,fma"))) inline void exp_shifted_in_place_avx2(float* x,
                                                                          std::int64_t count,
                                                                          float shift) {
  const __m256 by = _mm256_set1_ps(shift);
  std::int64_t j = 0;
  for (; j + 8 <= count; j += 8) {
    _mm256_storeu_ps(x + j, Sleef_expf8_u10avx2(_mm256_sub_ps(_mm256_loadu_ps(x + j), by)));
  }
  for (; j < count; ++j) x[j] = Sleef_expf_u10(x[j] - shift);
}

// x[j] = exp(x[j] - shift) for j < count (the difference rounded to fp32 first): the softmax's
// hot transcendental. 16 lanes where the CPU has AVX-512, 8 where it has AVX2 and FMA, else the
// 4-lane SLEEF entry point (SSE2 is the x86-64 baseline; SLEEF dispatches to SSE4 when present).
// All are SLEEF's 1-ulp exp.
inline void exp_shifted_in_place(float* x, std::int64_t count, float shift) {
  static const bool avx512 = cpu_runs_avx512();
  static const bool avx2 = cpu_runs_avx2();
  if (avx512) {
    exp_shifted_in_place_avx512(x, count, shift);
    return;
  }
  if (avx2) {
    exp_shifted_in_place_avx2(x, count, shift);
    return;
  }
  const __m128 by = _mm_set1_ps(shift);
  std::int64_t j = 0;
  for (; j + 4 <= count; j += 4) {
    _mm_storeu_ps(x + j, Sleef_expf4_u10(_mm_sub_ps(_mm_loadu_ps(x + j), by)));
  }
  for (; j < count; ++j) x[j] = Sleef_expf_u10(x[j] - shift);
}

// GCC 12's AVX-512 headers trip -Wuninitialized in their own masked intrinsics (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// e^x for x <= 0 in 16 lanes, as tilelab/detail/exp_nonpositive.hpp computes it (the degree-6
// polynomial: 1.23 ulp, against SLEEF's 1): 0 below -87 (and for -inf), where e^x is below
// 1.7e-38, next to fp32's smallest normal; NaN for NaN.
__attribute__((target("avx512f"))) inline __m512 exp_nonpositive_avx512(__m512 x) {
  using E = ExpNonpositive;
  const __m512i n = _mm512_cvttps_epi32(_mm512_mul_ps(x, _mm512_set1_ps(E::kLog2E)));
  const __m512 whole = _mm512_cvtepi32_ps(n);
  __m512 r = _mm512_fnmadd_ps(whole, _mm512_set1_ps(E::kLn2High), x);
  r = _mm512_fnmadd_ps(whole, _mm512_set1_ps(E::kLn2Low), r);
  __m512 p = _mm512_set1_ps(E::kDegree6[0]);
  for (std::size_t i = 1; i < std::size(E::kDegree6); ++i) {
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(E::kDegree6[i]));
  }
  const __m512 e =
      _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), _mm512_slli_epi32(n, 23)));
  // x >= -87 is false for NaN: keep x there (a NaN), else 0 below -87.
  const __mmask16 in_range = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_mask_mov_ps(_mm512_maskz_mov_ps(in_range, e), nan, x);
}

// e^x for one x <= 0 (exp_nonpositive_avx512 in lane 0): 0 below -87 and for -inf, NaN for NaN.
__attribute__((target("avx512f"))) inline float exp_nonpositive_one_avx512(float x) {
  return _mm512_cvtss_f32(exp_nonpositive_avx512(_mm512_set1_ps(x)));
}

// s[j] = exp(s[j] - shift) for j < count, returning their sum (16 partial sums, then a fixed
// tree: the same order on every call).
__attribute__((target("avx512f"))) inline float exp_shifted_sum_avx512(float* s, std::int64_t count,
                                                                       float shift) {
  const __m512 by = _mm512_set1_ps(shift);
  __m512 sum = _mm512_setzero_ps();
  std::int64_t j = 0;
  for (; j + 16 <= count; j += 16) {
    const __m512 e = exp_nonpositive_avx512(_mm512_sub_ps(_mm512_loadu_ps(s + j), by));
    _mm512_storeu_ps(s + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (j < count) {
    const auto lanes = static_cast<__mmask16>((1u << (count - j)) - 1u);
    const __m512 e = exp_nonpositive_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, s + j), by));
    _mm512_mask_storeu_ps(s + j, lanes, e);
    sum = _mm512_mask_add_ps(sum, lanes, sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

#pragma GCC diagnostic pop

// Which exp softmax_block_update runs: SLEEF's (1 ulp), or, where the CPU has AVX-512,
// exp_nonpositive_avx512, fused with the block's sum, for the probabilities and for the row's
// correction (SLEEF elsewhere). The paged kernel takes the second: SLEEF's exp and the separate
// sum took about 7% of its decode with the cache in L2, and SLEEF's scalar exp for the correction
// another 2% of fp8 decode (Zen 4).
enum class SoftmaxExp { sleef, polynomial_on_avx512 };

// Turns one block of a row's scores s[0, visible) into probabilities relative to the row's new
// running max, updating the row's (max, sum); returns the factor the row's accumulator must be
// multiplied by before the block's p·v is added. block_max is the scores' nan_propagating_max and
// not -inf (a block whose scores are all -inf contributes nothing: skip it, exp(-inf - -inf) would
// be NaN). NaN or +inf among the scores makes s - new_max NaN for that key, and so the row's sum
// and output.
inline float softmax_block_update(float* s, std::int64_t visible, float block_max, float& row_max,
                                  float& row_sum, SoftmaxExp kind = SoftmaxExp::sleef) {
  static const bool avx512 = cpu_runs_avx512();
  const float new_max = nan_propagating_max(row_max, block_max);
  float correction, block_sum;  // correction: 0 on the first block
  if (kind == SoftmaxExp::polynomial_on_avx512 && avx512) {
    correction = exp_nonpositive_one_avx512(row_max - new_max);
    block_sum = exp_shifted_sum_avx512(s, visible, new_max);
  } else {
    correction = Sleef_expf_u10(row_max - new_max);
    exp_shifted_in_place(s, visible, new_max);
    block_sum = block_sum_of(s, visible);
  }
  row_sum = row_sum * correction + block_sum;
  row_max = new_max;
  return correction;
}

// Merges one block of a row's scores s[0, visible) into the row's running (max, sum, acc[0,
// head_dim)) (softmax_block_update, then acc = acc · correction + p·v); `values` holds the block's
// V rows, head_dim apart. Overwrites s with the unnormalized probabilities.
inline void merge_block_into_row(float* s, std::int64_t visible, float block_max,
                                 const float* values, std::int64_t head_dim, float& row_max,
                                 float& row_sum, float* acc_row) {
  const float correction = softmax_block_update(s, visible, block_max, row_max, row_sum);
  for (std::int64_t d = 0; d < head_dim; ++d) acc_row[d] *= correction;
  for (std::int64_t j = 0; j < visible; ++j) {
    const float p = s[j];
    const float* v_row = &values[j * head_dim];
    for (std::int64_t d = 0; d < head_dim; ++d) acc_row[d] += p * v_row[d];
  }
}

// x[j] = cap · tanh(x[j] / cap) for j < count: logit soft-capping (SLEEF, 4 lanes).
inline void softcap_in_place(float* x, std::int64_t count, float cap) {
  const float inverse_cap = 1.0f / cap;
  std::int64_t j = 0;
  const __m128 cap4 = _mm_set1_ps(cap), inverse4 = _mm_set1_ps(inverse_cap);
  for (; j + 4 <= count; j += 4) {
    const __m128 t = Sleef_tanhf4_u10(_mm_mul_ps(_mm_loadu_ps(x + j), inverse4));
    _mm_storeu_ps(x + j, _mm_mul_ps(t, cap4));
  }
  for (; j < count; ++j) x[j] = cap * Sleef_tanhf_u10(x[j] * inverse_cap);
}

// Folds a partial softmax state (max, sum, acc[0, head_dim)) of some of a row's keys into the
// row's running state, as merge_block_into_row folds raw scores: the part with the smaller max is
// rescaled. A part whose max is -inf holds no contribution (its sum and acc are 0) and is skipped,
// since exp(-inf - -inf) would be NaN; NaN maxima propagate.
inline void merge_partial_into_row(float part_max, float part_sum, const float* part_acc,
                                   std::int64_t head_dim, float& row_max, float& row_sum,
                                   float* acc_row) {
  if (part_max == -std::numeric_limits<float>::infinity()) return;
  const float new_max = nan_propagating_max(row_max, part_max);
  const float row_correction = Sleef_expf_u10(row_max - new_max);  // 0 when the row was empty
  const float part_correction = Sleef_expf_u10(part_max - new_max);
  row_sum = row_sum * row_correction + part_sum * part_correction;
  row_max = new_max;
  for (std::int64_t d = 0; d < head_dim; ++d) {
    acc_row[d] = acc_row[d] * row_correction + part_acc[d] * part_correction;
  }
}

// What a finished row's accumulator is multiplied by: 1 / row_sum, or 0 for a row no key
// contributed to (fully masked: out 0), or NaN for a row whose contributing scores were all -inf
// (row_sum 0: the softmax of only -inf). A NaN row_sum stays NaN.
inline float inverse_row_sum(bool any_key_counted, float row_sum) {
  if (!any_key_counted) return 0.0f;
  return row_sum == 0.0f ? std::numeric_limits<float>::quiet_NaN() : 1.0f / row_sum;
}

}  // namespace tilelab::detail
