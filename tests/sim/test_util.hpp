// Shared helpers for the simulator tests.
#pragma once

#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <tilelab/error.hpp>

#include "sim/functional.hpp"
#include "sim/machine.hpp"
#include "sim/program.hpp"
#include "sim/timing.hpp"

namespace tilelab::sim::test {

inline const Machine& trn1() {
  static const Machine m = load_machine("trn1");
  return m;
}
inline const Machine& trn2() {
  static const Machine m = load_machine("trn2");
  return m;
}

// n values uniform in [-1, 1), exactly representable in `dtype` (so the kernel's input rounding
// does not enter the comparison).
inline std::vector<float> random_values(size_t n, DType dtype, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = round_to_dtype(dist(rng), dtype);
  return v;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Returns the message of the tilelab::Error thrown by `f`, or fails the test.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("expected a tilelab::Error");
  return {};
}

}  // namespace tilelab::sim::test
