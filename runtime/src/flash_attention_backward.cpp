// flash_attention_backward: validate, dispatch to the generated kernel or the reference, and fold
// the bias gradient into the bias's broadcast shape.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "attention_problem.hpp"
#include "tilelab/error.hpp"
#include "tilelab/threading.hpp"

namespace tilelab {

namespace {

using detail::AttentionBackwardProblem;

bool has_full_shape(const TensorView& view, const detail::AttentionProblem& f) {
  return view.dim(0) == f.batch && view.dim(1) == f.q_heads && view.dim(2) == f.q_len &&
         view.dim(3) == f.kv_len;
}

// dbias[b', h', i', j] = Σ ds[b, h, i, j] over the dims where dbias has extent 1. `ds` is a dense
// [B, Hq, M, N]; each output element is summed in one fixed order (deterministic), in double.
void reduce_bias_gradient(const std::vector<float>& ds, const detail::AttentionProblem& f,
                          const TensorView& dbias) {
  const std::int64_t extents[3] = {f.batch, f.q_heads, f.q_len};
  std::int64_t reduced[3], kept[3];
  for (int a = 0; a < 3; ++a) {
    kept[a] = dbias.dim(a);
    reduced[a] = kept[a] == 1 ? extents[a] : 1;
  }
  const std::int64_t n = f.kv_len, out_rows = kept[0] * kept[1] * kept[2];
  float* const out = static_cast<float*>(dbias.data());
#pragma omp parallel num_threads(num_threads())
  {
    std::vector<double> sum(n);
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < out_rows; ++r) {
      const std::int64_t b0 = r / (kept[1] * kept[2]), h0 = r / kept[2] % kept[1], i0 = r % kept[2];
      std::fill(sum.begin(), sum.end(), 0.0);
      for (std::int64_t b = 0; b < reduced[0]; ++b) {
        for (std::int64_t h = 0; h < reduced[1]; ++h) {
          for (std::int64_t i = 0; i < reduced[2]; ++i) {
            const float* row =
                ds.data() + (((b0 + b) * f.q_heads + (h0 + h)) * f.q_len + (i0 + i)) * n;
            for (std::int64_t j = 0; j < n; ++j) sum[j] += row[j];
          }
        }
      }
      float* dst = out + b0 * dbias.stride(0) + h0 * dbias.stride(1) + i0 * dbias.stride(2);
      for (std::int64_t j = 0; j < n; ++j) dst[j * dbias.stride(3)] = static_cast<float>(sum[j]);
    }
  }
}

}  // namespace

void flash_attention_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                              const TensorView& v, const TensorView& out, const TensorView& lse,
                              const TensorView& dq, const TensorView& dk, const TensorView& dv,
                              const FlashAttentionOptions& options,
                              const std::optional<TensorView>& dbias,
                              const std::optional<TensorView>& dsinks) {
  const AttentionBackwardProblem problem = detail::validate_flash_attention_backward(
      dout, q, k, v, out, lse, dq, dk, dv, options, dbias, dsinks);
  const detail::AttentionProblem& f = problem.forward;

  // dS goes straight into a dense dbias of the full shape; otherwise into a dense scratch that is
  // then summed over the bias's broadcast dims.
  std::vector<float> ds_scratch;
  TensorView ds_view;
  const TensorView* ds = nullptr;
  if (problem.dbias) {
    if (has_full_shape(*problem.dbias, f) && problem.dbias->is_contiguous()) {
      ds_view = *problem.dbias;
    } else {
      const std::int64_t count = f.batch * f.q_heads * f.q_len * f.kv_len;
      try {
        ds_scratch.resize(static_cast<std::size_t>(count));
      } catch (const std::bad_alloc&) {
        throw Error("dbias: summing the bias gradient over the broadcast dims of " +
                    problem.dbias->describe() + " needs a scratch of " + std::to_string(count) +
                    " fp32 values, which could not be allocated; pass a bias of the full shape [" +
                    std::to_string(f.batch) + ", " + std::to_string(f.q_heads) + ", " +
                    std::to_string(f.q_len) + ", " + std::to_string(f.kv_len) + "]");
      }
      ds_view = TensorView(ds_scratch.data(), DType::f32, {f.batch, f.q_heads, f.q_len, f.kv_len});
    }
    ds = &ds_view;
  }

  switch (options.implementation) {
    case Implementation::reference:
      detail::reference_flash_attention_backward(problem, ds);
      break;
    case Implementation::generated:
      TILELAB_REQUIRE(detail::generated_flash_attention_backward(problem, ds))
          << "implementation: 'generated' does not cover this call (" << q.describe()
          << "); the generated kernels need innermost stride 1 on every tensor but lse, "
             "head_dim <= 256 and, with score options, finite q, k, v and dout; use 'automatic' "
             "or 'reference'";
      break;
    case Implementation::automatic:
      if (!detail::generated_flash_attention_backward(problem, ds)) {
        detail::reference_flash_attention_backward(problem, ds);
      }
      break;
  }
  if (!ds_scratch.empty()) reduce_bias_gradient(ds_scratch, f, *problem.dbias);
  if (problem.dsinks) detail::sink_gradient(problem);
}

const char* flash_attention_backward_implementation(
    const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
    const TensorView& out, const TensorView& lse, const TensorView& dq, const TensorView& dk,
    const TensorView& dv, const FlashAttentionOptions& options,
    const std::optional<TensorView>& dbias, const std::optional<TensorView>& dsinks) {
  const AttentionBackwardProblem problem = detail::validate_flash_attention_backward(
      dout, q, k, v, out, lse, dq, dk, dv, options, dbias, dsinks);
  return detail::generated_flash_attention_backward_runs(problem) ? "generated" : "reference";
}

}  // namespace tilelab
