// The reference flash attention: OpenMP over (batch, query head, block of query rows), online
// softmax over blocks of keys, SLEEF exp, fp32 accumulation, any strides and any supported dtype.
#include <immintrin.h>
#include <sleef.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attention_problem.hpp"
#include "dtype_convert.hpp"
#include "reference_softmax.hpp"
#include "strided4.hpp"
#include "tilelab/error.hpp"
#include "tilelab/threading.hpp"

namespace tilelab::detail {

namespace {

// Query rows per task: a block of keys is converted to fp32 once and reused by this many rows.
constexpr std::int64_t kQueryBlock = 16;
// Keys per online-softmax step: 64 keys × D ≤ 256 fp32 = at most 64 KiB each for K and V, which
// stay in L2 while the block's query rows use them.
constexpr std::int64_t kKeyBlock = 64;

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

template <DType dtype>
void run_reference(const AttentionProblem& problem) {
  using Traits = ElementTraits<dtype>;
  using Storage = typename Traits::Storage;

  const std::int64_t batch = problem.batch, q_heads = problem.q_heads, q_len = problem.q_len;
  const std::int64_t kv_len = problem.kv_len, head_dim = problem.head_dim;
  const std::int64_t heads_per_kv_head = problem.q_heads / problem.kv_heads;
  const std::int64_t causal_offset = problem.causal_offset;
  const float scale = problem.scale;

  const Strided4<const Storage> q(problem.q, false), k(problem.k, false), v(problem.v, false);
  const Strided4<const Storage> out_view(problem.out, false);
  Storage* const out_data = static_cast<Storage*>(problem.out.data());
  const bool has_bias = problem.bias.has_value();
  const Strided4<const float> bias = has_bias ? Strided4<const float>(*problem.bias, true)
                                              : Strided4<const float>(problem.q, false);  // unused
  float* const lse_data = problem.lse ? static_cast<float*>(problem.lse->data()) : nullptr;
  const std::int64_t lse_stride[3] = {problem.lse ? problem.lse->stride(0) : 0,
                                      problem.lse ? problem.lse->stride(1) : 0,
                                      problem.lse ? problem.lse->stride(2) : 0};

  const std::int64_t q_blocks = (q_len + kQueryBlock - 1) / kQueryBlock;
  const std::int64_t tasks = batch * q_heads * q_blocks;

#pragma omp parallel num_threads(num_threads())
  {
    // Per-thread scratch, fp32: keys transposed ([d][j]) so the score loop runs over contiguous j
    // and vectorizes without reassociating a dot product.
    std::vector<float> q_rows(kQueryBlock * head_dim);
    std::vector<float> keys_transposed(head_dim * kKeyBlock);
    std::vector<float> values(kKeyBlock * head_dim);
    std::vector<float> scores(kKeyBlock);
    std::vector<float> acc(kQueryBlock * head_dim);
    float row_max[kQueryBlock];
    float row_sum[kQueryBlock];
    bool row_unmasked[kQueryBlock];  // some key is not masked (all may still score -inf)

#pragma omp for schedule(dynamic)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t b = task / (q_heads * q_blocks);
      const std::int64_t h = (task / q_blocks) % q_heads;
      const std::int64_t row_begin = (task % q_blocks) * kQueryBlock;
      const std::int64_t rows = std::min(kQueryBlock, q_len - row_begin);
      const std::int64_t kv_head = h / heads_per_kv_head;

      for (std::int64_t r = 0; r < rows; ++r) {
        const Storage* src = q.row(b, h, row_begin + r);
        for (std::int64_t d = 0; d < head_dim; ++d) {
          q_rows[r * head_dim + d] = Traits::to_float(src[d * q.stride[3]]);
        }
        row_max[r] = kNegativeInfinity;
        row_sum[r] = 0.0f;
        row_unmasked[r] = false;
      }
      std::fill(acc.begin(), acc.end(), 0.0f);

      // Keys past the last row's causal limit are invisible to every row of the block.
      const std::int64_t key_end =
          std::clamp<std::int64_t>(row_begin + rows - 1 + causal_offset + 1, 0, kv_len);
      for (std::int64_t key_begin = 0; key_begin < key_end; key_begin += kKeyBlock) {
        const std::int64_t keys = std::min(kKeyBlock, key_end - key_begin);
        for (std::int64_t j = 0; j < keys; ++j) {
          const Storage* k_row = k.row(b, kv_head, key_begin + j);
          const Storage* v_row = v.row(b, kv_head, key_begin + j);
          for (std::int64_t d = 0; d < head_dim; ++d) {
            keys_transposed[d * kKeyBlock + j] = Traits::to_float(k_row[d * k.stride[3]]);
            values[j * head_dim + d] = Traits::to_float(v_row[d * v.stride[3]]);
          }
        }

        for (std::int64_t r = 0; r < rows; ++r) {
          const std::int64_t i = row_begin + r;
          // Key j is visible iff j <= i + causal_offset.
          const std::int64_t visible = std::min(keys, i + causal_offset + 1 - key_begin);
          if (visible <= 0) continue;

          float* const s = scores.data();
          std::fill(s, s + visible, 0.0f);
          const float* q_row = &q_rows[r * head_dim];
          for (std::int64_t d = 0; d < head_dim; ++d) {
            const float q_d = q_row[d];
            const float* k_d = &keys_transposed[d * kKeyBlock];
            for (std::int64_t j = 0; j < visible; ++j) s[j] += q_d * k_d[j];
          }
          float block_max = kNegativeInfinity;
          const float* bias_row =
              has_bias ? bias.row(b, h, i) + key_begin * bias.stride[3] : nullptr;
          for (std::int64_t j = 0; j < visible; ++j) {
            s[j] *= scale;
            bool masked = false;
            if (has_bias) {
              // A bias of -inf masks the key whatever q·k is (even NaN).
              const float bias_value = bias_row[j * bias.stride[3]];
              masked = bias_value == kNegativeInfinity;
              s[j] = masked ? kNegativeInfinity : s[j] + bias_value;
            }
            row_unmasked[r] = row_unmasked[r] || !masked;
            block_max = nan_propagating_max(block_max, s[j]);
          }
          // Nothing in the block contributes (masked, or q·k overflowed to -inf), and
          // exp(-inf - -inf) would be NaN.
          if (block_max == kNegativeInfinity) continue;

          merge_block_into_row(s, visible, block_max, values.data(), head_dim, row_max[r],
                               row_sum[r], &acc[r * head_dim]);
        }
      }

      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t i = row_begin + r;
        // row_sum is >= 1 once any key contributed (its max contributes exp(0)), so 0 means a
        // fully masked row: out 0 and lse -inf, as PyTorch's CPU flash attention does; or a row
        // whose unmasked scores are all -inf: NaN, the softmax of only -inf. A NaN sum (NaN or
        // +inf among the scores) gives NaN out and lse.
        const bool fully_masked = row_sum[r] == 0.0f && !row_unmasked[r];
        const float inverse_sum = inverse_row_sum(!fully_masked, row_sum[r]);
        Storage* dst = out_data + out_view.row_offset(b, h, i);
        const float* acc_row = &acc[r * head_dim];
        for (std::int64_t d = 0; d < head_dim; ++d) {
          dst[d * out_view.stride[3]] = Traits::from_float(acc_row[d] * inverse_sum);
        }
        if (lse_data) {
          lse_data[b * lse_stride[0] + h * lse_stride[1] + i * lse_stride[2]] =
              fully_masked         ? kNegativeInfinity
              : row_sum[r] == 0.0f ? std::numeric_limits<float>::quiet_NaN()
                                   : row_max[r] + std::log(row_sum[r]);
        }
      }
    }
  }
}

}  // namespace

void reference_flash_attention(const AttentionProblem& problem) {
  switch (problem.dtype) {
    case DType::f32:
      return run_reference<DType::f32>(problem);
    case DType::f16:
      return run_reference<DType::f16>(problem);
    case DType::bf16:
      return run_reference<DType::bf16>(problem);
    case DType::i32:
    case DType::f8e4m3fn:
    case DType::f8e5m2:
      break;
  }
  TILELAB_CHECK(false) << "reference_flash_attention: dtype " << dtype_name(problem.dtype)
                       << " passed validation";
}

}  // namespace tilelab::detail
