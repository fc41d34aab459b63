// NKI-compatible flash paged attention (vLLM's NKI kernel: prefix prefill with a paged KV cache,
// block tables, continuous batching through a mask) and its helpers, on the CPU.
#pragma once

#include <cstdint>
#include <optional>

#include "tilelab/tensor.hpp"

namespace tilelab::nki {

// Which schedule of the generated kernel runs (same algorithm and rounding points; the results
// differ only by fp32 summation order).
//   cpu:  tuned for x86
//   tile: the NeuronCore tiling (128-row query tiles, 128-partition KV gathers, 128 × 512 score
//         tiles), the one the simulator's kernel uses
enum class PagedSchedule { cpu, tile };

struct FlashPagedAttentionOptions {
  // Multiplies q before q·kᵀ; default 1/sqrt(d). Must be finite.
  std::optional<float> softmax_scale;
  // true: bf16 tensor-engine operands (q·scale, K, V, P rounded to nearest even), fp32
  // accumulation and softmax statistics, output rounded to bf16 (then stored in out's dtype).
  // false: fp32 throughout (the NKI kernel computes in the input dtype; same for float32 inputs).
  bool mixed_precision = true;
  // LARGE_TILE_SZ: prior-context tokens per large tile, a multiple of 512 in [512, 8192] and of
  // block_size, with large_tile_size / block_size a power of two.
  std::int64_t large_tile_size = 2048;
  PagedSchedule schedule = PagedSchedule::cpu;
  // PagedAttentionSchedule::block_size_tiling_factor_override. The generated kernels derive the
  // tiling factor from large_tile_size and block_size (the simulator can force another one to
  // show the tiling trick), so only 0 or the derived factor is accepted here.
  std::int64_t block_size_tiling_factor_override = 0;
  // cpu schedule: leave out (query block, large tile) pairs whose mask is all zero when that
  // provably changes no output bit: every position of the 32-row query block sees a key, and
  // every score and value is finite and small enough (|score| < 9000 from the norms of q and k,
  // |v| bounded) that a left-out tile's exp(-9984 - max) terms are exactly 0 in fp32 or are
  // erased by the rescale at the row's first visible key (schedules/paged/masked_tiles.hpp).
  // Otherwise every pair is computed. false computes every pair (the same output; for tests and
  // benchmarks). The tile schedule always computes every pair.
  bool skip_masked_tiles = true;
};

// The NKI kernel's masked-score fill: a masked (query, key) pair scores -9984 (not -inf), so a
// fully masked row (padding) averages V over every key rather than giving 0.
inline constexpr float kMaskedScore = -9984.0f;

// out[0, h, i, :] = softmax_j(s_ij) · V_j over the prior context (gathered from kv_cache through
// block_tables) followed by the new tokens (key, value), where s_ij = softmax_scale · q_i · k_j
// when mask[i, j] != 0 and -9984 otherwise; query head h reads kv head h / (n_heads / n_kv_heads).
//   query    [1, n_heads, d, seq_q]       key   [1, n_kv_heads, d, seq_q]
//   value    [1, n_kv_heads, seq_q, d]    out   [1, n_heads, seq_q, d]
//   kv_cache [2, num_blocks, n_kv_heads, block_size, d]  (index 0 keys, 1 values)
//   block_tables int32 [num_active_blocks]: context token t lives in cache block
//            block_tables[t / block_size] at offset t % block_size; entries in [0, num_blocks)
//   mask     int32 [seq_q, num_active_blocks · block_size + seq_q], nonzero = attend; the context
//            columns reordered with reorder_context_mask(mask, large_tile_size, block_size)
// Constraints (the NKI kernel's): d <= 128; seq_q a multiple of 128 (and of 512 above 512, of
// 2048 above 4096); block_size a power of two <= 256; num_active_blocks · block_size a positive
// multiple of large_tile_size. As in the NKI kernel, score blocks of the new tokens' tile lying
// wholly right of a 128-row query tile's first row (blocks of min(seq_q, 512) columns) are not
// computed: they score -9984 whatever the mask says (causal masks never see them).
// dtypes: query, key, value, kv_cache and out share one of float32, bfloat16.
// Strides: any non-negative strides; out must not overlap an input.
// Cost: the tile schedule computes every (query, context) score, as the NKI kernel does; the cpu
// schedule leaves out the large tiles a 32-row query block's mask is all zero on, whenever that
// provably changes no output bit (FlashPagedAttentionOptions::skip_masked_tiles).
// Threads: the library's OpenMP pool. Errors: tilelab::Error naming the argument (or schedule
// field) with given vs allowed; nothing is written on error.
void flash_paged_attention(const TensorView& query, const TensorView& key, const TensorView& value,
                           const TensorView& kv_cache, const TensorView& block_tables,
                           const TensorView& mask, const TensorView& out,
                           const FlashPagedAttentionOptions& options = {});

// Reorders the context columns of `mask` [seq_q, context_len + seq_q] (int32) into the order the
// kernel consumes them, writing `out` (same shape, int32): within each group of 128 ·
// tiled_block_size context columns, column tb · 128 + p takes original column p · tiled_block_size
// + tb, where tiled_block_size = large_tile_size / max(128, large_tile_size / block_size). The new
// tokens' columns are copied unchanged. context_len must be a multiple of large_tile_size
// (>= 128). `out` must not overlap `mask`.
void reorder_context_mask(const TensorView& mask, std::int64_t large_tile_size,
                          std::int64_t block_size, const TensorView& out);

// Writes key[t] and value[t] ([num_tokens, n_kv_heads, d] each) into kv_cache [2, num_blocks,
// n_kv_heads, block_size, d] at slot slot_mapping[t] (int32 [num_tokens]): block slot /
// block_size, offset slot % block_size. A negative slot (vLLM's padding slot -1) is skipped;
// slots must be < num_blocks · block_size. key, value and kv_cache share one dtype (float32,
// float16, bfloat16). When two tokens name the same slot the later one wins.
void reshape_and_cache(const TensorView& key, const TensorView& value, const TensorView& kv_cache,
                       const TensorView& slot_mapping);

}  // namespace tilelab::nki
