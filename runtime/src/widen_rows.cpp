// The row conversions of widen_rows.hpp.
#include "widen_rows.hpp"

#include <immintrin.h>

#include "cpu_features.hpp"

namespace tilelab::detail {

namespace {

// Widening of contiguous cache rows to fp32, vectorized in both versions (bit operations only).
template <DType dtype>
void widen_elements(const typename ElementTraits<dtype>::Storage* src, std::int64_t count,
                    float* dst) {
  for (std::int64_t d = 0; d < count; ++d) dst[d] = ElementTraits<dtype>::to_float(src[d]);
}

// The 8-bit floats widen through fp16 on CPUs with F16C: 16 elements move through the integer
// unit as 16-bit lanes and vcvtph2ps makes fp32 of them, about half the instructions of the
// fp32-lane bit operations (which the compiler also spends zero-extensions on). Both are exact.
// e5m2 is the upper byte of an fp16 (inf and NaN included).
__attribute__((target("arch=x86-64-v3"))) void widen_f8e5m2_f16c(const std::uint8_t* src,
                                                                 std::int64_t count, float* dst) {
  std::int64_t d = 0;
  for (; d + 16 <= count; d += 16) {
    const __m256i halves = _mm256_slli_epi16(
        _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + d))), 8);
    _mm256_storeu_ps(dst + d, _mm256_cvtph_ps(_mm256_castsi256_si128(halves)));
    _mm256_storeu_ps(dst + d + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(halves, 1)));
  }
  for (; d < count; ++d) dst[d] = f8e5m2_bits_to_float(src[d]);
}

// e4m3fn's magnitude bits placed at the top of an fp16's exponent field read as the value times
// 2^(7 - 15), subnormals included (fp16's own subnormals hold them); the multiply by 2^8 is
// exact. The magnitude 0x7f (NaN; e4m3fn has no inf) becomes an fp16 NaN first.
__attribute__((target("arch=x86-64-v3"))) void widen_f8e4m3fn_f16c(const std::uint8_t* src,
                                                                   std::int64_t count, float* dst) {
  const __m256i magnitude_mask = _mm256_set1_epi16(0x7f);
  const __m256i sign_mask = _mm256_set1_epi16(0x80);
  const __m256i nan_bits = _mm256_set1_epi16(0x7e00);
  const __m256 rebias = _mm256_set1_ps(0x1p8f);
  std::int64_t d = 0;
  for (; d + 16 <= count; d += 16) {
    const __m256i bytes =
        _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + d)));
    const __m256i magnitude = _mm256_and_si256(bytes, magnitude_mask);
    const __m256i nan = _mm256_and_si256(_mm256_cmpeq_epi16(magnitude, magnitude_mask), nan_bits);
    const __m256i halves =
        _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi16(magnitude, 7), nan),
                        _mm256_slli_epi16(_mm256_and_si256(bytes, sign_mask), 8));
    _mm256_storeu_ps(dst + d,
                     _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(halves)), rebias));
    _mm256_storeu_ps(dst + d + 8,
                     _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(halves, 1)), rebias));
  }
  for (; d < count; ++d) dst[d] = f8e4m3fn_bits_to_float(src[d]);
}

}  // namespace

void widen_bf16(const std::uint16_t* src, std::int64_t count, float* dst) {
  auto widen = [&]() TILELAB_ALWAYS_INLINE { widen_elements<DType::bf16>(src, count, dst); };
  run_compiled_for_cpu(widen);
}
void widen_f16(const std::uint16_t* src, std::int64_t count, float* dst) {
  auto widen = [&]() TILELAB_ALWAYS_INLINE { widen_elements<DType::f16>(src, count, dst); };
  run_compiled_for_cpu(widen);
}
void widen_f8e4m3fn(const std::uint8_t* src, std::int64_t count, float* dst) {
  if (cpu_runs_avx2()) {
    widen_f8e4m3fn_f16c(src, count, dst);
  } else {
    widen_elements<DType::f8e4m3fn>(src, count, dst);
  }
}
void widen_f8e5m2(const std::uint8_t* src, std::int64_t count, float* dst) {
  if (cpu_runs_avx2()) {
    widen_f8e5m2_f16c(src, count, dst);
  } else {
    widen_elements<DType::f8e5m2>(src, count, dst);
  }
}

void scale_to_bf16(const float* src, std::int64_t count, float scale, std::uint16_t* dst) {
  run_compiled_for_cpu([&]() TILELAB_ALWAYS_INLINE {
    for (std::int64_t d = 0; d < count; ++d) dst[d] = float_to_bf16_bits(src[d] * scale);
  });
}

void scale_to_f32(const float* src, std::int64_t count, float scale, float* dst) {
  run_compiled_for_cpu([&]() TILELAB_ALWAYS_INLINE {
    for (std::int64_t d = 0; d < count; ++d) dst[d] = src[d] * scale;
  });
}

}  // namespace tilelab::detail
