// Serving attention over a paged KV cache (vLLM's layout and conventions): variable-length
// sequences, per-sequence block tables, the score options of ScoreOptions, fp8 caches and split-KV
// decode; and the cache writer that fills such a cache.
#pragma once

#include <cstdint>
#include <optional>

#include "tilelab/attention.hpp"
#include "tilelab/tensor.hpp"

namespace tilelab {

struct PagedAttentionOptions {
  // Multiplies q·k before the softmax; default 1/sqrt(D). Must be finite.
  std::optional<float> scale;
  // Query position i sees key position j <= i (bottom-right: a sequence's queries are its last
  // positions). false: every key of the sequence, subject to score.sliding_window.
  bool causal = true;
  // softcap, ALiBi, sliding window and sinks; the semantics of ScoreOptions (attention.hpp).
  ScoreOptions score;
  // Dequantization scales of fp8 caches: key = k_scale · stored key, value = v_scale · stored
  // value. Must be finite; 1 for caches of the query's dtype.
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  // Split-KV ("flash decoding"): each (sequence, kv head, query rows) work item's keys are split
  // into pieces computed in parallel, each giving a partial (max, sum, output), merged in a fixed
  // order. 0: automatic (split only when the batch has fewer work items than keep every thread
  // busy; pieces of at least 512 keys). n >= 1: up to n pieces of at least 64 keys (1: no split).
  // The result does not depend on the thread count except through the automatic choice (fp32
  // summation order), and is identical run to run.
  std::int64_t split_kv = 0;
  // bf16: as FlashAttentionOptions::fp32_probabilities. On CPUs that prefer bf16 dot products
  // (prefers_bf16_dot_products), P is rounded to bf16 before P·V unless this is true, on the
  // generated prefill kernels and on the paged kernel (decode and short queries), whose decode
  // products then run on bf16 dot products; with an fp8 cache, on every CPU with AVX-512 BF16.
  // Elsewhere P stays fp32.
  bool fp32_probabilities = false;
};

// out[t, h, :] = softmax_j(s_tj) · V_j over the visible keys of token t's sequence, read from the
// paged cache. docs/paged_attention.md has the full contract; in short:
//   query [num_tokens, Hq, D]; key_cache, value_cache [num_blocks, Hkv, block_size, D];
//   block_table int32 [num_seqs, max_blocks_per_seq]; seq_lens int32 [num_seqs] (context plus new
//   tokens); query_start_loc int32 [num_seqs + 1] (prefix sums of the query lengths: 0 first,
//   non-decreasing, num_tokens last); out [num_tokens, Hq, D].
//   Sequence s has query tokens query_start_loc[s] .. query_start_loc[s+1]) (q_len <= seq_len),
//   at positions seq_len - q_len .. seq_len - 1; its key position j lives in cache block
//   block_table[s, j / block_size] at offset j % block_size. Only the first
//   ceil(seq_len / block_size) entries of a row are read, and each must be in [0, num_blocks).
//   Any block_size >= 1; 1 <= D <= 512; Hq a multiple of Hkv (query head h reads kv head
//   h / (Hq / Hkv)).
//   dtypes: query and out one of f32, f16, bf16; the caches that dtype or f8e4m3fn / f8e5m2
//   (both caches the same), converted in registers and scaled by k_scale / v_scale.
//   Accumulation fp32. Any non-negative strides; out disjoint from itself and the inputs.
//   Masking and non-finite values as flash_attention: only causality and the window mask a key;
//   NaN or inf in the data propagate.
// Threads: the library's OpenMP pool. Throws tilelab::Error naming the argument on any invalid
// input (including out-of-range block-table entries: no read outside the cache); on error nothing
// is written.
void paged_attention(const TensorView& query, const TensorView& key_cache,
                     const TensorView& value_cache, const TensorView& block_table,
                     const TensorView& seq_lens, const TensorView& query_start_loc,
                     const TensorView& out, const PagedAttentionOptions& options = {});

// Writes key[t] and value[t] ([num_tokens, Hkv, D] each, f32/f16/bf16) into key_cache and
// value_cache ([num_blocks, Hkv, block_size, D]) at slot slot_mapping[t] (int32 [num_tokens]):
// block slot / block_size, offset slot % block_size. A negative slot (padding) is skipped; slots
// must be < num_blocks · block_size. The caches have the key's dtype (k_scale and v_scale must be
// 1), or an fp8 dtype: then the stored value is key / k_scale (value / v_scale) rounded to
// nearest even, finite values beyond
// the format's range saturating to its largest finite value (vLLM's convention); NaN stays NaN,
// ±inf becomes ±inf in f8e5m2 and NaN in f8e4m3fn (which has no inf). k_scale and v_scale must
// be finite and nonzero (and 1 for a cache of the key's dtype). When two tokens name the same slot
// the later one wins.
void reshape_and_cache_flash(const TensorView& key, const TensorView& value,
                             const TensorView& key_cache, const TensorView& value_cache,
                             const TensorView& slot_mapping, float k_scale = 1.0f,
                             float v_scale = 1.0f);

}  // namespace tilelab
