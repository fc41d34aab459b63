// Flash attention forward on the CPU: generated Halide kernels behind a checked API, and the
// reference implementation they are tested against.
#pragma once

#include <cstdint>
#include <optional>

#include "tilelab/tensor.hpp"

namespace tilelab {

// Where the causal diagonal sits when M != N (they agree when M == N).
//   top_left:     query i sees keys j <= i              (PyTorch SDPA is_causal, FA Triton)
//   bottom_right: query i sees keys j <= i + (N - M)    (FlashAttention-2 >= 2.1, vLLM)
enum class CausalAlignment { top_left, bottom_right };

// Which implementation computes the result.
//   automatic: decode (M == 1) without a bias runs on the paged kernel (paged.hpp), which reads
//     each K/V row once for a whole GQA group; otherwise the generated kernel when it covers the
//     call, else the reference.
//   generated: the generated kernel; Error when the call is outside what it covers.
//   reference: the reference implementation (OpenMP + SLEEF, fp32 accumulation).
enum class Implementation { automatic, generated, reference };

// Which keys a query sees around its own position: key j is visible to query position i iff
// i - left <= j <= i + right; -1 means unbounded on that side. Applied on top of causality.
struct SlidingWindow {
  std::int64_t left = -1;
  std::int64_t right = -1;
};

// Score options, one semantics for every attention entry point that takes them
// (docs/attention_options.md). With i the query's absolute position and j the key's, the score
// is s = scale · q·k, then in this order:
//   softcap > 0:  s = softcap · tanh(s / softcap)         (0 turns it off; must be finite, >= 0)
//   alibi_slopes: s += slope[h] · (j - i)                 (fp32 [Hq], h the query head)
//   sliding_window: keys outside the window are masked (never loaded or computed)
//   sinks:        a per-head logit (fp32 [Hq]) that joins the softmax denominator only:
//                 out = Σ_j e^(s_j - m) v_j / (e^(sink - m) + Σ_j e^(s_j - m)).
// The slopes and sinks are data: NaN or inf in them propagate like NaN or inf in q.
struct ScoreOptions {
  float softcap = 0.0f;
  std::optional<TensorView> alibi_slopes;
  SlidingWindow sliding_window;
  std::optional<TensorView> sinks;
};

struct FlashAttentionOptions {
  bool causal = false;
  CausalAlignment causal_alignment = CausalAlignment::top_left;
  // Multiplies q·k before the softmax; default 1/sqrt(D). Must be finite.
  std::optional<float> scale;
  // Additive fp32 bias broadcastable to [B, Hq, M, N]: shape [B|1, Hq|1, M|1, N].
  std::optional<TensorView> bias;
  // When set: fp32 [B, Hq, M], receives the natural-log sum-exp of each row's scaled, biased,
  // masked scores (-inf for a fully masked row).
  std::optional<TensorView> lse;
  // softcap, ALiBi, sliding window and sinks (the semantics of ScoreOptions above). The query's
  // absolute position i is its row plus N - M (bottom_right) or plus 0 (top_left), whether or not
  // the call is causal. Not combinable with `bias` yet.
  ScoreOptions score;
  // Dequantization scales of fp8 k and v (k = k_scale · stored, v = v_scale · stored); 1 for k and
  // v of q's dtype. Must be finite.
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  // bf16 q on CPUs whose bf16 dot products (vdpbf16ps) outrun their fp32 FMAs
  // (prefers_bf16_dot_products(): AMD Zen 4 and later, twice the FMA rate): the generated prefill
  // kernels and the paged kernel (which runs decode, fp8 k/v and score options) round the
  // probabilities P to bf16 before P·V, as FlashAttention's mixed precision does, so that q·k and
  // P·V both run on bf16 dot products. true keeps P in fp32 (fp32 FMAs). The bf16 × bf16 products
  // are exact in fp32 either way; the softmax denominator always sums fp32 P. The bf16 backward
  // likewise rounds P and dS to bf16 before dV = Pᵀ dO, dK = dSᵀ Q and dQ = dS K unless this is
  // true. On other CPUs (Intel's, whose bf16 dot products run at half the FMA rate or less, and
  // those without AVX-512 BF16), other dtypes and the reference, P stays fp32 and the products
  // run on fp32 FMAs whatever this says; except fp8 k/v on any CPU with AVX-512 BF16, which run on
  // bf16 dot products with P rounded (widening fp8 for FMAs costs more there).
  bool fp32_probabilities = false;
  Implementation implementation = Implementation::automatic;
};

// Whether this CPU's bf16 dot products outrun its fp32 FMAs, so that bf16 calls without
// fp32_probabilities round P to bf16 and run on them (FlashAttentionOptions::fp32_probabilities).
// Decided by the CPU's features and vendor, once per process.
bool prefers_bf16_dot_products();

// out = softmax(scale · q kᵀ + bias, masked) v, per batch and query head, with online softmax
// (no M×N buffer).
//   q   [B, Hq, M, D], k and v [B, Hkv, N, D], out [B, Hq, M, D]; Hq a multiple of Hkv (GQA/MQA:
//   query head h reads kv head h / (Hq / Hkv)). M, N >= 1, 1 <= D <= 256.
//   dtypes: q, k, v and out share one dtype of f32, f16, bf16; or k and v are both f8e4m3fn or
//   f8e5m2 (widened in registers, scaled by options.k_scale / v_scale). Accumulation is fp32.
//   Calls with score options or fp8 k/v run on the paged kernel (paged.hpp; the generated dense
//   kernels do not cover them).
//   Strides: any non-negative strides; out must not overlap itself or any input.
//   Masking and non-finite values, the same in every implementation: only the mask masks a key,
//   i.e. causal masking and a bias of exactly -inf (whatever q·k is, NaN included). Every other
//   score follows IEEE arithmetic as PyTorch does: NaN or +inf among a row's scores (from q, k,
//   bias, or q·k overflowing fp32) gives that row out NaN and lse NaN; a score of -inf (q·k
//   overflowing to -inf) contributes exp(-inf) = 0, so a row whose unmasked scores are all -inf
//   is NaN too (0 / 0). Large finite scores such as -1e30 are ordinary scores. A fully masked row
//   gives out 0 and lse -inf, never NaN.
// Threads: runs on the library's OpenMP pool (set_num_threads). Throws tilelab::Error naming the
// argument on any invalid input; on error nothing is written.
void flash_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const FlashAttentionOptions& options = {});

// Which implementation flash_attention would use for these arguments under
// Implementation::automatic ("generated", "reference", or "paged": score options, fp8 k/v, and
// decode, i.e. M == 1 without a bias), after the same validation.
const char* flash_attention_implementation(const TensorView& q, const TensorView& k,
                                           const TensorView& v, const TensorView& out,
                                           const FlashAttentionOptions& options = {});

// The generated kernel flash_attention runs for these arguments under Implementation::automatic,
// by name (e.g. "flash_fwd_bf16_fp32_probabilities_tall"; the target <name>_listings writes its
// lowered statement and assembly to listings/<name>.stmt and .s in the build's generators
// directory), or nullptr when the call runs on the paged kernel or the reference. The choice may
// depend on num_threads(). Validates like flash_attention.
const char* flash_attention_kernel(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& out,
                                   const FlashAttentionOptions& options = {});

// The gradients of flash_attention: given dout = dL/dout, writes dq, dk and dv (and the bias
// gradient) for the same q, k, v and options, recomputing the probabilities from `out` and `lse`
// as flash_attention(..., lse) returned them (FlashAttention-2: no M×N buffer).
//   dout, out, dq [B, Hq, M, D]; dk, dv [B, Hkv, N, D]; lse fp32 [B, Hq, M]. All of dout, q, k,
//   v, out, dq, dk, dv share one dtype of f32, f16, bf16; accumulation is fp32.
//   GQA/MQA: dk and dv of a kv head sum over the query heads that read it.
//   options: causal, causal_alignment, scale, bias, the score options (softcap, ALiBi, sliding
//   window, sinks) and implementation as for the forward, the values it was called with;
//   options.lse must be empty (lse is an input here). k and v are not fp8.
//   dbias: when set, fp32 with the bias's own shape [B|1, Hq|1, M|1, N]; receives the gradient
//   with respect to the bias, summed over its broadcast dimensions. Needs options.bias.
//   dsinks: when set, fp32 [Hq]; receives the gradient with respect to options.score.sinks
//   (summed over the batch and the rows). Needs sinks. The ALiBi slopes get no gradient.
//   With score options, as in the forward, masked keys are never read: NaN or inf in them reaches
//   no gradient (the generated kernels run such calls only when q, k, v and dout are finite).
//   Masked (query, key) pairs contribute nothing, and a fully masked row gives zero gradients;
//   NaN and inf elsewhere propagate.
//   Results are the same bits for every thread count and every run: the work is split by the
//   shape alone, and partial sums are added in a fixed order.
//   Gradient outputs must not overlap each other, themselves or any input.
// Throws tilelab::Error naming the argument on any invalid input; on error nothing is written.
void flash_attention_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                              const TensorView& v, const TensorView& out, const TensorView& lse,
                              const TensorView& dq, const TensorView& dk, const TensorView& dv,
                              const FlashAttentionOptions& options = {},
                              const std::optional<TensorView>& dbias = std::nullopt,
                              const std::optional<TensorView>& dsinks = std::nullopt);

// Which implementation flash_attention_backward would use for these arguments under
// Implementation::automatic ("generated" or "reference"), after the same validation.
const char* flash_attention_backward_implementation(
    const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
    const TensorView& out, const TensorView& lse, const TensorView& dq, const TensorView& dk,
    const TensorView& dv, const FlashAttentionOptions& options = {},
    const std::optional<TensorView>& dbias = std::nullopt,
    const std::optional<TensorView>& dsinks = std::nullopt);

}  // namespace tilelab
