// Shared helpers for the simulator tests.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>
#include <tilelab/error.hpp>

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
