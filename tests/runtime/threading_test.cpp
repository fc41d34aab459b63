// set_num_threads / num_threads.
#include <catch2/catch.hpp>

#include <string>

#include "tilelab/tilelab.hpp"

TEST_CASE("threading: set_num_threads sets the library's thread count", "[runtime][threading]") {
  const int before = tilelab::num_threads();
  CHECK(before >= 1);
  tilelab::set_num_threads(3);
  CHECK(tilelab::num_threads() == 3);
  tilelab::set_num_threads(before);
  CHECK(tilelab::num_threads() == before);
}

TEST_CASE("threading: a thread count below 1 is rejected naming n", "[runtime][threading]") {
  const int before = tilelab::num_threads();
  for (const int bad : {0, -4}) {
    try {
      tilelab::set_num_threads(bad);
      FAIL("expected an error for " << bad);
    } catch (const tilelab::Error& error) {
      CHECK(error.kind() == tilelab::ErrorKind::invalid_value);
      CHECK(std::string(error.what()).rfind("n:", 0) == 0);
    }
  }
  CHECK(tilelab::num_threads() == before);
}
