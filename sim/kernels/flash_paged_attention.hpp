// Flash paged attention as a tile program: the algorithm and tiling of vLLM's NKI kernel
// flash_paged_attention (vllm/attention/ops/nki_flash_attn.py), built on the simulator's builder
// from the shared PagedAttentionSchedule, plus the batch (block tables, mask) it runs on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "schedules/paged_attention_schedule.hpp"
#include "sim/machine.hpp"
#include "sim/program.hpp"

namespace tilelab::sim {

struct FlashPagedAttentionConfig {
  schedules::PagedAttentionSchedule schedule;
  schedules::PagedAttentionShape shape;
  int64_t num_cache_blocks = 1;  // blocks in kv_cache; every block table entry is below it
  DType dtype = DType::bf16;     // query, key, value, kv_cache and output
  float softmax_scale = 0;       // 0: 1 / sqrt(head_dim)
};

// config.schedule, validated: the schedule the kernel runs.
schedules::PagedAttentionSchedule effective_schedule(const FlashPagedAttentionConfig& config);

// How one large KV tile is gathered and in which order its tokens reach the score columns.
struct KvTileLayout {
  int64_t tiling_factor = 1;     // pieces per cache block
  int64_t tiled_block_size = 1;  // tokens per partition per gather
  int64_t rows_per_load = 1;     // partitions one gather spans = keys per TensorE chunk
  int64_t loads = 1;             // gathers per large tile, for K and for V each
};

// The gather layout of effective_schedule(config) (Error names
// `block_size_tiling_factor_override` for a factor that does not fit).
KvTileLayout kv_tile_layout(const FlashPagedAttentionConfig& config);

// For kernel score column c of a large tile (the order the tensor engine consumes keys), the
// token of the large tile it holds: c = (load·tiled + t)·rows + p  <-  token (load·rows + p)·tiled
// + t. The identity when tiled_block_size is 1.
std::vector<int64_t> context_token_of_column(const KvTileLayout& layout, int64_t large_tile_size);

// The mask as the kernel reads it: the context columns of every large tile permuted by
// context_token_of_column (vLLM's reorder_context_mask); the new-token columns unchanged.
// `mask` is [query_len, context_len + query_len] row-major, 1 = attend.
std::vector<uint8_t> reorder_context_mask(const std::vector<uint8_t>& mask, int64_t query_len,
                                          int64_t context_len, const KvTileLayout& layout,
                                          int64_t large_tile_size);

// The HBM tensors: "query" (1, n_heads, d, seq_q), "key" (1, n_kv_heads, d, seq_q), "value"
// (1, n_kv_heads, seq_q, d), "kv_cache" declared in the kernel's flattened view (2, num_blocks ·
// n_kv_heads · tiling_factor, tiled_block_size · d) — the same bytes as (2, num_blocks,
// n_kv_heads, block_size, d) —, "block_tables" (num_active_blocks,) int32, "mask" (seq_q,
// num_active_blocks · block_size + seq_q) uint8 reordered, "output" (1, n_heads, seq_q, d).
// One program runs the kernel's grid over the kv heads back to back on one NeuronCore.
// Throws tilelab::Error naming the parameter for an invalid schedule, shape or machine.
Program build_flash_paged_attention(const Machine& machine,
                                    const FlashPagedAttentionConfig& config);

// One request of a continuous batch: new tokens and prior context.
struct PagedAttentionRequest {
  int64_t query_len = 1;
  int64_t context_len = 0;
};

// A batch laid out for the kernel: queries concatenated (padded to whole partition tiles), each
// request's context in its own cache blocks (a shuffled, deterministic choice of blocks), the
// block table padded to whole large tiles, and the natural-order mask (1 = attend; a request's
// query attends its own context and, causally, its own earlier new tokens; padding attends none).
struct PagedAttentionBatch {
  int64_t query_len = 0;  // seq_q after padding
  int64_t num_active_blocks = 0;
  int64_t num_cache_blocks = 0;
  std::vector<int32_t> block_tables;
  std::vector<uint8_t> mask;            // [query_len, num_active_blocks·block_size + query_len]
  std::vector<int64_t> request_of_row;  // request of each query row, -1 for padding
};

PagedAttentionBatch make_paged_attention_batch(const std::vector<PagedAttentionRequest>& requests,
                                               int64_t block_size, int64_t large_tile_size,
                                               int64_t partition_tile, uint32_t seed);

// The default workload of `tilelab sim paged-attention` (see its --help).
std::vector<PagedAttentionRequest> default_paged_attention_requests();

// The CLI's request parameter values: "QUERY_LEN:CONTEXT_LEN,..." of the prefill requests
// (prefill = true) or "CONTEXT_LEN,..." of the decode requests (query length 1).
std::string format_paged_attention_requests(const std::vector<PagedAttentionRequest>& requests,
                                            bool prefill);

}  // namespace tilelab::sim
