// Bounded parsing of user JSON.
#include "common/json_input.hpp"

#include <set>
#include <vector>

#include <tilelab/error.hpp>

namespace tilelab {
namespace {

// nlohmann's message without its "[json.exception.parse_error.101] " prefix.
std::string reason(const nlohmann::json::exception& e) {
  std::string text = e.what();
  if (text.size() > 200) text = text.substr(0, 200) + "...";
  const size_t end = text.rfind("] ", text.find(' '));
  return text.rfind("[json.exception.", 0) == 0 && end != std::string::npos ? text.substr(end + 2)
                                                                            : text;
}

}  // namespace

nlohmann::json parse_user_json(const std::string& text, const std::string& origin) {
  using nlohmann::json;
  // One set of keys per open object, innermost last.
  std::vector<std::set<std::string>> keys;
  const json::parser_callback_t check = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > kMaxJsonDepth)
      throw Error(origin + ": JSON nested more than " + std::to_string(kMaxJsonDepth) +
                  " levels deep");
    switch (event) {
      case json::parse_event_t::object_start:
        keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && !keys.back().insert(parsed.get<std::string>()).second)
          throw Error(origin + ": key '" + parsed.get<std::string>() +
                      "' appears twice in one object");
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text, check);
  } catch (const json::parse_error& e) {
    throw Error(origin + ": malformed JSON: " + reason(e));
  } catch (const json::exception& e) {
    // out_of_range 406: a number beyond the double range.
    throw Error(origin + ": invalid JSON value: " + reason(e) +
                " (numbers must lie within about +-1.8e308)");
  }
}

std::string json_excerpt(const nlohmann::json& value, size_t max_chars) {
  std::string text = value.dump();
  if (text.size() > max_chars) text = text.substr(0, max_chars) + "...";
  return text;
}

}  // namespace tilelab
