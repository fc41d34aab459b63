// Continuous batches for the paged-attention kernel: requests packed into query tiles and cache
// blocks, the block table and the natural-order mask.
#include "sim/kernels/paged_attention_workload.hpp"

#include <algorithm>
#include <numeric>
#include <random>

#include <tilelab/error.hpp>

#include "schedules/paged/default_problem.hpp"

namespace tilelab::sim {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

PagedAttentionBatch make_paged_attention_batch(const std::vector<PagedAttentionRequest>& requests,
                                               int64_t block_size, int64_t large_tile_size,
                                               int64_t partition_tile, uint32_t seed) {
  TILELAB_REQUIRE(!requests.empty()) << "requests: expected at least one request";
  TILELAB_REQUIRE(block_size >= 1 && large_tile_size % block_size == 0)
      << "block_size: " << block_size << " must divide large_tile_size " << large_tile_size;
  PagedAttentionBatch batch;
  int64_t queries = 0, blocks = 0;
  for (const auto& r : requests) {
    TILELAB_REQUIRE(r.query_len >= 1 && r.context_len >= 0)
        << "requests: query length must be >= 1 and context length >= 0, got " << r.query_len
        << " and " << r.context_len;
    queries += r.query_len;
    blocks += ceil_div(r.context_len, block_size);
  }
  const int64_t blocks_per_tile = large_tile_size / block_size;
  batch.query_len = std::max<int64_t>(1, ceil_div(queries, partition_tile)) * partition_tile;
  batch.num_active_blocks =
      std::max<int64_t>(1, ceil_div(blocks, blocks_per_tile)) * blocks_per_tile;
  // Spare cache blocks so that the table is a scattered choice, as in a long-running server.
  batch.num_cache_blocks = batch.num_active_blocks + batch.num_active_blocks / 2 + 1;
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
