// ScoreOptions checked and copied for a call (alibi slopes and sinks read once), and the K/V
// dequantization scales: shared by flash_attention and paged_attention.
#pragma once

#include <cstdint>
#include <vector>

#include "tilelab/attention.hpp"

namespace tilelab::detail {

struct ResolvedScoreOptions {
  float softcap = 0.0f;
  std::vector<float> alibi_slopes, sinks;  // [Hq] each, or empty
  SlidingWindow window;

  // Whether a score or its visibility changes: every option but the sinks (which only join the
  // denominator, so they are in lse; the backward runs sinks alone on its plain kernels).
  bool changes_scores() const {
    return softcap != 0.0f || !alibi_slopes.empty() || window.left >= 0 || window.right >= 0;
  }
  bool any() const { return changes_scores() || !sinks.empty(); }
};

// Checks `options` (softcap finite and >= 0, window sides >= -1, slopes and sinks fp32 [q_heads])
// and copies them. Throws tilelab::Error naming the option.
ResolvedScoreOptions resolve_score_options(const ScoreOptions& options, std::int64_t q_heads);

// Whether K/V of `dtype` are stored in fp8 (dequantized with k_scale / v_scale).
inline bool is_fp8(DType dtype) {
  return dtype == DType::f8e4m3fn || dtype == DType::f8e5m2;
}

// k_scale and v_scale finite, and exactly 1 unless `kv_dtype` is fp8. Throws tilelab::Error
// naming the scale.
void require_kv_scales(DType kv_dtype, float k_scale, float v_scale);

}  // namespace tilelab::detail
