// A consumer of the installed tilelab: runs flash_attention on a small problem and compares it with
// a naive computation. Exits 0 when they agree, 1 otherwise.
#include <tilelab/tilelab.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  // q [B, Hq, M, D], k and v [B, Hkv, N, D]; two query heads share one kv head; bottom-right
  // causal.
  constexpr int B = 2, Hq = 2, Hkv = 1, M = 5, N = 9, D = 16;
  std::vector<float> q(B * Hq * M * D), k(B * Hkv * N * D), v(B * Hkv * N * D);
  std::vector<float> out(B * Hq * M * D, -1.0f), lse(B * Hq * M);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37f * i);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.11f * i);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.05f * i + 1.0f);

  tilelab::FlashAttentionOptions options;
  options.causal = true;
  options.causal_alignment = tilelab::CausalAlignment::bottom_right;
  options.lse = tilelab::TensorView(lse.data(), tilelab::DType::f32, {B, Hq, M});
  try {
    tilelab::flash_attention(tilelab::TensorView(q.data(), tilelab::DType::f32, {B, Hq, M, D}),
                             tilelab::TensorView(k.data(), tilelab::DType::f32, {B, Hkv, N, D}),
                             tilelab::TensorView(v.data(), tilelab::DType::f32, {B, Hkv, N, D}),
                             tilelab::TensorView(out.data(), tilelab::DType::f32, {B, Hq, M, D}),
                             options);
  } catch (const tilelab::Error& error) {
    std::fprintf(stderr, "flash_attention failed: %s\n", error.what());
    return 1;
  }

  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  double worst_out = 0.0, worst_lse = 0.0;
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < Hq; ++h) {
      const int kv_head = h / (Hq / Hkv);
      for (int i = 0; i < M; ++i) {
        std::vector<double> p(N, 0.0);
        double max_score = -INFINITY, sum = 0.0;
        const int visible = i + (N - M) + 1;  // keys j <= i + N - M
        for (int j = 0; j < visible; ++j) {
          double dot = 0.0;
          for (int d = 0; d < D; ++d) {
            dot += double(q[((b * Hq + h) * M + i) * D + d]) *
                   k[((b * Hkv + kv_head) * N + j) * D + d];
          }
          p[j] = scale * dot;
          max_score = std::max(max_score, p[j]);
        }
        for (int j = 0; j < visible; ++j) sum += (p[j] = std::exp(p[j] - max_score));
        for (int d = 0; d < D; ++d) {
          double expected = 0.0;
          for (int j = 0; j < visible; ++j)
            expected += p[j] * v[((b * Hkv + kv_head) * N + j) * D + d];
          expected /= sum;
          worst_out = std::max(worst_out, std::abs(expected - out[((b * Hq + h) * M + i) * D + d]));
        }
        const double expected_lse = max_score + std::log(sum);
        worst_lse = std::max(worst_lse, std::abs(expected_lse - lse[(b * Hq + h) * M + i]));
      }
    }
  }
  std::printf("tilelab %s: flash_attention max abs error: out %.3g, lse %.3g\n", TILELAB_VERSION,
              worst_out, worst_lse);
  // fp32 accumulation over at most 9 keys of 16 products each: a few ulps of values of order 1.
  return worst_out < 1e-5 && worst_lse < 1e-5 ? 0 : 1;
}
