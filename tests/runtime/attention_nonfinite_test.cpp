// flash_attention with NaN, ±inf and overflowing inputs: only the mask (causal, a bias of -inf)
// masks a key, everything else follows IEEE arithmetic, the same in every implementation.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "tilelab/tilelab.hpp"

namespace {

using tilelab::DType;
using tilelab::Implementation;
using tilelab::TensorView;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// One [1, 1, M, D] × [1, 1, N, D] fp32 problem, contiguous; with_bias adds a full [1, 1, M, N]
// bias (the generated kernels then use their bias variant; without, M = 1 uses the decode one).
struct Problem {
  std::int64_t m, n, d;
  std::vector<float> q, k, v, bias, out, lse;
  bool causal = false;
  bool with_bias = false;

  Problem(std::int64_t m_, std::int64_t n_, std::int64_t d_)
      : m(m_), n(n_), d(d_), q(m * d), k(n * d), v(n * d), bias(m * n, 0.0f), out(m * d), lse(m) {
    // Small values, distinct per element; v's rows differ so a dropped key changes the mean.
    for (std::size_t i = 0; i < q.size(); ++i) q[i] = 0.01f * static_cast<float>(i % 13) - 0.05f;
    for (std::size_t i = 0; i < k.size(); ++i) k[i] = 0.02f * static_cast<float>(i % 11) - 0.1f;
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * static_cast<float>(i % 17) - 0.8f;
  }

  float& q_at(std::int64_t i, std::int64_t dim) { return q[i * d + dim]; }
  float& k_at(std::int64_t j, std::int64_t dim) { return k[j * d + dim]; }
  float& bias_at(std::int64_t i, std::int64_t j) {
    with_bias = true;
    return bias[i * n + j];
  }
  float out_at(std::int64_t i, std::int64_t dim) const { return out[i * d + dim]; }

  void run(Implementation implementation) {
    std::fill(out.begin(), out.end(), 12345.0f);
    std::fill(lse.begin(), lse.end(), 12345.0f);
    tilelab::FlashAttentionOptions options;
    options.causal = causal;
    options.implementation = implementation;
    if (with_bias) options.bias = TensorView(bias.data(), DType::f32, {1, 1, m, n});
    options.lse = TensorView(lse.data(), DType::f32, {1, 1, m});
    tilelab::flash_attention(TensorView(q.data(), DType::f32, {1, 1, m, d}),
                             TensorView(k.data(), DType::f32, {1, 1, n, d}),
                             TensorView(v.data(), DType::f32, {1, 1, n, d}),
                             TensorView(out.data(), DType::f32, {1, 1, m, d}), options);
  }

  bool row_all_nan(std::int64_t i) const {
    for (std::int64_t dim = 0; dim < d; ++dim) {
      if (!std::isnan(out_at(i, dim))) return false;
    }
    return true;
  }
  bool row_all_finite(std::int64_t i) const {
    for (std::int64_t dim = 0; dim < d; ++dim) {
      if (!std::isfinite(out_at(i, dim))) return false;
    }
    return std::isfinite(lse[i]);
  }
  bool row_masked(std::int64_t i) const {
    for (std::int64_t dim = 0; dim < d; ++dim) {
      if (out_at(i, dim) != 0.0f) return false;
    }
    return lse[i] == -kInf;
  }
};

std::vector<Implementation> implementations() {
#ifdef TILELAB_HAVE_KERNELS
  return {Implementation::generated, Implementation::reference};
#else
  return {Implementation::reference};
#endif
}

const char* implementation_name(Implementation implementation) {
  return implementation == Implementation::generated ? "generated" : "reference";
}

// Query rows: 1 (the decode kernel) and 5 (prefill); 70 keys span two key blocks.
const std::int64_t kQueryRows[] = {1, 5};

}  // namespace

TEST_CASE("flash_attention: NaN in a row of q gives that row NaN out and NaN lse",
          "[runtime][attention][nonfinite]") {
  for (const Implementation implementation : implementations()) {
    for (const std::int64_t m : kQueryRows) {
      INFO(implementation_name(implementation) << " M=" << m);
      Problem p(m, 70, 16);
      const std::int64_t row = m - 1;
      p.q_at(row, 3) = kNaN;
      p.run(implementation);
      CHECK(p.row_all_nan(row));
      CHECK(std::isnan(p.lse[row]));
      for (std::int64_t i = 0; i < row; ++i) CHECK(p.row_all_finite(i));
    }
  }
}

TEST_CASE("flash_attention: NaN in a visible key or in the bias gives NaN, not a dropped key",
          "[runtime][attention][nonfinite]") {
  for (const Implementation implementation : implementations()) {
    for (const std::int64_t m : kQueryRows) {
      INFO(implementation_name(implementation) << " M=" << m);
      {
        Problem p(m, 70, 16);
        p.k_at(66, 0) = kNaN;  // the second key block
        p.run(implementation);
        for (std::int64_t i = 0; i < m; ++i) {
          CHECK(p.row_all_nan(i));
          CHECK(std::isnan(p.lse[i]));
        }
      }
      {
        Problem p(m, 70, 16);
        p.bias_at(0, 5) = kNaN;
        p.run(implementation);
        CHECK(p.row_all_nan(0));
        CHECK(std::isnan(p.lse[0]));
        for (std::int64_t i = 1; i < m; ++i) CHECK(p.row_all_finite(i));
      }
    }
  }
}

TEST_CASE("flash_attention: NaN in a causally masked key changes nothing",
          "[runtime][attention][nonfinite]") {
  for (const Implementation implementation : implementations()) {
    INFO(implementation_name(implementation));
    Problem clean(5, 5, 16);
    clean.causal = true;
    clean.run(implementation);
    Problem p = clean;
    p.k_at(4, 2) = kNaN;  // seen by row 4 only
    p.run(implementation);
    for (std::int64_t i = 0; i < 4; ++i) {
      for (std::int64_t dim = 0; dim < p.d; ++dim) CHECK(p.out_at(i, dim) == clean.out_at(i, dim));
      CHECK(p.lse[i] == clean.lse[i]);
    }
    CHECK(p.row_all_nan(4));
  }
}

TEST_CASE("flash_attention: a bias of +inf gives NaN (inf - inf), not a finite row",
          "[runtime][attention][nonfinite]") {
  for (const Implementation implementation : implementations()) {
    for (const std::int64_t m : kQueryRows) {
      INFO(implementation_name(implementation) << " M=" << m);
      Problem p(m, 70, 16);
      p.bias_at(0, 10) = kInf;
      p.run(implementation);
      CHECK(p.row_all_nan(0));
      CHECK(std::isnan(p.lse[0]));
      for (std::int64_t i = 1; i < m; ++i) CHECK(p.row_all_finite(i));
    }
  }
}

TEST_CASE("flash_attention: q·k overflowing fp32 gives NaN as IEEE does, not a masked row",
          "[runtime][attention][nonfinite]") {
  // Every score +inf (inf - inf) or every score -inf (0 / 0).
  for (const float k_value : {1e20f, -1e20f}) {
    for (const Implementation implementation : implementations()) {
      for (const std::int64_t m : kQueryRows) {
        INFO(implementation_name(implementation) << " M=" << m << " k=" << k_value);
        Problem p(m, 70, 16);
        std::fill(p.q.begin(), p.q.end(), 1e20f);
        std::fill(p.k.begin(), p.k.end(), k_value);
        p.run(implementation);
        for (std::int64_t i = 0; i < m; ++i) {
          CHECK(p.row_all_nan(i));
          CHECK(std::isnan(p.lse[i]));
        }
      }
    }
  }
}

TEST_CASE("flash_attention: a bias of -inf masks the key whatever q is; masked rows are never NaN",
          "[runtime][attention][nonfinite]") {
  for (const Implementation implementation : implementations()) {
    for (const std::int64_t m : kQueryRows) {
      INFO(implementation_name(implementation) << " M=" << m);
      Problem p(m, 70, 16);
      for (std::int64_t j = 0; j < p.n; ++j) p.bias_at(0, j) = -kInf;
      p.q_at(0, 0) = kNaN;
      for (std::int64_t dim = 0; dim < p.d; ++dim) p.k_at(3, dim) = kInf;
      p.run(implementation);
      CHECK(p.row_masked(0));
      // Key 3 (q·k = inf - inf) is visible to the other rows: NaN there.
      for (std::int64_t i = 1; i < m; ++i) CHECK(p.row_all_nan(i));
    }
  }
}

TEST_CASE("flash_attention: very negative finite scores are scores, in every implementation",
          "[runtime][attention][nonfinite]") {
  for (const Implementation implementation : implementations()) {
    for (const std::int64_t m : kQueryRows) {
      INFO(implementation_name(implementation) << " M=" << m);
      Problem p(m, 70, 16);
      for (std::int64_t j = 0; j < p.n; ++j) p.bias_at(0, j) = -1e30f;
      p.run(implementation);
      // q·k is negligible next to 1e30: uniform weights, out = mean of V, lse = -1e30 + log N.
      for (std::int64_t dim = 0; dim < p.d; ++dim) {
        double mean = 0;
        for (std::int64_t j = 0; j < p.n; ++j) mean += p.v[j * p.d + dim];
        mean /= static_cast<double>(p.n);
        CHECK(p.out_at(0, dim) == Approx(mean).margin(1e-5));
      }
      CHECK(p.lse[0] == Approx(-1e30));
    }
  }
}
