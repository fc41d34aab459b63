// Tile views with two free levels (columns of every row of a [P, rows, cols] tile): addressing in
// the functional executor, dependency regions, DMA run lengths and bounds.
#include "test_util.hpp"

using namespace tilelab::sim;
using namespace tilelab::sim::test;
using Catch::Matchers::Contains;

TEST_CASE("two-level view: addresses columns of every row", "[sim][view]") {
  // A [4, 3 rows x 5 cols] tile; the view takes columns 1..3 of each row: 3 x 3 elements.
  ProgramBuilder b(trn1(), "two_level");
  const Tensor in = b.hbm_tensor("in", {4, 15}, DType::fp32);
  const Tensor out = b.hbm_tensor("out", {4, 9}, DType::fp32);
  const Tile t = b.sbuf_tile("t", 4, 15, DType::fp32);
  const Tile packed = b.sbuf_tile("packed", 4, 9, DType::fp32);
  b.dma_copy(b.view(t), b.hbm_rows(in, 0, 4, 0, 15));
  const TileRef columns = b.view(t, 0, 4, 1, /*outer_count=*/3, /*outer_stride=*/5,
                                 /*inner_count=*/3, /*inner_stride=*/1);
  CHECK(columns.free_count == 9);
  CHECK(columns.two_level());
  CHECK(columns.last_free_element() == 13);
  CHECK(columns.contiguous_run() == 3);
  b.tensor_scalar(b.view(packed), columns, AluOp::multiply, Scalar::constant(2.0f));
  b.dma_copy(b.hbm_rows(out, 0, 4, 0, 9), b.view(packed));
  const Program p = b.finish();
  FunctionalExecutor x(p);
  std::vector<float> values(60);
  for (size_t i = 0; i < values.size(); ++i) values[i] = float(i);
  x.set_tensor(in, values);
  x.run();
  const std::vector<float> result = x.tensor(out);
  for (int row = 0; row < 4; ++row)
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 3; ++c)
        CHECK(result[row * 9 + r * 3 + c] == 2.0f * float(row * 15 + r * 5 + 1 + c));
}

TEST_CASE("two-level view: a contiguous outer level is one run", "[sim][view]") {
  ProgramBuilder b(trn1(), "runs");
  const Tile t = b.sbuf_tile("t", 8, 64, DType::bf16);
  CHECK(b.view(t, 0, 8, 0, 4, 16, 16, 1).contiguous());
  CHECK_FALSE(b.view(t, 0, 8, 0, 4, 16, 8, 1).contiguous());
  CHECK(b.view(t, 0, 8, 0, 4, 16, 8, 1).contiguous_run() == 8);
  // A load into a view with runs of 8 elements (16 B) is cut into 16 B descriptors.
  const Tensor in = b.hbm_tensor("in", {8, 32}, DType::bf16);
  b.dma_copy(b.view(t, 0, 8, 0, 4, 16, 8, 1), b.hbm_rows(in, 0, 8, 0, 32));
  const Program p = b.finish();
  REQUIRE(p.dmas.size() == 1);
  CHECK(p.dmas[0].run_bytes == 16);
  CHECK(p.dmas[0].bytes_per_partition == 64);
}

TEST_CASE("two-level view: dependencies see the whole span", "[sim][view]") {
  ProgramBuilder b(trn1(), "deps");
  const Tile t = b.sbuf_tile("t", 8, 64, DType::fp32);
  const Tile u = b.sbuf_tile("u", 8, 64, DType::fp32);
  b.memset(b.view(t, 0, 8, 60, 4), 1.0f, Engine::gpsimd);                 // writes 60..63
  b.tensor_copy(b.view(u, 0, 8, 0, 8), b.view(t, 0, 8, 0, 2, 60, 4, 1));  // reads 0..3, 60..63
  b.tensor_copy(b.view(u, 0, 8, 8, 4), b.view(t, 0, 8, 4, 4), Engine::scalar);  // reads 4..7
  const Program p = b.finish();
  const TimingResult r = simulate_timing(p);
  CHECK(r.instructions[1].wait_on == 0);
  CHECK(r.instructions[2].wait_on != 0);
}

TEST_CASE("two-level view: out of the tile is an error", "[sim][view]") {
  ProgramBuilder b(trn1(), "bounds");
  const Tile t = b.sbuf_tile("t", 8, 64, DType::fp32);
  CHECK_THAT(error_of([&] { b.view(t, 0, 8, 1, 4, 16, 16, 1); }),
             Contains("reaches free element 64") && Contains("[0, 64)"));
  CHECK_THAT(error_of([&] { b.view(t, 0, 8, 0, 0, 16, 16, 1); }), Contains("outer count"));
  CHECK_THAT(error_of([&] { b.view(t, 0, 8, 0, 2, -1, 16, 1); }), Contains("outer stride"));
}
