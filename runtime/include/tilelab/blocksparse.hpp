// Block-sparse attention: a per-head CSR layout of kept (query block, key block) pairs, and
// attention over packed variable-length sequences that visits only the kept blocks.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tilelab/attention.hpp"
#include "tilelab/tensor.hpp"

namespace tilelab {

// Which key blocks each query block attends to, per head, over absolute token positions split into
// blocks of `block_size` tokens: query block qb covers positions [qb·block_size, (qb+1)·block_size)
// and so does key block qb. The layout is square: num_row_blocks query blocks and as many key
// blocks, enough for sequences of up to num_row_blocks · block_size tokens.
//
// Storage (int32, row-major), per head h:
//   crow [n_heads, num_row_blocks + 1]: crow[h][0] = 0, non-decreasing; the key blocks of row qb
//     are col[h][crow[h][qb] .. crow[h][qb + 1]).
//   col  [n_heads, nnz_max]: nnz_max = the largest crow[h][num_row_blocks]; each head's row of col
//     holds its crow[h][num_row_blocks] column indices first, then -1 padding (ignored).
// Within a row the column indices are sorted, unique and in [0, num_row_blocks).
//
// causal: key j is visible to query i only when j <= i (positions), also inside the diagonal
// blocks, and no kept block lies above the diagonal (col <= row). A non-causal layout may keep any
// block and applies no mask inside blocks.
//
// density(): kept blocks / candidate blocks, over all heads: the candidates are the blocks on or
// below the diagonal, n_heads · R(R+1)/2, for a causal layout, and all n_heads · R² blocks
// otherwise (R = num_row_blocks). It is the fraction of a dense (causal) block-wise kernel's work
// a kernel that skips absent blocks does, which is what the benchmark compares times against.
class BlockSparseLayout {
 public:
  // From CSR arrays, laid out as above (`crow` has n_heads · (num_row_blocks + 1) entries, `col`
  // n_heads · nnz_max entries; padding past a head's last column may hold any value and is stored
  // as -1). Throws tilelab::Error naming the array, the head and the row on any violation: sizes,
  // crow[h][0] = 0 and monotone, columns sorted, unique, in range, and none above the diagonal
  // when causal.
  BlockSparseLayout(std::int64_t n_heads, std::int64_t block_size, std::vector<std::int32_t> crow,
                    std::vector<std::int32_t> col, bool causal = true);

  // Local plus vertically strided blocks (Phi-3-small, vLLM): key block kb is kept for query block
  // qb of head h iff qb >= kb and (qb - kb < local_blocks or (kb + h·step + 1) % vert_stride == 0),
  // where step = 0 when homo_head, else head_sliding_step when given, else
  // max(1, vert_stride / n_heads). num_row_blocks = ceil(max_seqlen / block_size). Causal. With
  // homo_head every head has the same blocks (the layout still has n_heads heads).
  static BlockSparseLayout local_strided(std::int64_t n_heads, std::int64_t max_seqlen,
                                         std::int64_t block_size, std::int64_t local_blocks,
                                         std::int64_t vert_stride, bool homo_head = false,
                                         std::optional<std::int64_t> head_sliding_step = {});

  // From a block mask [n_heads, num_blocks, num_blocks], row-major, nonzero = kept (query block,
  // key block). Validated like the CSR constructor (a causal layout keeps nothing above the
  // diagonal).
  static BlockSparseLayout from_dense(const std::vector<std::uint8_t>& block_mask,
                                      std::int64_t n_heads, std::int64_t num_blocks,
                                      std::int64_t block_size, bool causal = true);

  // The block mask [n_heads, num_row_blocks, num_row_blocks], row-major, 1 = kept.
  std::vector<std::uint8_t> to_dense() const;

  // Token-level mask [seqlen, seqlen] of `head` for a sequence of seqlen tokens, row-major,
  // 1 = query i (row) sees key j (column): the block of (i, j) is kept and, when causal, j <= i.
  // A sequence whose queries are its last q_len tokens uses the last q_len rows.
  // Error unless head in [0, n_heads) and seqlen in [0, num_row_blocks · block_size].
  std::vector<std::uint8_t> token_mask(std::int64_t head, std::int64_t seqlen) const;

  // See the class comment.
  double density() const;

  std::int64_t n_heads() const { return n_heads_; }
  std::int64_t block_size() const { return block_size_; }
  std::int64_t num_row_blocks() const { return num_row_blocks_; }
  // The longest sequence the layout covers: num_row_blocks · block_size tokens.
  std::int64_t max_seqlen() const { return num_row_blocks_ * block_size_; }
  std::int64_t nnz_max() const { return nnz_max_; }
  bool causal() const { return causal_; }
  // Kept blocks of one head.
  std::int64_t nnz(std::int64_t head) const;
  // The whole arrays, laid out as in the class comment.
  const std::vector<std::int32_t>& crow() const { return crow_; }
  const std::vector<std::int32_t>& col() const { return col_; }
  // The key blocks of (head, row block), sorted; no bounds checks beyond the layout's own.
  std::span<const std::int32_t> columns(std::int64_t head, std::int64_t row_block) const {
    const std::int32_t* head_crow = &crow_[head * (num_row_blocks_ + 1)];
    return {&col_[head * nnz_max_ + head_crow[row_block]],
            static_cast<std::size_t>(head_crow[row_block + 1] - head_crow[row_block])};
  }

 private:
  std::int64_t n_heads_ = 0, block_size_ = 0, num_row_blocks_ = 0, nnz_max_ = 0;
  bool causal_ = true;
  std::vector<std::int32_t> crow_, col_;
};

struct BlockSparseAttentionOptions {
  // Multiplies q·k before the softmax; default 1/sqrt(D). Must be finite.
  std::optional<float> scale;
  // bf16: keep P in fp32 instead of rounding it to bf16 for bf16 dot products (the meaning of
  // FlashAttentionOptions::fp32_probabilities).
  bool fp32_probabilities = false;
  Implementation implementation = Implementation::automatic;
};

// Block-sparse attention over packed variable-length sequences.
//   q [total_q, Hq, D], k and v [total_k, Hkv, D], out [total_q, Hq, D]; one dtype of f32, f16,
//   bf16 for all four (accumulation fp32); 1 <= D <= 256; Hq a multiple of Hkv (query head h reads
//   kv head h / (Hq / Hkv)); non-negative strides; out disjoint from itself and the inputs.
//   cu_seqlens_q, cu_seqlens_k: int32 [num_seqs + 1] prefix sums: entry 0 is 0, non-decreasing,
//   the last is total_q (total_k). Sequence s has queries q[cu_q[s] .. cu_q[s+1]) and keys
//   k[cu_k[s] .. cu_k[s+1]); q_len <= k_len, and k_len <= layout.max_seqlen().
//   Positions: sequence s's keys are positions 0 .. k_len - 1 and its queries are its last q_len
//   positions (bottom-right alignment): query r sits at position k_len - q_len + r. q_len = 1 is
//   decode.
//   Layout: layout.n_heads() is Hq, Hkv or 1, and query head h uses layout head h, its kv head
//   h / (Hq / Hkv), or head 0 respectively (a layout of Hkv heads slides the strided pattern by kv
//   head, as vLLM's negative head_sliding_step does). Query position i sees key position j iff
//   block (i / block_size, j / block_size) is kept for that head and, for a causal layout, j <= i.
//   Absent blocks are never read.
//   Masking and non-finite values as flash_attention: only the layout masks a key; NaN or +inf
//   scores give NaN rows, a row whose visible scores are all -inf is NaN, and a row with no
//   visible key (its query block keeps no block, or only blocks past k_len) gives out 0.
// Throws tilelab::Error naming the argument on any invalid input; on error nothing is written.
void blocksparse_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                           const BlockSparseLayout& layout, const TensorView& cu_seqlens_q,
                           const TensorView& cu_seqlens_k, const TensorView& out,
                           const BlockSparseAttentionOptions& options = {});

// The generated kernels blocksparse_attention runs for these arguments (options.implementation
// included), by name, sorted: one per variant the call's sequences take (e.g.
// {"blocksparse_bf16_decode", "blocksparse_bf16_prefill_fp32_probabilities_tall"}; the target
// <name>_listings writes a kernel's lowered statement and assembly to listings/<name>.stmt and .s
// in the build's generators directory). Under Implementation::automatic, {"paged"} for decode (one
// query per sequence), which runs on the paged kernel's streamed micro-kernels on CPUs with AVX2,
// FMA and F16C. Empty when the call runs on the reference (always, under
// Implementation::reference). The choice may depend on num_threads(). Validates like
// blocksparse_attention and throws what it throws, including for Implementation::generated on a
// call no generated kernel covers (out is not written).
std::vector<std::string> blocksparse_attention_kernels(
    const TensorView& q, const TensorView& k, const TensorView& v, const BlockSparseLayout& layout,
    const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, const TensorView& out,
    const BlockSparseAttentionOptions& options = {});

}  // namespace tilelab
