// TILELAB_MAX_CPU_ISA=avx2 (cpu_features.hpp) as the runtime's own checks and the generated
// kernels' multitarget dispatch see it.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <initializer_list>

#include "HalideRuntime.h"
#include "cpu_features.hpp"
#include "halide_glue.hpp"

namespace {

// Whether the multitarget kernels would run a variant that needs `features`.
int can_use(std::initializer_list<int> features) {
  uint64_t words[(halide_target_feature_end + 63) / 64] = {};
  for (const int feature : features) words[feature / 64] |= uint64_t{1} << (feature % 64);
  return halide_can_use_target_features(static_cast<int>(std::size(words)), words);
}

}  // namespace

TEST_CASE("cpu isa: capped at avx2, nothing runs AVX-512") {
  // The variable is read once per process: ctest runs this case in its own. (Run among the other
  // cases in one process, it may come after the first read.)
  setenv("TILELAB_MAX_CPU_ISA", "avx2", 1);
  if (!tilelab::detail::cpu_isa_capped_at_avx2()) {
    WARN("TILELAB_MAX_CPU_ISA was read before this case set it; run it alone");
    return;
  }
  tilelab::detail::install_halide_hooks();
  CHECK_FALSE(tilelab::detail::cpu_runs_avx512());
  CHECK_FALSE(tilelab::detail::cpu_has_bf16_dot_products());
  CHECK(can_use({halide_target_feature_avx512, halide_target_feature_avx512_skylake}) == 0);
  CHECK(can_use({halide_target_feature_avx512_zen4}) == 0);
  CHECK(can_use({halide_target_feature_avx512_sapphirerapids}) == 0);
  CHECK(can_use({}) == 1);
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c") && __builtin_cpu_supports("sse4.1");
  CHECK(can_use({halide_target_feature_avx, halide_target_feature_avx2, halide_target_feature_fma,
                 halide_target_feature_f16c, halide_target_feature_sse41}) == (avx2 ? 1 : 0));
}
