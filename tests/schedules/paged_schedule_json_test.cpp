// PagedAttentionSchedule::from_json on bad input: every mistake is a tilelab::Error whose message
// names the key, what was given and what is allowed (never an exception of the JSON library).
#include <catch2/catch.hpp>

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "schedules/paged/schedule.hpp"
#include "tilelab/error.hpp"

using tilelab::schedules::PagedAttentionSchedule;

namespace {

const std::string kHeader =
    R"({"schema": "tilelab.paged_attention_schedule", "schema_version": 1, )";

// The message of the tilelab::Error from_json throws for `text`; any other outcome fails.
std::string error_of(const std::string& text) {
  try {
    (void)PagedAttentionSchedule::from_json(text);
  } catch (const tilelab::Error& error) {
    return error.what();
  } catch (const std::exception& error) {
    FAIL("from_json threw something other than tilelab::Error: " << error.what());
  }
  FAIL("from_json accepted " << text);
  return {};
}

void check_errors(const std::vector<std::pair<std::string, std::string>>& cases) {
  for (const auto& [text, message] : cases) {
    INFO(text);
    CHECK(error_of(text) == message);
  }
}

}  // namespace

TEST_CASE("paged schedule JSON: the fuzzer's findings are Errors", "[schedules][paged][json]") {
  // fuzz/corpus/schedule_json_fuzzer/number_overflow.json and schema_not_a_string.json (once
  // fuzz findings).
  check_errors({
      {R"({"block_size": 1e400})",
       "paged attention schedule: invalid JSON value: number overflow parsing '1e400' (numbers "
       "must lie within about +-1.8e308)"},
      {R"({"schema": 1})", R"(schema: expected "tilelab.paged_attention_schedule", got 1)"},
  });
}

TEST_CASE("paged schedule JSON: malformed, nested, duplicated and non-object input",
          "[schedules][paged][json]") {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  check_errors({
      {"nonsense",
       "paged attention schedule: malformed JSON: parse error at line 1, column 2: syntax error "
       "while parsing value - invalid literal; last read: 'no'"},
      {"",
       "paged attention schedule: malformed JSON: parse error at line 1, column 1: syntax error "
       "while parsing value - unexpected end of input; expected '[', '{', or a literal"},
      {kHeader + R"("transpose": )" + deep + "}",
       "paged attention schedule: JSON nested more than 64 levels deep"},
      {kHeader + R"("derived": )" + deep + "}",
       "paged attention schedule: JSON nested more than 64 levels deep"},
      {kHeader + R"("kv_buffers": 2, "kv_buffers": 3})",
       "paged attention schedule: key 'kv_buffers' appears twice in one object"},
      {kHeader + R"("schema": "tilelab.paged_attention_schedule"})",
       "paged attention schedule: key 'schema' appears twice in one object"},
      {"[1, 2]", "paged attention schedule: expected a JSON object, got array [1,2]"},
      {"32", "paged attention schedule: expected a JSON object, got number 32"},
  });
}

TEST_CASE("paged schedule JSON: schema, schema_version and derived must have their types",
          "[schedules][paged][json]") {
  const std::string schema = R"({"schema": "tilelab.paged_attention_schedule", )";
  check_errors({
      {R"({"schema_version": 1})",
       R"(schema: expected "tilelab.paged_attention_schedule", got nothing)"},
      {R"({"schema": null, "schema_version": 1})",
       R"(schema: expected "tilelab.paged_attention_schedule", got null)"},
      {R"({"schema": ["tilelab.paged_attention_schedule"]})",
       R"(schema: expected "tilelab.paged_attention_schedule", got ["tilelab.paged_attention_schedule"])"},
      {R"({"schema": "tilelab.machine"})",
       R"(schema: expected "tilelab.paged_attention_schedule", got "tilelab.machine")"},
      {schema + "\"block_size\": 32}", "schema_version: expected 1, got nothing"},
      {schema + "\"schema_version\": 1.9}", "schema_version: expected 1, got 1.9"},
      {schema + "\"schema_version\": 1.0}", "schema_version: expected 1, got 1.0"},
      {schema + "\"schema_version\": \"1\"}", R"(schema_version: expected 1, got "1")"},
      {schema + "\"schema_version\": 2}", "schema_version: expected 1, got 2"},
      {schema + "\"schema_version\": 1e400}",
       "paged attention schedule: invalid JSON value: number overflow parsing '1e400' (numbers "
       "must lie within about +-1.8e308)"},
      {kHeader + R"("derived": 1})",
       "derived: expected an object (derived values, ignored on read), got 1"},
  });
  // derived is ignored on read, whatever it holds.
  CHECK(PagedAttentionSchedule::from_json(kHeader + R"("derived": {"block_size": "x"}})") ==
        PagedAttentionSchedule{});
}

TEST_CASE("paged schedule JSON: every field rejects a value of the wrong type",
          "[schedules][paged][json]") {
  check_errors({
      {kHeader + R"("partition_tile": "128"})",
       R"(partition_tile: expected an integer in [1, 65536], got "128")"},
      {kHeader + R"("free_tile": 512.0})",
       "free_tile: expected an integer in [1, 65536], got 512.0"},
      {kHeader + R"("large_tile_size": true})",
       "large_tile_size: expected an integer in [1, 1048576], got true"},
      {kHeader + R"("block_size": null})",
       "block_size: expected an integer in [1, 65536], got null"},
      {kHeader + R"("mixed_precision": 1})", "mixed_precision: expected true or false, got 1"},
      {kHeader + R"("mixed_precision": "true"})",
       R"(mixed_precision: expected true or false, got "true")"},
      {kHeader + R"("transpose": 1})", R"(transpose: expected "pe" or "dma", got 1)"},
      {kHeader + R"("transpose": ["pe"]})", R"(transpose: expected "pe" or "dma", got ["pe"])"},
      {kHeader + R"("transpose": "tensor"})", R"(transpose: expected "pe" or "dma", got "tensor")"},
      {kHeader + R"("kv_buffers": {}})", "kv_buffers: expected an integer in [1, 4], got {}"},
      {kHeader + R"("block_size_tiling_factor_override": []})",
       "block_size_tiling_factor_override: expected an integer in [0, 65536], got []"},
  });
  // Every field of the table is covered above.
  CHECK(tilelab::schedules::paged_attention_schedule_fields().size() == 8);
}

TEST_CASE("paged schedule JSON: integers out of their range are named, never wrapped",
          "[schedules][paged][json]") {
  check_errors({
      {kHeader + R"("kv_buffers": 0})", "kv_buffers: expected an integer in [1, 4], got 0"},
      {kHeader + R"("kv_buffers": 4294967298})",
       "kv_buffers: expected an integer in [1, 4], got 4294967298"},
      {kHeader + R"("kv_buffers": 18446744073709551615})",
       "kv_buffers: expected an integer in [1, 4], got 18446744073709551615"},
      {kHeader + R"("kv_buffers": 9223372036854775808})",
       "kv_buffers: expected an integer in [1, 4], got 9223372036854775808"},
      {kHeader + R"("block_size_tiling_factor_override": -9223372036854775808})",
       "block_size_tiling_factor_override: expected an integer in [0, 65536], got "
       "-9223372036854775808"},
      // Beyond 64 bits nlohmann reads a float.
      {kHeader + R"("large_tile_size": 99999999999999999999})",
       "large_tile_size: expected an integer in [1, 1048576], got 1e+20"},
      {kHeader + R"("block_size": 1e3})",
       "block_size: expected an integer in [1, 65536], got 1000.0"},
      {kHeader + R"("block_size": -1e400})",
       "paged attention schedule: invalid JSON value: number overflow parsing '-1e400' (numbers "
       "must lie within about +-1.8e308)"},
      // In its JSON range but not a tiling the kernel can run: validate()'s message.
      {kHeader + R"("block_size": 3})", "block_size: expected a power of two in [1, 256], got 3"},
  });
}

TEST_CASE("paged schedule JSON: unknown keys are listed with the known ones, cut when long",
          "[schedules][paged][json]") {
  const std::string known =
      " (known: partition_tile, free_tile, large_tile_size, block_size, mixed_precision, "
      "transpose, kv_buffers, block_size_tiling_factor_override)";
  check_errors({
      {kHeader + R"("large_tile": 512})",
       R"(paged attention schedule: unknown key "large_tile")" + known},
      {kHeader + "\"" + std::string(1000, 'k') + "\": 1}",
       "paged attention schedule: unknown key \"" + std::string(79, 'k') + "..." + known},
  });
}
