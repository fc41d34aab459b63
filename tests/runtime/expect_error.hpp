// expect_error: a call throws tilelab::Error whose message names `argument` first and contains
// each of the given texts.
#pragma once

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "tilelab/error.hpp"

namespace tilelab_test {

// Expects an Error whose message starts with "`argument`:" and contains every string of `also`.
template <typename Call>
void expect_error(Call&& call, const std::string& argument, std::vector<std::string> also = {}) {
  std::string message;
  try {
    call();
  } catch (const tilelab::Error& error) {
    message = error.what();
  }
  INFO("message: " << message);
  REQUIRE(!message.empty());
  CHECK(message.rfind(argument + ":", 0) == 0);
  for (const std::string& text : also) CHECK(message.find(text) != std::string::npos);
}

}  // namespace tilelab_test
