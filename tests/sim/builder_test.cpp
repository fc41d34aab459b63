// Program builder: operand limits, allocation with lifetimes, multi-buffering.
#include "test_util.hpp"

using namespace tilelab::sim;
using namespace tilelab::sim::test;
using Catch::Matchers::Contains;

TEST_CASE("builder: tile partition dim is limited to pmax", "[sim][builder]") {
  ProgramBuilder b(trn1(), "t");
  CHECK_THAT(error_of([&] { b.sbuf_tile("big", 129, 16, DType::fp32); }),
             Contains("'big'") && Contains("partition dim 129") && Contains("pmax"));
  CHECK_THAT(error_of([&] { b.sbuf_tile("empty", 128, 0, DType::fp32); }),
             Contains("free size must be positive"));
}

TEST_CASE("builder: matmul operand limits name the limit", "[sim][builder]") {
  ProgramBuilder b(trn1(), "t");
  const Tile acc = b.psum_tile("acc", 128, 512, DType::fp32);
  const Tile wide_stationary = b.sbuf_tile("stationary", 128, 256, DType::bf16);
  const Tile moving = b.sbuf_tile("moving", 128, 1024, DType::bf16);
  const Tile small = b.sbuf_tile("small", 64, 128, DType::bf16);
  CHECK_THAT(
      error_of([&] {
        b.matmul(b.view(acc), b.view(wide_stationary), b.view(moving, 0, 128, 0, 512), false);
      }),
      Contains("stationary free size 256") && Contains("gemm_stationary_fmax") && Contains("128"));
  CHECK_THAT(error_of([&] {
               b.matmul(b.view(acc), b.view(wide_stationary, 0, 128, 0, 128), b.view(moving),
                        false);
             }),
             Contains("moving free size 1024") && Contains("gemm_moving_fmax") && Contains("512"));
  CHECK_THAT(error_of([&] {
               b.matmul(b.view(acc), b.view(small), b.view(moving, 0, 128, 0, 512), false);
             }),
             Contains("contraction") && Contains("64") && Contains("128"));
  CHECK_THAT(error_of([&] {
               b.matmul(b.view(acc, 0, 128, 0, 256), b.view(wide_stationary, 0, 128, 0, 128),
                        b.view(moving, 0, 128, 0, 512), false);
             }),
             Contains("dst must be [128, 512]"));
  const Tile psum_in = b.psum_tile("psum_in", 128, 128, DType::fp32);
  CHECK_THAT(error_of([&] {
               b.matmul(b.view(acc), b.view(psum_in), b.view(moving, 0, 128, 0, 512), false);
             }),
             Contains("TensorE reads only SBUF"));
  const Tile sbuf_out = b.sbuf_tile("sbuf_out", 128, 512, DType::fp32);
  CHECK_THAT(error_of([&] {
               b.matmul(b.view(sbuf_out), b.view(wide_stationary, 0, 128, 0, 128),
                        b.view(moving, 0, 128, 0, 512), false);
             }),
             Contains("fp32 PSUM tile"));
  // Within limits: fine.
  b.matmul(b.view(acc), b.view(wide_stationary, 0, 128, 0, 128), b.view(moving, 0, 128, 0, 512),
           false);
  CHECK(b.instruction_count() == 1);
}

TEST_CASE("builder: a PSUM tile fits one 2 KiB bank and there are 8 banks", "[sim][builder]") {
  ProgramBuilder b(trn1(), "t");
  CHECK_THAT(error_of([&] { b.psum_tile("wide", 128, 1024, DType::fp32); }),
             Contains("'wide'") && Contains("4096 B per partition exceeds one PSUM bank") &&
                 Contains("psum_bank_bytes_per_partition = 2048"));
  for (int i = 0; i < 8; ++i) b.psum_tile("bank" + std::to_string(i), 128, 512, DType::fp32);
  CHECK_THAT(error_of([&] { b.psum_tile("ninth", 128, 512, DType::fp32); }),
             Contains("PSUM allocation failed for tile 'ninth'") && Contains("bank0") &&
                 Contains("bank7"));
}

TEST_CASE("builder: PSUM tiles do not straddle banks", "[sim][builder]") {
  ProgramBuilder b(trn1(), "t");
  b.psum_tile("a", 128, 384, DType::fp32);                 // 1536 B of bank 0
  const Tile t = b.psum_tile("b", 128, 256, DType::fp32);  // 1 KiB: must start in bank 1
  const Program p = b.finish();
  CHECK(p.buffers[t.id].address == 2048);
}

TEST_CASE("builder: SBUF overflow is an allocation failure naming the live tiles",
          "[sim][builder]") {
  ProgramBuilder b(trn1(), "t");
  b.sbuf_tile("lhsT_tiles", 128, 64 * 512, DType::bf16);  // 64 KiB
  b.sbuf_tile("rhs_tiles", 128, 64 * 512, DType::bf16);   // 64 KiB
  const std::string message =
      error_of([&] { b.sbuf_tile("result_tiles", 128, 64 * 512, DType::fp32); });
  CHECK_THAT(message, Contains("SBUF allocation failed for tile 'result_tiles'") &&
                          Contains("131072 B per partition") && Contains("lhsT_tiles") &&
                          Contains("rhs_tiles") && Contains("196608"));
}

TEST_CASE("builder: released memory is reused and ordered after its last use", "[sim][builder]") {
  ProgramBuilder b(trn1(), "t");
  const Tile first = b.sbuf_tile("first", 128, 40000, DType::fp32);  // 160000 B
  b.memset(b.view(first, 0, 128, 0, 512), 1.0f);
  b.release(first);
  CHECK_THAT(error_of([&] { b.memset(b.view(first, 0, 128, 0, 512), 1.0f); }),
             Contains("after it was released"));
  CHECK_THAT(error_of([&] { b.release(first); }), Contains("already released"));
  const Tile second = b.sbuf_tile("second", 128, 40000, DType::fp32);  // fits only if reused
  b.memset(b.view(second, 0, 128, 0, 512), 2.0f, Engine::gpsimd);
  const Program p = b.finish();
  CHECK(p.buffers[second.id].address == p.buffers[first.id].address);
  CHECK(p.buffers[second.id].predecessors == std::vector<uint32_t>{first.id});
  // The GpSimd memset into the reused memory waits for the VectorE memset of the old tile.
  const TimingResult t = simulate_timing(p);
  CHECK(t.instructions[1].start_ns >= t.instructions[0].end_ns);
  CHECK(t.instructions[1].wait_on == 0);
}

TEST_CASE("builder: pools hand out buffers round-robin", "[sim][builder]") {
  ProgramBuilder b(trn1(), "t");
  TilePool pool = b.pool("buf", Memory::sbuf, 128, 256, DType::bf16, 3);
  const Tile a = b.next(pool), c = b.next(pool), d = b.next(pool), e = b.next(pool);
  CHECK(a.id != c.id);
  CHECK(c.id != d.id);
  CHECK(e.id == a.id);
  const Program p = b.finish();
  CHECK(p.buffers[a.id].name == "buf[0]");
  CHECK(p.peak_sbuf_bytes_per_partition == 3 * 512);
}

TEST_CASE("builder: vector/scalar/gpsimd operand rules", "[sim][builder]") {
  ProgramBuilder b(trn1(), "t");
  const Tile s = b.sbuf_tile("s", 128, 512, DType::fp32);
  const Tile q = b.psum_tile("q", 128, 512, DType::fp32);
  const Tile q2 = b.psum_tile("q2", 128, 512, DType::fp32);
  const Tile half = b.sbuf_tile("half", 64, 512, DType::fp32);
  CHECK_THAT(error_of([&] { b.tensor_tensor(b.view(s), b.view(q), b.view(q2), AluOp::add); }),
             Contains("both inputs are in PSUM"));
  CHECK_THAT(error_of([&] { b.tensor_copy(b.view(s), b.view(q), Engine::gpsimd); }),
             Contains("GpSimd cannot access PSUM"));
  CHECK_THAT(error_of([&] { b.tensor_copy(b.view(s), b.view(half)); }),
             Contains("128 partitions") && Contains("64"));
  CHECK_THAT(
      error_of([&] { b.tensor_copy(b.view(s, 16, 40, 0, 512), b.view(half, 0, 40, 0, 512)); }),
      Contains("starts at partition 16 with 40 partitions"));
  const Tile wide = b.sbuf_tile("wide", 128, 70000, DType::bf16);
  CHECK_THAT(error_of([&] { b.tensor_copy(b.view(wide), b.view(wide)); }),
             Contains("has 70000 free elements; the limit in sbuf is 65536") &&
                 Contains("engine_max_free_elements_sbuf"));
  b.release(wide);
  CHECK_THAT(error_of([&] { b.tensor_reduce(b.view(s, 0, 128, 0, 2), b.view(s), AluOp::max); }),
             Contains("dst must be [P, 1]"));
  CHECK_THAT(error_of([&] { b.tensor_reduce(b.view(s, 0, 128, 0, 1), b.view(s), AluOp::divide); }),
             Contains("op divide not allowed"));
  CHECK_THAT(error_of([&] { b.tensor_copy(b.view(s), b.view(s), Engine::tensor); }),
             Contains("engine tensor not allowed"));
  const Tile long_row = b.sbuf_tile("long_row", 1, 70000, DType::fp8_e4m3);
  CHECK_THAT(error_of([&] { b.activation(b.view(long_row), b.view(long_row), ActFunc::exp); }),
             Contains("70000 free elements") && Contains("65536"));
  CHECK_THAT(error_of([&] {
               ActivationOptions o;
               o.bias = b.view(s);
               b.activation(b.view(s), b.view(s), ActFunc::exp, o);
             }),
             Contains("bias") && Contains("[P, 1]"));
}

TEST_CASE("builder: views and HBM access patterns are bounds-checked", "[sim][builder]") {
  ProgramBuilder b(trn1(), "t");
  const Tile s = b.sbuf_tile("s", 64, 512, DType::bf16);
  const Tensor x = b.hbm_tensor("x", {256, 1024}, DType::bf16);
  CHECK_THAT(error_of([&] { b.view(s, 32, 64, 0, 16); }),
             Contains("'s'") && Contains("partitions [32, 96)"));
  CHECK_THAT(error_of([&] { b.view(s, 0, 64, 500, 16); }), Contains("free elements [500, 516)"));
  CHECK_THAT(error_of([&] { b.hbm_rows(x, 200, 64, 0, 16); }),
             Contains("'x'") && Contains("rows [200, 264)"));
  CHECK_THAT(error_of([&] { b.hbm_rows(x, 0, 64, 1000, 32); }), Contains("columns [1000, 1032)"));
  CHECK_THAT(error_of([&] { b.hbm_pattern(x, 0, 1024, 64, {{2, 1024 * 200}}); }),
             Contains("reaches element"));
  CHECK_THAT(error_of([&] { b.dma_copy(b.view(s), b.hbm_rows(x, 0, 64, 0, 256)); }),
             Contains("256 elements per partition") && Contains("512"));
  CHECK_THAT(
      error_of([&] { b.dma_copy(b.view(s), b.hbm_rows(x, 0, 64, 0, 512), {Engine::sync, 16}); }),
      Contains("queue 16"));
  CHECK_THAT(error_of([&] {
               b.dma_copy(b.view(s), b.hbm_rows(x, 0, 64, 0, 512), {Engine::sync, -1, 100});
             }),
             Contains("partition mask keeps 100"));
  const Tile q = b.psum_tile("q", 64, 512, DType::fp32);
  CHECK_THAT(error_of([&] { b.dma_copy(b.hbm_rows(x, 0, 64, 0, 512), b.view(q)); }),
             Contains("PSUM") && Contains("copy it to SBUF"));
}

TEST_CASE("builder: DMA transpose is NeuronCore-v3 only, gathers need int32 index tiles",
          "[sim][builder]") {
  ProgramBuilder b(trn1(), "t");
  const Tile s = b.sbuf_tile("s", 128, 128, DType::bf16);
  const Tensor x = b.hbm_tensor("x", {128, 128}, DType::bf16);
  CHECK_THAT(error_of([&] { b.dma_transpose(b.view(s), b.hbm_rows(x, 0, 128, 0, 128)); }),
             Contains("dma_transpose") && Contains("dma_transpose_supported"));
  const Tile float_index = b.sbuf_tile("float_index", 128, 1, DType::fp32);
  CHECK_THAT(error_of([&] { b.dma_gather(b.view(s), x, b.view(float_index), 0); }),
             Contains("int32"));
  const Tile index = b.sbuf_tile("index", 128, 1, DType::int32);
  CHECK_THAT(error_of([&] { b.dma_gather(b.view(s), x, b.view(index), 64); }),
             Contains("columns [64, 192)"));
  b.dma_gather(b.view(s), x, b.view(index), 0);
  const Program p = b.finish();
  CHECK(p.instructions.back().engine == Engine::gpsimd);  // SWDGE
  ProgramBuilder b3(trn2(), "t3");
  const Tile s3 = b3.sbuf_tile("s", 128, 64, DType::bf16);
  const Tensor x3 = b3.hbm_tensor("x", {64, 128}, DType::bf16);
  b3.dma_transpose(b3.view(s3), b3.hbm_rows(x3, 0, 64, 0, 128));
  CHECK_THAT(error_of([&] { b3.dma_transpose(b3.view(s3), b3.hbm_rows(x3, 0, 64, 0, 64)); }),
             Contains("needs dst [64, 64]"));
}
