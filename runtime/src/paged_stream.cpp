// The streaming micro-kernels of the paged kernel (paged_stream.hpp): AVX-512, and AVX2 for CPUs
// without it.
//
// Everything between the target pragmas has internal linkage and uses intrinsics only, so no
// inline function shared with other translation units is ever emitted with AVX2 or AVX-512
// instructions.
// The entry points below the pragmas dispatch on the dtypes; callers check the CPU first.
#include "paged_stream.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "cpu_features.hpp"
#include "tilelab/error.hpp"

namespace tilelab::detail {

// The AVX-512 kernels run where cpu_runs_avx512(), the AVX2 kernels on the other CPUs that
// cpu_runs_avx2() (which every AVX-512 CPU does).
bool cpu_streams_cache_rows() {
  return cpu_runs_avx2();
}

std::int64_t streamed_acc_index(DType cache_dtype, StreamedProducts products, std::int64_t d,
                                std::int64_t head_dim) {
  if (products == StreamedProducts::bf16_dots) {
    if (cache_dtype == DType::bf16) {  // every 32: position 16·k + 4·l + m holds 8·l + 4·k + m
      const std::int64_t group = d / 32 * 32, e = d - group;
      return group + e % 8 / 4 * 16 + e / 8 * 4 + e % 4;
    }
    constexpr std::int64_t kPanel = 64;
    const std::int64_t panel = d / kPanel * kPanel, e = d - panel;
    if (head_dim - panel <= kPanel / 2) return d;  // a lone last group
    return panel + e % 16 / 4 * 16 + e / 16 * 4 + e % 4;
  }
  if (cache_dtype != DType::bf16) return d;
  // bf16 widens as the even and the odd elements of a vector's worth of 32-bit lanes.
  const std::int64_t group = cpu_runs_avx512() ? 32 : 16;
  return d / group * group + d % 2 * (group / 2) + d % group / 2;
}

namespace {

// Caches whose every element is a bf16 value (the 8-bit floats exactly): what vdpbf16ps can read.
constexpr bool holds_bf16_values(DType dtype) {
  return dtype == DType::bf16 || dtype == DType::f8e4m3fn || dtype == DType::f8e5m2;
}

// Calls f(std::integral_constant<int, n>{}) for a row tile of n = min(rows, kStreamedRowTile)
// rows, so that the tile's rows index registers.
template <typename F>
void with_tile_rows(std::int64_t rows, F&& f) {
  switch (std::min(rows, kStreamedRowTile)) {
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    default:
      return f(std::integral_constant<int, 1>{});
  }
}
static_assert(kStreamedRowTile == 4);

template <DType dtype>
constexpr std::int64_t element_bytes() {
  if constexpr (dtype == DType::f32) return 4;
  if constexpr (dtype == DType::bf16 || dtype == DType::f16) return 2;
  return 1;
}

// Prefetches as paged_stream.hpp describes, key by key (a distance of 0 prefetches nothing). Two
// distances: a block's rows at scattered addresses arrive in about the time of one block's
// products, so one block ahead into L1 alone leaves the memory idle between requests (measured
// on Zen 4, decode of 64 sequences with 16-key blocks: the L2 prefetch three blocks ahead made
// bf16 1.15-1.28x and fp8 1.1-1.23x faster, against 32 or 64 keys ahead within a few percent).
template <DType dtype>
class RowPrefetcher {
 public:
  RowPrefetcher(StreamedRows rows, std::int64_t distance, std::int64_t head_dim)
      : rows_(rows),
        distance_(distance),
        available_(rows.count + rows.lookahead),
        far_per_key_(rows.count > 0 ? (rows.far_count + rows.count - 1) / rows.count : 0),
        bytes_(head_dim * element_bytes<dtype>()) {}

  // Called for every key j in order.
  [[gnu::always_inline]] void ahead_of(std::int64_t j) {
    if (distance_ == 0) return;
    if (j + distance_ < available_) rows_near_.prefetch(rows_.rows[j + distance_], bytes_);
    if (rows_.run_ahead > 0 && j + rows_.run_ahead < available_) {
      rows_run_ahead_.prefetch(rows_.rows[j + rows_.run_ahead], bytes_);
    }
    // The far stream goes into L2 only (a second request at the near distance measured no faster
    // on Emerald Rapids, and costs instructions where scoring is compute-bound).
    const std::int64_t end = std::min(far_next_ + far_per_key_, rows_.far_count);
    for (; far_next_ < end; ++far_next_) {
      rows_far_.prefetch(rows_.far_rows[far_next_], bytes_);
      if (rows_.far_companion != nullptr) {
        companion_far_.prefetch(rows_.far_companion[far_next_], bytes_);
      }
    }
  }

 private:
  StreamedRows rows_;
  std::int64_t distance_, available_, far_per_key_, bytes_;
  std::int64_t far_next_ = 0;
  LineStream<_MM_HINT_T0> rows_near_;
  LineStream<_MM_HINT_T1> rows_far_, companion_far_, rows_run_ahead_;
};

}  // namespace

StreamedRows stream_far_ahead(const void* const* rows, const void* const* companion,
                              std::int64_t count, std::int64_t lookahead,
                              std::int64_t prefetch_distance, std::int64_t run_ahead) {
  const std::int64_t far = kStreamedL2Ahead * prefetch_distance;
  const std::int64_t far_count = std::clamp<std::int64_t>(count + lookahead - far, 0, count);
  return {rows,
          count,
          lookahead,
          far_count > 0 ? rows + far : nullptr,
          far_count > 0 && companion != nullptr ? companion + far : nullptr,
          far_count,
          run_ahead};
}

StreamedProducts streamed_products(DType query_dtype, DType cache_dtype, bool fp32_probabilities) {
  // The bf16 dot-product kernels are AVX-512 kernels.
  return rounds_bf16_probabilities(query_dtype, cache_dtype, fp32_probabilities) &&
                 holds_bf16_values(cache_dtype) && cpu_runs_avx512()
             ? StreamedProducts::bf16_dots
             : StreamedProducts::fp32;
}

// GCC 12's AVX-512 headers trip -Wuninitialized in their own masked intrinsics (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")

namespace {

constexpr std::int64_t kVector = 16;     // fp32 lanes
constexpr int kTile = kStreamedRowTile;  // rows of a q·k or p·v tile, and keys of a q·k tile

// bf16 rows accumulate in even/odd order within each 32-element group (streamed_acc_index).
template <DType dtype>
constexpr bool kEvenOddRows = dtype == DType::bf16;

// The lanes of a vector of 8 · sizeof(Mask) elements starting `remaining` elements before the
// row's end.
template <typename Mask = __mmask16>
Mask lanes(std::int64_t remaining) {
  constexpr std::int64_t kLanes = 8 * sizeof(Mask);
  if (remaining >= kLanes) return static_cast<Mask>(~Mask{0});
  if (remaining <= 0) return 0;
  return static_cast<Mask>((std::uint64_t{1} << remaining) - 1);
}

// 16 elements of 16 bits from p; `masked`: lanes outside `mask` are zero and their memory is not
// read.
template <bool masked>
[[gnu::always_inline]] inline __m256i load16x16(const void* p, __mmask16 mask) {
  if constexpr (masked) return _mm256_maskz_loadu_epi16(mask, p);
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
// The bf16 bits of every fp8 magnitude (0 to 127): exact, since every fp8 value is a bf16 value.
// NaN encodings give a quiet NaN.
struct Fp8MagnitudeTable {
  std::uint16_t bits[128];
};

// The bf16 bits of mantissa · 2^exponent for a mantissa with `mantissa_bits` fraction bits below
// its leading one (a subnormal one is normalized).
constexpr std::uint16_t bf16_bits(int mantissa, int mantissa_bits, int exponent) {
  if (mantissa == 0) return 0;
  int leading = mantissa_bits;  // position of the leading one
  while ((mantissa >> leading) == 0) --leading;
  const int fraction = (mantissa - (1 << leading)) << (7 - leading);
  return static_cast<std::uint16_t>(((exponent + leading - mantissa_bits + 127) << 7) | fraction);
}

template <DType dtype>
constexpr Fp8MagnitudeTable fp8_magnitude_table() {
  Fp8MagnitudeTable table{};
  for (int m = 0; m < 128; ++m) {
    if constexpr (dtype == DType::f8e4m3fn) {  // bias 7, 3 fraction bits; S.1111.111 is NaN
      const int exponent_field = m >> 3, fraction = m & 7;
      table.bits[m] = m == 0x7f             ? std::uint16_t{0x7fc0}
                      : exponent_field == 0 ? bf16_bits(fraction, 3, -6)
                                            : bf16_bits(8 | fraction, 3, exponent_field - 7);
    } else {  // e5m2: bias 15, 2 fraction bits; all-ones exponent: inf and NaN
      const int exponent_field = m >> 2, fraction = m & 3;
      table.bits[m] = exponent_field == 31
                          ? static_cast<std::uint16_t>(fraction == 0 ? 0x7f80 : 0x7fc0)
                      : exponent_field == 0 ? bf16_bits(fraction, 2, -14)
                                            : bf16_bits(4 | fraction, 2, exponent_field - 15);
    }
  }
  return table;
}

// 32 fp8 values as bf16 bits: the magnitude through a 128-entry table (two vpermi2w lookups of 64
// entries and a blend), then the sign.
template <DType dtype>
[[gnu::always_inline]] inline __m512i fp8_to_bf16_bits(__m256i bytes) {
  static constexpr Fp8MagnitudeTable kTable = fp8_magnitude_table<dtype>();
  const __m512i x = _mm512_cvtepu8_epi16(bytes);
  const __m512i low = _mm512_permutex2var_epi16(_mm512_loadu_si512(kTable.bits), x,
                                                _mm512_loadu_si512(kTable.bits + 32));
  const __m512i high = _mm512_permutex2var_epi16(_mm512_loadu_si512(kTable.bits + 64), x,
                                                 _mm512_loadu_si512(kTable.bits + 96));
  const __mmask32 upper = _mm512_test_epi16_mask(x, _mm512_set1_epi16(0x40));
  const __m512i magnitude = _mm512_mask_blend_epi16(upper, low, high);
  // magnitude | (x << 8 & 0x8000)
  return _mm512_ternarylogic_epi32(magnitude, _mm512_slli_epi16(x, 8),
                                   _mm512_set1_epi16(static_cast<short>(0x8000)), 0xf8);
}

// Caches widened 32 elements per load: fp8 through the table, bf16 as the even and the odd
// elements (the low halves of its 32-bit lanes shifted up, and the high halves: one instruction
// each).
template <DType dtype>
constexpr bool kWidensIn32s = holds_bf16_values(dtype);

// The 32 cache elements at `element` widened to fp32 as two vectors: elements 0-15 and 16-31 for
// fp8, the even and the odd ones for bf16 (the order streamed_acc_index keeps); `masked`: lanes
// outside `mask` are zero and their memory is not read.
template <DType dtype, bool masked>
[[gnu::always_inline]] inline void widen32(const void* element, __mmask32 mask, __m512& first,
                                           __m512& second) {
  if constexpr (dtype == DType::bf16) {
    const __m512i bits =
        masked ? _mm512_maskz_loadu_epi16(mask, element) : _mm512_loadu_si512(element);
    first = _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
    second = _mm512_castsi512_ps(
        _mm512_and_si512(bits, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  } else {
    const __m256i bytes = masked ? _mm256_maskz_loadu_epi8(mask, element)
                                 : _mm256_loadu_si256(static_cast<const __m256i*>(element));
    const __m512i bf16 = fp8_to_bf16_bits<dtype>(bytes);
    first = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(bf16)), 16));
    second = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(bf16, 1)), 16));
  }
}

// The 16 cache elements at `element` widened to fp32, in order (fp32, bf16, f16); `masked`: lanes
// outside `mask` are zero and their memory is not read.
template <DType dtype, bool masked>
[[gnu::always_inline]] inline __m512 widen16(const void* element, __mmask16 mask) {
  if constexpr (dtype == DType::f32) {
    const auto* p = static_cast<const float*>(element);
    if constexpr (masked) return _mm512_maskz_loadu_ps(mask, p);
    return _mm512_loadu_ps(p);
  } else if constexpr (dtype == DType::bf16) {
    // bf16 is the upper half of an fp32.
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(load16x16<masked>(element, mask)), 16));
  } else {
    static_assert(dtype == DType::f16);
    return _mm512_cvtph_ps(load16x16<masked>(element, mask));
  }
}

// [x0+x2, x1+x3, y0+y2, y1+y3] of the 128-bit blocks of x and y.
[[gnu::always_inline]] inline __m512 fold_halves(__m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xee));
}
// [x0+x1, x2+x3, y0+y1, y2+y3] of the 128-bit blocks of x and y.
[[gnu::always_inline]] inline __m512 fold_pairs(__m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x88), _mm512_shuffle_f32x4(x, y, 0xdd));
}

// Four rows' dot products with one key, accumulated over the head dim (16 partial sums each).
struct KeyColumn {
  __m512 r0, r1, r2, r3;
};

// Row r's four 128-bit blocks of partial sums folded into block r of one vector.
[[gnu::always_inline]] inline __m512 fold_rows(const KeyColumn& c) {
  return fold_pairs(fold_halves(c.r0, c.r1), fold_halves(c.r2, c.r3));
}

// scores[r * score_stride + t] = scale · q[r]·k[t] for four rows r and four keys t, from each
// key's fold_rows: block r of key t's vector holds four partial sums of q[r]·k[t]. Two
// transpose-and-add steps finish the sums with row r's four keys in block r.
[[gnu::always_inline]] inline void store_tile_sums(__m512 key0, __m512 key1, __m512 key2,
                                                   __m512 key3, float scale, float* scores,
                                                   std::int64_t score_stride) {
  const __m512 keys01 =
      _mm512_add_ps(_mm512_unpacklo_ps(key0, key1), _mm512_unpackhi_ps(key0, key1));
  const __m512 keys23 =
      _mm512_add_ps(_mm512_unpacklo_ps(key2, key3), _mm512_unpackhi_ps(key2, key3));
  const __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(keys01), _mm512_castps_pd(keys23));
  const __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(keys01), _mm512_castps_pd(keys23));
  const __m512 sums = _mm512_mul_ps(_mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi)),
                                    _mm512_set1_ps(scale));
  _mm_storeu_ps(scores, _mm512_castps512_ps128(sums));
  _mm_storeu_ps(scores + score_stride, _mm512_extractf32x4_ps(sums, 1));
  _mm_storeu_ps(scores + 2 * score_stride, _mm512_extractf32x4_ps(sums, 2));
  _mm_storeu_ps(scores + 3 * score_stride, _mm512_extractf32x4_ps(sums, 3));
}

// Four q rows' dot products with four keys, accumulated over the head dim (16 partial sums
// each): sums[t] is key t's column.
using KeyTile = KeyColumn[kTile];

// Four q rows against four keys, the keys' rows read front to back together (sequential reads are
// what the hardware prefetcher follows). The 16 independent sums keep both FMA ports busy, and
// each widened key vector and each q vector is used four times. The q rows are in the order the
// widening keeps (bf16: even and odd elements of each 32-element group).
template <DType dtype>
[[gnu::always_inline]] inline void score_four_keys(const float* q, std::int64_t q_stride,
                                                   const char* const (&keys)[kTile],
                                                   std::int64_t head_dim, KeyTile& sums) {
  const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int t = 0; t < kTile; ++t) sums[t] = KeyColumn{zero, zero, zero, zero};
  // k[t] holds q-ordered elements d to d + 16 of key t; the q rows are zero past head_dim.
  const auto multiply_add = [&](std::int64_t d, const __m512(&k)[kTile]) {
    const __m512 q0 = _mm512_loadu_ps(q + d), q1 = _mm512_loadu_ps(q + q_stride + d);
    const __m512 q2 = _mm512_loadu_ps(q + 2 * q_stride + d);
    const __m512 q3 = _mm512_loadu_ps(q + 3 * q_stride + d);
#pragma GCC unroll 4
    for (int t = 0; t < kTile; ++t) {
      sums[t].r0 = _mm512_fmadd_ps(q0, k[t], sums[t].r0);
      sums[t].r1 = _mm512_fmadd_ps(q1, k[t], sums[t].r1);
      sums[t].r2 = _mm512_fmadd_ps(q2, k[t], sums[t].r2);
      sums[t].r3 = _mm512_fmadd_ps(q3, k[t], sums[t].r3);
    }
  };
  if constexpr (kWidensIn32s<dtype>) {
    const auto step = [&](std::int64_t d, auto masked, __mmask32 mask) {
      __m512 first[kTile], second[kTile];
#pragma GCC unroll 4
      for (int t = 0; t < kTile; ++t) {
        widen32<dtype, masked.value>(keys[t] + d * element_bytes<dtype>(), mask, first[t],
                                     second[t]);
      }
      multiply_add(d, first);
      multiply_add(d + kVector, second);
    };
    std::int64_t d = 0;
    for (; d + 2 * kVector <= head_dim; d += 2 * kVector) step(d, std::false_type{}, 0);
    if (d < head_dim) step(d, std::true_type{}, lanes<__mmask32>(head_dim - d));
  } else {
    const auto step = [&](std::int64_t d, auto masked, __mmask16 mask) {
      __m512 k[kTile];
#pragma GCC unroll 4
      for (int t = 0; t < kTile; ++t) {
        k[t] = widen16<dtype, masked.value>(keys[t] + d * element_bytes<dtype>(), mask);
      }
      multiply_add(d, k);
    };
    std::int64_t d = 0;
    for (; d + kVector <= head_dim; d += kVector) step(d, std::false_type{}, 0);
    if (d < head_dim) step(d, std::true_type{}, lanes(head_dim - d));
  }
}

// The scores of four rows against every key, four keys at a time. `per_key`: score(key) gives one
// key's fold_rows; otherwise score(keys, folded) gives the four keys' at once. The first row tile
// (`prefetch`) also prefetches ahead, key by key just before each key's work (per key) or before
// the tile's (measured fastest for each on Intel Emerald Rapids, with the cache in L2).
template <DType dtype, bool per_key, typename Score>
[[gnu::always_inline]] inline void score_tiles_of_keys(StreamedRows keys, std::int64_t head_dim,
                                                       float scale, float* scores,
                                                       std::int64_t score_stride,
                                                       std::int64_t prefetch_distance,
                                                       Score&& score) {
  RowPrefetcher<dtype> prefetcher(keys, prefetch_distance, head_dim);
  for (std::int64_t j = 0; j < keys.count; j += kTile) {
    // Past the last key the tile repeats it; those columns are padding.
    const auto key = [&](int t) {
      return static_cast<const char*>(keys.rows[j + t < keys.count ? j + t : keys.count - 1]);
    };
    __m512 folded[kTile];
    if constexpr (per_key) {
      // Unrolled, so that folded stays in registers and the four keys' chains interleave (decode
      // with fp8 and bf16 caches 1.06x faster, measured on Zen 4 with the cache in L3).
#pragma GCC unroll 4
      for (int t = 0; t < kTile; ++t) {
        prefetcher.ahead_of(j + t);
        folded[t] = score(key(t));
      }
    } else {
      const char* tile_keys[kTile];
#pragma GCC unroll 4
      for (int t = 0; t < kTile; ++t) {
        tile_keys[t] = key(t);
        prefetcher.ahead_of(j + t);
      }
      score(tile_keys, folded);
    }
    store_tile_sums(folded[0], folded[1], folded[2], folded[3], scale, scores + j, score_stride);
  }
}

// q rows in the order widen32 keeps for bf16: each 32-element group's even elements, then its
// odd ones.
void to_even_odd_order(const float* q, std::int64_t rows, std::int64_t q_stride, std::int64_t width,
                       float* out) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t d = 0; d < width; d += 2 * kVector) {
      const __m512 a = _mm512_loadu_ps(q + r * q_stride + d);
      const __m512 b = _mm512_loadu_ps(q + r * q_stride + d + kVector);
      _mm512_storeu_ps(out + r * width + d, _mm512_permutex2var_ps(a, even, b));
      _mm512_storeu_ps(out + r * width + d + kVector, _mm512_permutex2var_ps(a, odd, b));
    }
  }
}

template <DType dtype>
void scores_of(const float* q, std::int64_t rows, std::int64_t q_stride, StreamedRows keys,
               std::int64_t head_dim, float scale, float* scores, std::int64_t score_stride,
               std::int64_t prefetch_distance) {
  // bf16 keys widen into even/odd order: the q rows are reordered to match, per row tile.
  alignas(64) float reordered[kTile * kMaxStreamedHeadDim];
  const std::int64_t reordered_stride = (head_dim + 2 * kVector - 1) / (2 * kVector) * 2 * kVector;
  for (std::int64_t r = 0; r < rows; r += kTile) {
    const float* q_tile = q + r * q_stride;
    std::int64_t tile_stride = q_stride;
    if constexpr (kEvenOddRows<dtype>) {
      to_even_odd_order(q_tile, kTile, q_stride, reordered_stride, reordered);
      q_tile = reordered;
      tile_stride = reordered_stride;
    }
    score_tiles_of_keys<dtype, false>(
        keys, head_dim, scale, scores + r * score_stride, score_stride,
        r == 0 ? prefetch_distance : 0,
        [&](const char* const(&tile_keys)[kTile], __m512(&folded)[kTile]) {
          KeyTile sums;
          score_four_keys<dtype>(q_tile, tile_stride, tile_keys, head_dim, sums);
#pragma GCC unroll 4
          for (int t = 0; t < kTile; ++t) folded[t] = fold_rows(sums[t]);
        });
  }
}

// One row's accumulators over a panel of kPanelVectors vectors (64 elements) of the head dim.
constexpr int kPanelVectors = 4;
struct Panel {
  __m512 v0, v1, v2, v3;
};

// A panel whose vector v is vector(v).
template <typename Vector>
[[gnu::always_inline]] inline Panel make_panel(Vector&& vector) {
  return Panel{vector(0), vector(1), vector(2), vector(3)};
}

[[gnu::always_inline]] inline Panel load_panel(const float* acc, const __mmask16* mask,
                                               float correction) {
  const __m512 c = _mm512_set1_ps(correction);
  return make_panel(
      [&](int v) { return _mm512_mul_ps(_mm512_maskz_loadu_ps(mask[v], acc + v * kVector), c); });
}

[[gnu::always_inline]] inline void store_panel(float* acc, const __mmask16* mask,
                                               const Panel& panel) {
  _mm512_mask_storeu_ps(acc, mask[0], panel.v0);
  _mm512_mask_storeu_ps(acc + kVector, mask[1], panel.v1);
  _mm512_mask_storeu_ps(acc + 2 * kVector, mask[2], panel.v2);
  _mm512_mask_storeu_ps(acc + 3 * kVector, mask[3], panel.v3);
}

// The panel's elements of a cache row (from element d on) widened to fp32.
template <DType dtype, bool masked>
[[gnu::always_inline]] inline Panel widen_panel(const void* row, std::int64_t d,
                                                const __mmask16* mask) {
  const char* base = static_cast<const char*>(row) + d * element_bytes<dtype>();
  if constexpr (kWidensIn32s<dtype>) {
    Panel panel;
    const auto pair = [&](int v, __m512& first, __m512& second) {
      const auto mask32 = static_cast<__mmask32>(mask[v] | (std::uint32_t{mask[v + 1]} << 16));
      widen32<dtype, masked>(base + v * kVector * element_bytes<dtype>(), mask32, first, second);
    };
    pair(0, panel.v0, panel.v1);
    pair(2, panel.v2, panel.v3);
    return panel;
  } else {
    return make_panel([&](int v) {
      return widen16<dtype, masked>(base + v * kVector * element_bytes<dtype>(), mask[v]);
    });
  }
}

[[gnu::always_inline]] inline void add_to_panel(Panel& acc, float p, const Panel& v) {
  const __m512 pv = _mm512_set1_ps(p);
  acc.v0 = _mm512_fmadd_ps(pv, v.v0, acc.v0);
  acc.v1 = _mm512_fmadd_ps(pv, v.v1, acc.v1);
  acc.v2 = _mm512_fmadd_ps(pv, v.v2, acc.v2);
  acc.v3 = _mm512_fmadd_ps(pv, v.v3, acc.v3);
}

// `tile_rows` rows of the p·v update, one panel of the head dim at a time.
template <DType dtype, int tile_rows>
void value_tile(const float* p, std::int64_t p_stride, StreamedRows values, std::int64_t head_dim,
                const float* correction, float* acc, std::int64_t acc_stride,
                std::int64_t prefetch_distance) {
  static_assert(tile_rows >= 1 && tile_rows <= 4);
  constexpr std::int64_t kPanel = kPanelVectors * kVector;
  for (std::int64_t d = 0; d < head_dim; d += kPanel) {
    __mmask16 mask[kPanelVectors];  // the V elements of each vector
    // Each vector's accumulator lanes: whole 32-element groups in bf16's order.
    __mmask16 acc_mask[kPanelVectors];
    for (int v = 0; v < kPanelVectors; ++v) {
      mask[v] = lanes(head_dim - d - v * kVector);
      acc_mask[v] = kEvenOddRows<dtype>
                        ? (lanes(head_dim - d - (v & ~1) * kVector) != 0 ? 0xffff : 0)
                        : mask[v];
    }
    Panel row0 = load_panel(acc + d, acc_mask, correction[0]), row1{}, row2{}, row3{};
    if constexpr (tile_rows > 1) row1 = load_panel(acc + acc_stride + d, acc_mask, correction[1]);
    if constexpr (tile_rows > 2) {
      row2 = load_panel(acc + 2 * acc_stride + d, acc_mask, correction[2]);
    }
    if constexpr (tile_rows > 3) {
      row3 = load_panel(acc + 3 * acc_stride + d, acc_mask, correction[3]);
    }
    RowPrefetcher<dtype> prefetcher(values, d == 0 ? prefetch_distance : 0, head_dim);
    const auto add_keys = [&](auto masked) {
      for (std::int64_t j = 0; j < values.count; ++j) {
        prefetcher.ahead_of(j);
        const Panel x = widen_panel<dtype, masked.value>(values.rows[j], d, mask);
        add_to_panel(row0, p[j], x);
        if constexpr (tile_rows > 1) add_to_panel(row1, p[p_stride + j], x);
        if constexpr (tile_rows > 2) add_to_panel(row2, p[2 * p_stride + j], x);
        if constexpr (tile_rows > 3) add_to_panel(row3, p[3 * p_stride + j], x);
      }
    };
    // Whole panels (every one for head dims that are multiples of 64) load unmasked.
    if (d + kPanel <= head_dim) {
      add_keys(std::false_type{});
    } else {
      add_keys(std::true_type{});
    }
    store_panel(acc + d, acc_mask, row0);
    if constexpr (tile_rows > 1) store_panel(acc + acc_stride + d, acc_mask, row1);
    if constexpr (tile_rows > 2) store_panel(acc + 2 * acc_stride + d, acc_mask, row2);
    if constexpr (tile_rows > 3) store_panel(acc + 3 * acc_stride + d, acc_mask, row3);
  }
}

// Rows in tiles of four (the last one smaller), in panels of 64 elements and four rows: each V
// element is widened once per call, into 16 accumulators. (Whole rows of up to 128 elements two
// rows at a time, reading each V row front to back, measured faster for 2-byte and 4-byte caches
// on Zen 4; on Intel Emerald Rapids these panels made bf16 p·v 1.35x faster with the cache in L2,
// and the decode benchmark's bf16 batch 1.04x faster together with score_four_keys.)
template <DType dtype>
void values_of(const float* p, std::int64_t p_stride, std::int64_t rows, StreamedRows values,
               std::int64_t head_dim, const float* correction, float* acc, std::int64_t acc_stride,
               std::int64_t prefetch_distance) {
  for (std::int64_t r = 0; r < rows; r += kTile) {
    const std::int64_t tile_prefetch = r == 0 ? prefetch_distance : 0;
    const float* tile_p = p + r * p_stride;
    float* tile_acc = acc + r * acc_stride;
    with_tile_rows(rows - r, [&](auto tile_rows) {
      value_tile<dtype, tile_rows.value>(tile_p, p_stride, values, head_dim, correction + r,
                                         tile_acc, acc_stride, tile_prefetch);
    });
  }
}

}  // namespace

#pragma GCC pop_options

// q·k and p·v on vdpbf16ps, for bf16 queries with bf16 or fp8 caches on CPUs with AVX-512 BF16
// and VBMI. Every such key and value element is a bf16 value (fp8 ones exactly), so q·k is exact in
// fp32 as after widening, with half the multiply-adds and no fp32 widening; p·v rounds P to bf16
// (StreamedProducts::bf16_dots). fp8 widens to bf16 through byte-permute tables, 64 elements in
// five instructions. (Like the dense bf16 kernels, these treat bf16 subnormals as zero; fp8 values
// are never that small.)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi,f16c,fma")

namespace {

constexpr std::int64_t kPairs = 32;  // bf16 elements of one vdpbf16ps operand

// 64 bytes: a vpermi2b table or index vector.
struct ByteVector {
  std::uint8_t bytes[64];
};
struct Fp8ByteTables {
  std::uint8_t low[128], high[128];
};

// The low and the high bytes of fp8_magnitude_table: vpermi2b looks up 128 entries by the low 7
// bits of each byte, the magnitude.
template <DType dtype>
constexpr Fp8ByteTables fp8_byte_tables() {
  constexpr Fp8MagnitudeTable words = fp8_magnitude_table<dtype>();
  Fp8ByteTables tables{};
  for (int m = 0; m < 128; ++m) {
    tables.low[m] = static_cast<std::uint8_t>(words.bits[m] & 0xff);
    tables.high[m] = static_cast<std::uint8_t>(words.bits[m] >> 8);
  }
  return tables;
}

// Byte b of the result is byte index(b) of (low, high), high's bytes numbered from 64. `words`:
// 16-bit words from elements first..first + 31 in order. `pairs`: 32-bit lanes pairing element
// first + i with element 32 + first + i (the same head-dim element of two keys), i < 16.
constexpr ByteVector words_index(int first) {
  ByteVector index{};
  for (int i = 0; i < 32; ++i) {
    index.bytes[2 * i] = static_cast<std::uint8_t>(first + i);
    index.bytes[2 * i + 1] = static_cast<std::uint8_t>(64 + first + i);
  }
  return index;
}
constexpr ByteVector pairs_index(int first) {
  ByteVector index{};
  for (int i = 0; i < 16; ++i) {
    index.bytes[4 * i] = static_cast<std::uint8_t>(first + i);
    index.bytes[4 * i + 1] = static_cast<std::uint8_t>(64 + first + i);
    index.bytes[4 * i + 2] = static_cast<std::uint8_t>(32 + first + i);
    index.bytes[4 * i + 3] = static_cast<std::uint8_t>(96 + first + i);
  }
  return index;
}
// 32 indices of 16-bit words (vpermt2w).
struct WordVector {
  std::uint16_t words[32];
};

[[gnu::always_inline]] inline __m512i load_vector(const void* p) {
  return _mm512_loadu_si512(p);
}

// The bf16 bits of the 64 fp8 values of `bytes` as two byte vectors, low and high bytes, in the
// order of `bytes`.
template <DType dtype>
[[gnu::always_inline]] inline void fp8_to_bf16_bytes(__m512i bytes, __m512i& low, __m512i& high) {
  static constexpr Fp8ByteTables kTables = fp8_byte_tables<dtype>();
  low = _mm512_permutex2var_epi8(load_vector(kTables.low), bytes, load_vector(kTables.low + 64));
  const __m512i magnitude =
      _mm512_permutex2var_epi8(load_vector(kTables.high), bytes, load_vector(kTables.high + 64));
  // magnitude | (bytes & 0x80)
  high =
      _mm512_ternarylogic_epi32(magnitude, bytes, _mm512_set1_epi8(static_cast<char>(0x80)), 0xf8);
}

[[gnu::always_inline]] inline __m512bh as_pairs(__m512i x) {
  return reinterpret_cast<__m512bh>(x);
}

// Calls dots(g, k) for each 32-element group g < groups of a key row (groups: head_dim / 32 rounded
// up), k the group's elements as bf16, zero past head_dim; the row is read front to back. A
// constant `groups` (std::integral_constant) unrolls the loop, so that g indexes registers. fp8
// rows give a pair of groups (64 elements) in the order to_key_group_order puts q in: their bf16
// words are the low and the high bytes interleaved within 128-bit lanes (vpunpck{l,h}bw), which
// costs less than two cross-lane permutes (measured on Zen 4 with 4 rows, D 128 and the rows in
// L1: 8.1 ns a key against 8.9).
template <DType dtype, typename Groups, typename Dots>
[[gnu::always_inline]] inline void key_groups(const char* k_row, std::int64_t head_dim,
                                              Groups groups, Dots&& dots) {
  const std::int64_t count = groups;
  if constexpr (dtype == DType::bf16) {
#pragma GCC unroll 4
    for (std::int64_t g = 0; g < count; ++g) {
      const char* element = k_row + 2 * g * kPairs;
      dots(g, (g + 1) * kPairs <= head_dim
                  ? load_vector(element)
                  : _mm512_maskz_loadu_epi16(lanes<__mmask32>(head_dim - g * kPairs), element));
    }
  } else {
    static constexpr ByteVector kLowWords = words_index(0);
#pragma GCC unroll 2
    for (std::int64_t h = 0; 2 * h < count; ++h) {
      const char* element = k_row + 2 * h * kPairs;
      const __m512i bytes =
          (h + 1) * 2 * kPairs <= head_dim
              ? load_vector(element)
              : _mm512_maskz_loadu_epi8(lanes<__mmask64>(head_dim - 2 * h * kPairs), element);
      __m512i low, high;
      fp8_to_bf16_bytes<dtype>(bytes, low, high);
      if (2 * h + 1 < count) {
        dots(2 * h, _mm512_unpacklo_epi8(low, high));
        dots(2 * h + 1, _mm512_unpackhi_epi8(low, high));
      } else {
        dots(2 * h, _mm512_permutex2var_epi8(low, load_vector(kLowWords.bytes), high));
      }
    }
  }
}

// fp8 key rows give each whole pair of groups (64 elements) in the order of vpunpck{l,h}bw's
// results (key_groups): position 32·half + 8·lane + i holds element 16·lane + 8·half + i (i < 8,
// lane < 4). A lone last group keeps element order. Puts a bf16 q row (`groups` groups) in that
// order.
constexpr WordVector unpacked_order_index(int half) {
  WordVector index{};
  for (int lane = 0; lane < 4; ++lane) {
    for (int i = 0; i < 8; ++i) {
      index.words[8 * lane + i] = static_cast<std::uint16_t>(16 * lane + 8 * half + i);
    }
  }
  return index;
}
[[gnu::always_inline]] inline void to_key_group_order(std::uint16_t* row, std::int64_t groups) {
  static constexpr WordVector kFirst = unpacked_order_index(0), kSecond = unpacked_order_index(1);
  for (std::int64_t g = 0; g + 1 < groups; g += 2) {
    std::uint16_t* pair = row + g * kPairs;
    const __m512i a = load_vector(pair), b = load_vector(pair + kPairs);
    _mm512_storeu_si512(pair, _mm512_permutex2var_epi16(a, load_vector(kFirst.words), b));
    _mm512_storeu_si512(pair + kPairs, _mm512_permutex2var_epi16(a, load_vector(kSecond.words), b));
  }
}

// Four bf16 q rows against one key: q_pairs(r, g) is row r's elements 32g to 32g + 32 (zero past
// head_dim), from memory or, for a constant `groups`, from registers.
template <DType dtype, typename Groups, typename QPairs>
[[gnu::always_inline]] inline __m512 score_key_bf16_dot(const void* key, std::int64_t head_dim,
                                                        Groups groups, QPairs&& q_pairs) {
  const __m512 zero = _mm512_setzero_ps();
  KeyColumn c{zero, zero, zero, zero};
  key_groups<dtype>(static_cast<const char*>(key), head_dim, groups,
                    [&](std::int64_t g, __m512i k) {
                      c.r0 = _mm512_dpbf16_ps(c.r0, q_pairs(0, g), as_pairs(k));
                      c.r1 = _mm512_dpbf16_ps(c.r1, q_pairs(1, g), as_pairs(k));
                      c.r2 = _mm512_dpbf16_ps(c.r2, q_pairs(2, g), as_pairs(k));
                      c.r3 = _mm512_dpbf16_ps(c.r3, q_pairs(3, g), as_pairs(k));
                    });
  return fold_rows(c);
}

// The four-row tile's scores against every key with its q pairs held in registers (head dims of
// up to 32 · groups).
template <DType dtype, int groups>
void score_tile_held_q(const std::uint16_t* q, std::int64_t q_stride, StreamedRows keys,
                       std::int64_t head_dim, float scale, float* scores, std::int64_t score_stride,
                       std::int64_t prefetch_distance) {
  __m512i q_pairs[kTile][groups];
#pragma GCC unroll 4
  for (int r = 0; r < kTile; ++r) {
#pragma GCC unroll 4
    for (int g = 0; g < groups; ++g) q_pairs[r][g] = load_vector(q + r * q_stride + g * kPairs);
  }
  score_tiles_of_keys<dtype, true>(
      keys, head_dim, scale, scores, score_stride, prefetch_distance, [&](const char* key) {
        return score_key_bf16_dot<dtype>(
            key, head_dim, std::integral_constant<int, groups>{},
            [&](int r, std::int64_t g) { return as_pairs(q_pairs[r][g]); });
      });
}

// scores_of on vdpbf16ps. The q rows hold bf16 values (a bf16 query), so their bf16 copy, made
// per four-row tile, is exact.
template <DType dtype>
void scores_of_bf16_dot(const float* q, std::int64_t rows, std::int64_t q_stride, StreamedRows keys,
                        std::int64_t head_dim, float scale, float* scores,
                        std::int64_t score_stride, std::int64_t prefetch_distance) {
  const std::int64_t pair_stride = (head_dim + kPairs - 1) / kPairs * kPairs;
  alignas(64) std::uint16_t q_bf16[kTile * kMaxStreamedHeadDim];
  const std::int64_t group_count = pair_stride / kPairs;
  for (std::int64_t r = 0; r < rows; r += kTile) {
    for (int t = 0; t < kTile; ++t) {
      const float* src = q + (r + t) * q_stride;
      std::uint16_t* dst = q_bf16 + t * pair_stride;
      for (std::int64_t d = 0; d < pair_stride; d += kVector) {
        const __m512 x = d < q_stride ? _mm512_loadu_ps(src + d) : _mm512_setzero_ps();
        _mm256_store_si256(reinterpret_cast<__m256i*>(dst + d),
                           reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)));
      }
      if constexpr (dtype != DType::bf16) to_key_group_order(dst, group_count);
    }
    float* tile_scores = scores + r * score_stride;
    const std::int64_t distance = r == 0 ? prefetch_distance : 0;
    const auto held = [&](auto groups) {
      score_tile_held_q<dtype, groups.value>(q_bf16, pair_stride, keys, head_dim, scale,
                                             tile_scores, score_stride, distance);
    };
    switch (group_count) {
      case 1:
        held(std::integral_constant<int, 1>{});
        break;
      case 2:
        held(std::integral_constant<int, 2>{});
        break;
      case 3:
        held(std::integral_constant<int, 3>{});
        break;
      case 4:
        held(std::integral_constant<int, 4>{});
        break;
      default:
        score_tiles_of_keys<dtype, true>(
            keys, head_dim, scale, tile_scores, score_stride, distance, [&](const char* key) {
              return score_key_bf16_dot<dtype>(
                  key, head_dim, pair_stride / kPairs, [&](int row, std::int64_t g) {
                    return as_pairs(load_vector(q_bf16 + row * pair_stride + g * kPairs));
                  });
            });
    }
  }
}

// The value pairs of two keys for the 32 head-dim elements at row_a and row_b. bf16: paired
// within 128-bit lanes (vpunpck{l,h}wd, cheaper than cross-lane permutes): lane 4·l + m of `first`
// holds (a[e], b[e]) for e = 8·l + m, of `second` for e = 8·l + 4 + m (l, m < 4), the order
// streamed_acc_index gives. fp8: lane i of `first` holds (a[i], b[i]) for i < 16, lane i of
// `second` (a[16 + i], b[16 + i]). Without `partner`, b is zero and row_b is not read; `masked`:
// elements outside `mask` are zero and not read.
template <DType dtype, bool masked, bool partner>
[[gnu::always_inline]] inline void value_pairs(const char* row_a, const char* row_b, __mmask32 mask,
                                               __m512i& first, __m512i& second) {
  if constexpr (dtype == DType::bf16) {
    const auto load = [&](const char* row) {
      return masked ? _mm512_maskz_loadu_epi16(mask, row) : load_vector(row);
    };
    const __m512i a = load(row_a);
    const __m512i b = partner ? load(row_b) : _mm512_setzero_si512();
    first = _mm512_unpacklo_epi16(a, b);
    second = _mm512_unpackhi_epi16(a, b);
  } else {
    static constexpr ByteVector kFirst = pairs_index(0), kSecond = pairs_index(16);
    const auto load = [&](const char* row) {
      return masked ? _mm256_maskz_loadu_epi8(mask, row)
                    : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
    };
    const __m256i b = partner ? load(row_b) : _mm256_setzero_si256();
    __m512i low, high;
    fp8_to_bf16_bytes<dtype>(_mm512_inserti64x4(_mm512_castsi256_si512(load(row_a)), b, 1), low,
                             high);
    first = _mm512_permutex2var_epi8(low, load_vector(kFirst.bytes), high);
    second = _mm512_permutex2var_epi8(low, load_vector(kSecond.bytes), high);
  }
}

// value_pairs for 64 fp8 elements of two keys at once, paired within 128-bit lanes (two byte
// unpacks before the table lookups, two after each, in place of value_pairs' four cross-lane
// permutes and two inserts; Zen 4, 4 rows, D 128, rows in L1: 5.6 ns a key against 7.3): pairs[k]
// lane 4·l + m holds (a[e], b[e]) for e = 16·l + 4·k + m, the order streamed_acc_index gives bf16
// dots on fp8 rows. `masked`: elements outside `mask` are zero and not read.
template <DType dtype, bool masked, bool partner>
[[gnu::always_inline]] inline void value_pairs_in_lanes(const char* row_a, const char* row_b,
                                                        __mmask64 mask, __m512i (&pairs)[4]) {
  const auto load = [&](const char* row) {
    return masked ? _mm512_maskz_loadu_epi8(mask, row) : load_vector(row);
  };
  const __m512i a = load(row_a);
  const __m512i b = partner ? load(row_b) : _mm512_setzero_si512();
  __m512i low, high;
  fp8_to_bf16_bytes<dtype>(_mm512_unpacklo_epi8(a, b), low, high);
  pairs[0] = _mm512_unpacklo_epi8(low, high);
  pairs[1] = _mm512_unpackhi_epi8(low, high);
  fp8_to_bf16_bytes<dtype>(_mm512_unpackhi_epi8(a, b), low, high);
  pairs[2] = _mm512_unpacklo_epi8(low, high);
  pairs[3] = _mm512_unpackhi_epi8(low, high);
}

// Keys whose P a bf16 p·v call rounds at a time.
constexpr std::int64_t kPairedKeys = 256;

// `tile_rows` rows of p·v over `groups` 32-element groups of the head dim from element d:
// acc = acc · scale + Σ p · v, keys in pairs. p_pairs holds each row's P in bf16, a pair of keys
// per 32 bits, pair_stride pairs apart (zero past the last key).
template <DType dtype, int tile_rows, int groups, bool masked>
void value_tile_bf16_dot(const std::uint32_t* p_pairs, std::int64_t pair_stride,
                         StreamedRows values, std::int64_t d, std::int64_t head_dim,
                         const float* scale, float* acc, std::int64_t acc_stride,
                         std::int64_t prefetch_distance) {
  __m512 sums[tile_rows][2 * groups];
  __mmask32 mask[groups];
#pragma GCC unroll 4
  for (int g = 0; g < groups; ++g) mask[g] = lanes<__mmask32>(head_dim - d - g * kPairs);
  const __mmask64 panel_mask = lanes<__mmask64>(head_dim - d);
#pragma GCC unroll 4
  for (int r = 0; r < tile_rows; ++r) {
    const __m512 factor = _mm512_set1_ps(scale[r]);
#pragma GCC unroll 4
    for (int v = 0; v < 2 * groups; ++v) {
      sums[r][v] = _mm512_mul_ps(_mm512_loadu_ps(acc + r * acc_stride + d + v * kVector), factor);
    }
  }
  const auto add_pair = [&](std::int64_t j, auto partner) {
    const char* row_a = static_cast<const char*>(values.rows[j]);
    const char* row_b = partner.value ? static_cast<const char*>(values.rows[j + 1]) : nullptr;
    __m512i pair_p[tile_rows];
#pragma GCC unroll 4
    for (int r = 0; r < tile_rows; ++r) {
      pair_p[r] = _mm512_set1_epi32(static_cast<int>(p_pairs[r * pair_stride + j / 2]));
    }
    if constexpr (dtype != DType::bf16 && groups == 2) {
      __m512i pairs[4];
      value_pairs_in_lanes<dtype, masked, partner.value>(row_a + d, row_b + d, panel_mask, pairs);
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) {
#pragma GCC unroll 4
        for (int r = 0; r < tile_rows; ++r) {
          sums[r][v] = _mm512_dpbf16_ps(sums[r][v], as_pairs(pair_p[r]), as_pairs(pairs[v]));
        }
      }
      return;
    }
#pragma GCC unroll 4
    for (int g = 0; g < groups; ++g) {
      const std::int64_t offset = (d + g * kPairs) * element_bytes<dtype>();
      __m512i first, second;
      value_pairs<dtype, masked, partner.value>(row_a + offset, row_b + offset, mask[g], first,
                                                second);
#pragma GCC unroll 4
      for (int r = 0; r < tile_rows; ++r) {
        sums[r][2 * g] = _mm512_dpbf16_ps(sums[r][2 * g], as_pairs(pair_p[r]), as_pairs(first));
        sums[r][2 * g + 1] =
            _mm512_dpbf16_ps(sums[r][2 * g + 1], as_pairs(pair_p[r]), as_pairs(second));
      }
    }
  };
  RowPrefetcher<dtype> prefetcher(values, d == 0 ? prefetch_distance : 0, head_dim);
  std::int64_t j = 0;
  for (; j + 2 <= values.count; j += 2) {
    prefetcher.ahead_of(j);
    prefetcher.ahead_of(j + 1);
    add_pair(j, std::true_type{});
  }
  if (j < values.count) add_pair(j, std::false_type{});
#pragma GCC unroll 4
  for (int r = 0; r < tile_rows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < 2 * groups; ++v) {
      _mm512_storeu_ps(acc + r * acc_stride + d + v * kVector, sums[r][v]);
    }
  }
}

// value_tile_bf16_dot over the whole head dim: panels of two groups (64 elements), the last one
// masked where the head dim ends inside it.
template <DType dtype, int tile_rows>
void value_rows_bf16_dot(const std::uint32_t* p_pairs, std::int64_t pair_stride,
                         StreamedRows values, std::int64_t head_dim, const float* scale, float* acc,
                         std::int64_t acc_stride, std::int64_t prefetch_distance) {
  std::int64_t d = 0;
  for (; d + 2 * kPairs <= head_dim; d += 2 * kPairs) {
    value_tile_bf16_dot<dtype, tile_rows, 2, false>(p_pairs, pair_stride, values, d, head_dim,
                                                    scale, acc, acc_stride, prefetch_distance);
  }
  const std::int64_t left = head_dim - d;
  if (left > kPairs) {
    value_tile_bf16_dot<dtype, tile_rows, 2, true>(p_pairs, pair_stride, values, d, head_dim, scale,
                                                   acc, acc_stride, prefetch_distance);
  } else if (left == kPairs) {
    value_tile_bf16_dot<dtype, tile_rows, 1, false>(p_pairs, pair_stride, values, d, head_dim,
                                                    scale, acc, acc_stride, prefetch_distance);
  } else if (left > 0) {
    value_tile_bf16_dot<dtype, tile_rows, 1, true>(p_pairs, pair_stride, values, d, head_dim, scale,
                                                   acc, acc_stride, prefetch_distance);
  }
}

// values_of with StreamedProducts::bf16_dots: P rounded to bf16 per four-row tile and run of
// kPairedKeys keys. Accumulators in streamed_acc_index order.
template <DType dtype>
void values_of_bf16_dot(const float* p, std::int64_t p_stride, std::int64_t rows,
                        StreamedRows values, std::int64_t head_dim, const float* correction,
                        float* acc, std::int64_t acc_stride, std::int64_t prefetch_distance) {
  constexpr std::int64_t kPairStride = kPairedKeys / 2 + kVector / 2;
  alignas(64) std::uint32_t p_pairs[kTile * kPairStride];
  constexpr float kOnes[kTile] = {1.0f, 1.0f, 1.0f, 1.0f};
  for (std::int64_t run = 0; run < values.count; run += kPairedKeys) {
    const std::int64_t count = std::min(kPairedKeys, values.count - run);
    const StreamedRows run_values{values.rows + run, count};
    for (std::int64_t r = 0; r < rows; r += kTile) {
      const std::int64_t tile_rows = std::min<std::int64_t>(kTile, rows - r);
      for (std::int64_t t = 0; t < tile_rows; ++t) {
        const float* src = p + (r + t) * p_stride + run;
        auto* dst = reinterpret_cast<std::uint16_t*>(p_pairs + t * kPairStride);
        for (std::int64_t k = 0; k < count; k += kVector) {
          const __m512 x = _mm512_maskz_loadu_ps(lanes(count - k), src + k);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k),
                              reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)));
        }
      }
      const float* scale = run == 0 ? correction + r : kOnes;
      float* tile_acc = acc + r * acc_stride;
      const std::int64_t distance = r == 0 ? prefetch_distance : 0;
      with_tile_rows(tile_rows, [&](auto rows_in_tile) {
        value_rows_bf16_dot<dtype, rows_in_tile.value>(p_pairs, kPairStride, run_values, head_dim,
                                                       scale, tile_acc, acc_stride, distance);
      });
    }
  }
}

}  // namespace

#pragma GCC pop_options

// The fp32-product kernels for CPUs that stream without AVX-512 (AVX2, FMA and F16C: Zen 3,
// Intel's client cores). AVX2 has 16 vector registers, so each tile keeps 8 accumulators where
// the AVX-512 kernels keep 16, leaving registers for its operands: q·k in tiles of four rows by
// two keys (two rows by four, one by eight for smaller GQA groups), p·v in panels of 16 head dims
// by four rows (32 by two, 64 by one). Rows widen 16 elements at a time (bf16 as its even and its
// odd ones); tails are copied into a zeroed buffer, so no row is read past its end.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace avx2 {
namespace {

constexpr std::int64_t kLanes = 8;  // fp32 lanes

// What the widened elements of a dtype are, as multiples of its values: an e4m3fn element widens
// to its value times 2^-8 (below), which the products undo once per sum instead of once per
// element: scores in their scale, p·v in the accumulators as they are loaded and stored. Powers of
// two, so the results are the same (short of fp32's subnormal range).
template <DType dtype>
constexpr float kWidenedUnit = dtype == DType::f8e4m3fn ? 1.0f / 256.0f : 1.0f;

// fp8 codes (zero-extended to 16-bit lanes) as fp16 bits, exactly: an e5m2 code is the upper
// byte of the same fp16 value; an e4m3fn code's sign and magnitude moved into fp16's fields are
// its value times 2^-8 (the exponent biases differ by 8; subnormals too: kWidenedUnit), and its
// NaN code (S.1111.111) is made an fp16 NaN.
template <DType dtype>
[[gnu::always_inline]] inline __m256i fp8_to_fp16_bits(__m256i codes) {
  if constexpr (dtype == DType::f8e5m2) {
    return _mm256_slli_epi16(codes, 8);
  } else {
    static_assert(dtype == DType::f8e4m3fn);
    // S.MMMMMMM.00000000 shifted right arithmetically: S.S.MMMMMMM.0000000, the copy cleared.
    const __m256i value = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(codes, 8), 1),
                                           _mm256_set1_epi16(static_cast<short>(0xbfff)));
    const __m256i nan = _mm256_cmpeq_epi16(_mm256_and_si256(codes, _mm256_set1_epi16(0x7f)),
                                           _mm256_set1_epi16(0x7f));
    return _mm256_or_si256(value, _mm256_and_si256(nan, _mm256_set1_epi16(0x7e00)));
  }
}

// The 8 cache elements at `element` widened to fp32 (in kWidenedUnit<dtype>).
template <DType dtype>
[[gnu::always_inline]] inline __m256 widen8(const void* element) {
  if constexpr (dtype == DType::f32) {
    return _mm256_loadu_ps(static_cast<const float*>(element));
  } else if constexpr (dtype == DType::bf16) {  // the upper half of an fp32
    const __m128i bits = _mm_loadu_si128(static_cast<const __m128i*>(element));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
  } else if constexpr (dtype == DType::f16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(element)));
  } else {
    const __m128i codes = _mm_loadl_epi64(static_cast<const __m128i*>(element));
    const __m256i bits = fp8_to_fp16_bits<dtype>(_mm256_cvtepu8_epi16(codes));
    return _mm256_cvtph_ps(_mm256_castsi256_si128(bits));
  }
}

// The 16 cache elements at `element` widened to fp32: elements 0-7 in low and 8-15 in high, but
// bf16's even elements in low and its odd ones in high (the low halves of its 32-bit lanes shifted
// up, and the high halves: one instruction each, the order streamed_acc_index keeps). fp8
// converts all 16 in each integer instruction.
template <DType dtype>
[[gnu::always_inline]] inline void widen16(const void* element, __m256& low, __m256& high) {
  if constexpr (dtype == DType::bf16) {
    const __m256i bits = _mm256_loadu_si256(static_cast<const __m256i*>(element));
    low = _mm256_castsi256_ps(_mm256_slli_epi32(bits, 16));
    high = _mm256_castsi256_ps(
        _mm256_and_si256(bits, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  } else if constexpr (element_bytes<dtype>() == 1) {
    const __m128i codes = _mm_loadu_si128(static_cast<const __m128i*>(element));
    const __m256i bits = fp8_to_fp16_bits<dtype>(_mm256_cvtepu8_epi16(codes));
    low = _mm256_cvtph_ps(_mm256_castsi256_si128(bits));
    high = _mm256_cvtph_ps(_mm256_extracti128_si256(bits, 1));
  } else {
    low = widen8<dtype>(element);
    high = widen8<dtype>(static_cast<const char*>(element) + kLanes * element_bytes<dtype>());
  }
}

// widen16 of the `remaining` elements left in a row (some or all 16), zero past them; the memory
// past them is not read.
template <DType dtype>
[[gnu::always_inline]] inline void widen16_before_end(const void* element, std::int64_t remaining,
                                                      __m256& low, __m256& high) {
  if (remaining >= 2 * kLanes) return widen16<dtype>(element, low, high);
  alignas(32) unsigned char tail[2 * kLanes * sizeof(float)] = {};
  std::memcpy(tail, element, static_cast<std::size_t>(remaining * element_bytes<dtype>()));
  widen16<dtype>(tail, low, high);
}

// q rows in the order widen16 keeps for bf16: each 16-element group's even elements, then its odd
// ones; `width` (a multiple of 16) floats per row.
void to_even_odd_order(const float* q, std::int64_t q_stride, std::int64_t width, float* out) {
  for (std::int64_t r = 0; r < kTile; ++r) {
    for (std::int64_t d = 0; d < width; d += 2 * kLanes) {
      const __m256 a = _mm256_loadu_ps(q + r * q_stride + d);
      const __m256 b = _mm256_loadu_ps(q + r * q_stride + d + kLanes);
      // [a0 a2 b0 b2 a4 a6 b4 b6] and [a1 a3 b1 b3 a5 a7 b5 b7], their middle 64-bit pairs swapped.
      const __m256d even = _mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88));
      const __m256d odd = _mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xdd));
      _mm256_storeu_pd(reinterpret_cast<double*>(out + r * width + d),
                       _mm256_permute4x64_pd(even, 0xd8));
      _mm256_storeu_pd(reinterpret_cast<double*>(out + r * width + d + kLanes),
                       _mm256_permute4x64_pd(odd, 0xd8));
    }
  }
}

// Lane i: the sum of x[i]'s lanes.
[[gnu::always_inline]] inline __m256 sum_each(const __m256 (&x)[8]) {
  const __m256 t0 = _mm256_hadd_ps(x[0], x[1]), t1 = _mm256_hadd_ps(x[2], x[3]);
  const __m256 t2 = _mm256_hadd_ps(x[4], x[5]), t3 = _mm256_hadd_ps(x[6], x[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Keys per q·k tile of `rows` rows: eight accumulators (six for three rows).
template <int rows>
constexpr int kTileKeys = rows == 1   ? 8
                          : rows == 2 ? 4
                                      : 2;

// scores[r * score_stride + t] = scale · q[r]·k[t] for `rows` q rows r (q_stride floats apart, in
// widen16's order, zero from head_dim up to a multiple of 16) and kTileKeys<rows> keys t.
template <DType dtype, int rows>
[[gnu::always_inline]] inline void score_tile(const float* q, std::int64_t q_stride,
                                              const char* const (&key)[kTileKeys<rows>],
                                              std::int64_t head_dim, float scale, float* scores,
                                              std::int64_t score_stride) {
  constexpr int kKeys = kTileKeys<rows>;
  __m256 sums[8];  // row r with key t at kKeys · r + t; zero past rows · kKeys
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) sums[i] = _mm256_setzero_ps();
  const auto load_q = [&](int r, std::int64_t d) {
    __m256 q_r = _mm256_loadu_ps(q + r * q_stride + d);
    // One load for every key: GCC folds it into each FMA otherwise, and those loads outnumber
    // what the load ports serve in the FMAs' time (Zen 3, keys in cache: 1.08x faster bf16
    // scores, 1.15x fp32).
    asm("" : "+x"(q_r));
    return q_r;
  };
  constexpr std::int64_t kBytes = element_bytes<dtype>();
  const auto multiply_group = [&](std::int64_t d, auto whole) {
    const auto widen = [&](int t, __m256& low, __m256& high) {
      if constexpr (whole.value) {
        widen16<dtype>(key[t] + d * kBytes, low, high);
      } else {
        widen16_before_end<dtype>(key[t] + d * kBytes, head_dim - d, low, high);
      }
    };
    if constexpr (rows <= 2) {
      // The group's q vectors stay in registers; the keys are widened one at a time.
      __m256 q_low[rows], q_high[rows];
#pragma GCC unroll 2
      for (int r = 0; r < rows; ++r) {
        q_low[r] = load_q(r, d);
        q_high[r] = load_q(r, d + kLanes);
      }
#pragma GCC unroll 8
      for (int t = 0; t < kKeys; ++t) {
        __m256 low, high;
        widen(t, low, high);
#pragma GCC unroll 2
        for (int r = 0; r < rows; ++r) {
          sums[kKeys * r + t] = _mm256_fmadd_ps(q_low[r], low, sums[kKeys * r + t]);
          sums[kKeys * r + t] = _mm256_fmadd_ps(q_high[r], high, sums[kKeys * r + t]);
        }
      }
    } else {
      // The keys' vectors stay in registers; each q vector is loaded once.
      __m256 low[kKeys], high[kKeys];
#pragma GCC unroll 2
      for (int t = 0; t < kKeys; ++t) widen(t, low[t], high[t]);
      const auto multiply_add = [&](std::int64_t at, const __m256(&k)[kKeys]) {
#pragma GCC unroll 4
        for (int r = 0; r < rows; ++r) {
          const __m256 q_r = load_q(r, at);
#pragma GCC unroll 2
          for (int t = 0; t < kKeys; ++t) {
            sums[kKeys * r + t] = _mm256_fmadd_ps(q_r, k[t], sums[kKeys * r + t]);
          }
        }
      };
      multiply_add(d, low);
      multiply_add(d + kLanes, high);
    }
  };
  std::int64_t d = 0;
  for (; d + 2 * kLanes <= head_dim; d += 2 * kLanes) multiply_group(d, std::true_type{});
  if (d < head_dim) multiply_group(d, std::false_type{});
  const __m256 total = _mm256_mul_ps(sum_each(sums), _mm256_set1_ps(scale / kWidenedUnit<dtype>));
  const __m128 low = _mm256_castps256_ps128(total), high = _mm256_extractf128_ps(total, 1);
  if constexpr (kKeys == 8) {
    _mm256_storeu_ps(scores, total);
  } else if constexpr (kKeys == 4) {
    _mm_storeu_ps(scores, low);
    _mm_storeu_ps(scores + score_stride, high);
  } else {
    const __m128 quarters[4] = {low, low, high, high};
#pragma GCC unroll 4
    for (int r = 0; r < rows; ++r) {
      auto* row = reinterpret_cast<__m64*>(scores + r * score_stride);
      if (r % 2 == 0) {
        _mm_storel_pi(row, quarters[r]);
      } else {
        _mm_storeh_pi(row, quarters[r]);
      }
    }
  }
}

// One row tile's scores against every key, kTileKeys<rows> keys at a time (past the last key a
// tile repeats it: padding columns).
template <DType dtype, int rows>
void score_row_tile(const float* q, std::int64_t q_stride, StreamedRows keys, std::int64_t head_dim,
                    float scale, float* scores, std::int64_t score_stride,
                    std::int64_t prefetch_distance) {
  constexpr int kKeys = kTileKeys<rows>;
  RowPrefetcher<dtype> prefetcher(keys, prefetch_distance, head_dim);
  for (std::int64_t j = 0; j < keys.count; j += kKeys) {
    const char* key[kKeys];
#pragma GCC unroll 8
    for (int t = 0; t < kKeys; ++t) {
      prefetcher.ahead_of(j + t);
      key[t] = static_cast<const char*>(keys.rows[std::min(j + t, keys.count - 1)]);
    }
    score_tile<dtype, rows>(q, q_stride, key, head_dim, scale, scores + j, score_stride);
  }
}

// stream_scores' contract, in tiles of four rows (the last one smaller). The first row tile
// prefetches ahead.
template <DType dtype>
void scores_of(const float* q, std::int64_t rows, std::int64_t q_stride, StreamedRows keys,
               std::int64_t head_dim, float scale, float* scores, std::int64_t score_stride,
               std::int64_t prefetch_distance) {
  // bf16 keys widen into even/odd order: the q rows are reordered to match, per row tile.
  alignas(32) float reordered[kTile * kMaxStreamedHeadDim];
  const std::int64_t reordered_stride = (head_dim + 2 * kLanes - 1) / (2 * kLanes) * 2 * kLanes;
  for (std::int64_t r = 0; r < rows; r += kTile) {
    const float* q_tile = q + r * q_stride;
    std::int64_t tile_stride = q_stride;
    if constexpr (dtype == DType::bf16) {
      to_even_odd_order(q_tile, q_stride, reordered_stride, reordered);
      q_tile = reordered;
      tile_stride = reordered_stride;
    }
    const std::int64_t distance = r == 0 ? prefetch_distance : 0;
    with_tile_rows(rows - r, [&](auto tile_rows) {
      score_row_tile<dtype, tile_rows.value>(q_tile, tile_stride, keys, head_dim, scale,
                                             scores + r * score_stride, score_stride, distance);
    });
  }
}

// `tile_rows` rows of the p·v update over `groups` · 16 head dims from d (fewer where the row ends
// within a single group), each V element widened once. The accumulators past head_dim (up to a
// whole group; rows are padded to 32) add zeros.
template <DType dtype, int tile_rows, int groups>
void value_panel(const float* p, std::int64_t p_stride, StreamedRows values, std::int64_t head_dim,
                 std::int64_t d, const float* correction, float* acc, std::int64_t acc_stride,
                 std::int64_t prefetch_distance) {
  static_assert(tile_rows >= 1 && tile_rows <= kTile);
  constexpr int kVectors = 2 * groups;
  constexpr std::int64_t kBytes = element_bytes<dtype>();
  __m256 sums[tile_rows][kVectors];
#pragma GCC unroll 4
  for (int r = 0; r < tile_rows; ++r) {
    const __m256 c = _mm256_set1_ps(correction[r] * kWidenedUnit<dtype>);
#pragma GCC unroll 8
    for (int v = 0; v < kVectors; ++v) {
      sums[r][v] = _mm256_mul_ps(_mm256_loadu_ps(acc + r * acc_stride + d + v * kLanes), c);
    }
  }
  RowPrefetcher<dtype> prefetcher(values, prefetch_distance, head_dim);
  const auto add_keys = [&](auto whole) {
    for (std::int64_t j = 0; j < values.count; ++j) {
      prefetcher.ahead_of(j);
      const char* row = static_cast<const char*>(values.rows[j]) + d * kBytes;
      // Wide panels keep the rows' probabilities in registers across their groups; a single group
      // broadcasts each as it goes (four held alongside eight accumulators measured 1.1x slower).
      __m256 p_j[tile_rows];
      if constexpr (groups > 1) {
#pragma GCC unroll 4
        for (int r = 0; r < tile_rows; ++r) p_j[r] = _mm256_broadcast_ss(p + r * p_stride + j);
      }
#pragma GCC unroll 4
      for (int g = 0; g < groups; ++g) {
        __m256 x0, x1;
        if constexpr (whole.value) {
          widen16<dtype>(row + g * 2 * kLanes * kBytes, x0, x1);
        } else {
          widen16_before_end<dtype>(row, head_dim - d, x0, x1);
        }
#pragma GCC unroll 4
        for (int r = 0; r < tile_rows; ++r) {
          __m256 p_rj;
          if constexpr (groups > 1) {
            p_rj = p_j[r];
          } else {
            p_rj = _mm256_broadcast_ss(p + r * p_stride + j);
          }
          sums[r][2 * g] = _mm256_fmadd_ps(p_rj, x0, sums[r][2 * g]);
          sums[r][2 * g + 1] = _mm256_fmadd_ps(p_rj, x1, sums[r][2 * g + 1]);
        }
      }
    }
  };
  if constexpr (groups == 1) {
    if (d + 2 * kLanes > head_dim) {
      add_keys(std::false_type{});
    } else {
      add_keys(std::true_type{});
    }
  } else {
    add_keys(std::true_type{});  // value_tile's wide panels are whole
  }
  const __m256 unit = _mm256_set1_ps(1.0f / kWidenedUnit<dtype>);
#pragma GCC unroll 4
  for (int r = 0; r < tile_rows; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < kVectors; ++v) {
      if constexpr (kWidenedUnit<dtype> != 1.0f) sums[r][v] = _mm256_mul_ps(sums[r][v], unit);
      _mm256_storeu_ps(acc + r * acc_stride + d + v * kLanes, sums[r][v]);
    }
  }
}

// `tile_rows` rows of the p·v update in panels of as many 16-dim groups as eight accumulators
// hold (four for one row, two for two, one for three or four: a row of 16 dims alone would leave
// two FMA chains to wait on), the head dims past the last whole panel in single groups.
template <DType dtype, int tile_rows>
void value_tile(const float* p, std::int64_t p_stride, StreamedRows values, std::int64_t head_dim,
                const float* correction, float* acc, std::int64_t acc_stride,
                std::int64_t prefetch_distance) {
  constexpr int kGroups = tile_rows == 1 ? 4 : tile_rows == 2 ? 2 : 1;
  constexpr std::int64_t kPanel = kGroups * 2 * kLanes;
  std::int64_t d = 0;
  for (; d + kPanel <= head_dim; d += kPanel) {
    value_panel<dtype, tile_rows, kGroups>(p, p_stride, values, head_dim, d, correction, acc,
                                           acc_stride, d == 0 ? prefetch_distance : 0);
  }
  for (; d < head_dim; d += 2 * kLanes) {
    value_panel<dtype, tile_rows, 1>(p, p_stride, values, head_dim, d, correction, acc, acc_stride,
                                     d == 0 ? prefetch_distance : 0);
  }
}

// stream_values' contract (fp32 products), in tiles of four rows (the last one smaller).
template <DType dtype>
void values_of(const float* p, std::int64_t p_stride, std::int64_t rows, StreamedRows values,
               std::int64_t head_dim, const float* correction, float* acc, std::int64_t acc_stride,
               std::int64_t prefetch_distance) {
  for (std::int64_t r = 0; r < rows; r += kTile) {
    with_tile_rows(rows - r, [&](auto tile_rows) {
      value_tile<dtype, tile_rows.value>(p + r * p_stride, p_stride, values, head_dim,
                                         correction + r, acc + r * acc_stride, acc_stride,
                                         r == 0 ? prefetch_distance : 0);
    });
  }
}

}  // namespace
}  // namespace avx2

#pragma GCC pop_options
#pragma GCC diagnostic pop

namespace {

// Calls f(std::integral_constant<DType, cache_dtype>{}).
template <typename F>
void with_cache_dtype(DType cache_dtype, const char* caller, F&& f) {
  switch (cache_dtype) {
    case DType::f32:
      return f(std::integral_constant<DType, DType::f32>{});
    case DType::bf16:
      return f(std::integral_constant<DType, DType::bf16>{});
    case DType::f16:
      return f(std::integral_constant<DType, DType::f16>{});
    case DType::f8e4m3fn:
      return f(std::integral_constant<DType, DType::f8e4m3fn>{});
    case DType::f8e5m2:
      return f(std::integral_constant<DType, DType::f8e5m2>{});
    case DType::i32:
      break;
  }
  TILELAB_CHECK(false) << caller << ": cache dtype " << dtype_name(cache_dtype);
}

}  // namespace

void stream_scores(DType query_dtype, DType cache_dtype, const float* q, std::int64_t rows,
                   std::int64_t q_stride, StreamedRows keys, std::int64_t head_dim, float scale,
                   float* scores, std::int64_t score_stride, std::int64_t prefetch_distance) {
  TILELAB_CHECK(head_dim >= 1 && head_dim <= kMaxStreamedHeadDim && q_stride >= head_dim &&
                q_stride % 32 == 0)
      << "stream_scores: head_dim " << head_dim << ", q_stride " << q_stride;
  const bool bf16_dot = query_dtype == DType::bf16 && holds_bf16_values(cache_dtype) &&
                        bf16_dot_products_pay_off(cache_dtype);
  with_cache_dtype(cache_dtype, "stream_scores", [&](auto dtype) {
    if constexpr (holds_bf16_values(dtype.value)) {
      if (bf16_dot) {
        return scores_of_bf16_dot<dtype.value>(q, rows, q_stride, keys, head_dim, scale, scores,
                                               score_stride, prefetch_distance);
      }
    }
    if (!cpu_runs_avx512()) {
      return avx2::scores_of<dtype.value>(q, rows, q_stride, keys, head_dim, scale, scores,
                                          score_stride, prefetch_distance);
    }
    scores_of<dtype.value>(q, rows, q_stride, keys, head_dim, scale, scores, score_stride,
                           prefetch_distance);
  });
}

void stream_values(DType cache_dtype, StreamedProducts products, const float* p,
                   std::int64_t p_stride, std::int64_t rows, StreamedRows values,
                   std::int64_t head_dim, const float* correction, float* acc,
                   std::int64_t acc_stride, std::int64_t prefetch_distance) {
  with_cache_dtype(cache_dtype, "stream_values", [&](auto dtype) {
    if constexpr (holds_bf16_values(dtype.value)) {
      if (products == StreamedProducts::bf16_dots) {
        return values_of_bf16_dot<dtype.value>(p, p_stride, rows, values, head_dim, correction, acc,
                                               acc_stride, prefetch_distance);
      }
    }
    TILELAB_CHECK(products == StreamedProducts::fp32)
        << "stream_values: bf16 dot products for cache dtype " << dtype_name(cache_dtype);
    if (!cpu_runs_avx512()) {
      return avx2::values_of<dtype.value>(p, p_stride, rows, values, head_dim, correction, acc,
                                          acc_stride, prefetch_distance);
    }
    values_of<dtype.value>(p, p_stride, rows, values, head_dim, correction, acc, acc_stride,
                           prefetch_distance);
  });
}

}  // namespace tilelab::detail
