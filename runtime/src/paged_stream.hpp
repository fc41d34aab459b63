// The paged kernel's streaming micro-kernels: q·k and p·v over K/V cache rows read in place and
// widened in registers (AVX-512, or AVX2 on CPUs without it). They serve items with few rows
// (decode), where widening a chunk into fp32 scratch first costs more than the products it feeds
// and doubles the bytes the chunk moves through the caches.
#pragma once

#include <xmmintrin.h>

#include <cstdint>

#include "tilelab/tensor.hpp"

namespace tilelab::detail {

// The longest rows the streaming kernels take (paged_attention's limit).
constexpr std::int64_t kMaxStreamedHeadDim = 512;
// stream_scores computes q·k for rows in tiles of this many.
constexpr std::int64_t kStreamedRowTile = 4;

// True when the CPU runs the streaming micro-kernels: x86-64-v3 (AVX2, FMA, F16C), unless
// TILELAB_MAX_CPU_ISA is sse2 (cpu_runs_avx2).
bool cpu_streams_cache_rows();

// How stream_values forms p·v.
enum class StreamedProducts {
  // V widened to fp32, fp32 FMAs with P as given.
  fp32,
  // P rounded to bf16 (nearest even) and pairs of keys on vdpbf16ps: every bf16 and fp8 V element
  // is a bf16 value, so only P's rounding differs from fp32 products. Half the multiply-adds, and
  // V is never widened to fp32.
  bf16_dots,
};

// bf16_dots for bf16 queries with bf16 or fp8 caches where the call rounds P to bf16
// (rounds_bf16_probabilities: a CPU whose bf16 dot products outrun its fp32 FMAs, and
// PagedAttentionOptions::fp32_probabilities off).
StreamedProducts streamed_products(DType query_dtype, DType cache_dtype, bool fp32_probabilities);

// Where stream_values keeps head-dim element d (of head_dim) in an accumulator row. fp32 products
// widen bf16 rows a group at a time (32 elements with AVX-512, 16 with AVX2) as their even and
// their odd elements (one instruction each), so within each group the row holds the even elements,
// then the odd ones. bf16 dots pair two keys' elements within 128-bit lanes (vpunpck*): on bf16
// rows 32 elements at a time, position 16·k + 4·l + m holding element 8·l + 4·k + m (k < 2,
// l, m < 4); on fp8 rows 64 at a time, position 16·k + 4·l + m holding element 16·l + 4·k + m
// (k, l, m < 4), except in a last group of 32 or fewer, which keeps d. Other dtypes keep d.
// Accumulator rows must hold round_up(head_dim, 32) floats.
std::int64_t streamed_acc_index(DType cache_dtype, StreamedProducts products, std::int64_t d,
                                std::int64_t head_dim);

// Prefetches the 64-byte cache lines of a stream of rows, each line once. Rows need not start on a
// line (numpy aligns arrays to 16 bytes, so a 256-byte row spans five), and a row that starts in
// the line where the previous row ended (the rows of one cache block) skips that line. (The first
// line may start before the array: a prefetch of it is harmless.)
template <_mm_hint hint>
struct LineStream {
  std::uintptr_t next = 0;  // the line after the last one prefetched
  void prefetch(const void* row, std::int64_t bytes) {
    constexpr std::uintptr_t kLine = 64;
    const auto begin = reinterpret_cast<std::uintptr_t>(row);
    std::uintptr_t line = begin & ~(kLine - 1);
    if (line + kLine == next) line = next;
    for (; line < begin + static_cast<std::uintptr_t>(bytes); line += kLine) {
      _mm_prefetch(reinterpret_cast<const char*>(line), hint);
    }
    next = line;
  }
};

// The K or V rows of a run of keys: rows[j] is key j's row, head_dim contiguous elements of the
// cache dtype. rows holds `lookahead` more entries past count: keys that are only prefetched (the
// next chunk's). Optionally, rows to bring into L2 while these are read (stream_scores only): the
// far stream, far_count entries of far_rows and of far_companion (if not null), spread evenly over
// the keys, entry by entry. A caller names what it reads next: the same rows further on
// (stream_far_ahead), or the next chunk's rows in address order. And optionally (either kernel),
// the run-ahead stream: while key j is read, the row of key j + run_ahead (within the lookahead)
// into L2.
struct StreamedRows {
  const void* const* rows;
  std::int64_t count;
  std::int64_t lookahead = 0;
  const void* const* far_rows = nullptr;
  const void* const* far_companion = nullptr;
  std::int64_t far_count = 0;
  std::int64_t run_ahead = 0;  // 0: no run-ahead stream
};

// Both kernels read key j's row while prefetching the row of key j + prefetch_distance into L1
// (0: none, and no far or run-ahead stream either) and the run-ahead stream into L2;
// stream_scores also prefetches the far stream into L2. Rows at scattered addresses (short cache
// blocks) need it most, as the hardware prefetcher restarts at every block; long runs of rows
// measured faster with it too.
constexpr std::int64_t kStreamedL2Ahead = 3;

// The far stream of the rows themselves and their companions (the V rows of the keys scored, used
// after the scores), kStreamedL2Ahead · prefetch_distance keys ahead, one entry per key, and the
// run-ahead stream `run_ahead` keys ahead: `rows` and `companion` hold count + lookahead entries.
StreamedRows stream_far_ahead(const void* const* rows, const void* const* companion,
                              std::int64_t count, std::int64_t lookahead,
                              std::int64_t prefetch_distance, std::int64_t run_ahead);

// scores[r * score_stride + j] = scale · (q[r] · k[j]) for r < rows and j < keys.count (the dot
// product rounded to fp32, then multiplied). The q rows are fp32 values of `query_dtype`, q_stride
// floats apart, zero from head_dim up to q_stride (a multiple of 32); q and scores must hold
// round_up(rows, kStreamedRowTile) rows and scores round_up(keys.count, 8) columns: the padding
// is computed and written, its values unspecified.
void stream_scores(DType query_dtype, DType cache_dtype, const float* q, std::int64_t rows,
                   std::int64_t q_stride, StreamedRows keys, std::int64_t head_dim, float scale,
                   float* scores, std::int64_t score_stride, std::int64_t prefetch_distance);

// acc[r][i(d)] = acc[r][i(d)] · correction[r] + Σ_j p[r * p_stride + j] · v[j][d], for r < rows,
// j < values.count and d < head_dim, where i is streamed_acc_index; acc rows are acc_stride floats
// apart. `products` must be what streamed_products chose.
void stream_values(DType cache_dtype, StreamedProducts products, const float* p,
                   std::int64_t p_stride, std::int64_t rows, StreamedRows values,
                   std::int64_t head_dim, const float* correction, float* acc,
                   std::int64_t acc_stride, std::int64_t prefetch_distance);

}  // namespace tilelab::detail
