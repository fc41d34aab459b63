// validate_flash_attention: every check on flash_attention's arguments, in one place, before any
// implementation touches memory.
#include <algorithm>
#include <array>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "attention_problem.hpp"
#include "cpu_features.hpp"
#include "tilelab/detail/argument_checks.hpp"
#include "tilelab/error.hpp"

namespace tilelab::detail {

AttentionProblem validate_flash_attention(const TensorView& q, const TensorView& k,
                                          const TensorView& v, const TensorView& out,
                                          const FlashAttentionOptions& options) {
  check_cpu_isa_setting();
  require_rank(q, "q", 4, "[B, Hq, M, D]");
  require_rank(k, "k", 4, "[B, Hkv, N, D]");
  require_rank(v, "v", 4, "[B, Hkv, N, D]");
  require_rank(out, "out", 4, "[B, Hq, M, D]");

  if (is_fp8(k.dtype())) {
    // fp8 k and v: q and out share an attention dtype, v has k's.
    require_attention_operands(q, q, q, out);
    TILELAB_REQUIRE_TYPE(v.dtype() == k.dtype())
        << "v: expected dtype " << dtype_name(k.dtype()) << " (the dtype of k), got "
        << dtype_name(v.dtype());
    require_addressable(k, "k");
    require_addressable(v, "v");
  } else {
    require_attention_operands(q, k, v, out);
  }

  AttentionProblem problem;
  problem.q = q;
  problem.k = k;
  problem.v = v;
  problem.out = out;
  problem.dtype = q.dtype();
  problem.batch = q.dim(0);
  problem.q_heads = q.dim(1);
  problem.q_len = q.dim(2);
  problem.head_dim = q.dim(3);
  problem.kv_heads = k.dim(1);
  problem.kv_len = k.dim(2);

  TILELAB_REQUIRE(problem.batch >= 1) << "q: expected batch B >= 1, got " << shape_of(q);
  TILELAB_REQUIRE(problem.q_heads >= 1) << "q: expected Hq >= 1 heads, got " << shape_of(q);
  TILELAB_REQUIRE(problem.q_len >= 1) << "q: expected M >= 1 query rows, got " << shape_of(q);
  TILELAB_REQUIRE(problem.head_dim >= 1 && problem.head_dim <= kMaxFlashHeadDim)
      << "q: expected head dim D in [1, " << kMaxFlashHeadDim << "], got " << shape_of(q);
  TILELAB_REQUIRE(k.dim(0) == problem.batch)
      << "k: expected batch " << problem.batch << " (from q), got " << shape_of(k);
  TILELAB_REQUIRE(k.dim(3) == problem.head_dim)
      << "k: expected head dim " << problem.head_dim << " (from q), got " << shape_of(k);
  TILELAB_REQUIRE(problem.kv_heads >= 1) << "k: expected Hkv >= 1 heads, got " << shape_of(k);
  TILELAB_REQUIRE(problem.kv_len >= 1) << "k: expected N >= 1 keys, got " << shape_of(k);
  TILELAB_REQUIRE(problem.q_heads % problem.kv_heads == 0)
      << "k: expected a head count that divides q's (q heads must be a multiple of k heads), got "
      << "q heads " << problem.q_heads << " and k heads " << problem.kv_heads;
  for (int i = 0; i < 4; ++i) {
    TILELAB_REQUIRE(v.dim(i) == k.dim(i))
        << "v: expected shape " << shape_of(k) << " (the shape of k), got " << shape_of(v);
  }
  for (int i = 0; i < 4; ++i) {
    TILELAB_REQUIRE(out.dim(i) == q.dim(i))
        << "out: expected shape " << shape_of(q) << " (the shape of q), got " << shape_of(out);
  }

  if (options.bias) {
    const TensorView& bias = *options.bias;
    TILELAB_REQUIRE_TYPE(bias.dtype() == DType::f32)
        << "bias: expected dtype float32, got " << dtype_name(bias.dtype());
    require_rank(bias, "bias", 4, "[B|1, Hq|1, M|1, N]");
    const std::int64_t full[4] = {problem.batch, problem.q_heads, problem.q_len, problem.kv_len};
    const bool broadcastable = (bias.dim(0) == 1 || bias.dim(0) == full[0]) &&
                               (bias.dim(1) == 1 || bias.dim(1) == full[1]) &&
                               (bias.dim(2) == 1 || bias.dim(2) == full[2]) &&
                               bias.dim(3) == full[3];
    TILELAB_REQUIRE(broadcastable)
        << "bias: expected shape [" << full[0] << "|1, " << full[1] << "|1, " << full[2] << "|1, "
        << full[3] << "], got " << shape_of(bias);
    require_addressable(bias, "bias");
    problem.bias = bias;
  }

  if (options.lse) {
    const TensorView& lse = *options.lse;
    TILELAB_REQUIRE_TYPE(lse.dtype() == DType::f32)
        << "lse: expected dtype float32, got " << dtype_name(lse.dtype());
    require_rank(lse, "lse", 3, "[B, Hq, M]");
    TILELAB_REQUIRE(lse.dim(0) == problem.batch && lse.dim(1) == problem.q_heads &&
                    lse.dim(2) == problem.q_len)
        << "lse: expected shape [" << problem.batch << ", " << problem.q_heads << ", "
        << problem.q_len << "], got " << shape_of(lse);
    require_addressable(lse, "lse");
    problem.lse = lse;
  }

  problem.scale = resolve_attention_scale(options.scale, problem.head_dim);

  // Outputs are written while inputs are still being read, and rows are written concurrently: any
  // aliasing would make the result depend on the schedule.
  require_no_self_overlap(out, "out");
  require_disjoint(out, "out", q, "q");
  require_disjoint(out, "out", k, "k");
  require_disjoint(out, "out", v, "v");
  if (problem.bias) require_disjoint(out, "out", *problem.bias, "bias");
  if (problem.lse) {
    const TensorView& lse = *problem.lse;
    require_disjoint(out, "out", lse, "lse");
    require_no_self_overlap(lse, "lse");
    require_disjoint(lse, "lse", q, "q");
    require_disjoint(lse, "lse", k, "k");
    require_disjoint(lse, "lse", v, "v");
    if (problem.bias) require_disjoint(lse, "lse", *problem.bias, "bias");
  }

  problem.kv_dtype = k.dtype();
  problem.score = resolve_score_options(options.score, problem.q_heads);
  require_kv_scales(problem.kv_dtype, options.k_scale, options.v_scale);
  problem.k_scale = options.k_scale;
  problem.v_scale = options.v_scale;
  problem.fp32_probabilities = options.fp32_probabilities;
  TILELAB_REQUIRE(!(problem.bias && problem.has_score_options_or_fp8()))
      << "bias: expected no bias together with score options (softcap, alibi_slopes, "
         "sliding_window, sinks) or fp8 k/v, which do not take a bias yet; got a bias of shape "
      << shape_of(*problem.bias);
  problem.position_offset =
      options.causal_alignment == CausalAlignment::top_left ? 0 : problem.kv_len - problem.q_len;

  problem.causal = options.causal;
  if (!options.causal) {
    problem.causal_offset = problem.kv_len;
  } else if (options.causal_alignment == CausalAlignment::top_left) {
    problem.causal_offset = 0;
  } else {
    problem.causal_offset = problem.kv_len - problem.q_len;
  }
  return problem;
}

// (Compared before subtracting or adding: a side may be as large as int64 allows.)
KeyBounds key_bounds(const AttentionProblem& p) {
  const SlidingWindow& window = p.score.window;
  // -q_len: every row's window begins at or before key 0.
  KeyBounds bounds{-p.q_len, p.causal_offset};
  if (window.left >= 0 && window.left < p.position_offset + p.q_len) {
    bounds.window_begin = p.position_offset - window.left;
  }
  if (window.right >= 0 && window.right < bounds.causal_offset - p.position_offset) {
    bounds.causal_offset = p.position_offset + window.right;
  }
  return bounds;
}

}  // namespace tilelab::detail

namespace tilelab::detail {

AttentionBackwardProblem validate_flash_attention_backward(
    const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
    const TensorView& out, const TensorView& lse, const TensorView& dq, const TensorView& dk,
    const TensorView& dv, const FlashAttentionOptions& options,
    const std::optional<TensorView>& dbias, const std::optional<TensorView>& dsinks) {
  check_cpu_isa_setting();
  TILELAB_REQUIRE(!options.lse)
      << "options.lse: expected no view for the backward (lse is an argument of "
         "flash_attention_backward), got "
      << options.lse->describe();
  // The forward's checks cover q, k, v, out (with the shape of q), lse, the bias and the scale.
  FlashAttentionOptions forward_options = options;
  forward_options.lse = lse;
  AttentionBackwardProblem problem;
  problem.forward = validate_flash_attention(q, k, v, out, forward_options);
  const AttentionProblem& forward = problem.forward;
  TILELAB_REQUIRE_TYPE(!is_fp8(forward.kv_dtype))
      << "k: expected the dtype of q (" << dtype_name(q.dtype())
      << ") for the backward, which does not take fp8 k and v; got " << dtype_name(k.dtype());

  // dout and dq have the shape of q; dk and dv that of k; all the dtype of q.
  const auto require_like = [&](const TensorView& view, const char* name,
                                const TensorView& reference, const char* reference_name,
                                const char* layout) {
    require_rank(view, name, 4, layout);
    TILELAB_REQUIRE_TYPE(view.dtype() == q.dtype())
        << name << ": expected dtype " << dtype_name(q.dtype()) << " (the dtype of q), got "
        << dtype_name(view.dtype());
    for (int i = 0; i < 4; ++i) {
      TILELAB_REQUIRE(view.dim(i) == reference.dim(i))
          << name << ": expected shape " << shape_of(reference) << " (the shape of "
          << reference_name << "), got " << shape_of(view);
    }
    require_addressable(view, name);
  };
  require_like(dout, "dout", q, "q", "[B, Hq, M, D]");
  require_like(dq, "dq", q, "q", "[B, Hq, M, D]");
  require_like(dk, "dk", k, "k", "[B, Hkv, N, D]");
  require_like(dv, "dv", k, "k", "[B, Hkv, N, D]");
  problem.dout = dout;
  problem.dq = dq;
  problem.dk = dk;
  problem.dv = dv;

  if (dbias) {
    TILELAB_REQUIRE(forward.bias.has_value())
        << "dbias: expected no view without a bias (options.bias is empty), got "
        << dbias->describe();
    const TensorView& bias = *forward.bias;
    TILELAB_REQUIRE_TYPE(dbias->dtype() == DType::f32)
        << "dbias: expected dtype float32, got " << dtype_name(dbias->dtype());
    require_rank(*dbias, "dbias", 4, "(the shape of bias)");
    for (int i = 0; i < 4; ++i) {
      TILELAB_REQUIRE(dbias->dim(i) == bias.dim(i))
          << "dbias: expected shape " << shape_of(bias) << " (the shape of bias), got "
          << shape_of(*dbias);
    }
    require_addressable(*dbias, "dbias");
    problem.dbias = dbias;
  }

  if (dsinks) {
    TILELAB_REQUIRE(options.score.sinks.has_value())
        << "dsinks: expected no view without sinks (options.score.sinks is empty), got "
        << dsinks->describe();
    TILELAB_REQUIRE_TYPE(dsinks->dtype() == DType::f32)
        << "dsinks: expected dtype float32, got " << dtype_name(dsinks->dtype());
    TILELAB_REQUIRE(dsinks->rank() == 1 && dsinks->dim(0) == forward.q_heads)
        << "dsinks: expected shape [" << forward.q_heads << "] (the query heads), got "
        << shape_of(*dsinks);
    require_addressable(*dsinks, "dsinks");
    problem.dsinks = dsinks;
  }

  // Every gradient is written while all inputs are still read, and in parallel.
  std::vector<std::pair<const TensorView*, const char*>> inputs = {
      {&dout, "dout"}, {&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}, {&lse, "lse"}};
  if (forward.bias) inputs.push_back({&*forward.bias, "bias"});
  if (options.score.alibi_slopes) inputs.push_back({&*options.score.alibi_slopes, "alibi_slopes"});
  if (options.score.sinks) inputs.push_back({&*options.score.sinks, "sinks"});
  std::vector<std::pair<const TensorView*, const char*>> outputs = {
      {&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}};
  if (problem.dbias) outputs.push_back({&*problem.dbias, "dbias"});
  if (problem.dsinks) outputs.push_back({&*problem.dsinks, "dsinks"});
  for (std::size_t o = 0; o < outputs.size(); ++o) {
    const auto& [written, name] = outputs[o];
    require_no_self_overlap(*written, name);
    for (const auto& [input, input_name] : inputs) {
      require_disjoint(*written, name, *input, input_name);
    }
    for (std::size_t other = 0; other < o; ++other) {
      require_disjoint(*written, name, *outputs[other].first, outputs[other].second);
    }
  }
  return problem;
}

}  // namespace tilelab::detail
