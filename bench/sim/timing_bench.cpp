// Simulator throughput, timing only: builds the NKI matmul tutorial kernels (4096x8192x8192 bf16,
// trn1), a vector-heavy program and the default flash paged attention batch, and prints
// instructions per second for the build, the timing simulation and both together (end to end),
// each the best of several runs on one core (M/s: millions of instructions per second; "1st e2e"
// the first run's end-to-end rate; "report ms" the report a sweep point makes, not in e2e).
//
//   build/bench/sim/tilelab_sim_bench [--repeats N] [--only NAME_PREFIX] [--cpu-time]
//
// --cpu-time measures the thread's CPU time instead of the wall clock: on a machine shared with
// other work, preemption then does not count against the simulator.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <string>
#include <string_view>

#include "sim/kernels/matmul_tutorial.hpp"
#include "sim/kernels/registry.hpp"
#include "sim/report.hpp"
#include "sim/timing.hpp"

using namespace tilelab::sim;

namespace {

bool use_cpu_time = false;

double now_s() {
  if (use_cpu_time) {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// /proc/cpuinfo's first "model name", so that figures from different machines are not mixed up.
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
  }
  return "unknown CPU";
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

struct Throughput {
  size_t instructions = 0;
  double build_s = 1e300;       // best of the runs
  double simulate_s = 1e300;    // best of the runs
  double end_to_end_s = 1e300;  // best build + simulate of one run
  // The first run: ProgramBuilder starts from the capacity the last program on the thread needed,
  // so later runs do not grow their instruction vector from empty (as in a sweep).
  double first_end_to_end_s = 0;
  double simulated_ns = 0;
  double report_s = 1e300;  // make_report as a sweep point runs it (no critical-path segments)
};

// Builds and times `build()` `repeats` times; keeps the best of each phase.
Throughput measure(const std::function<Program()>& build, int repeats) {
  Throughput t;
  for (int r = 0; r < repeats; ++r) {
    const double start = now_s();
    const Program program = build();
    const double built = now_s();
    const TimingResult timing = simulate_timing(program);
    const double build_s = built - start, simulate_s = now_s() - built;
    if (r == 0) t.first_end_to_end_s = build_s + simulate_s;
    ReportOptions options;
    options.max_critical_path_segments = 0;
    options.idle_blame = false;
    const double report_start = now_s();
    const Report report = make_report(program, timing, options);
    t.report_s = std::min(t.report_s, now_s() - report_start);
    t.instructions = program.instructions.size();
    t.build_s = std::min(t.build_s, build_s);
    t.simulate_s = std::min(t.simulate_s, simulate_s);
    t.end_to_end_s = std::min(t.end_to_end_s, build_s + simulate_s);
    t.simulated_ns = timing.total_ns;
  }
  return t;
}

void print_row(const char* name, const Throughput& t) {
  const double n = double(t.instructions);
  std::printf("%-32s %9zu %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %11.3f\n", name,
              t.instructions, t.build_s * 1e3, n / t.build_s / 1e6, t.simulate_s * 1e3,
              n / t.simulate_s / 1e6, t.end_to_end_s * 1e3, n / t.end_to_end_s / 1e6,
              n / t.first_end_to_end_s / 1e6, t.report_s * 1e3, t.simulated_ns / 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 5;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--repeats" && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (arg == "--cpu-time") {
      use_cpu_time = true;
    } else {
      std::fprintf(stderr, "usage: %s [--repeats N] [--only NAME_PREFIX] [--cpu-time]\n", argv[0]);
      return 2;
    }
  }
  const Machine trn1 = load_machine("trn1");
  std::printf("simulator throughput, timing only: one core, best of %d runs (%s); CPU: %s\n",
              repeats, use_cpu_time ? "thread CPU time" : "wall clock", cpu_model().c_str());
  std::printf("%-32s %9s %9s %9s %9s %9s %9s %9s %9s %9s %11s\n", "workload", "instrs", "build ms",
              "build M/s", "sim ms", "sim M/s", "e2e ms", "e2e M/s", "1st e2e", "report ms",
              "simulated ms");
  const KernelInfo& paged = kernel_registry().find("paged-attention");
  const KernelParameters paged_defaults = resolve_parameters(paged, {});
  struct Workload {
    std::string name;
    std::function<Program()> build;
  };
  std::vector<Workload> workloads;
  // `tilelab sim paged-attention` with its defaults: the figure the simulator is judged by.
  workloads.push_back(
      {"paged-attention (default batch)", [&] { return paged.build(trn1, paged_defaults); }});
  for (const MatmulVariant v : {MatmulVariant::tiled, MatmulVariant::hoist_load,
                                MatmulVariant::block_free, MatmulVariant::fully_optimized}) {
    MatmulTutorialConfig c;
    c.variant = v;
    workloads.push_back({"matmul " + matmul_variant_name(v),
                         [&trn1, c] { return build_matmul_tutorial(trn1, c); }});
  }
  workloads.push_back({"vector_heavy (softmax rows)", [&] { return vector_heavy(trn1, 200000); }});
  double slowest = 1e300, default_batch = 0;
  for (const Workload& w : workloads) {
    if (w.name.rfind(only, 0) != 0) continue;
    const Throughput t = measure(w.build, repeats);
    print_row(w.name.c_str(), t);
    const double rate = double(t.instructions) / t.end_to_end_s;
    slowest = std::min(slowest, rate);
    if (&w == &workloads.front()) default_batch = rate;
  }
  if (default_batch > 0)
    std::printf("default paged batch end to end: %.2f M instructions/s (target >= 10)\n",
                default_batch / 1e6);
  std::printf("slowest end to end: %.2f M instructions/s\n", slowest / 1e6);
  return 0;
}
