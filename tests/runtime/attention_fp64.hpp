// An independent fp64 attention reference for the tests: plain loops and a full (not online)
// softmax, reading the same TensorViews the library receives.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "dtype_convert.hpp"
#include "tilelab/attention.hpp"

namespace tilelab_test {

// Output [B, Hq, M, D] and log-sum-exp [B, Hq, M], contiguous.
struct Fp64Attention {
  std::int64_t batch = 0, q_heads = 0, q_len = 0, head_dim = 0;
  std::vector<double> out;
  std::vector<double> lse;
  // Largest scale·Σ|q_d k_d| + |bias| over visible scores: fp32 rounding of a score is relative to
  // this, not to the score itself (which can cancel).
  double score_magnitude = 0;

  double out_at(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d) const {
    return out[((b * q_heads + h) * q_len + i) * head_dim + d];
  }
  double lse_at(std::int64_t b, std::int64_t h, std::int64_t i) const {
    return lse[(b * q_heads + h) * q_len + i];
  }
};

// One element of a rank-4 view as double, whatever its dtype and strides.
inline double element_fp64(const tilelab::TensorView& view, const std::int64_t (&index)[4]) {
  std::int64_t offset = 0;
  for (int i = 0; i < 4; ++i) offset += index[i] * view.stride(i);
  switch (view.dtype()) {
    case tilelab::DType::f32:
      return static_cast<const float*>(view.data())[offset];
    case tilelab::DType::f16:
      return tilelab::detail::f16_bits_to_float(
          static_cast<const std::uint16_t*>(view.data())[offset]);
    case tilelab::DType::bf16:
      return tilelab::detail::bf16_bits_to_float(
          static_cast<const std::uint16_t*>(view.data())[offset]);
    case tilelab::DType::i32:
      return static_cast<const std::int32_t*>(view.data())[offset];
    case tilelab::DType::f8e4m3fn:
      return tilelab::detail::f8e4m3fn_bits_to_float(
          static_cast<const std::uint8_t*>(view.data())[offset]);
    case tilelab::DType::f8e5m2:
      return tilelab::detail::f8e5m2_bits_to_float(
          static_cast<const std::uint8_t*>(view.data())[offset]);
  }
  return std::numeric_limits<double>::quiet_NaN();
}

// A rank-4 view copied into a contiguous double array.
inline std::vector<double> to_fp64(const tilelab::TensorView& view) {
  std::vector<double> values;
  values.reserve(static_cast<std::size_t>(view.numel()));
  std::int64_t index[4];
  for (index[0] = 0; index[0] < view.dim(0); ++index[0])
    for (index[1] = 0; index[1] < view.dim(1); ++index[1])
      for (index[2] = 0; index[2] < view.dim(2); ++index[2])
        for (index[3] = 0; index[3] < view.dim(3); ++index[3])
          values.push_back(element_fp64(view, index));
  return values;
}

// softmax(scale · q kᵀ + bias, masked) v straight from the definition, in double precision.
// Fully masked rows give out 0 and lse -inf.
inline Fp64Attention attention_fp64(const tilelab::TensorView& q, const tilelab::TensorView& k,
                                    const tilelab::TensorView& v,
                                    const tilelab::FlashAttentionOptions& options) {
  const std::int64_t batch = q.dim(0), q_heads = q.dim(1), q_len = q.dim(2), head_dim = q.dim(3);
  const std::int64_t kv_heads = k.dim(1), kv_len = k.dim(2);
  const std::int64_t group = q_heads / kv_heads;
  const double scale = options.scale ? static_cast<double>(*options.scale)
                                     : 1.0 / std::sqrt(static_cast<double>(head_dim));
  const std::vector<double> q64 = to_fp64(q), k64 = to_fp64(k), v64 = to_fp64(v);

  Fp64Attention result;
  result.batch = batch;
  result.q_heads = q_heads;
  result.q_len = q_len;
  result.head_dim = head_dim;
  result.out.assign(static_cast<std::size_t>(batch * q_heads * q_len * head_dim), 0.0);
  result.lse.assign(static_cast<std::size_t>(batch * q_heads * q_len),
                    -std::numeric_limits<double>::infinity());

#pragma omp parallel for collapse(2) schedule(dynamic)
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t h = 0; h < q_heads; ++h) {
      const std::int64_t kv_head = h / group;
      const double* k_head =
          &k64[static_cast<std::size_t>((b * kv_heads + kv_head) * kv_len * head_dim)];
      const double* v_head =
          &v64[static_cast<std::size_t>((b * kv_heads + kv_head) * kv_len * head_dim)];
      std::vector<double> scores(static_cast<std::size_t>(kv_len));
      std::vector<bool> visible(static_cast<std::size_t>(kv_len));
      double head_magnitude = 0.0;
      for (std::int64_t i = 0; i < q_len; ++i) {
        const double* q_row =
            &q64[static_cast<std::size_t>(((b * q_heads + h) * q_len + i) * head_dim)];
        double max_score = -std::numeric_limits<double>::infinity();
        double row_magnitude = 0.0;
        for (std::int64_t j = 0; j < kv_len; ++j) {
          bool is_visible = true;
          if (options.causal) {
            const std::int64_t limit =
                options.causal_alignment == tilelab::CausalAlignment::top_left ? i
                                                                               : i + kv_len - q_len;
            is_visible = j <= limit;
          }
          visible[j] = is_visible;
          if (!is_visible) continue;
          double dot = 0.0, magnitude = 0.0;
          for (std::int64_t d = 0; d < head_dim; ++d) {
            const double product = q_row[d] * k_head[j * head_dim + d];
            dot += product;
            magnitude += std::abs(product);
          }
          double score = scale * dot;
          magnitude *= std::abs(scale);
          if (options.bias) {
            const tilelab::TensorView& bias = *options.bias;
            const std::int64_t index[4] = {bias.dim(0) == 1 ? 0 : b, bias.dim(1) == 1 ? 0 : h,
                                           bias.dim(2) == 1 ? 0 : i, j};
            const double bias_value = element_fp64(bias, index);
            score += bias_value;
            magnitude += std::abs(bias_value);
          }
          row_magnitude = std::max(row_magnitude, magnitude);
          scores[j] = score;
          max_score = std::max(max_score, score);
        }
        if (max_score == -std::numeric_limits<double>::infinity()) continue;  // fully masked
        head_magnitude = std::max(head_magnitude, row_magnitude);
        double sum = 0.0;
        double* out_row =
            &result.out[static_cast<std::size_t>(((b * q_heads + h) * q_len + i) * head_dim)];
        for (std::int64_t j = 0; j < kv_len; ++j) {
          if (!visible[j]) continue;
          const double p = std::exp(scores[j] - max_score);
          sum += p;
          for (std::int64_t d = 0; d < head_dim; ++d) out_row[d] += p * v_head[j * head_dim + d];
        }
        for (std::int64_t d = 0; d < head_dim; ++d) out_row[d] /= sum;
        result.lse[static_cast<std::size_t>((b * q_heads + h) * q_len + i)] =
            max_score + std::log(sum);
      }
#pragma omp critical(tilelab_test_score_magnitude)
      result.score_magnitude = std::max(result.score_magnitude, head_magnitude);
    }
  }
  return result;
}

}  // namespace tilelab_test
