// The reference flash attention backward: OpenMP over (batch, kv head), one query row at a time
// over every key, fp32 accumulation, any strides and any supported dtype, and the score options
// (docs/attention_options.md). Written for clarity: it is what the generated kernels are checked
// against, and it runs the calls they do not cover.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "attention_problem.hpp"
#include "dtype_convert.hpp"
#include "strided4.hpp"
#include "tilelab/error.hpp"
#include "tilelab/threading.hpp"

namespace tilelab::detail {

namespace {

template <DType dtype>
void run_reference_backward(const AttentionBackwardProblem& problem, const TensorView* ds_view) {
  using Traits = ElementTraits<dtype>;
  using Storage = typename Traits::Storage;
  const AttentionProblem& f = problem.forward;
  const std::int64_t batch = f.batch, kv_heads = f.kv_heads, q_len = f.q_len, kv_len = f.kv_len;
  const std::int64_t head_dim = f.head_dim, group = f.q_heads / f.kv_heads;
  const float scale = f.scale;
  constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

  const Strided4<const Storage> q(f.q, false), k(f.k, false), v(f.v, false), out(f.out, false);
  const Strided4<const Storage> dout(problem.dout, false);
  const Strided4<Storage> dq(problem.dq, false), dk(problem.dk, false), dv(problem.dv, false);
  const TensorView& lse_view = *f.lse;
  const float* const lse = static_cast<const float*>(lse_view.data());
  float zero_bias = 0.0f;
  const TensorView no_bias(&zero_bias, DType::f32, {1, 1, 1, 1});
  const Strided4<const float> bias(f.bias ? *f.bias : no_bias, true);
  const Strided4<float> ds(ds_view ? *ds_view : no_bias, false);

  // Score options: masked keys are never read (docs/attention_options.md), so each row visits the
  // keys of its window only; without them, every key is visited and a masked one adds 0 · its row.
  const ResolvedScoreOptions& options = f.score;
  const bool with_options = options.any();
  const KeyBounds bounds = key_bounds(f);

#pragma omp parallel num_threads(num_threads())
  {
    std::vector<float> key(kv_len * head_dim), value(kv_len * head_dim);
    std::vector<float> dk_sum(kv_len * head_dim), dv_sum(kv_len * head_dim);
    std::vector<float> query(head_dim), grad_out(head_dim), dq_sum(head_dim);
#pragma omp for schedule(dynamic)
    for (std::int64_t task = 0; task < batch * kv_heads; ++task) {
      const std::int64_t b = task / kv_heads, hk = task % kv_heads;
      for (std::int64_t j = 0; j < kv_len; ++j) {
        for (std::int64_t d = 0; d < head_dim; ++d) {
          key[j * head_dim + d] = Traits::to_float(k.at(b, hk, j, d));
          value[j * head_dim + d] = Traits::to_float(v.at(b, hk, j, d));
        }
      }
      std::fill(dk_sum.begin(), dk_sum.end(), 0.0f);
      std::fill(dv_sum.begin(), dv_sum.end(), 0.0f);
      for (std::int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        for (std::int64_t i = 0; i < q_len; ++i) {
          float delta = 0.0f;
          for (std::int64_t d = 0; d < head_dim; ++d) {
            query[d] = Traits::to_float(q.at(b, h, i, d));
            grad_out[d] = Traits::to_float(dout.at(b, h, i, d));
            delta += grad_out[d] * Traits::to_float(out.at(b, h, i, d));
          }
          const float row_lse =
              lse[b * lse_view.stride(0) + h * lse_view.stride(1) + i * lse_view.stride(2)];
          const std::int64_t last_key = std::min(i + bounds.causal_offset, kv_len - 1);
          const std::int64_t first_key =
              with_options ? std::max<std::int64_t>(i + bounds.window_begin, 0) : 0;
          const std::int64_t end_key = with_options ? last_key + 1 : kv_len;
          const float slope = options.alibi_slopes.empty() ? 0.0f : options.alibi_slopes[h];
          const std::int64_t position = i + f.position_offset;
          std::fill(dq_sum.begin(), dq_sum.end(), 0.0f);
          for (std::int64_t j = first_key; j < end_key; ++j) {
            const float* key_row = &key[j * head_dim];
            const float* value_row = &value[j * head_dim];
            float score = 0.0f, dprob = 0.0f;
            for (std::int64_t d = 0; d < head_dim; ++d) {
              score += query[d] * scale * key_row[d];
              dprob += grad_out[d] * value_row[d];
            }
            // softcap, then ALiBi (docs/attention_options.md); the softcap's derivative,
            // 1 - tanh², carries dS back to scale · q·k.
            float cap_derivative = 1.0f;
            if (options.softcap > 0.0f) {
              const float tanh_value = std::tanh(score / options.softcap);
              score = options.softcap * tanh_value;
              cap_derivative = 1.0f - tanh_value * tanh_value;
            }
            score += slope * static_cast<float>(j - position);  // slope 0 without ALiBi
            const float biased = score + bias.at(b, h, i, j);
            // Only the mask and a bias of exactly -inf mask a score (attention.hpp).
            const bool visible = j <= last_key && biased != kNegativeInfinity;
            const float prob = visible ? std::exp(biased - row_lse) : 0.0f;
            const float dscore = prob == 0.0f ? 0.0f : prob * (dprob - delta) * cap_derivative;
            if (ds_view) ds.at(b, h, i, j) = dscore;
            float* dk_row = &dk_sum[j * head_dim];
            float* dv_row = &dv_sum[j * head_dim];
            for (std::int64_t d = 0; d < head_dim; ++d) {
              dv_row[d] += prob * grad_out[d];
              dk_row[d] += dscore * query[d];
              dq_sum[d] += dscore * key_row[d];
            }
          }
          for (std::int64_t d = 0; d < head_dim; ++d) {
            dq.at(b, h, i, d) = Traits::from_float(dq_sum[d] * scale);
          }
        }
      }
      for (std::int64_t j = 0; j < kv_len; ++j) {
        for (std::int64_t d = 0; d < head_dim; ++d) {
          dk.at(b, hk, j, d) = Traits::from_float(dk_sum[j * head_dim + d] * scale);
          dv.at(b, hk, j, d) = Traits::from_float(dv_sum[j * head_dim + d]);
        }
      }
    }
  }
}

// dsinks[h] = -Σ over (b, i) of e^(sink_h - lse) · rowsum(dout ∘ out): a sink takes the share
// e^(sink - lse) of its row's softmax away from out, so d out / d sink = -out · that share. A row
// whose lse is -inf (no visible key, sink -inf) adds nothing. In double, per head in one order.
template <DType dtype>
void run_sink_gradient(const AttentionBackwardProblem& problem) {
  using Storage = typename ElementTraits<dtype>::Storage;
  const AttentionProblem& f = problem.forward;
  const Strided4<const Storage> out(f.out, false), dout(problem.dout, false);
  const TensorView& lse_view = *f.lse;
  const float* const lse = static_cast<const float*>(lse_view.data());
  const TensorView& dsinks = *problem.dsinks;
  float* const result = static_cast<float*>(dsinks.data());
#pragma omp parallel for schedule(static) num_threads(num_threads())
  for (std::int64_t h = 0; h < f.q_heads; ++h) {
    const double sink = f.score.sinks[static_cast<std::size_t>(h)];
    double sum = 0.0;
    for (std::int64_t b = 0; b < f.batch; ++b) {
      for (std::int64_t i = 0; i < f.q_len; ++i) {
        const double row_lse =
            lse[b * lse_view.stride(0) + h * lse_view.stride(1) + i * lse_view.stride(2)];
        if (row_lse == -std::numeric_limits<double>::infinity()) continue;
        double delta = 0.0;
        for (std::int64_t d = 0; d < f.head_dim; ++d) {
          delta += static_cast<double>(ElementTraits<dtype>::to_float(dout.at(b, h, i, d))) *
                   ElementTraits<dtype>::to_float(out.at(b, h, i, d));
        }
        sum += std::exp(sink - row_lse) * delta;
      }
    }
    result[h * dsinks.stride(0)] = static_cast<float>(-sum);
  }
}

// Calls f(std::integral_constant<DType, dtype>{}) for the dtypes of q (f32, f16, bf16).
template <typename F>
void with_element_type(DType dtype, const char* caller, F&& f) {
  switch (dtype) {
    case DType::f32:
      return f(std::integral_constant<DType, DType::f32>{});
    case DType::f16:
      return f(std::integral_constant<DType, DType::f16>{});
    case DType::bf16:
      return f(std::integral_constant<DType, DType::bf16>{});
    case DType::i32:
    case DType::f8e4m3fn:
    case DType::f8e5m2:
      break;
  }
  TILELAB_CHECK(false) << caller << ": unsupported dtype " << dtype_name(dtype);
}

}  // namespace

void sink_gradient(const AttentionBackwardProblem& problem) {
  with_element_type(problem.forward.dtype, "sink_gradient",
                    [&](auto dtype) { run_sink_gradient<dtype.value>(problem); });
}

void reference_flash_attention_backward(const AttentionBackwardProblem& problem,
                                        const TensorView* ds) {
  with_element_type(problem.forward.dtype, "reference_flash_attention_backward",
                    [&](auto dtype) { run_reference_backward<dtype.value>(problem, ds); });
}

}  // namespace tilelab::detail
