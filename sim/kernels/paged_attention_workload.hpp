// The workload of the paged-attention kernel: a continuous batch of requests laid out as the
// kernel's inputs (cache blocks, block table, mask), and the default batch of the CLI.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "schedules/paged/schedule.hpp"

namespace tilelab::sim {

// One request of a continuous batch: new tokens and prior context.
struct PagedAttentionRequest {
  int64_t query_len = 1;
  int64_t context_len = 0;
};

// The sizes of a batch: all a timing-only build needs (the kernel's program depends on them, not
// on which blocks the table names or on the mask).
struct PagedAttentionBatchShape {
  int64_t query_len = 0;  // seq_q after padding
  int64_t num_active_blocks = 0;
  int64_t num_cache_blocks = 0;
};

// A batch laid out for the kernel: queries concatenated (padded as padded_query_rows says), each
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

// Limits of a batch, checked before anything is allocated: new tokens of all requests (query
// rows), prior-context tokens of all requests, and mask bytes (query rows x columns after
// padding). Errors name the request ("prefill[i]" / "decode[i]", counted as
// format_paged_attention_requests lists them) and the limit.
inline constexpr int64_t kMaxBatchQueryRows = int64_t{1} << 20;
inline constexpr int64_t kMaxBatchContextTokens = int64_t{1} << 30;
inline constexpr int64_t kMaxBatchMaskBytes = int64_t{1} << 31;

// The batch of `requests` for `tiling` (a valid tiling: block_size, large_tile_size, and the
// query-row multiples its validate(shape) requires).
PagedAttentionBatch make_paged_attention_batch(const std::vector<PagedAttentionRequest>& requests,
                                               const schedules::PagedAttentionTiling& tiling,
                                               uint32_t seed);
// The shape make_paged_attention_batch gives the batch, with the same checks and errors, without
// laying out the block table and the mask (query rows x columns bytes).
PagedAttentionBatchShape paged_attention_batch_shape(
    const std::vector<PagedAttentionRequest>& requests,
    const schedules::PagedAttentionTiling& tiling);
// The same with the default tiling's other fields.
PagedAttentionBatch make_paged_attention_batch(const std::vector<PagedAttentionRequest>& requests,
                                               int64_t block_size, int64_t large_tile_size,
                                               int64_t partition_tile, uint32_t seed);

// The smallest query length >= `rows` (and >= one partition tile) that `tiling` accepts: a
// multiple of partition_tile, and above free_tile a multiple of the pieces the new tokens' tile
// is transposed and reduced in (PagedAttentionTiling::validate(shape) is the rule).
int64_t padded_query_rows(const schedules::PagedAttentionTiling& tiling, int64_t rows);

// The default workload of `tilelab sim paged-attention` (see its --help).
std::vector<PagedAttentionRequest> default_paged_attention_requests();

// The CLI's request parameter values: "QUERY_LEN:CONTEXT_LEN,..." of the prefill requests
// (prefill = true) or "CONTEXT_LEN,..." of the decode requests (query length 1).
std::string format_paged_attention_requests(const std::vector<PagedAttentionRequest>& requests,
                                            bool prefill);

}  // namespace tilelab::sim
