// Per-instruction cost formulas (engine cycles), each reproduced exactly as documented in the NKI
// ISA "Estimated instruction cost" notes, and their conversion to time by engine clock.
#include "sim/cost.hpp"

#include "test_util.hpp"

using namespace tilelab::sim;
using namespace tilelab::sim::test;

namespace {

// Builds a one-instruction program with `emit` and returns its engine cycles.
template <typename Emit>
double cycles_of(const Machine& machine, Emit&& emit) {
  ProgramBuilder b(machine, "cost");
  emit(b);
  const Program p = b.finish();
  REQUIRE(p.instructions.size() == 1);
  return instruction_cycles(p, p.instructions[0]);
}

// Time of that instruction in the timing engine (it starts at 0).
template <typename Emit>
double ns_of(const Machine& machine, Emit&& emit) {
  ProgramBuilder b(machine, "cost");
  emit(b);
  const Program p = b.finish();
  const TimingResult t = simulate_timing(p);
  return t.instructions[0].end_ns - t.instructions[0].start_ns;
}

auto matmul(int64_t k, int64_t m, int64_t n, DType dtype) {
  return [=](ProgramBuilder& b) {
    const Tile acc = b.psum_tile("acc", int(m), n, DType::fp32);
    const Tile s = b.sbuf_tile("stationary", int(k), m, dtype);
    const Tile v = b.sbuf_tile("moving", int(k), n, dtype);
    b.matmul(b.view(acc), b.view(s), b.view(v), false);
  };
}

}  // namespace

TEST_CASE("cost: matmul is max(min(64, N_stationary), N_moving), x4 for fp32", "[sim][cost]") {
  CHECK(cycles_of(trn1(), matmul(128, 128, 512, DType::bf16)) == 512);
  CHECK(cycles_of(trn1(), matmul(128, 128, 128, DType::bf16)) == 128);
  CHECK(cycles_of(trn1(), matmul(128, 128, 16, DType::bf16)) == 64);
  CHECK(cycles_of(trn1(), matmul(128, 32, 16, DType::bf16)) == 32);
  CHECK(cycles_of(trn1(), matmul(64, 96, 100, DType::fp16)) == 100);
  CHECK(cycles_of(trn1(), matmul(128, 128, 512, DType::fp32)) == 4 * 512);
  CHECK(cycles_of(trn1(), matmul(128, 16, 8, DType::fp32)) == 4 * 16);
  // 512 TensorE cycles at 2.8 GHz (trn1) and 2.4 GHz (trn2).
  CHECK(ns_of(trn1(), matmul(128, 128, 512, DType::bf16)) == Approx(512 / 2.8));
  CHECK(ns_of(trn2(), matmul(128, 128, 512, DType::bf16)) == Approx(512 / 2.4));
}

TEST_CASE("cost: pe_transpose is max(P, min(64, F))", "[sim][cost]") {
  auto transpose = [](int p, int64_t f) {
    return [=](ProgramBuilder& b) {
      const Tile in = b.sbuf_tile("in", p, f, DType::bf16);
      const Tile out = b.psum_tile("out", int(f), p, DType::fp32);
      b.pe_transpose(b.view(out), b.view(in));
    };
  };
  CHECK(cycles_of(trn1(), transpose(128, 128)) == 128);
  CHECK(cycles_of(trn1(), transpose(32, 16)) == 32);
  CHECK(cycles_of(trn1(), transpose(16, 128)) == 64);
  CHECK(cycles_of(trn1(), transpose(16, 40)) == 40);
}

TEST_CASE("cost: activation is max(MIN_II, N), + MIN_II with a fused reduce", "[sim][cost]") {
  auto act = [](int64_t n, bool reduce) {
    return [=](ProgramBuilder& b) {
      const Tile x = b.sbuf_tile("x", 128, n, DType::fp32);
      const Tile bias = b.sbuf_tile("bias", 128, 1, DType::fp32);
      const Tile sum = b.sbuf_tile("sum", 128, 1, DType::fp32);
      ActivationOptions o;
      o.bias = b.view(bias);
      o.scale = 0.5f;
      if (reduce) o.reduce_result = b.view(sum);
      b.activation(b.view(x), b.view(x), ActFunc::exp, o);
    };
  };
  CHECK(cycles_of(trn1(), act(512, false)) == 512);
  CHECK(cycles_of(trn1(), act(10, false)) == 64);
  CHECK(cycles_of(trn1(), act(1024, true)) == 1024 + 64);
  CHECK(cycles_of(trn1(), act(1, true)) == 64 + 64);
  CHECK(ns_of(trn1(), act(1400, false)) == Approx(1000.0));  // 1400 cycles at 1.4 GHz
}

TEST_CASE("cost: tensor_tensor is N with one PSUM input or fast bf16, else 2N", "[sim][cost]") {
  auto tt = [](Memory mem_a, DType dtype, AluOp op, int64_t n, int64_t stride = 1) {
    return [=](ProgramBuilder& b) {
      const Tile a = mem_a == Memory::psum ? b.psum_tile("a", 128, n, DType::fp32)
                                           : b.sbuf_tile("a", 128, n, dtype);
      const Tile c = b.sbuf_tile("c", 128, n * stride, dtype);
      const Tile d = b.sbuf_tile("d", 128, n, dtype);
      b.tensor_tensor(b.view(d), b.view(a), b.view(c, 0, 128, 0, n, stride), op);
    };
  };
  CHECK(cycles_of(trn1(), tt(Memory::psum, DType::fp32, AluOp::add, 512)) == 512);
  CHECK(cycles_of(trn1(), tt(Memory::psum, DType::bf16, AluOp::max, 512)) == 512);
  CHECK(cycles_of(trn1(), tt(Memory::sbuf, DType::bf16, AluOp::add, 512)) == 512);
  CHECK(cycles_of(trn1(), tt(Memory::sbuf, DType::bf16, AluOp::multiply, 512)) == 512);
  CHECK(cycles_of(trn1(), tt(Memory::sbuf, DType::bf16, AluOp::max, 512)) == 1024);
  CHECK(cycles_of(trn1(), tt(Memory::sbuf, DType::fp32, AluOp::add, 512)) == 1024);
  CHECK(cycles_of(trn1(), tt(Memory::sbuf, DType::fp32, AluOp::add, 20)) == 64);
  // bf16 non-contiguous loses the fast path: 2N (stride 2 x 2 B = 4 B: no stride penalty).
  CHECK(cycles_of(trn1(), tt(Memory::sbuf, DType::bf16, AluOp::add, 512, 2)) == 1024);
  // NC-v3: 2x for 16-bit inputs both in SBUF.
  CHECK(cycles_of(trn2(), tt(Memory::sbuf, DType::bf16, AluOp::add, 512)) == 256);
  CHECK(cycles_of(trn2(), tt(Memory::sbuf, DType::fp32, AluOp::add, 512)) == 1024);
}

TEST_CASE("cost: tensor_tensor_scan is max(MIN_II, 2N) on VectorE", "[sim][cost]") {
  auto scan = [](int64_t n, bool initial_tile, Memory mem_a = Memory::sbuf) {
    return [=](ProgramBuilder& b) {
      const Tile a = mem_a == Memory::psum ? b.psum_tile("a", 128, n, DType::fp32)
                                           : b.sbuf_tile("a", 128, n, DType::fp32);
      const Tile c = b.sbuf_tile("c", 128, n, DType::bf16);
      const Tile d = b.sbuf_tile("d", 128, n, DType::fp32);
      const Tile s = b.sbuf_tile("s", 128, 1, DType::fp32);
      b.tensor_tensor_scan(
          b.view(d), b.view(a), b.view(c), AluOp::multiply, AluOp::add,
          initial_tile ? Scalar::per_partition(b.view(s)) : Scalar::constant(0.0f));
    };
  };
  CHECK(cycles_of(trn1(), scan(512, false)) == 1024);
  CHECK(cycles_of(trn1(), scan(512, true)) == 1024);
  CHECK(cycles_of(trn1(), scan(512, false, Memory::psum)) == 1024);  // no PSUM fast case
  CHECK(cycles_of(trn1(), scan(20, false)) == 64);
  CHECK(cycles_of(trn2(), scan(512, false)) == 1024);
}

TEST_CASE("cost: bn_stats is max(MIN_II, N), bn_aggr max(MIN_II, 13 N / 3)", "[sim][cost]") {
  auto stats = [](int64_t n) {
    return [=](ProgramBuilder& b) {
      const Tile x = b.sbuf_tile("x", 128, n, DType::bf16);
      const Tile s = b.sbuf_tile("s", 128, 6, DType::fp32);
      b.bn_stats(b.view(s), b.view(x));
    };
  };
  auto aggr = [](int64_t groups) {
    return [=](ProgramBuilder& b) {
      const Tile s = b.sbuf_tile("s", 128, 6 * groups, DType::fp32);
      const Tile m = b.sbuf_tile("m", 128, 2, DType::fp32);
      b.bn_aggr(b.view(m), b.view(s));
    };
  };
  CHECK(cycles_of(trn1(), stats(512)) == 512);
  CHECK(cycles_of(trn1(), stats(20)) == 64);
  CHECK(cycles_of(trn1(), aggr(4)) == 13 * 8);  // 24 elements: 8 groups of 3
  CHECK(cycles_of(trn1(), aggr(1)) == 64);
}

TEST_CASE("cost: tensor_scalar and tensor_copy are max(MIN_II, N)", "[sim][cost]") {
  auto ts = [](Engine engine, int64_t n) {
    return [=](ProgramBuilder& b) {
      const Tile x = b.sbuf_tile("x", 128, n, DType::fp32);
      const Tile s = b.sbuf_tile("s", 128, 1, DType::fp32);
      b.tensor_scalar(b.view(x), b.view(x), AluOp::multiply, Scalar::per_partition(b.view(s)),
                      AluOp::add, Scalar::constant(1.0f), engine);
    };
  };
  CHECK(cycles_of(trn1(), ts(Engine::vector, 512)) == 512);
  CHECK(cycles_of(trn1(), ts(Engine::scalar, 512)) == 512);
  CHECK(cycles_of(trn1(), ts(Engine::vector, 3)) == 64);
  auto copy = [](Memory src_mem, DType src_dtype, DType dst_dtype, int64_t n) {
    return [=](ProgramBuilder& b) {
      const Tile src = src_mem == Memory::psum ? b.psum_tile("src", 128, n, src_dtype)
                                               : b.sbuf_tile("src", 128, n, src_dtype);
      const Tile dst = b.sbuf_tile("dst", 128, n, dst_dtype);
      b.tensor_copy(b.view(dst), b.view(src));
    };
  };
  CHECK(cycles_of(trn1(), copy(Memory::psum, DType::fp32, DType::bf16, 512)) == 512);
  CHECK(cycles_of(trn1(), copy(Memory::sbuf, DType::bf16, DType::bf16, 2048)) == 2048);
  // NC-v3 VectorE perf modes: 4x contiguous 16-bit SBUF->SBUF, 2x with one side in PSUM; an
  // fp32 PSUM eviction gets none.
  CHECK(cycles_of(trn2(), copy(Memory::sbuf, DType::bf16, DType::bf16, 2048)) == 512);
  CHECK(cycles_of(trn2(), copy(Memory::psum, DType::bf16, DType::bf16, 512)) == 256);
  CHECK(cycles_of(trn2(), copy(Memory::psum, DType::fp32, DType::bf16, 512)) == 512);
}

TEST_CASE("cost: tensor_reduce is N/2 for bf16 add/max, else N", "[sim][cost]") {
  auto reduce = [](DType in, DType out, AluOp op, int64_t n) {
    return [=](ProgramBuilder& b) {
      const Tile x = b.sbuf_tile("x", 128, n, in);
      const Tile r = b.sbuf_tile("r", 128, 1, out);
      b.tensor_reduce(b.view(r), b.view(x), op);
    };
  };
  CHECK(cycles_of(trn1(), reduce(DType::bf16, DType::bf16, AluOp::add, 512)) == 256);
  CHECK(cycles_of(trn1(), reduce(DType::bf16, DType::bf16, AluOp::max, 512)) == 256);
  CHECK(cycles_of(trn1(), reduce(DType::bf16, DType::bf16, AluOp::min, 512)) == 512);
  CHECK(cycles_of(trn1(), reduce(DType::bf16, DType::fp32, AluOp::add, 512)) == 512);
  CHECK(cycles_of(trn1(), reduce(DType::fp32, DType::fp32, AluOp::max, 512)) == 512);
  CHECK(cycles_of(trn1(), reduce(DType::bf16, DType::bf16, AluOp::add, 100)) == 64);
}

TEST_CASE("cost: memset is N/2 for zero in 16-bit, else N, iota is 150 + N", "[sim][cost]") {
  auto fill = [](DType dtype, float value, Engine engine) {
    return [=](ProgramBuilder& b) {
      const Tile x = b.sbuf_tile("x", 128, 512, dtype);
      b.memset(b.view(x), value, engine);
    };
  };
  CHECK(cycles_of(trn1(), fill(DType::bf16, 0.0f, Engine::vector)) == 256);
  CHECK(cycles_of(trn1(), fill(DType::fp16, 0.0f, Engine::gpsimd)) == 256);
  CHECK(cycles_of(trn1(), fill(DType::bf16, 1.0f, Engine::vector)) == 512);
  CHECK(cycles_of(trn1(), fill(DType::fp32, 0.0f, Engine::vector)) == 512);
  auto iota = [](int64_t n) {
    return [=](ProgramBuilder& b) {
      const Tile x = b.sbuf_tile("x", 128, n, DType::int32);
      b.iota(b.view(x), 0, 1, 0);
    };
  };
  CHECK(cycles_of(trn1(), iota(100)) == 250);
  CHECK(cycles_of(trn1(), iota(1)) == 151);
  CHECK(ns_of(trn1(), iota(1250)) == Approx(1000.0));  // 1400 cycles at 1.4 GHz
}

TEST_CASE("cost: innermost stride above 16 bytes halves bandwidth", "[sim][cost]") {
  auto strided_copy = [](int64_t stride) {
    return [=](ProgramBuilder& b) {
      const Tile src = b.sbuf_tile("src", 128, 512 * stride, DType::fp32);
      const Tile dst = b.sbuf_tile("dst", 128, 512, DType::fp32);
      b.tensor_copy(b.view(dst), b.view(src, 0, 128, 0, 512, stride));
    };
  };
  CHECK(cycles_of(trn1(), strided_copy(4)) == 512);   // 16 B: full rate
  CHECK(cycles_of(trn1(), strided_copy(5)) == 1024);  // 20 B: half rate
}

TEST_CASE("cost: select follows the tensor_tensor rule, DMA triggers cost the trigger engine",
          "[sim][cost]") {
  auto select = [](Memory x_memory) {
    return [=](ProgramBuilder& b) {
      const Tile cond = b.sbuf_tile("cond", 128, 512, DType::fp32);
      const Tile x = x_memory == Memory::psum ? b.psum_tile("x", 128, 512, DType::fp32)
                                              : b.sbuf_tile("x", 128, 512, DType::fp32);
      const Tile out = b.sbuf_tile("out", 128, 512, DType::fp32);
      b.select(b.view(out), b.view(cond), b.view(x), Scalar::constant(-9984.0f));
    };
  };
  CHECK(cycles_of(trn1(), select(Memory::psum)) == 512);   // one SBUF + one PSUM input
  CHECK(cycles_of(trn1(), select(Memory::sbuf)) == 1024);  // two SBUF inputs
  auto load = [](Engine trigger) {
    return [=](ProgramBuilder& b) {
      const Tensor x = b.hbm_tensor("x", {128, 512}, DType::bf16);
      const Tile t = b.sbuf_tile("t", 128, 512, DType::bf16);
      b.dma_copy(b.view(t), b.hbm_rows(x, 0, 128, 0, 512), {trigger});
    };
  };
  CHECK(cycles_of(trn1(), load(Engine::sync)) == 64);
  CHECK(cycles_of(trn1(), load(Engine::scalar)) == 64);
}
