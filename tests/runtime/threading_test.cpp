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

TEST_CASE("threading: a thread count above max_num_threads is rejected naming n and the cap",
          "[runtime][threading]") {
  const int before = tilelab::num_threads();
  CHECK(tilelab::max_num_threads() >= 8);
  tilelab::set_num_threads(tilelab::max_num_threads());
  CHECK(tilelab::num_threads() == tilelab::max_num_threads());
  tilelab::set_num_threads(before);
  for (const int bad : {tilelab::max_num_threads() + 1, 100000}) {
    try {
      tilelab::set_num_threads(bad);
      FAIL("expected an error for " << bad);
    } catch (const tilelab::Error& error) {
      const std::string message = error.what();
      CHECK(error.kind() == tilelab::ErrorKind::invalid_value);
      CHECK(message.rfind("n:", 0) == 0);
      CHECK(message.find(std::to_string(tilelab::max_num_threads())) != std::string::npos);
      CHECK(message.find(std::to_string(bad)) != std::string::npos);
    }
  }
  CHECK(tilelab::num_threads() == before);
}
