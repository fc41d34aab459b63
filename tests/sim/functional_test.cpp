// Functional mode against fp64 references: tiled matmuls (the tutorial kernels at small shapes),
// a softmax tile program, rounding, NaN-filled memory, gathers and transposes.
#include <cmath>
#include <random>

#include "sim/functional.hpp"
#include "sim/kernels/matmul_tutorial.hpp"
#include "test_util.hpp"

using namespace tilelab::sim;
using namespace tilelab::sim::test;
using Catch::Matchers::Contains;

namespace {

std::vector<float> random_values(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<float> rounded(std::vector<float> v, DType dtype) {
  for (auto& x : v) x = round_to_dtype(x, dtype);
  return v;
}

// Runs a tutorial matmul functionally and compares with an fp64 reference of the rounded inputs.
// Checks every `row_step`-th row. Tolerance per element: output rounding (2^-8 relative for bf16)
// on each of the `roundings` roundings of partial sums, plus fp32 accumulation, all relative to sum
// |a||b|.
void check_matmul(MatmulVariant variant, int64_t m, int64_t k, int64_t n, DType dtype,
                  int roundings, int64_t row_step = 1) {
  MatmulTutorialConfig c;
  c.variant = variant;
  c.m = m;
  c.k = k;
  c.n = n;
  c.dtype = dtype;
  const Program p = build_matmul_tutorial(trn1(), c);
  const std::vector<float> lhsT = rounded(random_values(size_t(k * m), -1, 1, 1), dtype);
  const std::vector<float> rhs = rounded(random_values(size_t(k * n), -1, 1, 2), dtype);
  FunctionalExecutor exec(p);
  exec.set_tensor("lhsT", lhsT);
  exec.set_tensor("rhs", rhs);
  exec.run();
  const std::vector<float> result = exec.tensor("result");
  const double unit = dtype == DType::fp32 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -8);
  double worst = 0;
  for (int64_t i = 0; i < m; i += row_step)
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0, magnitude = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double prod = double(lhsT[kk * m + i]) * double(rhs[kk * n + j]);
        ref += prod;
        magnitude += std::fabs(prod);
      }
      const double got = result[i * n + j];
      const double tolerance =
          roundings * unit * magnitude + double(k) * std::ldexp(1.0, -24) * magnitude;
      worst = std::max(worst, std::fabs(got - ref) / tolerance);
      if (!(std::fabs(got - ref) <= tolerance)) {
        FAIL_CHECK("result[" << i << ", " << j << "] = " << got << ", fp64 " << ref
                             << ", tolerance " << tolerance);
        return;
      }
    }
  INFO("worst error / tolerance " << worst);
  CHECK(worst <= 1.0);
}

}  // namespace

TEST_CASE("functional: bf16 and fp16 rounding is round-to-nearest-even", "[sim][functional]") {
  CHECK(round_to_dtype(1.0f + std::ldexp(1.0f, -8), DType::bf16) == 1.0f);  // tie -> even
  CHECK(round_to_dtype(1.0f + 3 * std::ldexp(1.0f, -8), DType::bf16) ==
        1.0f + std::ldexp(1.0f, -6));  // tie -> even (up)
  CHECK(round_to_dtype(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -12), DType::bf16) ==
        1.0f + std::ldexp(1.0f, -7));
  CHECK(round_to_dtype(1.0f + std::ldexp(1.0f, -11), DType::fp16) == 1.0f);
  CHECK(round_to_dtype(1.0f + 3 * std::ldexp(1.0f, -11), DType::fp16) ==
        1.0f + std::ldexp(1.0f, -9));
  CHECK(std::isinf(round_to_dtype(65520.0f, DType::fp16)));
  CHECK(round_to_dtype(65519.0f, DType::fp16) == 65504.0f);
  CHECK(round_to_dtype(std::ldexp(1.0f, -24), DType::fp16) == std::ldexp(1.0f, -24));  // subnormal
  CHECK(round_to_dtype(std::ldexp(1.0f, -26), DType::fp16) == 0.0f);
  CHECK(std::isnan(round_to_dtype(std::nanf(""), DType::bf16)));
  CHECK(round_to_dtype(2.5f, DType::int32) == 2.0f);
  CHECK(round_to_dtype(1.4f, DType::uint8) == 1.0f);
  CHECK(round_to_dtype(300.0f, DType::uint8) == 255.0f);
  CHECK(round_to_dtype(-3.0f, DType::uint8) == 0.0f);
}

TEST_CASE("functional: tutorial matmuls match an fp64 reference", "[sim][functional]") {
  SECTION("tiled, bf16") {
    check_matmul(MatmulVariant::tiled, 256, 256, 512, DType::bf16, 1);
  }
  SECTION("hoist_load, bf16") {
    check_matmul(MatmulVariant::hoist_load, 128, 384, 1024, DType::bf16, 1);
  }
  SECTION("block_free, fp32") {
    check_matmul(MatmulVariant::block_free, 256, 256, 1024, DType::fp32, 1);
  }
}

TEST_CASE("functional: fully optimized matmul matches an fp64 reference",
          "[sim][functional][slow]") {
  // The SBUF result accumulator is bf16 and rounds once per K block (2) and once on the copy.
  check_matmul(MatmulVariant::fully_optimized, 2048, 2048, 1024, DType::bf16, 3, /*row_step=*/7);
}

TEST_CASE("functional: a softmax tile program matches fp64", "[sim][functional]") {
  for (const DType out_dtype : {DType::fp32, DType::bf16}) {
    ProgramBuilder b(trn1(), "softmax");
    const int64_t rows = 128, cols = 1000;
    const Tensor x = b.hbm_tensor("x", {rows, cols}, DType::fp32);
    const Tensor y = b.hbm_tensor("y", {rows, cols}, out_dtype);
    const Tile xt = b.sbuf_tile("x_sb", 128, cols, DType::fp32);
    const Tile neg_max = b.sbuf_tile("neg_max", 128, 1, DType::fp32);
    const Tile sum = b.sbuf_tile("sum", 128, 1, DType::fp32);
    const Tile inv = b.sbuf_tile("inv", 128, 1, DType::fp32);
    const Tile e = b.sbuf_tile("e", 128, cols, DType::fp32);
    const Tile out = b.sbuf_tile("out", 128, cols, out_dtype);
    b.dma_copy(b.view(xt), b.hbm_rows(x, 0, rows, 0, cols));
    b.tensor_reduce(b.view(neg_max), b.view(xt), AluOp::max, /*negate=*/true);
    ActivationOptions o;
    o.bias = b.view(neg_max);
    o.reduce_result = b.view(sum);
    b.activation(b.view(e), b.view(xt), ActFunc::exp, o);
    b.activation(b.view(inv), b.view(sum), ActFunc::reciprocal);
    b.tensor_scalar(b.view(out), b.view(e), AluOp::multiply, Scalar::per_partition(b.view(inv)));
    b.dma_copy(b.hbm_rows(y, 0, rows, 0, cols), b.view(out));
    const Program p = b.finish();

    const std::vector<float> input = random_values(size_t(rows * cols), -8, 8, 3);
    FunctionalExecutor exec(p);
    exec.set_tensor(x, input);
    exec.run();
    const std::vector<float> got = exec.tensor(y);
    const double relative = out_dtype == DType::bf16 ? std::ldexp(1.0, -8) : 2e-6 * 8;
    for (int64_t r = 0; r < rows; ++r) {
      double max = -1e300, total = 0;
      for (int64_t c = 0; c < cols; ++c) max = std::max(max, double(input[r * cols + c]));
      for (int64_t c = 0; c < cols; ++c) total += std::exp(double(input[r * cols + c]) - max);
      for (int64_t c = 0; c < cols; ++c) {
        const double ref = std::exp(double(input[r * cols + c]) - max) / total;
        const double g = got[r * cols + c];
        if (!(std::fabs(g - ref) <= relative * ref + 1e-9)) {
          FAIL("softmax[" << r << ", " << c << "] = " << g << ", fp64 " << ref << " ("
                          << dtype_name(out_dtype) << ")");
        }
      }
    }
  }
}

TEST_CASE("functional: uninitialised memory reads as NaN", "[sim][functional]") {
  ProgramBuilder b(trn1(), "nan");
  const Tensor y = b.hbm_tensor("y", {128, 8}, DType::fp32);
  const Tile t = b.sbuf_tile("t", 128, 8, DType::fp32);
  b.memset(b.view(t, 0, 128, 0, 4), 1.0f);  // half initialised
  b.dma_copy(b.hbm_rows(y, 0, 128, 0, 8), b.view(t));
  const Program p = b.finish();
  FunctionalExecutor exec(p);
  exec.run();
  const std::vector<float> out = exec.tensor(y);
  CHECK(out[0] == 1.0f);
  CHECK(out[3] == 1.0f);
  CHECK(std::isnan(out[4]));
  CHECK(std::isnan(out[7 * 8 + 7]));
}

TEST_CASE("functional: iota + indirect gather, and a bad index is a clear error",
          "[sim][functional]") {
  for (const bool out_of_range : {false, true}) {
    ProgramBuilder b(trn1(), "gather");
    const Tensor table = b.hbm_tensor("table", {300, 16}, DType::fp32);
    const Tile index = b.sbuf_tile("index", 128, 1, DType::int32);
    const Tile rows = b.sbuf_tile("rows", 128, 8, DType::fp32);
    b.iota(b.view(index), out_of_range ? 200 : 5, 2, 0);  // row 5 + 2p (or 200 + 2p)
    b.dma_gather(b.view(rows), table, b.view(index), 4);
    const Program p = b.finish();
    std::vector<float> values(300 * 16);
    for (size_t i = 0; i < values.size(); ++i) values[i] = float(i);
    FunctionalExecutor exec(p);
    exec.set_tensor(table, values);
    if (out_of_range) {
      CHECK_THAT(error_of([&] { exec.run(); }),
                 Contains("index tile 'index'") && Contains("row 300") && Contains("[0, 300)"));
    } else {
      exec.run();
      const std::vector<float> got = exec.tile(rows);
      for (int p_index = 0; p_index < 128; ++p_index)
        for (int j = 0; j < 8; ++j)
          CHECK(got[p_index * 8 + j] == float((5 + 2 * p_index) * 16 + 4 + j));
    }
  }
}

TEST_CASE("functional: gather from one batch of a rank-3 tensor, selected by a uint8 mask",
          "[sim][functional]") {
  ProgramBuilder b(trn1(), "batched gather");
  const Tensor cache = b.hbm_tensor("cache", {2, 50, 8}, DType::fp32);  // [kv, rows, cols]
  const Tensor mask = b.hbm_tensor("mask", {32, 8}, DType::uint8);
  const Tile index = b.sbuf_tile("index", 32, 1, DType::int32);
  const Tile rows = b.sbuf_tile("rows", 32, 8, DType::fp32);
  const Tile keep = b.sbuf_tile("keep", 32, 8, DType::uint8);
  const Tile out = b.sbuf_tile("out", 32, 8, DType::fp32);
  b.iota(b.view(index), 49, -1, 0);  // rows 49, 48, ..., 18 of batch 1
  b.dma_gather(b.view(rows), cache, 1, b.view(index), 0);
  b.dma_copy(b.view(keep), b.hbm_rows(mask, 0, 32, 0, 8));
  b.select(b.view(out), b.view(keep), b.view(rows), Scalar::constant(-9984.0f));
  CHECK_THAT(error_of([&] { b.dma_gather(b.view(rows), cache, 2, b.view(index), 0); }),
             Contains("batch 2 outside [0, 2)"));
  const Program p = b.finish();
  CHECK(p.dmas[0].bytes_per_partition == 8 * 4);
  CHECK(p.dmas[1].bytes_per_partition == 8);  // one byte per mask element
  std::vector<float> values(2 * 50 * 8), keep_values(32 * 8);
  for (size_t i = 0; i < values.size(); ++i) values[i] = float(i);
  for (size_t i = 0; i < keep_values.size(); ++i) keep_values[i] = float(i % 3 == 0);
  FunctionalExecutor exec(p);
  exec.set_tensor(cache, values);
  exec.set_tensor(mask, keep_values);
  exec.run();
  const std::vector<float> got = exec.tile(out);
  for (int row = 0; row < 32; ++row)
    for (int j = 0; j < 8; ++j)
      CHECK(got[size_t(row * 8 + j)] ==
            ((row * 8 + j) % 3 == 0 ? float((50 + 49 - row) * 8 + j) : -9984.0f));
}

TEST_CASE("functional: PE transpose, DMA transpose, select and casts", "[sim][functional]") {
  ProgramBuilder b(trn2(), "transpose");
  const Tensor x = b.hbm_tensor("x", {64, 32}, DType::bf16);
  const Tile in = b.sbuf_tile("in", 64, 32, DType::bf16);
  const Tile pe = b.psum_tile("pe", 32, 64, DType::fp32);
  const Tile dma = b.sbuf_tile("dma", 32, 64, DType::bf16);
  const Tile mask = b.sbuf_tile("mask", 32, 64, DType::fp32);
  const Tile picked = b.sbuf_tile("picked", 32, 64, DType::fp16);
  b.dma_copy(b.view(in), b.hbm_rows(x, 0, 64, 0, 32));
  b.pe_transpose(b.view(pe), b.view(in));
  b.dma_transpose(b.view(dma), b.hbm_rows(x, 0, 64, 0, 32));
  b.iota(b.view(mask), 0, 0, 1);  // column index
  b.tensor_scalar(b.view(mask), b.view(mask), AluOp::subtract, Scalar::constant(31.5f));
  b.tensor_scalar(b.view(mask), b.view(mask), AluOp::max, Scalar::constant(0.0f));  // f > 31
  b.select(b.view(picked), b.view(mask), b.view(pe), Scalar::constant(-9984.0f));
  const Program p = b.finish();
  std::vector<float> values(64 * 32);
  for (size_t i = 0; i < values.size(); ++i) values[i] = float(i) * 0.37f;
  FunctionalExecutor exec(p);
  exec.set_tensor(x, values);
  exec.run();
  const auto pe_out = exec.tile(pe);
  const auto dma_out = exec.tile(dma);
  const auto picked_out = exec.tile(picked);
  for (int f = 0; f < 32; ++f)
    for (int q = 0; q < 64; ++q) {
      const float source = round_to_dtype(values[q * 32 + f], DType::bf16);
      CHECK(pe_out[f * 64 + q] == source);
      CHECK(dma_out[f * 64 + q] == source);
      CHECK(picked_out[f * 64 + q] == (q > 31 ? round_to_dtype(source, DType::fp16) : -9984.0f));
    }
}

TEST_CASE("functional: activation scale/bias tiles, two-op tensor_scalar and reductions",
          "[sim][functional]") {
  ProgramBuilder b(trn1(), "ops");
  const Tile x = b.sbuf_tile("x", 32, 16, DType::fp32);
  const Tile scale = b.sbuf_tile("scale", 32, 1, DType::fp32);
  const Tile bias = b.sbuf_tile("bias", 32, 1, DType::bf16);
  const Tile y = b.sbuf_tile("y", 32, 16, DType::fp32);
  const Tile z = b.sbuf_tile("z", 32, 16, DType::fp32);
  const Tile sum = b.sbuf_tile("sum", 32, 1, DType::fp32);
  const Tile low = b.sbuf_tile("low", 32, 1, DType::fp32);
  b.iota(b.view(x), -8, 1, 1);     // x[p, f] = p + f - 8
  b.iota(b.view(scale), 1, 1, 0);  // scale[p] = p + 1
  b.memset(b.view(bias), 0.5f);
  ActivationOptions o;
  o.scale_tile = b.view(scale);
  o.bias = b.view(bias);
  o.reduce_result = b.view(sum);
  b.activation(b.view(y), b.view(x), ActFunc::square, o);  // (x * (p+1) + 0.5)^2
  b.tensor_scalar(b.view(z), b.view(x), AluOp::multiply, Scalar::constant(2.0f), AluOp::add,
                  Scalar::per_partition(b.view(scale)));  // 2x + p + 1
  b.tensor_reduce(b.view(low), b.view(z), AluOp::min, /*negate=*/true);
  const Program p = b.finish();
  FunctionalExecutor exec(p);
  exec.run();
  const auto y_out = exec.tile(y), z_out = exec.tile(z), sum_out = exec.tile(sum),
             low_out = exec.tile(low);
  for (int q = 0; q < 32; ++q) {
    double expected_sum = 0;
    for (int f = 0; f < 16; ++f) {
      const double xv = q + f - 8;
      const double yv = (xv * (q + 1) + 0.5) * (xv * (q + 1) + 0.5);
      expected_sum += yv;
      CHECK(y_out[q * 16 + f] == Approx(yv));
      CHECK(z_out[q * 16 + f] == Approx(2 * xv + q + 1));
    }
    CHECK(sum_out[q] == Approx(expected_sum));
    CHECK(low_out[q] == Approx(-(2.0 * (q - 8) + q + 1)));
  }
}

TEST_CASE("functional: a partition mask moves only the kept partitions", "[sim][functional]") {
  ProgramBuilder b(trn1(), "mask");
  const Tensor x = b.hbm_tensor("x", {128, 4}, DType::fp32);
  const Tile t = b.sbuf_tile("t", 128, 4, DType::fp32);
  b.dma_copy(b.view(t), b.hbm_rows(x, 0, 128, 0, 4), {Engine::sync, -1, 100});
  const Program p = b.finish();
  CHECK(p.dmas[0].partitions == 100);
  CHECK(p.dmas[0].bytes() == 100 * 16);
  std::vector<float> values(128 * 4, 3.0f);
  FunctionalExecutor exec(p);
  exec.set_tensor(x, values);
  exec.run();
  const auto out = exec.tile(t);
  CHECK(out[99 * 4 + 3] == 3.0f);
  CHECK(std::isnan(out[100 * 4]));
}

TEST_CASE("functional: tensor_tensor_scan runs the recurrence in fp32 per partition",
          "[sim][functional]") {
  for (const bool reverse : {false, true}) {
    ProgramBuilder b(trn1(), "scan");
    const Tensor x = b.hbm_tensor("x", {3, 5}, DType::fp32);
    const Tensor y = b.hbm_tensor("y", {3, 5}, DType::fp32);
    const Tile a = b.sbuf_tile("a", 3, 5, DType::fp32);
    const Tile c = b.sbuf_tile("c", 3, 5, DType::fp32);
    const Tile start = b.sbuf_tile("start", 3, 1, DType::fp32);
    const Tile out = b.sbuf_tile("out", 3, 5, DType::fp32);
    b.dma_copy(b.view(a), b.hbm_rows(x, 0, 3, 0, 5));
    b.dma_copy(b.view(c), b.hbm_rows(y, 0, 3, 0, 5));
    b.iota(b.view(start), 1, 1, 0);  // 1, 2, 3 down the partitions
    b.tensor_tensor_scan(b.view(out), b.view(a), b.view(c), AluOp::subtract, AluOp::add,
                         Scalar::per_partition(b.view(start)), reverse, false);
    const Program p = b.finish();
    std::vector<float> xs(15), ys(15);
    for (int i = 0; i < 15; ++i) {
      xs[i] = float(i % 4);
      ys[i] = 0.5f * float(i);
    }
    FunctionalExecutor exec(p);
    exec.set_tensor(x, xs);
    exec.set_tensor(y, ys);
    exec.run();
    const std::vector<float> got = exec.tile(out);
    for (int row = 0; row < 3; ++row) {
      double state = row + 1;
      for (int j = 0; j < 5; ++j) {
        const double xv = xs[row * 5 + j];
        state = (reverse ? state - xv : xv - state) + ys[row * 5 + j];
        CHECK(got[row * 5 + j] == float(state));
      }
    }
  }
}

TEST_CASE("builder: tensor_tensor_scan rejects bad operands by name", "[sim][functional]") {
  ProgramBuilder b(trn1(), "scan");
  const Tile a = b.sbuf_tile("a", 128, 8, DType::fp32);
  const Tile wide = b.sbuf_tile("wide", 128, 9, DType::fp32);
  const Tile pa = b.psum_tile("pa", 128, 8, DType::fp32);
  const Tile pb = b.psum_tile("pb", 128, 8, DType::fp32);
  const Scalar zero = Scalar::constant(0.0f);
  CHECK_THAT(error_of([&] {
               b.tensor_tensor_scan(b.view(a), b.view(a), b.view(wide), AluOp::multiply, AluOp::add,
                                    zero);
             }),
             Contains("data0 has 8 free elements, data1 has 9"));
  CHECK_THAT(error_of([&] {
               b.tensor_tensor_scan(b.view(a), b.view(pa), b.view(pb), AluOp::multiply, AluOp::add,
                                    zero);
             }),
             Contains("both inputs are in PSUM"));
  CHECK_THAT(error_of([&] {
               b.tensor_tensor_scan(b.view(a), b.view(a), b.view(a), AluOp::bypass, AluOp::add,
                                    zero);
             }),
             Contains("op0 and op1"));
  CHECK_THAT(error_of([&] {
               b.tensor_tensor_scan(b.view(a), b.view(a), b.view(a), AluOp::multiply, AluOp::add,
                                    Scalar::per_partition(b.view(a)));
             }),
             Contains("initial"));
}
