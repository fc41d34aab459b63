// Golden reports: the main job's numbers and the calibrated matmul pinned, so that any change to
// the timing model shows up as a reviewed diff of tests/sim/golden/*.json rather than silently.
// Regenerate after an intended model change with scripts/update_golden_reports.sh.
#include <cmath>
#include <cstdlib>
#include <fstream>

#include "sim/kernels/registry.hpp"
#include "sim/report.hpp"
#include "test_util.hpp"

using namespace tilelab::sim;
using namespace tilelab::sim::test;
using nlohmann::json;

namespace {

// Relative tolerance for numbers: the model is deterministic, so this only absorbs differences in
// floating-point contraction between compilers and CPUs. Strings, integers' presence, keys and
// array lengths must match exactly.
constexpr double kRelativeTolerance = 1e-9;
constexpr double kAbsoluteTolerance = 1e-9;

struct GoldenCase {
  const char* file;
  const char* kernel;
  const char* machine;
  KernelParameters parameters;
};

const std::vector<GoldenCase>& golden_cases() {
  static const std::vector<GoldenCase> cases = {
      {"paged_attention_default_trn1.json", "paged-attention", "trn1", {}},
      {"paged_attention_default_trn2.json", "paged-attention", "trn2", {}},
      {"matmul_fully_optimized_trn1.json", "matmul", "trn1", {{"variant", "fully_optimized"}}},
      {"matmul_fully_optimized_trn2.json", "matmul", "trn2", {{"variant", "fully_optimized"}}},
  };
  return cases;
}

json report_of(const GoldenCase& c) {
  const KernelInfo& kernel = kernel_registry().find(c.kernel);
  const KernelParameters parameters = resolve_parameters(kernel, c.parameters);
  const Program program = kernel.build(load_machine(c.machine), parameters);
  ReportOptions options;
  options.kernel = kernel.name;
  options.parameters = parameters;
  return report_json(make_report(program, simulate_timing(program), options));
}

// Collects every difference (path: expected vs actual) so one failure shows the whole drift.
void compare(const json& expected, const json& actual, const std::string& path,
             std::vector<std::string>& differences) {
  auto differ = [&](const std::string& what) {
    differences.push_back(path + ": " + what + " (golden " + expected.dump() + ", now " +
                          actual.dump() + ")");
  };
  if (expected.is_number() && actual.is_number()) {
    const double e = expected.get<double>(), a = actual.get<double>();
    const bool close = (std::isnan(e) && std::isnan(a)) || e == a ||
                       std::abs(e - a) <= kAbsoluteTolerance + kRelativeTolerance * std::abs(e);
    if (!close) differ("number differs");
    return;
  }
  if (expected.type() != actual.type()) return differ("type differs");
  if (expected.is_object()) {
    for (const auto& [key, value] : expected.items()) {
      if (!actual.contains(key))
        differences.push_back(path + "." + key + ": missing now");
      else
        compare(value, actual[key], path + "." + key, differences);
    }
    for (const auto& [key, value] : actual.items())
      if (!expected.contains(key)) differences.push_back(path + "." + key + ": new key");
    return;
  }
  if (expected.is_array()) {
    if (expected.size() != actual.size()) return differ("array length differs");
    for (size_t i = 0; i < expected.size(); ++i)
      compare(expected[i], actual[i], path + "[" + std::to_string(i) + "]", differences);
    return;
  }
  if (expected != actual) differ("value differs");
}

}  // namespace

TEST_CASE("golden reports: paged attention and matmul on trn1 and trn2 match tests/sim/golden") {
  const std::string directory = std::string(TILELAB_SOURCE_DIR) + "/tests/sim/golden/";
  const bool update = std::getenv("TILELAB_UPDATE_GOLDEN") != nullptr;
  for (const GoldenCase& c : golden_cases()) {
    const json actual = report_of(c);
    const std::string path = directory + c.file;
    if (update) {
      std::ofstream(path) << actual.dump(1) << "\n";
      continue;
    }
    INFO("golden file " << path << " (regenerate with scripts/update_golden_reports.sh)");
    const std::string text = read_text(path);
    REQUIRE_FALSE(text.empty());
    std::vector<std::string> differences;
    compare(json::parse(text), actual, "$", differences);
    std::string shown;
    for (size_t i = 0; i < differences.size() && i < 20; ++i) shown += differences[i] + "\n";
    INFO(differences.size() << " differences, first ones:\n" << shown);
    CHECK(differences.empty());
  }
}
