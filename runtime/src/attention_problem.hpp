// The validated, normalized form of one flash_attention call, shared by the dispatcher, the
// generated-kernel path and the reference implementation.
#pragma once

#include <cstdint>
#include <optional>

#include "score_options.hpp"
#include "tilelab/attention.hpp"

namespace tilelab::detail {

// The largest head dim flash_attention takes (both implementations).
inline constexpr std::int64_t kMaxFlashHeadDim = 256;

struct AttentionProblem {
  TensorView q, k, v, out;         // [B, Hq, M, D], [B, Hkv, N, D] x2, [B, Hq, M, D]
  std::optional<TensorView> bias;  // fp32, rank 4, broadcast dims have extent 1
  std::optional<TensorView> lse;   // fp32 [B, Hq, M]
  DType dtype = DType::f32;
  std::int64_t batch = 0, q_heads = 0, kv_heads = 0, q_len = 0, kv_len = 0, head_dim = 0;
  float scale = 1.0f;
  bool causal = false;
  // Key j is visible to query i iff j <= i + causal_offset. Top-left: 0; bottom-right: N - M.
  // Non-causal: kv_len (every key visible).
  std::int64_t causal_offset = 0;
  // Added to a query row to give its absolute position (score options): N - M for bottom-right
  // alignment, 0 for top-left, causal or not.
  std::int64_t position_offset = 0;
  DType kv_dtype = DType::f32;  // k and v: dtype, or fp8
  ResolvedScoreOptions score;
  float k_scale = 1.0f, v_scale = 1.0f;
  bool fp32_probabilities = false;  // FlashAttentionOptions::fp32_probabilities

  // Score options or fp8 k/v: the dense reference does not implement them (the paged kernel does;
  // the generated kernels cover score options on prefill-sized calls). The backward takes score
  // options, not fp8 k/v.
  bool has_score_options_or_fp8() const { return score.any() || is_fp8(kv_dtype); }
  // Decode (one query row per batch entry and head) without a bias: under automatic dispatch the
  // paged kernel, which reads each K/V row once for a whole GQA group, outruns the generated
  // kernels (measured: bench/attention/bench_flash.py's decode rows).
  bool automatic_prefers_paged_kernel() const { return q_len == 1 && !bias; }
  // Rows of one kv head for the kernels that fold the GQA group into rows: (query head of the
  // group, query) pairs.
  std::int64_t rows_per_kv_head() const { return q_len * (q_heads / kv_heads); }
};

// The visible keys of docs/attention_options.md for the dense kernels: key j is visible to query
// row i iff i + window_begin <= j <= i + causal_offset (the causal limit and the window's right
// edge folded into one bound). Every dense implementation, forward and backward, masks by these.
struct KeyBounds {
  std::int64_t window_begin, causal_offset;
};
KeyBounds key_bounds(const AttentionProblem& problem);

// flash_attention on the paged kernel (paged_kernel_attention), the whole batch as one paged
// problem: batch entry b is sequence b, and k[b], v[b] are its cache of one block of N keys.
// Handles score options, fp8 k/v and lse.
void flash_attention_on_paged_kernel(const AttentionProblem& problem);

// Checks every argument of flash_attention (ranks, shapes, GQA divisibility, dtypes, strides,
// bias broadcastability, lse shape, aliasing of out/lse with inputs and themselves, scale
// finiteness) and returns the normalized problem. Throws tilelab::Error naming the argument.
AttentionProblem validate_flash_attention(const TensorView& q, const TensorView& k,
                                          const TensorView& v, const TensorView& out,
                                          const FlashAttentionOptions& options);

// The reference implementation: OpenMP over (batch, query head, query row), SLEEF exp, fp32
// accumulation with online softmax; handles any strides. Writes out (and lse when present).
void reference_flash_attention(const AttentionProblem& problem);

// Runs the generated Halide kernel; false when the problem is outside what the generated kernels
// cover (then nothing is written). With score options they cover prefill-sized calls (more than
// kDecodeMaxRows rows per kv head) without fp8 k/v and, for bf16, without fp32_probabilities.
// They multiply a masked key's v row by P = 0: callers with score options (whose masked keys are
// never read, docs/attention_options.md) check v for NaN and inf first.
bool generated_flash_attention(const AttentionProblem& problem);
// The name of the kernel generated_flash_attention would run, or nullptr when it would not.
const char* generated_flash_attention_kernel(const AttentionProblem& problem);
// Whether generated_flash_attention would accept the problem.
inline bool generated_flash_attention_covers(const AttentionProblem& problem) {
  return generated_flash_attention_kernel(problem) != nullptr;
}

// The validated form of one flash_attention_backward call: the forward's problem (q, k, v, out,
// bias, lse as inputs) plus the incoming gradient and the gradient outputs.
struct AttentionBackwardProblem {
  AttentionProblem forward;          // forward.lse is set: the forward's log-sum-exp, an input here
  TensorView dout, dq, dk, dv;       // [B, Hq, M, D], [B, Hq, M, D], [B, Hkv, N, D] x2
  std::optional<TensorView> dbias;   // fp32, the shape of forward.bias
  std::optional<TensorView> dsinks;  // fp32 [Hq], with forward.score.sinks
};

// Checks every argument of flash_attention_backward (the forward's checks on q, k, v, out, lse and
// options, then dout, the gradient outputs' shapes and dtypes, and that no output overlaps
// another, itself or an input; k and v not fp8). Throws tilelab::Error naming the argument.
AttentionBackwardProblem validate_flash_attention_backward(
    const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
    const TensorView& out, const TensorView& lse, const TensorView& dq, const TensorView& dk,
    const TensorView& dv, const FlashAttentionOptions& options,
    const std::optional<TensorView>& dbias, const std::optional<TensorView>& dsinks);

// dS of every (row, key), written to `ds`: fp32 [B, Hq, M, N]. Both implementations produce it
// when the bias gradient is asked for; reduce_bias_gradient folds it into the bias's shape.
// The reference implementation: OpenMP over (batch, kv head), fp32 accumulation, any strides.
// Writes dq, dk, dv, and `ds` when given.
void reference_flash_attention_backward(const AttentionBackwardProblem& problem,
                                        const TensorView* ds);
// Writes problem.dsinks, the gradient with respect to the sinks, from lse, out and dout (both
// implementations' dq, dk, dv do not depend on it).
void sink_gradient(const AttentionBackwardProblem& problem);
// Runs the generated Halide kernel (writing `ds` when given); false when the problem is outside
// what the generated kernels cover (then nothing is written).
bool generated_flash_attention_backward(const AttentionBackwardProblem& problem,
                                        const TensorView* ds);
// Whether the generated kernels run the call: they cover its shapes, strides and options and, with
// score options, q, k, v and dout are finite (this reads them).
bool generated_flash_attention_backward_runs(const AttentionBackwardProblem& problem);
// Key blocks per task of the generated backward: each task, one chunk of keys of one (kv head,
// batch), sums its own partial dq; the partial sums are then added in chunk order. Depends on the
// shape only, so results do not depend on the thread count.
std::int64_t flash_backward_chunk_blocks(const AttentionProblem& problem);

}  // namespace tilelab::detail
