// What a fuzz target treats as a finding: tilelab::Error is the documented answer to bad input;
// any other exception escaping the code under test is reported with its type and message and
// aborts, so libFuzzer saves the input (as it does for crashes and sanitizer reports).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <typeinfo>

#include <tilelab/error.hpp>

namespace tilelab::fuzz {

template <typename Body>
void expect_only_tilelab_errors(const char* what, Body&& body) {
  try {
    body();
  } catch (const tilelab::Error&) {
    // Rejected with a message: the expected outcome for bad input.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: uncaught %s: %s\n", what, typeid(e).name(), e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "%s: uncaught exception of an unknown type\n", what);
    std::abort();
  }
}

// An invariant of a successful parse that does not hold (e.g. a round trip that changes the value).
[[noreturn]] inline void invariant_broken(const char* what) {
  std::fprintf(stderr, "invariant broken: %s\n", what);
  std::abort();
}

}  // namespace tilelab::fuzz
