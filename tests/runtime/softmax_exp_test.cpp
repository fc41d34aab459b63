// The paged kernel's AVX-512 exp (exp_nonpositive_avx512, reference_softmax.hpp) against the fp64
// exp: its accuracy over [-87, 0], the values outside it and the non-finite ones, and the fused
// exp-and-sum pass over ragged lengths.
#include <catch2/catch.hpp>

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu_features.hpp"
#include "reference_softmax.hpp"

namespace {

using tilelab::detail::cpu_runs_avx512;

// e^x of 16 lanes at once, lane by lane.
__attribute__((target("avx512f"))) void exp16(const float* x, float* out) {
  _mm512_storeu_ps(out, tilelab::detail::exp_nonpositive_avx512(_mm512_loadu_ps(x)));
}

// Distance in units in the last place of `expected` (an fp32 normal).
double ulp_error(float got, double expected) {
  const int exponent = std::ilogb(expected);
  return std::abs(static_cast<double>(got) - expected) / std::ldexp(1.0, exponent - 23);
}

}  // namespace

TEST_CASE("exp_nonpositive_avx512 is within 1.3 ulp of exp over [-87, 0]", "[softmax]") {
  if (!cpu_runs_avx512()) {
    WARN("this CPU has no AVX-512: nothing to test");
    return;
  }
  // Every 97th fp32 value from 0 down to -87 (about 11 million), in batches of 16.
  std::uint32_t bits = 0x80000000u;  // -0
  float x[16], e[16];
  double worst = 0.0;
  float worst_x = 0.0f;
  bool done = false;
  while (!done) {
    for (int lane = 0; lane < 16; ++lane) {
      float value;
      std::memcpy(&value, &bits, sizeof value);
      if (value < -87.0f) {
        value = -87.0f;
        done = true;
      }
      x[lane] = value;
      bits += 97;
    }
    exp16(x, e);
    for (int lane = 0; lane < 16; ++lane) {
      const double error = ulp_error(e[lane], std::exp(static_cast<double>(x[lane])));
      if (error > worst) {
        worst = error;
        worst_x = x[lane];
      }
    }
  }
  INFO("worst at x = " << worst_x);
  CHECK(worst <= 1.3);
}

TEST_CASE("exp_nonpositive_avx512 outside [-87, 0] and on non-finite values", "[softmax]") {
  if (!cpu_runs_avx512()) {
    WARN("this CPU has no AVX-512: nothing to test");
    return;
  }
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float x[16] = {0.0f, -0.0f, -kInf,  -87.5f,  -88.0f, -103.0f, -1e30f, nan,
                       -nan, -1.0f, -87.0f, -1e-30f, -0.5f,  -20.0f,  -60.0f, -86.99f};
  float e[16];
  exp16(x, e);
  CHECK(e[0] == 1.0f);
  CHECK(e[1] == 1.0f);
  for (int lane : {2, 3, 4, 5, 6}) CHECK(e[lane] == 0.0f);  // underflow, and exp(-inf) = 0
  CHECK(std::isnan(e[7]));
  CHECK(std::isnan(e[8]));
  CHECK(e[11] == 1.0f);
  for (int lane : {9, 10, 12, 13, 14, 15}) {
    INFO("x = " << x[lane]);
    CHECK(ulp_error(e[lane], std::exp(static_cast<double>(x[lane]))) <= 1.3);
  }
}

TEST_CASE("exp_shifted_sum_avx512 over ragged lengths", "[softmax]") {
  if (!cpu_runs_avx512()) {
    WARN("this CPU has no AVX-512: nothing to test");
    return;
  }
  for (std::int64_t count : {0, 1, 5, 15, 16, 17, 31, 32, 33, 100, 256}) {
    INFO("count = " << count);
    std::vector<float> s(static_cast<std::size_t>(count) + 16, 123.0f);  // past count: untouched
    for (std::int64_t j = 0; j < count; ++j) s[j] = -0.37f * static_cast<float>(j % 23) + 1.5f;
    const std::vector<float> before = s;
    const float shift = 1.5f;
    const float sum = tilelab::detail::exp_shifted_sum_avx512(s.data(), count, shift);
    double expected_sum = 0.0;
    for (std::int64_t j = 0; j < count; ++j) {
      const double expected = std::exp(static_cast<double>(before[j] - shift));
      CHECK(ulp_error(s[j], expected) <= 1.3);
      expected_sum += expected;
    }
    for (std::int64_t j = count; j < count + 16; ++j) CHECK(s[j] == 123.0f);
    CHECK(sum == Approx(expected_sum).epsilon(1e-6).margin(0.0));
  }
  // A NaN score makes the sum NaN; a -inf one adds 0.
  float s[20];
  for (float& value : s) value = 0.0f;
  s[3] = -std::numeric_limits<float>::infinity();
  CHECK(tilelab::detail::exp_shifted_sum_avx512(s, 20, 0.0f) == 19.0f);
  CHECK(s[3] == 0.0f);
  s[18] = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(tilelab::detail::exp_shifted_sum_avx512(s, 20, 0.0f)));
}
