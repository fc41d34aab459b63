// JSON read from users (machine files, overrides, schedules): parsed with bounded nesting and
// without duplicate keys, and quoted in error messages without unbounded output. One parser for
// the simulator and the schedule descriptions (tilelab_json_input: plain C++, no Halide).
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

namespace tilelab {

// Deeper nesting is rejected while parsing: no user input nests more than a few levels, and
// formatting a deeply nested value recurses once per level.
inline constexpr int kMaxJsonDepth = 64;

// Parses `text`; throws tilelab::Error starting with `origin` for malformed JSON, nesting deeper
// than kMaxJsonDepth, a number out of the double range, or a key given twice in one object.
nlohmann::json parse_user_json(const std::string& text, const std::string& origin);

// `value` as JSON text for an error message, cut to about `max_chars` characters ("..." marks
// the cut). The value must come from parse_user_json or the program (bounded depth).
std::string json_excerpt(const nlohmann::json& value, size_t max_chars = 80);

}  // namespace tilelab
