// Timing-only throughput: builds the NKI matmul tutorial kernels (4096x8192x8192 bf16, trn1), a
// vector-heavy program and the default flash paged attention batch, times them without data, and
// prints instructions per second on one core.
#include <chrono>
#include <cstdio>

#include "sim/kernels/matmul_tutorial.hpp"
#include "sim/kernels/registry.hpp"
#include "sim/timing.hpp"

using namespace tilelab::sim;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Best of `repeats` timing runs; returns instructions per second.
double measure(const char* name, const Program& program, int repeats) {
  double best = 1e300;
  double total_ns = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    const TimingResult t = simulate_timing(program);
    best = std::min(best, seconds_since(start));
    total_ns = t.total_ns;
  }
  const double rate = double(program.instructions.size()) / best;
  std::printf("%-34s %9zu instructions  %8.3f s  %6.2f M instructions/s  (simulated %.3f ms)\n",
              name, program.instructions.size(), best, rate / 1e6, total_ns / 1e6);
  return rate;
}

// Softmax-like rows: many small dependent Vector/Scalar instructions and loads.
Program vector_heavy(const Machine& machine, int rows) {
  ProgramBuilder b(machine, "vector_heavy");
  const Tensor x = b.hbm_tensor("x", {128, 512}, DType::fp32);
  TilePool data = b.pool("data", Memory::sbuf, 128, 512, DType::fp32, 4);
  TilePool stats = b.pool("stats", Memory::sbuf, 128, 1, DType::fp32, 8);
  for (int i = 0; i < rows; ++i) {
    const Tile t = b.next(data);
    const Tile m = b.next(stats);
    const Tile s = b.next(stats);
    b.dma_copy(b.view(t), b.hbm_rows(x, 0, 128, 0, 512));
    b.tensor_reduce(b.view(m), b.view(t), AluOp::max, true);
    ActivationOptions o;
    o.bias = b.view(m);
    o.reduce_result = b.view(s);
    b.activation(b.view(t), b.view(t), ActFunc::exp, o);
    b.tensor_scalar(b.view(t), b.view(t), AluOp::divide, Scalar::per_partition(b.view(s)));
    b.dma_copy(b.hbm_rows(x, 0, 128, 0, 512), b.view(t));
  }
  return b.finish();
}

}  // namespace

int main() {
  const Machine trn1 = load_machine("trn1");
  std::printf("timing-only simulation throughput (one core, best of 3)\n");
  double worst = 1e300;
  const double measured_ms[] = {51.80, 42.96, 22.07, 6.97};  // NKI matmul tutorial, trn1
  int index = 0;
  for (const MatmulVariant v : {MatmulVariant::tiled, MatmulVariant::hoist_load,
                                MatmulVariant::block_free, MatmulVariant::fully_optimized}) {
    MatmulTutorialConfig c;
    c.variant = v;
    const auto start = std::chrono::steady_clock::now();
    const Program p = build_matmul_tutorial(trn1, c);
    const double build_s = seconds_since(start);
    const std::string name = "matmul " + matmul_variant_name(v);
    worst = std::min(worst, measure(name.c_str(), p, 3));
    std::printf("%-34s build %.3f s (%.2f M instructions/s); published %.2f ms on trn1\n", "",
                build_s, p.instructions.size() / build_s / 1e6, measured_ms[index++]);
  }
  const Program heavy = vector_heavy(trn1, 200000);
  worst = std::min(worst, measure("vector_heavy (softmax rows)", heavy, 3));
  // `tilelab sim paged-attention` with its defaults (the schedule's tiling factor).
  const KernelInfo& paged = kernel_registry().find("paged-attention");
  const auto paged_start = std::chrono::steady_clock::now();
  const Program paged_program = paged.build(trn1, resolve_parameters(paged, {}));
  const double paged_build_s = seconds_since(paged_start);
  worst = std::min(worst, measure("paged-attention (default batch)", paged_program, 3));
  std::printf("%-34s build %.3f s (%.2f M instructions/s)\n", "", paged_build_s,
              paged_program.instructions.size() / paged_build_s / 1e6);
  std::printf("slowest: %.2f M instructions/s (target >= 5)\n", worst / 1e6);
  return 0;
}
