// Flash prefill kernel: functional runs against an fp64 reference (partial tiles, one token,
// causal on and off, bf16 and fp32) and clear errors for bad parameters.
#include <cmath>
#include <random>

#include "sim/functional.hpp"
#include "sim/kernels/flash_prefill.hpp"
#include "sim/kernels/registry.hpp"
#include "test_util.hpp"

namespace tilelab::sim {
namespace {

using namespace test;

// Runs the kernel on random data; returns the largest |kernel - fp64 reference| (NaN if any).
double max_error(const Machine& machine, const FlashPrefillConfig& c) {
  const Program program = build_flash_prefill(machine, c);
  const int64_t H = c.num_heads, S = c.seq_len, d = c.head_dim;
  std::mt19937 rng(5);
  const auto query = random_values(size_t(H * d * S), c.dtype, rng);
  const auto key = random_values(size_t(H * d * S), c.dtype, rng);
  const auto value = random_values(size_t(H * S * d), c.dtype, rng);
  FunctionalExecutor exec(program);
  exec.set_tensor("query", query);  // (H, d, S)
  exec.set_tensor("key", key);      // (H, d, S)
  exec.set_tensor("value", value);  // (H, S, d)
  exec.run();
  const std::vector<float> out = exec.tensor("output");  // (H, S, d)
  REQUIRE(out.size() == size_t(H * S * d));

  const double scale = 1.0 / std::sqrt(double(d));
  double worst = 0;
  std::vector<double> scores(size_t(S), 0.0), acc(size_t(d), 0.0);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t q = 0; q < S; ++q) {
      const int64_t keys = c.causal ? q + 1 : S;
      double best = -1e300;
      for (int64_t k = 0; k < keys; ++k) {
        double dot = 0;
        for (int64_t i = 0; i < d; ++i)
          dot += double(query[size_t((h * d + i) * S + q)]) * key[size_t((h * d + i) * S + k)];
        scores[size_t(k)] = dot * scale;
        best = std::max(best, scores[size_t(k)]);
      }
      double sum = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t k = 0; k < keys; ++k) {
        const double w = std::exp(scores[size_t(k)] - best);
        sum += w;
        for (int64_t i = 0; i < d; ++i) acc[size_t(i)] += w * value[size_t((h * S + k) * d + i)];
      }
      for (int64_t i = 0; i < d; ++i) {
        const double error = std::fabs(out[size_t((h * S + q) * d + i)] - acc[size_t(i)] / sum);
        if (std::isnan(error)) return error;  // std::max would drop it
        worst = std::max(worst, error);
      }
    }
  return worst;
}

// bf16 TensorE inputs and P in bf16 (2^-8 relative each) as in the paged kernel's test; fp32 all
// through.
constexpr double kBf16Tolerance = 1e-2;
constexpr double kFp32Tolerance = 2e-6;

FlashPrefillConfig config(int64_t seq_len, int64_t head_dim, int64_t kv_tile, bool causal,
                          DType dtype) {
  FlashPrefillConfig c;
  c.num_heads = 2;
  c.seq_len = seq_len;
  c.head_dim = head_dim;
  c.kv_tile = kv_tile;
  c.causal = causal;
  c.dtype = dtype;
  return c;
}

}  // namespace

TEST_CASE("flash prefill: matches the fp64 reference on partial tiles", "[sim][flash_prefill]") {
  for (const bool causal : {true, false}) {
    INFO("causal " << causal);
    // 300 tokens = 2 full query tiles + 44 rows; key tiles of 256: one full, one of 44 keys.
    CHECK(max_error(trn1(), config(300, 64, 256, causal, DType::fp32)) < kFp32Tolerance);
    CHECK(max_error(trn1(), config(300, 64, 256, causal, DType::bf16)) < kBf16Tolerance);
    // One key tile of 512 over 3 query tiles; trn2.
    CHECK(max_error(trn2(), config(333, 32, 512, causal, DType::fp32)) < kFp32Tolerance);
    // Key tiles of 128 (one query tile each): every causal tile is diagonal or skipped.
    CHECK(max_error(trn1(), config(200, 128, 128, causal, DType::fp32)) < kFp32Tolerance);
  }
}

TEST_CASE("flash prefill: one token attends itself", "[sim][flash_prefill]") {
  for (const bool causal : {true, false}) {
    CHECK(max_error(trn1(), config(1, 16, 512, causal, DType::fp32)) < kFp32Tolerance);
    CHECK(max_error(trn1(), config(1, 128, 512, causal, DType::bf16)) < kBf16Tolerance);
  }
}

TEST_CASE("flash prefill: causal skips the key tiles after each query tile",
          "[sim][flash_prefill]") {
  const Program causal = build_flash_prefill(trn1(), config(1024, 64, 128, true, DType::bf16));
  const Program dense = build_flash_prefill(trn1(), config(1024, 64, 128, false, DType::bf16));
  auto matmuls = [](const Program& p) {
    return std::count_if(p.instructions.begin(), p.instructions.end(),
                         [](const Instruction& i) { return i.opcode == Opcode::matmul; });
  };
  // 8 query tiles x 8 key tiles dense; 36 of the pairs are on or below the diagonal.
  CHECK(matmuls(causal) * 64 == matmuls(dense) * 36);
}

TEST_CASE("flash prefill: bad parameters are clear errors", "[sim][flash_prefill]") {
  const KernelInfo& kernel = kernel_registry().find("flash-prefill");
  auto build = [&kernel](KernelParameters given) {
    return [&kernel, given] { kernel.build(trn1(), resolve_parameters(kernel, given)); };
  };
  CHECK_THAT(error_of(build({{"seq_len", "0"}})),
             Catch::Contains("parameter 'seq_len': 0 outside [1, 1048576]"));
  CHECK_THAT(error_of(build({{"head_dim", "200"}})),
             Catch::Contains("parameter 'head_dim': 200 outside [1, 128]"));
  CHECK_THAT(error_of(build({{"kv_tile", "300"}})),
             Catch::Contains("kv_tile: 300 must be a multiple of 128 in [128, 8192]"));
  CHECK_THAT(error_of(build({{"causal", "yes"}})),
             Catch::Contains("parameter 'causal': 'yes' is not one of true, false"));
  CHECK_THAT(error_of(build({{"dtype", "int8"}})),
             Catch::Contains("parameter 'dtype': 'int8' is not one of bf16, fp16, fp32"));
  CHECK_THAT(error_of(build({{"num_heads", "-1"}})),
             Catch::Contains("parameter 'num_heads': -1 outside [1, 4096]"));

  FlashPrefillConfig c;
  c.head_dim = 129;
  CHECK_THAT(error_of([&] { build_flash_prefill(trn1(), c); }),
             Catch::Contains("head_dim: 129 outside [1, 128]"));
  c = {};
  c.seq_len = 0;
  CHECK_THAT(error_of([&] { build_flash_prefill(trn1(), c); }),
             Catch::Contains("seq_len: 0 outside [1, 1048576]"));
  c = {};
  c.kv_tile = 64;
  CHECK_THAT(error_of([&] { build_flash_prefill(trn1(), c); }),
             Catch::Contains("kv_tile: 64 must be a multiple of 128"));
  c = {};
  c.dtype = DType::int32;
  CHECK_THAT(error_of([&] { build_flash_prefill(trn1(), c); }),
             Catch::Contains("dtype: expected bf16, fp16 or fp32, got int32"));
}

}  // namespace tilelab::sim
