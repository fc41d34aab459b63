// The validated, normalized form of one blocksparse_attention call, shared by the dispatcher, the
// generated-kernel path and the reference implementation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "paged_problem.hpp"
#include "tilelab/blocksparse.hpp"

namespace tilelab::detail {

struct BlockSparseProblem {
  TensorView q, k, v, out;  // [total_q, Hq, D], [total_k, Hkv, D] x2, [total_q, Hq, D]
  TensorView cu_seqlens_q, cu_seqlens_k;  // int32 [num_seqs + 1], as given
  // The prefix sums read once from cu_seqlens_q / cu_seqlens_k (validated): sequence s has
  // queries [q_starts[s], q_starts[s + 1]) and keys [k_starts[s], k_starts[s + 1]).
  std::vector<std::int32_t> q_starts, k_starts;
  const BlockSparseLayout* layout = nullptr;  // the caller's, alive for the call
  DType dtype = DType::f32;
  std::int64_t num_seqs = 0, total_q = 0, total_k = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  std::int64_t max_q_len = 0, max_k_len = 0;
  float scale = 1.0f;
  bool fp32_probabilities = false;  // BlockSparseAttentionOptions::fp32_probabilities

  // The layout head query head h uses: h (one layout head per query head), its kv head (one per kv
  // head), or 0 (a single-head layout).
  std::int64_t layout_head(std::int64_t q_head) const {
    if (layout->n_heads() == q_heads) return q_head;
    return layout->n_heads() == kv_heads ? q_head / (q_heads / kv_heads) : 0;
  }
  std::int64_t q_len(std::int64_t seq) const { return q_starts[seq + 1] - q_starts[seq]; }
  std::int64_t k_len(std::int64_t seq) const { return k_starts[seq + 1] - k_starts[seq]; }
};

// Checks every argument of blocksparse_attention (ranks, shapes, dtypes, GQA divisibility, layout
// heads and coverage, cu_seqlens values, strides, aliasing of out, scale) and returns the
// normalized problem. Throws tilelab::Error naming the argument.
BlockSparseProblem validate_blocksparse_attention(
    const TensorView& q, const TensorView& k, const TensorView& v, const BlockSparseLayout& layout,
    const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, const TensorView& out,
    const BlockSparseAttentionOptions& options);

// The reference implementation: OpenMP over (sequence, query head, query block), fp32 accumulation
// with online softmax over the layout's key blocks only; any strides. Writes out.
void reference_blocksparse_attention(const BlockSparseProblem& problem);

// Runs the generated Halide kernel; false when the problem is outside what the generated kernels
// cover or none were built (then nothing is written).
bool generated_blocksparse_attention(const BlockSparseProblem& problem);

// Decode (every sequence's q_len <= 1) on a CPU that runs the streamed micro-kernels, as a paged
// problem for paged_kernel_attention: the blocks some query head keeps as block tables over K and
// V in place, and which heads keep which of them where heads differ (PagedProblem::
// head_sees_block). Nothing for any other problem (blocksparse_paged.cpp).
std::optional<PagedProblem> blocksparse_decode_as_paged(const BlockSparseProblem& problem);

// The names of the generated kernels generated_blocksparse_attention runs for the problem, sorted
// (empty when it has nothing to compute); nullopt when it would return false.
std::optional<std::vector<std::string>> generated_blocksparse_kernels(
    const BlockSparseProblem& problem);

}  // namespace tilelab::detail
