// Timing engine: dependencies become semaphore waits, engines overlap, queues run in order, and
// NC-v2 shared ports serialise VectorE with GpSimd (SBUF) and ScalarE (PSUM).
#include <algorithm>
#include <array>

#include "sim/cost.hpp"
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

// The dependency tracker keeps few records per buffer (a write drops what it covers, repeated
// reads merge, lists whose latest access cannot delay an instruction are not scanned). Checked
// against the rule it implements, by brute force over every earlier access: an instruction starts
// when its engine is free and every earlier conflicting access (a write, or a read the
// instruction overwrites) of an overlapping region is done, plus a semaphore wait when that
// access ran on another engine. Random programs of partial, overlapping views on three tiles,
// on trn2 (no shared ports) and without DMAs, so those are the only rules.
TEST_CASE("timing: start times follow the dependency rule over all earlier accesses",
          "[sim][timing]") {
  const Machine& m = trn2();
  const int seed = GENERATE(1, 2, 3, 4, 5, 6);
  std::mt19937 rng(static_cast<unsigned>(seed));
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };

  constexpr int kFree = 256;
  ProgramBuilder b(m, "random_regions");
  const std::vector<Tile> tiles = {b.sbuf_tile("t0", 128, kFree, DType::fp32),
                                   b.sbuf_tile("t1", 128, kFree, DType::fp32),
                                   b.sbuf_tile("t2", 128, kFree, DType::fp32)};
  struct Access {
    uint32_t tile;
    int p0, p1;
    int64_t e0, e1;  // free elements [e0, e1)
    bool write;
  };
  std::vector<std::vector<Access>> accesses;
  // Views of one partition-start rule's shape, mostly small so that regions overlap partially;
  // `like` gives a second operand the first one's shape.
  auto random_view = [&](const TileRef* like) {
    const Tile tile = tiles[pick(0, 2)];
    int partitions = 0, p0 = 0;
    if (like) {
      partitions = like->partition_count;
      p0 = like->partition_start;
    } else {
      const int shape = pick(0, 2);
      partitions = shape == 0 ? 128 : shape == 1 ? 64 : 32;
      p0 = partitions == 128 ? 0 : partitions == 64 ? 64 * pick(0, 1) : 32 * pick(0, 3);
    }
    const int64_t count = like ? like->free_count : pick(1, pick(0, 3) == 0 ? kFree : 48);
    const int64_t offset = pick(0, kFree - static_cast<int>(count));
    return b.view(tile, p0, partitions, offset, count);
  };
  auto access = [](const TileRef& r, bool write) {
    return Access{r.tile,
                  r.partition_start,
                  r.partition_start + r.partition_count,
                  int64_t(r.free_offset),
                  int64_t(r.free_offset) + r.free_count,
                  write};
  };
  for (int i = 0; i < 400; ++i) {
    const TileRef dst = random_view(nullptr);
    const TileRef a = random_view(&dst);
    switch (pick(0, 3)) {
      case 0:
        b.tensor_copy(dst, a, Engine::vector);
        accesses.push_back({access(dst, true), access(a, false)});
        break;
      case 1:
        b.tensor_copy(dst, a, Engine::gpsimd);
        accesses.push_back({access(dst, true), access(a, false)});
        break;
      case 2:
        b.activation(dst, a, ActFunc::exp);
        accesses.push_back({access(dst, true), access(a, false)});
        break;
      default: {
        const TileRef c = random_view(&dst);
        b.tensor_tensor(dst, a, c, AluOp::add);
        accesses.push_back({access(dst, true), access(a, false), access(c, false)});
      }
    }
  }
  const Program p = b.finish();
  const TimingResult r = simulate_timing(p);
  REQUIRE(r.region_merges == 0);  // merged records may add waits the rule does not
  std::array<double, kEngineCount> engine_free{};
  for (size_t i = 0; i < p.instructions.size(); ++i) {
    const int e = static_cast<int>(p.instructions[i].engine);
    const double semaphore_ns = m.semaphore_wait_cycles / engine_clock_ghz(m, Engine(e));
    double start = engine_free[e];
    for (size_t j = 0; j < i; ++j) {
      for (const Access& x : accesses[i]) {
        for (const Access& y : accesses[j]) {
          const bool conflict = x.tile == y.tile && (x.write || y.write) && x.p0 < y.p1 &&
                                y.p0 < x.p1 && x.e0 < y.e1 && y.e0 < x.e1;
          if (!conflict) continue;
          const bool same_engine = p.instructions[j].engine == p.instructions[i].engine;
          start = std::max(start, r.instructions[j].end_ns + (same_engine ? 0.0 : semaphore_ns));
        }
      }
    }
    INFO("seed " << seed << ", instruction " << i);
    REQUIRE(r.instructions[i].start_ns == Approx(start).margin(1e-9));
    engine_free[e] = r.instructions[i].issue_end_ns;
  }
}
