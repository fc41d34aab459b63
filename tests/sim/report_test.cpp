// Reports: JSON against docs/sim_report.schema.json, idle-time blame, critical path, trace, text.
#include "sim/report.hpp"

#include <set>

#include "sim/kernels/matmul_tutorial.hpp"
#include "sim/kernels/registry.hpp"
#include "test_util.hpp"

using namespace tilelab::sim;
using namespace tilelab::sim::test;
using Catch::Matchers::Contains;
using nlohmann::json;

namespace {

// A small JSON-schema check covering what our schema uses: $ref (to #/$defs), const, enum, type,
// required, properties, additionalProperties (false or a schema) and items.
void validate(const json& value, const json& schema, const json& root, const std::string& path) {
  if (schema.contains("$ref")) {
    const std::string ref = schema["$ref"];
    REQUIRE(ref.rfind("#/$defs/", 0) == 0);
    validate(value, root["$defs"][ref.substr(8)], root, path);
    return;
  }
  INFO("at " << path);
  if (schema.contains("const")) CHECK(value == schema["const"]);
  if (schema.contains("enum")) {
    bool found = false;
    for (const auto& e : schema["enum"]) found |= e == value;
    CHECK(found);
  }
  if (schema.contains("type")) {
    const std::string type = schema["type"];
    if (type == "object") CHECK(value.is_object());
    if (type == "array") CHECK(value.is_array());
    if (type == "string") CHECK(value.is_string());
    if (type == "number") CHECK(value.is_number());
    if (type == "integer") CHECK(value.is_number_integer());
    if (type == "boolean") CHECK(value.is_boolean());
  }
  if (schema.contains("minimum") && value.is_number())
    CHECK(value.get<double>() >= schema["minimum"].get<double>());
  if (value.is_object()) {
    if (schema.contains("required"))
      for (const auto& key : schema["required"]) {
        INFO("required key " << key);
        CHECK(value.contains(key.get<std::string>()));
      }
    for (const auto& [key, child] : value.items()) {
      if (schema.contains("properties") && schema["properties"].contains(key)) {
        validate(child, schema["properties"][key], root, path + "." + key);
      } else if (schema.contains("additionalProperties")) {
        const json& extra = schema["additionalProperties"];
        INFO("unexpected key " << key);
        if (extra.is_boolean())
          CHECK(extra.get<bool>());
        else
          validate(child, extra, root, path + "." + key);
      }
    }
  }
  if (value.is_array() && schema.contains("items"))
    for (size_t i = 0; i < value.size(); ++i)
      validate(value[i], schema["items"], root, path + "[" + std::to_string(i) + "]");
}

// Loads into a single buffer, then a matmul per load: TensorE waits on DMA.
Program dma_bound_program() {
  ProgramBuilder b(trn1(), "dma_bound");
  const Tensor x = b.hbm_tensor("x", {128, 16 * 512}, DType::bf16);
  const Tile stationary = b.sbuf_tile("stationary", 128, 128, DType::bf16);
  b.memset(b.view(stationary), 1.0f);
  const Tile acc = b.psum_tile("acc", 128, 512, DType::fp32);
  const Tile moving = b.sbuf_tile("moving", 128, 512, DType::bf16);
  for (int i = 0; i < 16; ++i) {
    b.dma_copy(b.view(moving), b.hbm_rows(x, 0, 128, i * 512, 512));
    b.matmul(b.view(acc), b.view(stationary), b.view(moving), i > 0);
  }
  const Tile out = b.sbuf_tile("out", 128, 512, DType::fp32);
  b.tensor_copy(b.view(out), b.view(acc));
  const Tile probe = b.sbuf_tile("probe", 128, 128, DType::bf16);
  b.pe_transpose(b.view(b.psum_tile("t", 128, 128, DType::fp32)), b.view(probe));
  return b.finish();
}

}  // namespace

TEST_CASE("report: the paged-attention report follows the schema, DMA kinds included",
          "[sim][report][paged_attention]") {
  const json schema =
      json::parse(read_text(std::string(TILELAB_SOURCE_DIR) + "/docs/sim_report.schema.json"));
  const KernelInfo& kernel = kernel_registry().find("paged-attention");
  const KernelParameters parameters =
      resolve_parameters(kernel, {{"num_heads", "2"}, {"num_kv_heads", "1"}});
  const Program p = kernel.build(trn1(), parameters);
  ReportOptions options;
  options.kernel = kernel.name;
  options.parameters = parameters;
  const json j = report_json(make_report(p, simulate_timing(p), options));
  validate(j, schema, schema, "report");
  REQUIRE(j["dma"]["by_kind"].size() == 2);
  CHECK(j["dma"]["by_kind"][1]["kind"] == "dma_gather");
  CHECK(j["dma"]["by_kind"][1]["engines_used"] == 16);
  CHECK(j["dma"]["by_kind"][1]["average_bytes_per_partition"] == 4096);  // 16 tokens x 128 x bf16
  CHECK(j["dma"]["dma_utilization_percent"].get<double>() > 0);
}

TEST_CASE("report: JSON follows docs/sim_report.schema.json", "[sim][report]") {
  const json schema =
      json::parse(read_text(std::string(TILELAB_SOURCE_DIR) + "/docs/sim_report.schema.json"));
  const Program p = dma_bound_program();
  const TimingResult t = simulate_timing(p);
  ReportOptions options;
  options.kernel = "dma_bound";
  options.parameters = {{"loads", "16"}};
  const json j = report_json(make_report(p, t, options));
  CHECK(j["schema"] == "tilelab.sim_report");
  CHECK(j["schema_version"] == kReportSchemaVersion);
  validate(j, schema, schema, "report");
  CHECK(j["dma"]["dma_transfer_count"] == 16);
  CHECK(j["dma"]["dma_transfer_total_bytes"] == 16 * 128 * 1024);
  CHECK(j["dma"]["dma_transfer_average_bytes"] == Approx(128 * 1024));
  CHECK(j["dma"]["bytes_per_partition_histogram"].size() == 1);
  CHECK(j["dma"]["bytes_per_partition_histogram"][0]["bytes_per_partition_min"] == 1024);
  CHECK(j["dma"]["engines"].size() == 16);
  CHECK(j["tensor"]["transpose_flops"] == Approx(2.0 * 128 * 128 * 128));
  CHECK(j["tensor"]["hardware_flops"] ==
        Approx(16 * 2.0 * 128 * 128 * 512 + 2.0 * 128 * 128 * 128));
  CHECK(j["memory"]["peak_psum_bytes_per_partition"] == 2048 + 512);
  CHECK(j["engines"][0]["name"] == "tensor");
  CHECK(j["engines"][0]["instruction_count"] == 17);
}

TEST_CASE("report: idle time is blamed on what each engine waited for", "[sim][report]") {
  const Program p = dma_bound_program();
  const TimingResult t = simulate_timing(p);
  const Report r = make_report(p, t);
  const EngineSummary& tensor = r.engines[int(Engine::tensor)];
  REQUIRE_FALSE(tensor.idle_blame.empty());
  CHECK(tensor.idle_blame[0].waited_on == "dma");
  CHECK(tensor.idle_blame[0].idle_ns > 0.5 * r.total_time_ns);
  REQUIRE_FALSE(tensor.top_waits.empty());
  CHECK(tensor.top_waits[0].waited_on == "dma_copy -> moving");
  // Blame plus active time accounts for the whole run on every engine.
  for (const auto& e : r.engines) {
    double blamed = 0;
    for (const auto& b : e.idle_blame) blamed += b.idle_ns;
    INFO(e.name);
    CHECK(blamed + e.active_time_ns == Approx(r.total_time_ns).epsilon(1e-6));
  }
  // The sync queue waits for the matmul that reads the single buffer (write after read).
  const EngineSummary& sync = r.engines[int(Engine::sync)];
  REQUIRE_FALSE(sync.idle_blame.empty());
  CHECK(sync.idle_blame[0].waited_on == "tensor");
}

TEST_CASE("report: the critical path telescopes to the total time", "[sim][report]") {
  const Program p = dma_bound_program();
  const TimingResult t = simulate_timing(p);
  const Report r = make_report(p, t);
  double sum = 0;
  for (const auto& [unit, ns] : r.critical_path_ns_by_unit) sum += ns;
  CHECK(sum == Approx(r.total_time_ns));
  CHECK(r.critical_path_ns_by_unit.at("dma") > 0.5 * r.total_time_ns);
  REQUIRE(r.critical_path.size() >= 3);
  CHECK(r.critical_path.front().start_ns == 0);
}

TEST_CASE("report: the fully optimized matmul is TensorE-bound on its critical path",
          "[sim][report]") {
  MatmulTutorialConfig c;
  c.m = 2048;
  c.k = 2048;
  c.n = 2048;
  const Program p = build_matmul_tutorial(trn1(), c);
  const Report r = make_report(p, simulate_timing(p));
  CHECK(r.critical_path_ns_by_unit.at("tensor") > 0.6 * r.total_time_ns);
  CHECK(r.engines[int(Engine::tensor)].active_time_percent > 60);
  CHECK(r.hfu_percent > 60);
}

TEST_CASE("report: Chrome trace has a track per engine and DMA queue with operands",
          "[sim][report]") {
  const Program p = dma_bound_program();
  const TimingResult t = simulate_timing(p, {.record_dma_pieces = true});
  const json trace = json::parse(chrome_trace(p, t));
  REQUIRE(trace.contains("traceEvents"));
  int complete = 0, dma_queue = 0, dma_engine = 0;
  std::set<std::string> thread_names;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") thread_names.insert(e["args"]["name"]);
    if (e["ph"] != "X") continue;
    ++complete;
    CHECK(e["dur"].get<double>() >= 0);
    CHECK(e.contains("args"));
    if (e["pid"] == 2) ++dma_queue;
    if (e["pid"] == 3) ++dma_engine;
  }
  CHECK(thread_names.count("tensor"));
  CHECK(thread_names.count("queue 0"));
  CHECK(thread_names.count("dma engine 15"));
  CHECK(complete == int(p.instructions.size()) + 16 + 16 * 16);
  CHECK(dma_queue == 16);
  CHECK(dma_engine == 16 * 16);
  const json small = json::parse(chrome_trace(p, t, 5));
  CHECK(small["metadata"]["truncated"] == true);
}

TEST_CASE("report: Chrome trace text escapes names and matches the timing", "[sim][report]") {
  // Strings with quotes, backslashes and control characters: a file name from a front end, the
  // program's and machine's names. The text must read back as JSON with the same strings.
  const std::string file = "dir/we\"ird\\name\n\t\x01.py";
  ProgramBuilder b(trn1(), "prog \"x\"\\");
  const uint32_t line = b.add_source({file, 7, "kernel", "y = x", kNone});
  b.set_source(line);
  const Tensor x = b.hbm_tensor("x", {128, 64}, DType::fp32);
  const Tile t0 = b.sbuf_tile("t0", 128, 64, DType::fp32);
  b.dma_copy(b.view(t0), b.hbm_rows(x, 0, 128, 0, 64));
  b.tensor_scalar(b.view(t0), b.view(t0), AluOp::multiply, Scalar::constant(2.0f));
  const Program p = b.finish();
  const TimingResult t = simulate_timing(p, {.record_dma_pieces = true});
  const json trace = json::parse(chrome_trace(p, t));
  CHECK(trace["metadata"]["program"] == p.name);
  CHECK(trace["metadata"]["machine"] == p.machine.name);
  CHECK(trace["metadata"]["truncated"] == false);
  CHECK(trace["displayTimeUnit"] == "ns");
  int slices = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X" || e["pid"] != 1) continue;
    const uint32_t i = e["args"]["instruction"];
    REQUIRE(i < p.instructions.size());
    CHECK(e["args"]["source"] == file + ":7");
    CHECK(e["args"]["operands"] == p.describe(p.instructions[i]));
    CHECK(e["ts"].get<double>() == Approx(t.instructions[i].start_ns / 1e3));
    CHECK(e["dur"].get<double>() ==
          Approx((t.instructions[i].issue_end_ns - t.instructions[i].start_ns) / 1e3));
    ++slices;
  }
  CHECK(slices == int(p.instructions.size()));
}

TEST_CASE("report: Chrome trace escapes a character at any position of a string", "[sim][report]") {
  // Strings are scanned eight bytes at a time: every position within and across those words,
  // and the characters on both sides of the escaped ranges (space, DEL, UTF-8 bytes).
  const Machine machine = trn1();
  for (const std::string_view special :
       {"\"", "\\", "\n", "\x01", "\x1f", " ", "\x7f", "\xc3\xa9"}) {
    for (size_t before = 0; before <= 18; ++before) {
      for (size_t after = 0; before + after <= 18; ++after) {
        const std::string name =
            std::string(before, 'a') + std::string(special) + std::string(after, 'b');
        ProgramBuilder b(machine, name);
        const Program p = b.finish();
        const json trace = json::parse(chrome_trace(p, simulate_timing(p)));
        CHECK(trace["metadata"]["program"].get<std::string>() == name);
      }
    }
  }
}

TEST_CASE("report: text table lists engines, DMA and the critical path", "[sim][report]") {
  const Program p = dma_bound_program();
  const std::string text = report_text(make_report(p, simulate_timing(p)));
  CHECK_THAT(text, Contains("tensor") && Contains("DMA:") && Contains("GB/s") &&
                       Contains("critical path") && Contains("HFU"));
}

TEST_CASE("report: an empty program reports zeros", "[sim][report]") {
  ProgramBuilder b(trn1(), "empty");
  const Program p = b.finish();
  const TimingResult t = simulate_timing(p);
  const Report r = make_report(p, t);
  CHECK(r.total_time_ns == 0);
  CHECK(r.dma_transfer_count == 0);
  CHECK(r.critical_path.empty());
  const json j = report_json(r);
  CHECK(j["engines"].size() == 5);
  CHECK(json::parse(chrome_trace(p, t))["traceEvents"].is_array());
}

TEST_CASE("report: a DMA starting inside an engine's partitions counts every engine it touches",
          "[sim][report]") {
  // trn1: 8 partitions per DMA engine, so partitions [4, 12) are served by engines 0 and 1.
  REQUIRE(trn1().dma_partitions_per_engine == 8);
  ProgramBuilder b(trn1(), "offset_dma");
  const Tensor x = b.hbm_tensor("x", {8, 512}, DType::bf16);
  const Tile t = b.sbuf_tile("t", 128, 512, DType::bf16);
  b.dma_copy(b.view(t, 4, 8, 0, 512), b.hbm_rows(x, 0, 8, 0, 512));
  const Program program = b.finish();
  const Report report = make_report(program, simulate_timing(program));
  REQUIRE(report.dma_by_kind.size() == 1);
  CHECK(report.dma_by_kind[0].engines_used == 2);
}

TEST_CASE("report: dependency-record merges are reported, in JSON and text", "[sim][report]") {
  // One more distinct region of src and dst than the tracker keeps: each list merges once.
  ProgramBuilder b(trn1(), "merges");
  const Tile src = b.sbuf_tile("src", 1, 2048, DType::fp32);
  const Tile dst = b.sbuf_tile("dst", 1, 2048, DType::fp32);
  for (int i = 0; i < static_cast<int>(kMaxAccessRecords) + 1; ++i)
    b.tensor_copy(b.view(dst, 0, 1, i, 1), b.view(src, 0, 1, i, 1));
  const Program program = b.finish();
  const Report report = make_report(program, simulate_timing(program));
  CHECK(report.dependency_region_merges == 2);
  CHECK(report_json(report)["memory"]["dependency_region_merges"] == 2);
  CHECK_THAT(report_text(report), Contains("dependency tracking merged access records 2 times"));
  ProgramBuilder small(trn1(), "no_merges");
  const Tile a = small.sbuf_tile("a", 1, 8, DType::fp32);
  small.tensor_copy(small.view(small.sbuf_tile("c", 1, 8, DType::fp32)), small.view(a));
  const Program few = small.finish();
  const Report clean = make_report(few, simulate_timing(few));
  CHECK(clean.dependency_region_merges == 0);
  CHECK_THAT(report_text(clean), !Contains("dependency tracking merged"));
}
