// Continuous batches for the paged-attention kernel: requests packed into query tiles and cache
// blocks, the block table and the natural-order mask.
#include "sim/kernels/paged_attention_workload.hpp"

#include <algorithm>
#include <numeric>
#include <random>
#include <string>

#include <tilelab/error.hpp>

#include "schedules/paged/default_problem.hpp"

namespace tilelab::sim {
namespace {

// Non-negative a, positive b: no overflow for any a.
int64_t ceil_div(int64_t a, int64_t b) {
  return a / b + (a % b != 0);
}

// "prefill[i]" or "decode[i]": the request as the CLI and Python list it (query_len > 1 is a
// prefill request, as in format_paged_attention_requests).
std::string request_name(const std::vector<PagedAttentionRequest>& requests, size_t r) {
  const bool prefill = requests[r].query_len > 1;
  size_t index = 0;
  for (size_t i = 0; i < r; ++i) index += (requests[i].query_len > 1) == prefill;
  return std::string(prefill ? "prefill[" : "decode[") + std::to_string(index) + "]";
}

}  // namespace

int64_t padded_query_rows(const schedules::PagedAttentionTiling& tiling, int64_t rows) {
  tiling.validate();
  const int64_t step = tiling.partition_tile;
  TILELAB_REQUIRE(rows >= 0 && rows <= kMaxBatchQueryRows)
      << "query rows: expected 0 to " << kMaxBatchQueryRows << ", got " << rows;
  // A shape valid in everything but query_len, so that validate(shape) judges query_len alone.
  schedules::PagedAttentionShape shape;
  shape.num_active_blocks = tiling.num_blocks_per_large_tile();
  int64_t query_len = std::max<int64_t>(1, ceil_div(rows, step)) * step;
  // The required multiple is at most a few free tiles; give up (rethrow) well beyond that.
  for (int attempt = 0;; ++attempt, query_len += step) {
    shape.query_len = query_len;
    try {
      tiling.validate(shape);
      return query_len;
    } catch (const Error&) {
      if (attempt >= 256) throw;
    }
  }
}

PagedAttentionBatch make_paged_attention_batch(const std::vector<PagedAttentionRequest>& requests,
                                               int64_t block_size, int64_t large_tile_size,
                                               int64_t partition_tile, uint32_t seed) {
  schedules::PagedAttentionTiling tiling;
  tiling.block_size = block_size;
  tiling.large_tile_size = large_tile_size;
  tiling.partition_tile = partition_tile;
  return make_paged_attention_batch(requests, tiling, seed);
}

PagedAttentionBatchShape paged_attention_batch_shape(
    const std::vector<PagedAttentionRequest>& requests,
    const schedules::PagedAttentionTiling& tiling) {
  TILELAB_REQUIRE(!requests.empty()) << "requests: expected at least one request";
  const int64_t block_size = tiling.block_size, large_tile_size = tiling.large_tile_size;
  TILELAB_REQUIRE(block_size >= 1 && large_tile_size % block_size == 0)
      << "block_size: " << block_size << " must divide large_tile_size " << large_tile_size;
  // Totals are checked after each request; each term is within its limit, so no sum overflows.
  int64_t queries = 0, context_tokens = 0, blocks = 0;
  for (size_t r = 0; r < requests.size(); ++r) {
    const PagedAttentionRequest& req = requests[r];
    TILELAB_REQUIRE(req.query_len >= 1 && req.context_len >= 0)
        << request_name(requests, r) << ": query length must be >= 1 and context length >= 0, got "
        << req.query_len << " and " << req.context_len;
    TILELAB_REQUIRE(req.query_len <= kMaxBatchQueryRows - queries)
        << request_name(requests, r) << ": query length " << req.query_len
        << " brings the batch's query rows above the limit of " << kMaxBatchQueryRows;
    TILELAB_REQUIRE(req.context_len <= kMaxBatchContextTokens - context_tokens)
        << request_name(requests, r) << ": context length " << req.context_len
        << " brings the batch's context above the limit of " << kMaxBatchContextTokens << " tokens";
    queries += req.query_len;
    context_tokens += req.context_len;
    blocks += ceil_div(req.context_len, block_size);
  }
  PagedAttentionBatchShape batch;
  const int64_t blocks_per_tile = large_tile_size / block_size;
  batch.query_len = padded_query_rows(tiling, queries);
  batch.num_active_blocks =
      std::max<int64_t>(1, ceil_div(blocks, blocks_per_tile)) * blocks_per_tile;
  // Both factors are below 2^31 here, so the product does not overflow.
  const int64_t mask_bytes =
      batch.query_len * (batch.num_active_blocks * block_size + batch.query_len);
  TILELAB_REQUIRE(mask_bytes <= kMaxBatchMaskBytes)
      << "prefill, decode: the batch's mask (" << batch.query_len << " query rows x "
      << batch.num_active_blocks * block_size + batch.query_len << " columns = " << mask_bytes
      << " bytes) exceeds the limit of " << kMaxBatchMaskBytes << " bytes";
  // Spare cache blocks so that the table is a scattered choice, as in a long-running server.
  batch.num_cache_blocks = batch.num_active_blocks + batch.num_active_blocks / 2 + 1;
  return batch;
}

PagedAttentionBatch make_paged_attention_batch(const std::vector<PagedAttentionRequest>& requests,
                                               const schedules::PagedAttentionTiling& tiling,
                                               uint32_t seed) {
  const PagedAttentionBatchShape shape = paged_attention_batch_shape(requests, tiling);
  const int64_t block_size = tiling.block_size;
  int64_t blocks = 0;
  for (const PagedAttentionRequest& req : requests) blocks += ceil_div(req.context_len, block_size);
  PagedAttentionBatch batch;
  batch.query_len = shape.query_len;
  batch.num_active_blocks = shape.num_active_blocks;
  batch.num_cache_blocks = shape.num_cache_blocks;
  std::vector<int32_t> free_blocks(static_cast<size_t>(batch.num_cache_blocks));
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  batch.block_tables.assign(static_cast<size_t>(batch.num_active_blocks), 0);
  for (int64_t i = 0; i < blocks; ++i) batch.block_tables[size_t(i)] = free_blocks[size_t(i)];
  // Padding entries point at a real block (any row may be read) and are masked out.
  for (int64_t i = blocks; i < batch.num_active_blocks; ++i)
    batch.block_tables[size_t(i)] = free_blocks[size_t(blocks % batch.num_cache_blocks)];

  const int64_t context = batch.num_active_blocks * block_size;
  const int64_t columns = context + batch.query_len;
  batch.mask.assign(size_t(batch.query_len * columns), 0);
  batch.request_of_row.assign(size_t(batch.query_len), -1);
  int64_t row0 = 0, block0 = 0;
  for (size_t r = 0; r < requests.size(); ++r) {
    const auto& req = requests[r];
    for (int64_t j = 0; j < req.query_len; ++j) {
      const int64_t row = row0 + j;
      batch.request_of_row[size_t(row)] = int64_t(r);
      uint8_t* line = &batch.mask[size_t(row * columns)];
      for (int64_t t = 0; t < req.context_len; ++t) line[block0 * block_size + t] = 1;
      for (int64_t k = 0; k <= j; ++k) line[context + row0 + k] = 1;  // causal among new tokens
    }
    row0 += req.query_len;
    block0 += ceil_div(req.context_len, block_size);
  }
  return batch;
}

std::vector<PagedAttentionRequest> default_paged_attention_requests() {
  std::vector<PagedAttentionRequest> requests;
  for (const auto& r : schedules::paged::kDefaultRequests)
    requests.push_back({r.query_len, r.context_len});
  return requests;
}

std::string format_paged_attention_requests(const std::vector<PagedAttentionRequest>& requests,
                                            bool prefill) {
  std::string out;
  for (const auto& r : requests) {
    if ((r.query_len > 1) != prefill) continue;
    if (!out.empty()) out += ",";
    out += prefill ? std::to_string(r.query_len) + ":" + std::to_string(r.context_len)
                   : std::to_string(r.context_len);
  }
  return out;
}

}  // namespace tilelab::sim
