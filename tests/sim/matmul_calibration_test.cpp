// Calibration against the NKI matrix-multiplication tutorial: 4096x8192 @ 8192x8192 bf16 on trn1,
// published latencies 51.80 / 42.96 / 22.07 / 6.97 ms (aws-neuron-sdk 2.20-2.26).
#include <cstdio>

#include "sim/kernels/matmul_tutorial.hpp"
#include "sim/report.hpp"
#include "test_util.hpp"

using namespace tilelab::sim;
using namespace tilelab::sim::test;

TEST_CASE("calibration: matmul tutorial kernels rank as measured and fully optimized is within 15%",
          "[sim][calibration][matmul]") {
  struct Case {
    MatmulVariant variant;
    double measured_ms;
  };
  const Case cases[] = {{MatmulVariant::tiled, 51.80},
                        {MatmulVariant::hoist_load, 42.96},
                        {MatmulVariant::block_free, 22.07},
                        {MatmulVariant::fully_optimized, 6.97}};
  std::vector<double> simulated;
  std::printf("\nNKI matmul tutorial, trn1, [4096,8192] @ [8192,8192] bf16\n");
  std::printf("%-16s %12s %12s %8s %8s %10s\n", "kernel", "simulated_ms", "measured_ms", "ratio",
              "HFU_%", "DMA_GB/s");
  for (const Case& c : cases) {
    MatmulTutorialConfig config;
    config.variant = c.variant;
    const Program p = build_matmul_tutorial(trn1(), config);
    const TimingResult t = simulate_timing(p);
    const Report r = make_report(p, t);
    simulated.push_back(t.total_ns / 1e6);
    std::printf("%-16s %12.2f %12.2f %8.2f %8.1f %10.1f\n", matmul_variant_name(c.variant).c_str(),
                t.total_ns / 1e6, c.measured_ms, t.total_ns / 1e6 / c.measured_ms, r.hfu_percent,
                r.dma_achieved_gbps);
  }
  for (size_t i = 1; i < simulated.size(); ++i) {
    INFO("variant " << i << " should be faster than variant " << i - 1);
    CHECK(simulated[i] < simulated[i - 1]);
  }
  CHECK(simulated[3] == Approx(6.97).epsilon(0.15));
}
