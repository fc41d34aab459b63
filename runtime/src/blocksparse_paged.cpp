// Block-sparse decode on the paged kernel (paged_kernel.cpp): each sequence's one query reads the
// keys of its layout row's blocks through a block table, so its streamed micro-kernels read K and V
// in place, as they do for flash_attention's decode. The generated decode kernels reduce every
// score horizontally and read a key tile without prefetching: measured side by side on Zen 4 (B8
// Hq32 Hkv8 N4096 D128, dense decode), they took 1.4-1.75x as long as the streamed kernels, and
// block-sparse K/V ([total_k, Hkv, D], each kv head's rows Hkv·D elements apart) made both slower.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "blocksparse_problem.hpp"
#include "paged_stream.hpp"

namespace tilelab::detail {
namespace {

// The key blocks some layout head keeps in layout row `row_block`, sorted, and whether every layout
// head keeps all of them. Every layout head is some query head's (BlockSparseProblem::layout_head),
// so the layout's heads stand for the query heads'.
std::pair<std::vector<std::int32_t>, bool> blocks_some_head_keeps(const BlockSparseLayout& layout,
                                                                  std::int64_t row_block) {
  const std::span<const std::int32_t> first = layout.columns(0, row_block);
  std::vector<std::int32_t> blocks(first.begin(), first.end());
  bool every_head_keeps_all = true;
  for (std::int64_t head = 1; head < layout.n_heads(); ++head) {
    const std::span<const std::int32_t> other = layout.columns(head, row_block);
    if (std::equal(first.begin(), first.end(), other.begin(), other.end())) continue;
    every_head_keeps_all = false;
    std::vector<std::int32_t> merged;
    std::set_union(blocks.begin(), blocks.end(), other.begin(), other.end(),
                   std::back_inserter(merged));
    blocks.swap(merged);
  }
  return {std::move(blocks), every_head_keeps_all};
}

}  // namespace

std::optional<PagedProblem> blocksparse_decode_as_paged(const BlockSparseProblem& p) {
  // One query per sequence (q_len 1, or 0): the decode that the streamed kernels serve.
  if (p.max_q_len > 1 || !cpu_streams_cache_rows()) return std::nullopt;
  // The streamed kernels read rows whose head dim is contiguous; block-table entries are int32.
  if (p.k.stride(2) != 1 || p.v.stride(2) != 1 ||
      p.total_k > std::numeric_limits<std::int32_t>::max()) {
    return std::nullopt;
  }
  const BlockSparseLayout& layout = *p.layout;
  const std::int64_t block_size = layout.block_size();
  PagedProblem paged;
  paged.seq_lens.resize(p.num_seqs);
  std::vector<std::vector<std::int32_t>> columns(p.num_seqs);  // the listed blocks
  std::vector<std::int64_t> row_blocks(p.num_seqs);
  bool heads_differ = false;
  for (std::int64_t s = 0; s < p.num_seqs; ++s) {
    if (p.q_len(s) == 0) continue;
    // The query sits at the sequence's last position k_len - 1: every key of its row's kept
    // blocks before k_len is visible (a causal layout keeps no block right of the row), so the
    // blocks some head keeps are listed in order as one logical sequence, of which only the last
    // may be partial (the block holding k_len - 1). A block is named by the token of its first key.
    const std::int64_t k_len = p.k_len(s);
    row_blocks[s] = (k_len - 1) / block_size;
    const auto [blocks, every_head_keeps_all] = blocks_some_head_keeps(layout, row_blocks[s]);
    heads_differ = heads_differ || !every_head_keeps_all;
    for (const std::int32_t column : blocks) {
      const std::int64_t first_key = column * block_size;
      if (first_key >= k_len) break;
      columns[s].push_back(column);
      paged.seq_lens[s] += std::min(block_size, k_len - first_key);
    }
  }
  paged.dtype = paged.cache_dtype = p.dtype;
  paged.num_tokens = p.total_q;
  paged.q_heads = p.q_heads;
  paged.kv_heads = p.kv_heads;
  paged.head_dim = p.head_dim;
  paged.num_seqs = p.num_seqs;
  paged.block_size = block_size;
  paged.num_blocks = p.total_k;
  paged.query_starts.assign(p.q_starts.begin(), p.q_starts.end());
  paged.max_blocks_per_seq = 1;
  for (const auto& listed : columns) {
    paged.max_blocks_per_seq =
        std::max(paged.max_blocks_per_seq, static_cast<std::int64_t>(listed.size()));
  }
  paged.block_table.assign(p.num_seqs * paged.max_blocks_per_seq, 0);
  for (std::int64_t s = 0; s < p.num_seqs; ++s) {
    for (std::size_t b = 0; b < columns[s].size(); ++b) {
      paged.block_table[s * paged.max_blocks_per_seq + static_cast<std::int64_t>(b)] =
          static_cast<std::int32_t>(p.k_starts[s] + columns[s][b] * block_size);
    }
  }
  if (heads_differ) {
    // Which query heads keep which of the listed blocks: a GQA group is read once, over the
    // blocks some head of it keeps, and each head folds in only its own.
    paged.head_sees_block.assign(p.num_seqs * paged.max_blocks_per_seq * p.q_heads, 0);
    for (std::int64_t s = 0; s < p.num_seqs; ++s) {
      for (std::int64_t h = 0; h < p.q_heads; ++h) {
        const std::span<const std::int32_t> kept = layout.columns(p.layout_head(h), row_blocks[s]);
        for (std::size_t b = 0; b < columns[s].size(); ++b) {
          paged.head_sees_block[(s * paged.max_blocks_per_seq + static_cast<std::int64_t>(b)) *
                                    p.q_heads +
                                h] = std::binary_search(kept.begin(), kept.end(), columns[s][b]);
        }
      }
    }
  }
  // Every listed key is visible to the sequence's query (above); a query whose row keeps no block
  // sees none and gives 0, as a paged row that no key reached.
  paged.causal = false;
  paged.scale = p.scale;
  paged.fp32_probabilities = p.fp32_probabilities;
  // Results that do not depend on the thread count: no split-KV (its pieces follow the threads).
  paged.split_kv = 1;
  paged.query = p.q;
  paged.out = p.out;
  // The cache as blocks that start at any token: block b, slot i of kv head h is token b + i.
  const auto as_cache = [&](const TensorView& kv) {
    return TensorView(kv.data(), kv.dtype(), {p.total_k, p.kv_heads, block_size, p.head_dim},
                      {kv.stride(0), kv.stride(1), kv.stride(0), 1});
  };
  paged.key_cache = as_cache(p.k);
  paged.value_cache = as_cache(p.v);
  return paged;
}

}  // namespace tilelab::detail
