// Bad input to the simulator's front doors: request lengths that overflow, deeply nested or
// duplicated JSON, numbers beyond double, oversized programs. Each is a tilelab::Error naming
// what was given; none crashes or allocates without bound.
#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "sim/kernels/flash_paged_attention.hpp"
#include "sim/kernels/registry.hpp"
#include "test_util.hpp"

namespace tilelab::sim {
namespace {

using namespace test;
using Catch::Matchers::Contains;
using nlohmann::json;

PagedAttentionBatch batch_of(const std::vector<PagedAttentionRequest>& requests) {
  return make_paged_attention_batch(requests, schedules::PagedAttentionTiling{}, 1);
}

TEST_CASE("bad input: request lengths that overflow are named before allocating",
          "[sim][bad_input]") {
  CHECK_THAT(error_of([] { batch_of({{1, INT64_MAX}}); }),
             Contains("decode[0]: context length 9223372036854775807") &&
                 Contains("limit of 1073741824 tokens"));
  CHECK_THAT(error_of([] { batch_of({{1, 1000000000000}}); }),
             Contains("decode[0]: context length 1000000000000"));
  CHECK_THAT(
      error_of([] { batch_of({{INT64_MAX, 0}}); }),
      Contains("prefill[0]: query length 9223372036854775807") && Contains("limit of 1048576"));
  // The sum of lengths each within its limit overflows no counter: the total is what is named.
  CHECK_THAT(error_of([] { batch_of({{1, kMaxBatchContextTokens}, {1, kMaxBatchContextTokens}}); }),
             Contains("decode[1]: context length 1073741824 brings the batch's context above"));
  // Within the token limits, the mask (rows x columns bytes) is bounded too.
  CHECK_THAT(error_of([] { batch_of({{1, kMaxBatchContextTokens / 2}}); }),
             Contains("the batch's mask") && Contains("exceeds the limit of 2147483648 bytes"));
  CHECK_THAT(error_of([] { batch_of({{1, -1}}); }), Contains("decode[0]: query length must be"));
}

TEST_CASE("bad input: query rows are padded as the kernel's tiling requires", "[sim][bad_input]") {
  const schedules::PagedAttentionTiling tiling;
  CHECK(padded_query_rows(tiling, 0) == 128);
  CHECK(padded_query_rows(tiling, 500) == 512);
  // Above free_tile (512) the new tokens' tile is cut in free_tile pieces: 513 rows need 1024.
  CHECK(padded_query_rows(tiling, 513) == 1024);
  CHECK(padded_query_rows(tiling, 4097) == 6144);
  // The default batch plus one prefill token builds (it was padded to 640 and rejected).
  auto requests = default_paged_attention_requests();
  requests.push_back({2, 0});
  schedules::PagedAttentionSchedule schedule;
  const PagedAttentionRun run = paged_attention_run(schedule, requests, 4, 1, 64, DType::bf16, 1);
  CHECK(run.batch.query_len == 1024);
  CHECK_NOTHROW(build_flash_paged_attention(trn1(), run.config));
}

std::string machine_error(const std::string& text) {
  return error_of([&] { parse_machine_json(text, "test.json"); });
}

TEST_CASE("bad input: deeply nested JSON is rejected while parsing", "[sim][bad_input]") {
  json doc = json::parse(machine_preset_json("trn1"));
  doc["parameters"]["partitions"]["value"] = "DEEP";
  std::string text = doc.dump();
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  text.replace(text.find("\"DEEP\""), 6, deep);
  CHECK_THAT(machine_error(text), Contains("test.json: JSON nested more than 64 levels deep"));
  const std::string override_value = std::string(100000, '[') + std::string(100000, ']');
  const std::string message =
      error_of([&] { load_machine("trn1", {"partitions=" + override_value}); });
  CHECK_THAT(message, Contains("nested more than 64 levels deep"));
  CHECK(message.size() < 400);
}

TEST_CASE("bad input: machine JSON values are checked before they are read", "[sim][bad_input]") {
  json doc = json::parse(machine_preset_json("trn1"));
  const std::string tag = doc["sources"].begin().key();
  doc["sources"][tag] = 5;
  CHECK_THAT(machine_error(doc.dump()),
             Contains("key 'sources." + tag + "': expected a string (a reference), got 5"));
  CHECK_THAT(machine_error("5"), Contains("expected a JSON object at the top level, got 5"));
  // Numbers beyond double, in the file and in an override.
  std::string text = json::parse(machine_preset_json("trn1")).dump();
  REQUIRE(text.find("\"tensor_clock_ghz\":{") != std::string::npos);
  const size_t at = text.find("\"value\":", text.find("\"tensor_clock_ghz\":{"));
  text.replace(at, std::string("\"value\":2.8").size(), "\"value\":1e400");
  CHECK_THAT(machine_error(text), Contains("number overflow parsing '1e400'"));
  CHECK_THAT(error_of([] { load_machine("trn1", {"tensor_clock_ghz=1e400"}); }),
             Contains("machine override 'tensor_clock_ghz=1e400'") && Contains("number overflow"));
  const std::string digits(400, '9');
  const std::string message =
      error_of([&] { load_machine("trn1", {"tensor_clock_ghz=" + digits}); });
  CHECK_THAT(message, Contains("number overflow"));
  CHECK(message.size() < 600);
  // A key given twice.
  std::string twice = machine_preset_json("trn1");
  twice.replace(twice.find("\"schema_version\": 1"), 19,
                "\"schema_version\": 1, \"schema_version\": 1");
  CHECK_THAT(machine_error(twice), Contains("key 'schema_version' appears twice in one object"));
  // Long values are cut in messages.
  doc = json::parse(machine_preset_json("trn1"));
  doc["parameters"]["partitions"]["value"] = json::array();
  for (int i = 0; i < 100000; ++i) doc["parameters"]["partitions"]["value"].push_back(i);
  const std::string long_message = machine_error(doc.dump());
  CHECK_THAT(long_message, Contains("key 'partitions': expected an integer, got [0,1,2"));
  CHECK(long_message.size() < 300);
}

TEST_CASE("bad input: a directory or a missing file as machine says so", "[sim][bad_input]") {
  const auto dir = std::filesystem::temp_directory_path();
  CHECK_THAT(error_of([&] { load_machine(dir.string()); }), Contains("is a directory"));
  CHECK_THAT(error_of([] { load_machine("/nonexistent/m.json"); }),
             Contains("neither a preset nor an existing JSON file"));
}

TEST_CASE("bad input: program size is limited before memory runs out", "[sim][bad_input]") {
  const KernelInfo& matmul = kernel_registry().find("matmul");
  const auto build = [&](const KernelParameters& given) {
    return matmul.build(trn1(), resolve_parameters(matmul, given));
  };
  const KernelParameters huge = {
      {"variant", "tiled"}, {"M", "65536"}, {"K", "65536"}, {"N", "65536"}};
  CHECK_THAT(error_of([&] { build(huge); }),
             Contains("more than 1073741824 elements (max_buffer_elements"));
  const ProgramLimits defaults = program_limits();
  ProgramLimits raised = defaults;
  raised.max_buffer_elements = uint64_t{1} << 40;
  raised.max_instructions = 1000;
  set_program_limits(raised);
  const std::string message = error_of([&] { build(huge); });
  set_program_limits(defaults);
  CHECK_THAT(message, Contains("more than 1000 instructions (max_instructions)"));
  CHECK_THAT(error_of([] { set_program_limits({0, 1}); }), Contains("max_instructions"));
  CHECK_NOTHROW(build({{"variant", "tiled"}, {"M", "256"}, {"K", "256"}, {"N", "512"}}));
}

}  // namespace
}  // namespace tilelab::sim
