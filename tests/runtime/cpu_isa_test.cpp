// TILELAB_MAX_CPU_ISA=avx2 and sse2 (cpu_features.hpp) as the runtime's own checks and the
// generated kernels' multitarget dispatch see them.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <iterator>

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

// What the AVX2 variants of TILELAB_HALIDE_TARGETS need.
constexpr std::initializer_list<int> kAvx2Target = {
    halide_target_feature_avx, halide_target_feature_avx2, halide_target_feature_fma,
    halide_target_feature_f16c, halide_target_feature_sse41};

// Sets TILELAB_MAX_CPU_ISA to `value` and installs the Halide hooks; false (with a warning) when
// the process read the variable before. It is read once per process: ctest runs each case in its
// own. (Run among the other cases in one process, a case may come after the first read.)
bool cap_cpu_isa(const char* value, tilelab::detail::CpuIsa expected) {
  setenv("TILELAB_MAX_CPU_ISA", value, 1);
  if (tilelab::detail::max_cpu_isa() != expected) {
    WARN("TILELAB_MAX_CPU_ISA was read before this case set it; run it alone");
    return false;
  }
  tilelab::detail::install_halide_hooks();
  return true;
}

}  // namespace

TEST_CASE("cpu isa: capped at avx2, nothing runs AVX-512") {
  if (!cap_cpu_isa("avx2", tilelab::detail::CpuIsa::avx2)) return;
  CHECK_FALSE(tilelab::detail::cpu_runs_avx512());
  CHECK_FALSE(tilelab::detail::cpu_has_bf16_dot_products());
  CHECK(can_use({halide_target_feature_avx512, halide_target_feature_avx512_skylake}) == 0);
  CHECK(can_use({halide_target_feature_avx512_zen4}) == 0);
  CHECK(can_use({halide_target_feature_avx512_sapphirerapids}) == 0);
  CHECK(can_use({}) == 1);
  const bool avx2 = __builtin_cpu_supports("x86-64-v3");
  CHECK(tilelab::detail::cpu_runs_avx2() == avx2);
  CHECK(can_use(kAvx2Target) == (avx2 ? 1 : 0));
}

TEST_CASE("cpu isa: capped at sse2, only the baseline runs") {
  if (!cap_cpu_isa("sse2", tilelab::detail::CpuIsa::sse2)) return;
  CHECK_FALSE(tilelab::detail::cpu_runs_avx2());
  CHECK_FALSE(tilelab::detail::cpu_runs_avx512());
  CHECK_FALSE(tilelab::detail::cpu_has_bf16_dot_products());
  CHECK(can_use({halide_target_feature_avx512_zen4}) == 0);
  CHECK(can_use(kAvx2Target) == 0);
  CHECK(can_use({halide_target_feature_sse41}) == 0);
  CHECK(can_use({}) == 1);
}

TEST_CASE("cpu isa: both versions of run_compiled_for_cpu compute the body") {
  float values[37];
  for (int i = 0; i < 37; ++i) values[i] = 0.5f * static_cast<float>(i) - 3.0f;
  auto sum_of_squares = [&]() TILELAB_ALWAYS_INLINE {
    double sum = 0;
    for (const float x : values) sum += double(x) * double(x);
    return sum;
  };
  const double expected = tilelab::detail::run_compiled_for_baseline(sum_of_squares);
  CHECK(expected > 0);
  if (__builtin_cpu_supports("x86-64-v3")) {
    CHECK(tilelab::detail::run_compiled_for_avx2(sum_of_squares) == expected);
  }
  CHECK(tilelab::detail::run_compiled_for_cpu(sum_of_squares) == expected);
}
