// The validated, normalized form of one paged_attention call, shared by the dispatcher, the
// dense-kernel route and the paged kernel.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "score_options.hpp"
#include "tilelab/paged.hpp"

namespace tilelab::detail {

struct PagedProblem {
  TensorView query, key_cache, value_cache, out;  // [T, Hq, D], [NB, Hkv, bs, D] x2, [T, Hq, D]
  DType dtype = DType::f32;                       // query and out
  DType cache_dtype = DType::f32;                 // key_cache and value_cache
  std::int64_t num_tokens = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  std::int64_t num_blocks = 0, block_size = 0, num_seqs = 0;
  // Copies of the int32 inputs, checked: seq_lens[s] >= q_len(s), and the block table's used
  // entries (the first ceil(seq_len / block_size) of each row) are in [0, num_blocks).
  std::vector<std::int64_t> seq_lens, query_starts;  // [num_seqs], [num_seqs + 1]
  std::vector<std::int32_t> block_table;             // [num_seqs][max_blocks_per_seq], dense
  std::int64_t max_blocks_per_seq = 0;
  float scale = 1.0f;  // the softmax scale, before k_scale
  bool causal = true;
  ResolvedScoreOptions score;
  float k_scale = 1.0f, v_scale = 1.0f;
  // Added to every query position (paged_attention: 0, queries are the sequence's last
  // positions; flash_attention with top-left alignment: -(N - M)).
  std::int64_t position_shift = 0;
  // When set: fp32 [num_tokens, Hq], receives each row's natural-log sum-exp (sinks included),
  // -inf for a row that saw no key.
  std::optional<TensorView> lse;
  std::int64_t split_kv = 0;
  bool fp32_probabilities = false;  // PagedAttentionOptions::fp32_probabilities
  // Sequences computed elsewhere (nonzero entries; empty: none), which the paged kernel skips.
  std::vector<char> computed_elsewhere;
  // Which query heads see which blocks of their sequence's table (block-sparse decode whose heads
  // keep different blocks): nonzero when query head h sees logical block b of sequence s, at
  // [(s * max_blocks_per_seq + b) * q_heads + h], so that a GQA group's heads are side by side.
  // Empty: every head sees every block.
  std::vector<std::uint8_t> head_sees_block;
  // Elements added per sequence to the address of a query, out and lse row: token t of
  // sequence s is at s * seq_stride + t * stride(0). 0 for paged_attention's packed tokens; a
  // batched dense call uses it to address q[b] without a uniform token stride across b.
  std::int64_t query_seq_stride = 0, out_seq_stride = 0, lse_seq_stride = 0;

  std::int64_t q_len(std::int64_t seq) const { return query_starts[seq + 1] - query_starts[seq]; }
  // The absolute position of the sequence's first query token.
  std::int64_t first_query_position(std::int64_t seq) const {
    return seq_lens[seq] - q_len(seq) + position_shift;
  }
  std::int32_t physical_block(std::int64_t seq, std::int64_t logical_block) const {
    return block_table[seq * max_blocks_per_seq + logical_block];
  }
  // head_sees_block's entries of logical block `logical_block` of `seq`, from query head
  // `first_head` on (head_sees_block must not be empty).
  const std::uint8_t* heads_seeing_block(std::int64_t seq, std::int64_t logical_block,
                                         std::int64_t first_head) const {
    return &head_sees_block[(seq * max_blocks_per_seq + logical_block) * q_heads + first_head];
  }
  // Keys [begin, end) that query position i sees (end <= begin when none). (Window sides are
  // compared before they are added or subtracted: they may be as large as int64 allows.)
  std::int64_t first_visible_key(std::int64_t position) const {
    const std::int64_t left = score.window.left;
    return left >= 0 && left < position ? position - left : 0;
  }
  std::int64_t visible_key_end(std::int64_t seq, std::int64_t position) const {
    std::int64_t end = seq_lens[seq];
    if (causal) end = std::min(end, position + 1);
    const std::int64_t right = score.window.right;
    if (right >= 0 && right < end - position - 1) end = position + right + 1;
    return end;
  }
};

// Checks every argument of paged_attention (ranks, shapes, dtypes, strides, the int32 arrays'
// contents, options, aliasing of out) and returns the normalized problem. Throws tilelab::Error
// naming the argument.
PagedProblem validate_paged_attention(const TensorView& query, const TensorView& key_cache,
                                      const TensorView& value_cache, const TensorView& block_table,
                                      const TensorView& seq_lens, const TensorView& query_start_loc,
                                      const TensorView& out, const PagedAttentionOptions& options);

// Prefill on the generated dense kernels (paged_prefill.cpp): which sequences they take (those
// with enough query rows per kv head, when the call has no score options and no lse, and its cache
// has the query's dtype or is fp8 with bf16 or fp32 queries), and running them, each sequence's
// K/V gathered into contiguous rows of the query's dtype first. A sequence whose V holds NaN or
// inf is left to the paged kernel: its entry of `sequences` is cleared.
std::vector<char> sequences_for_generated_prefill(const PagedProblem& problem);
void generated_prefill_attention(const PagedProblem& problem, std::vector<char>& sequences);

// The paged kernel: reads K/V in place through the block table; OpenMP over (sequence, kv head,
// query rows, key piece) work items, the GQA group's query heads folded so each K/V element is read
// once per item.
void paged_kernel_attention(const PagedProblem& problem);

}  // namespace tilelab::detail
