// Timing engine: dependencies become semaphore waits, engines overlap, queues run in order, and
// NC-v2 shared ports serialise VectorE with GpSimd (SBUF) and ScalarE (PSUM).
#include "sim/kernels/registry.hpp"
#include "sim/report.hpp"
#include "test_util.hpp"

using namespace tilelab::sim;
using namespace tilelab::sim::test;
using Catch::Matchers::Contains;

TEST_CASE("timing: a read after a DMA write waits for completion plus a semaphore",
          "[sim][timing]") {
  ProgramBuilder b(trn1(), "raw");
  const Tensor x = b.hbm_tensor("x", {128, 512}, DType::fp32);
  const Tile t = b.sbuf_tile("t", 128, 512, DType::fp32);
  b.dma_copy(b.view(t), b.hbm_rows(x, 0, 128, 0, 512));
  b.activation(b.view(t), b.view(t), ActFunc::exp);
  const Program p = b.finish();
  const TimingResult r = simulate_timing(p);
  const double semaphore_ns = 100 / 1.4;  // 100 ScalarE cycles
  CHECK(r.instructions[1].start_ns == Approx(r.instructions[0].end_ns + semaphore_ns));
  CHECK(r.instructions[1].wait_on == 0);
  CHECK(r.instructions[1].wait_reason == WaitReason::dependency);
  CHECK(r.total_ns == Approx(r.instructions[1].end_ns));
}

TEST_CASE("timing: independent engines overlap, one engine runs its queue in order",
          "[sim][timing]") {
  ProgramBuilder b(trn2(), "overlap");
  const Tile a = b.sbuf_tile("a", 128, 960, DType::fp32);
  const Tile c = b.sbuf_tile("c", 128, 1200, DType::fp32);
  b.tensor_scalar(b.view(a), b.view(a), AluOp::add, Scalar::constant(1));  // 960 cycles: 1 us
  b.activation(b.view(c), b.view(c), ActFunc::exp);                        // 1200 cycles: 1 us
  b.tensor_scalar(b.view(a), b.view(a), AluOp::add, Scalar::constant(1));  // after the first
  const Program p = b.finish();
  const TimingResult r = simulate_timing(p);
  CHECK(r.instructions[0].start_ns == 0);
  CHECK(r.instructions[1].start_ns == 0);
  CHECK(r.instructions[2].start_ns == Approx(1000));
  CHECK(r.total_ns == Approx(2000));
  CHECK(r.engine_active_ns[int(Engine::vector)] == Approx(2000));
  CHECK(r.engine_active_ns[int(Engine::scalar)] == Approx(1000));
}

TEST_CASE("timing: write-after-read makes a single buffer serialise, double buffering overlaps",
          "[sim][timing]") {
  auto run = [](int buffers) {
    ProgramBuilder b(trn1(), "war");
    const Tensor x = b.hbm_tensor("x", {128, 8 * 2048}, DType::bf16);
    TilePool pool = b.pool("in", Memory::sbuf, 128, 2048, DType::bf16, buffers);
    const Tile out = b.sbuf_tile("out", 128, 2048, DType::bf16);
    for (int i = 0; i < 8; ++i) {
      const Tile t = b.next(pool);
      b.dma_copy(b.view(t), b.hbm_rows(x, 0, 128, i * 2048, 2048));
      b.activation(b.view(out), b.view(t), ActFunc::exp);
    }
    const Program p = b.finish();
    return simulate_timing(p);
  };
  const TimingResult single = run(1);
  const TimingResult twice = run(2);
  // Load 2 (instruction 2) into the only buffer waits for the activation reading it.
  CHECK(single.instructions[2].start_ns >= single.instructions[1].end_ns);
  CHECK(single.instructions[2].wait_on == 1);
  CHECK(twice.total_ns < 0.8 * single.total_ns);
}

TEST_CASE("timing: dependencies track regions, not whole tiles", "[sim][timing]") {
  ProgramBuilder b(trn1(), "regions");
  const Tensor x = b.hbm_tensor("x", {128, 1024}, DType::fp32);
  const Tile t = b.sbuf_tile("t", 128, 1024, DType::fp32);
  b.dma_copy(b.view(t, 0, 128, 0, 512), b.hbm_rows(x, 0, 128, 0, 512));
  b.tensor_scalar(b.view(t, 0, 128, 512, 512), b.view(t, 0, 128, 512, 512), AluOp::add,
                  Scalar::constant(1));  // other half: independent of the load
  b.tensor_scalar(b.view(t, 0, 128, 0, 64), b.view(t, 0, 128, 0, 64), AluOp::add,
                  Scalar::constant(1));  // first half: waits for the load
  const Program p = b.finish();
  const TimingResult r = simulate_timing(p);
  CHECK(r.instructions[1].start_ns == 0);
  CHECK(r.instructions[2].wait_on == 0);
  CHECK(r.instructions[2].start_ns > r.instructions[0].end_ns);
}

TEST_CASE("timing: NC-v2 VectorE and GpSimd share the SBUF port, NC-v3 lifts it", "[sim][timing]") {
  auto run = [](const Machine& m) {
    ProgramBuilder b(m, "ports");
    const Tile a = b.sbuf_tile("a", 128, 2048, DType::fp32);
    const Tile c = b.sbuf_tile("c", 128, 2048, DType::fp32);
    b.memset(b.view(a), 1.0f, Engine::vector);
    b.memset(b.view(c), 1.0f, Engine::gpsimd);
    const Program p = b.finish();
    return simulate_timing(p);
  };
  const TimingResult v2 = run(trn1());
  CHECK(v2.instructions[1].start_ns == Approx(v2.instructions[0].end_ns));
  CHECK(v2.instructions[1].wait_reason == WaitReason::port);
  const TimingResult v3 = run(trn2());
  CHECK(v3.instructions[1].start_ns == 0);
}

TEST_CASE("timing: NC-v2 VectorE and ScalarE share the PSUM port", "[sim][timing]") {
  auto run = [](const Machine& m) {
    ProgramBuilder b(m, "psum_port");
    const Tile q0 = b.psum_tile("q0", 128, 512, DType::fp32);
    const Tile q1 = b.psum_tile("q1", 128, 512, DType::fp32);
    const Tile s0 = b.sbuf_tile("s0", 128, 512, DType::bf16);
    const Tile s1 = b.sbuf_tile("s1", 128, 512, DType::bf16);
    b.tensor_copy(b.view(s0), b.view(q0), Engine::vector);
    b.activation(b.view(s1), b.view(q1), ActFunc::copy);
    const Program p = b.finish();
    return simulate_timing(p);
  };
  CHECK(run(trn1()).instructions[1].start_ns > 0);
  CHECK(run(trn2()).instructions[1].start_ns == 0);
}

TEST_CASE("timing: matmuls into one PSUM accumulator run back to back on TensorE",
          "[sim][timing]") {
  ProgramBuilder b(trn1(), "accumulate");
  const Tile acc = b.psum_tile("acc", 128, 512, DType::fp32);
  const Tile s = b.sbuf_tile("s", 128, 128, DType::bf16);
  const Tile v = b.sbuf_tile("v", 128, 512, DType::bf16);
  for (int k = 0; k < 4; ++k) b.matmul(b.view(acc), b.view(s), b.view(v), k > 0);
  const Program p = b.finish();
  const TimingResult r = simulate_timing(p);
  CHECK(r.total_ns == Approx(4 * 512 / 2.8));
}

TEST_CASE("timing: region merges past the tracker's record limit are counted", "[sim][timing]") {
  auto run = [](int copies) {
    ProgramBuilder b(trn1(), "merges");
    const Tile src = b.sbuf_tile("src", 1, 2048, DType::fp32);
    const Tile dst = b.sbuf_tile("dst", 1, 2048, DType::fp32);
    // Each copy reads and writes one distinct element: one new read region of src and one new
    // write region of dst per instruction.
    for (int i = 0; i < copies; ++i)
      b.tensor_copy(b.view(dst, 0, 1, i, 1), b.view(src, 0, 1, i, 1));
    const Program p = b.finish();
    return simulate_timing(p);
  };
  const int limit = static_cast<int>(kMaxAccessRecords);
  const TimingResult below = run(limit);
  CHECK(below.region_merges == 0);
  CHECK(below.region_records_merged == 0);
  // One more region than the limit merges src's reads once and dst's writes once.
  const TimingResult above = run(limit + 1);
  CHECK(above.region_merges == 2);
  CHECK(above.region_records_merged == 2 * (kMaxAccessRecords + 1));
  const TimingResult twice = run(2 * limit + 2);
  CHECK(twice.region_merges == 4);
}

TEST_CASE("timing: a built program is timed on other timing parameters without a rebuild",
          "[sim][timing]") {
  const KernelInfo& kernel = kernel_registry().find("paged-attention");
  const KernelParameters parameters = resolve_parameters(kernel, {});
  const Program program = kernel.build(trn1(), parameters);
  // Timing parameters only: DMA bandwidth and a clock.
  Machine faster = trn1();
  faster.dma_bytes_per_ns_per_engine *= 2;
  faster.vector_clock_ghz *= 1.5;
  const TimingResult reused = simulate_timing(program, faster);
  const Program rebuilt = kernel.build(faster, parameters);
  const TimingResult fresh = simulate_timing(rebuilt);
  CHECK(reused.total_ns == fresh.total_ns);
  CHECK(reused.total_ns < simulate_timing(program).total_ns);
  CHECK(report_json(make_report(program, reused)) == report_json(make_report(rebuilt, fresh)));
  // A build-time limit cannot change under a built program.
  Machine fewer_engines = trn1();
  fewer_engines.dma_engines = 8;
  CHECK_THAT(error_of([&] { simulate_timing(program, fewer_engines); }),
             Contains("machine: 'dma_engines' is a build-time limit; the program was built for 16, "
                      "got 8"));
}
