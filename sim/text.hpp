// Text appended to a std::string without streams: the trace and the reports describe every
// instruction, where an ostringstream per description took a quarter of the main job.
#pragma once

#include <charconv>
#include <concepts>
#include <string>

namespace tilelab::sim {

// `value` in decimal, as `out << value` writes it.
template <std::integral Integer>
void append_decimal(std::string& out, Integer value) {
  char digits[24];
  const auto end = std::to_chars(digits, digits + sizeof digits, value).ptr;
  out.append(digits, end);
}

}  // namespace tilelab::sim
