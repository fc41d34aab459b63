// The validated, normalized form of one flash_attention call, shared by the dispatcher, the
// generated-kernel path and the reference implementation.
#pragma once

#include <cstdint>
#include <optional>

#include "tilelab/attention.hpp"

namespace tilelab::detail {

struct AttentionProblem {
  TensorView q, k, v, out;       // [B, Hq, M, D], [B, Hkv, N, D] x2, [B, Hq, M, D]
  std::optional<TensorView> bias;  // fp32, rank 4, broadcast dims have extent 1
  std::optional<TensorView> lse;   // fp32 [B, Hq, M]
  DType dtype = DType::f32;
  std::int64_t batch = 0, q_heads = 0, kv_heads = 0, q_len = 0, kv_len = 0, head_dim = 0;
  float scale = 1.0f;
  bool causal = false;
  // Key j is visible to query i iff j <= i + causal_offset. Top-left: 0; bottom-right: N - M.
  // Non-causal: kv_len (every key visible).
  std::int64_t causal_offset = 0;
};

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
// cover (then nothing is written).
bool generated_flash_attention(const AttentionProblem& problem);
// Whether generated_flash_attention would accept the problem.
bool generated_flash_attention_covers(const AttentionProblem& problem);

}  // namespace tilelab::detail
