// The paged kernel's streaming micro-kernels: q·k and p·v over K/V cache rows read in place and
// widened in registers (AVX-512). They serve items with few rows (decode), where widening a chunk
// into fp32 scratch first costs more than the products it feeds and doubles the bytes the chunk
// moves through the caches.
#pragma once

#include <cstdint>

#include "tilelab/tensor.hpp"

namespace tilelab::detail {

// The longest rows the streaming kernels take (paged_attention's limit).
constexpr std::int64_t kMaxStreamedHeadDim = 512;
// stream_scores computes q·k for rows in tiles of this many.
constexpr std::int64_t kStreamedRowTile = 4;

// True when the CPU runs the streaming micro-kernels (AVX-512 F, BW, VL, DQ, and F16C).
bool cpu_streams_cache_rows();

// Where stream_values keeps head-dim element d in an accumulator row: bf16 rows are widened 32
// elements at a time as their even and their odd elements (one instruction each), so within each
// group of 32 the row holds the 16 even elements, then the 16 odd ones. Other dtypes keep d.
// Accumulator rows must hold round_up(head_dim, 32) floats.
std::int64_t streamed_acc_index(DType cache_dtype, std::int64_t d);

// The K or V rows of a run of keys: rows[j] is key j's row, head_dim contiguous elements of the
// cache dtype.
struct StreamedRows {
  const void* const* rows;
  std::int64_t count;
};

// Both kernels read key j's row while prefetching the row of key j + prefetch_distance (0: none).
// Rows that come in short runs (small cache blocks at scattered addresses) need it; long runs are
// better left to the hardware prefetcher.

// scores[r * score_stride + j] = q[r] · k[j] for r < rows and j < keys.count. The q rows are fp32
// values of `query_dtype`, q_stride floats apart, zero from head_dim up to q_stride (a multiple of
// 32); q and scores must hold round_up(rows, kStreamedRowTile) rows and scores
// round_up(keys.count, kStreamedRowTile) columns: the padding is computed and written, its values
// unspecified.
void stream_scores(DType query_dtype, DType cache_dtype, const float* q, std::int64_t rows,
                   std::int64_t q_stride, StreamedRows keys, std::int64_t head_dim, float* scores,
                   std::int64_t score_stride, std::int64_t prefetch_distance);

// acc[r][i(d)] = acc[r][i(d)] · correction[r] + Σ_j p[r * p_stride + j] · v[j][d], for r < rows,
// j < values.count and d < head_dim, where i is streamed_acc_index; acc rows are acc_stride floats
// apart.
void stream_values(DType cache_dtype, const float* p, std::int64_t p_stride, std::int64_t rows,
                   StreamedRows values, std::int64_t head_dim, const float* correction, float* acc,
                   std::int64_t acc_stride, std::int64_t prefetch_distance);

}  // namespace tilelab::detail
