// Flash paged attention as a tile program: the algorithm and tiling of vLLM's NKI kernel
// flash_paged_attention (vllm/attention/ops/nki_flash_attn.py), built on the simulator's builder
// from the shared PagedAttentionSchedule. The batch it runs on (block tables, mask) is in
// paged_attention_workload.hpp, included here for the callers that build both.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "schedules/paged/schedule.hpp"
#include "sim/kernels/paged_attention_workload.hpp"
#include "sim/machine.hpp"
#include "sim/program.hpp"

namespace tilelab::sim {

struct FlashPagedAttentionConfig {
  schedules::PagedAttentionSchedule schedule;
  schedules::PagedAttentionShape shape;
  int64_t num_cache_blocks = 1;  // blocks in kv_cache; every block table entry is below it
  DType dtype = DType::bf16;     // query, key, value, kv_cache and output
  // None: 1 / sqrt(head_dim); validated as the CPU kernel validates it (resolve_softmax_scale).
  std::optional<float> softmax_scale;
};

// config.schedule, validated: the schedule the kernel runs.
schedules::PagedAttentionSchedule effective_schedule(const FlashPagedAttentionConfig& config);

// How one large KV tile is gathered and in which order its tokens reach the score columns: the
// shared arithmetic of schedules/paged/kv_tiling.hpp (partitions_per_load() = keys per TensorE
// chunk).
using KvTileLayout = schedules::paged::KvGatherTiling<int64_t>;

// The gather layout of effective_schedule(config) (Error names
// `block_size_tiling_factor_override` for a factor that does not fit).
KvTileLayout kv_tile_layout(const FlashPagedAttentionConfig& config);

// For kernel score column c of a large tile (the order the tensor engine consumes keys), the
// token of the large tile it holds (KvGatherTiling::token_of_column): c = (load·tiled + t)·rows +
// p  <-  token (load·rows + p)·tiled + t. The identity when tiled_block_size is 1.
std::vector<int64_t> context_token_of_column(const KvTileLayout& layout, int64_t large_tile_size);

// The mask as the kernel reads it: the context columns of every large tile permuted by
// context_token_of_column (vLLM's reorder_context_mask); the new-token columns unchanged.
// `mask` is [query_len, context_len + query_len] row-major, 1 = attend.
std::vector<uint8_t> reorder_context_mask(const std::vector<uint8_t>& mask, int64_t query_len,
                                          int64_t context_len, const KvTileLayout& layout,
                                          int64_t large_tile_size);

// A run of the kernel on a generated batch: the batch of `requests` (block tables, mask; random
// cache block order from `seed`) and the configuration whose shape and cache size it fills in.
struct PagedAttentionRun {
  FlashPagedAttentionConfig config;
  PagedAttentionBatch batch;
};
// The configuration paged_attention_run gives, without generating the batch's block table and
// mask: what a timing-only build needs (the program does not depend on the block placement).
FlashPagedAttentionConfig paged_attention_config(const schedules::PagedAttentionSchedule& schedule,
                                                 const std::vector<PagedAttentionRequest>& requests,
                                                 int64_t num_heads, int64_t num_kv_heads,
                                                 int64_t head_dim, DType dtype);
PagedAttentionRun paged_attention_run(const schedules::PagedAttentionSchedule& schedule,
                                      const std::vector<PagedAttentionRequest>& requests,
                                      int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                                      DType dtype, uint32_t seed);

// The HBM tensors: "query" (1, n_heads, d, seq_q), "key" (1, n_kv_heads, d, seq_q), "value"
// (1, n_kv_heads, seq_q, d), "kv_cache" declared in the kernel's flattened view (2, num_blocks ·
// n_kv_heads · tiling_factor, tiled_block_size · d) — the same bytes as (2, num_blocks,
// n_kv_heads, block_size, d) —, "block_tables" (num_active_blocks,) int32, "mask" (seq_q,
// num_active_blocks · block_size + seq_q) uint8 reordered, "output" (1, n_heads, seq_q, d).
// One program runs the kernel's grid over the kv heads back to back on one NeuronCore.
// Throws tilelab::Error naming the parameter for an invalid schedule, shape or machine.
Program build_flash_paged_attention(const Machine& machine,
                                    const FlashPagedAttentionConfig& config);

}  // namespace tilelab::sim
