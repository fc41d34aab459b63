// Machine JSON loading: presets, sources, validation and overrides.
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "test_util.hpp"

using namespace tilelab::sim;
using namespace tilelab::sim::test;
using Catch::Matchers::Contains;
using nlohmann::json;

namespace {

json preset(const std::string& name) {
  return json::parse(machine_preset_json(name));
}

std::string error_for(const json& doc, std::vector<std::string> overrides = {}) {
  return error_of([&] { parse_machine_json(doc.dump(), "test.json", overrides); });
}

}  // namespace

TEST_CASE("machine: presets carry the documented NeuronCore numbers", "[sim][machine]") {
  const Machine& v2 = trn1();
  CHECK(v2.nc_version == 2);
  CHECK(v2.partitions == 128);
  CHECK(v2.sbuf_bytes_per_partition == 192 * 1024);
  CHECK(v2.psum_bytes_per_partition == 16 * 1024);
  CHECK(v2.psum_banks == 8);
  CHECK(v2.psum_bank_bytes_per_partition == 2048);
  CHECK(v2.tensor_clock_ghz == 2.8);
  CHECK(v2.vector_clock_ghz == 1.12);
  CHECK(v2.scalar_clock_ghz == 1.4);
  CHECK(v2.gpsimd_clock_ghz == 1.4);
  CHECK(v2.dma_engines == 16);
  CHECK(v2.dma_partitions_per_engine == 8);
  CHECK(v2.dma_bytes_per_ns_per_engine == 17);
  CHECK(v2.hbm_bytes_per_ns == 410);
  CHECK(v2.vector_gpsimd_share_sbuf_port);
  CHECK_FALSE(v2.dma_transpose_supported);
  const Machine& v3 = trn2();
  CHECK(v3.nc_version == 3);
  CHECK(v3.sbuf_bytes_per_partition == 224 * 1024);
  CHECK(v3.tensor_clock_ghz == 2.4);
  CHECK(v3.vector_clock_ghz == 0.96);
  CHECK(v3.dma_bytes_per_ns_per_engine == 23);
  CHECK(v3.dma_transpose_supported);
  CHECK_FALSE(v3.vector_scalar_share_psum_port);
  CHECK(machine_preset_names() == std::vector<std::string>{"trn1", "trn2"});
}

TEST_CASE("machine: every parameter names its source", "[sim][machine]") {
  for (const std::string name : {"trn1", "trn2"}) {
    const json doc = preset(name);
    for (const auto& [key, entry] : doc["parameters"].items()) {
      INFO(name << "." << key);
      REQUIRE(entry.contains("source"));
      CHECK(doc["sources"].contains(entry["source"].get<std::string>()));
    }
    const Machine m = load_machine(name);
    CHECK(m.source_of_key.size() == doc["parameters"].size());
  }
}

TEST_CASE("machine: the DMA efficiency curve interpolates the documented points",
          "[sim][machine]") {
  const Machine& m = trn2();
  CHECK(m.dma_efficiency(256) == Approx(0.104));
  CHECK(m.dma_efficiency(2048) == Approx(0.814));
  CHECK(m.dma_efficiency(65536) == Approx(1.0));
  CHECK(m.dma_efficiency(16) == Approx(0.009));  // proportional below the first point
  const double mid = m.dma_efficiency(3000);
  CHECK(mid > 0.814);
  CHECK(mid < 0.966);
}

TEST_CASE("machine: malformed JSON names the file", "[sim][machine]") {
  const std::string message = error_of([] { parse_machine_json("{\"schema\": ", "broken.json"); });
  CHECK_THAT(message, Contains("broken.json") && Contains("malformed JSON"));
}

TEST_CASE("machine: unknown keys are rejected by name", "[sim][machine]") {
  json doc = preset("trn1");
  doc["parameters"]["sbuf_kib"] = {{"value", 1}, {"source", "AR2"}};
  CHECK_THAT(error_for(doc), Contains("unknown key 'parameters.sbuf_kib'"));
  json top = preset("trn1");
  top["clock"] = 1;
  CHECK_THAT(error_for(top), Contains("unknown top-level key 'clock'"));
  json field = preset("trn1");
  field["parameters"]["partitions"]["units"] = "count";
  CHECK_THAT(error_for(field), Contains("'partitions'") && Contains("unknown field 'units'"));
}

TEST_CASE("machine: missing, mistyped and out-of-range keys are named", "[sim][machine]") {
  json missing = preset("trn1");
  missing["parameters"].erase("dma_engines");
  CHECK_THAT(error_for(missing), Contains("missing key 'parameters.dma_engines'"));

  json mistyped = preset("trn1");
  mistyped["parameters"]["partitions"]["value"] = "many";
  CHECK_THAT(error_for(mistyped),
             Contains("key 'partitions'") && Contains("expected an integer") && Contains("many"));

  json fractional = preset("trn1");
  fractional["parameters"]["psum_banks"]["value"] = 7.5;
  CHECK_THAT(error_for(fractional), Contains("key 'psum_banks'") && Contains("integer"));

  json negative = preset("trn1");
  negative["parameters"]["dma_bytes_per_ns_per_engine"]["value"] = -3;
  CHECK_THAT(error_for(negative),
             Contains("key 'dma_bytes_per_ns_per_engine'") && Contains("out of range"));

  json no_source = preset("trn1");
  no_source["parameters"]["partitions"] = {{"value", 128}};
  CHECK_THAT(error_for(no_source), Contains("key 'partitions'") && Contains("\"source\""));

  json bad_source = preset("trn1");
  bad_source["parameters"]["partitions"]["source"] = "folklore";
  CHECK_THAT(error_for(bad_source),
             Contains("key 'partitions'") && Contains("'folklore' is not defined"));

  json bad_schema = preset("trn1");
  bad_schema["schema_version"] = 7;
  CHECK_THAT(error_for(bad_schema), Contains("schema_version"));
}

TEST_CASE("machine: inconsistent numbers are rejected naming the key", "[sim][machine]") {
  json psum = preset("trn1");
  psum["parameters"]["psum_banks"]["value"] = 4;
  CHECK_THAT(error_for(psum), Contains("psum_bytes_per_partition") && Contains("psum_banks"));

  json dma = preset("trn1");
  dma["parameters"]["dma_partitions_per_engine"]["value"] = 4;
  CHECK_THAT(error_for(dma), Contains("dma_partitions_per_engine"));

  json peak = preset("trn1");
  peak["parameters"]["tensor_peak_bf16_tflops"]["value"] = 200;
  CHECK_THAT(error_for(peak), Contains("tensor_peak_bf16_tflops") && Contains("tensor_clock_ghz"));

  json curve = preset("trn1");
  curve["parameters"]["dma_efficiency_curve"]["value"] = {{64, 0.1}, {32, 0.2}};
  CHECK_THAT(error_for(curve), Contains("dma_efficiency_curve") && Contains("increase"));

  json curve_range = preset("trn1");
  curve_range["parameters"]["dma_efficiency_curve"]["value"] = {{64, 1.5}};
  CHECK_THAT(error_for(curve_range), Contains("dma_efficiency_curve") && Contains("(0, 1]"));
}

TEST_CASE("machine: key=value overrides apply and are checked", "[sim][machine]") {
  const Machine m =
      load_machine("trn1", {"dma_bytes_per_ns_per_engine=20", "dma_start_latency_ns=0"});
  CHECK(m.dma_bytes_per_ns_per_engine == 20);
  CHECK(m.dma_start_latency_ns == 0);
  CHECK(m.source_of_key.at("dma_bytes_per_ns_per_engine") == "override");
  CHECK_THAT(error_of([] { load_machine("trn1", {"sbuf_kib=3"}); }),
             Contains("unknown key 'sbuf_kib'"));
  CHECK_THAT(error_of([] { load_machine("trn1", {"partitions"}); }), Contains("key=value"));
  CHECK_THAT(error_of([] { load_machine("trn1", {"partitions=lots"}); }), Contains("lots"));
  CHECK_THAT(error_of([] { load_machine("trn1", {"partitions=0"}); }),
             Contains("key 'partitions'") && Contains("out of range"));
}

TEST_CASE("machine: a user JSON file loads, a missing one is a clear error", "[sim][machine]") {
  const auto path = std::filesystem::temp_directory_path() / "tilelab_machine_test.json";
  json doc = preset("trn2");
  doc["name"] = "my_machine";
  doc["parameters"]["dma_bytes_per_ns_per_engine"]["value"] = 30;
  {
    std::ofstream out(path);
    out << doc.dump(2);
  }
  const Machine m = load_machine(path.string());
  CHECK(m.name == "my_machine");
  CHECK(m.dma_bytes_per_ns_per_engine == 30);
  std::filesystem::remove(path);
  CHECK_THAT(error_of([] { load_machine("/nonexistent/trn9.json"); }),
             Contains("/nonexistent/trn9.json") && Contains("presets: trn1 trn2"));
}

TEST_CASE("machine: the repository JSON files equal the embedded presets", "[sim][machine]") {
  for (const std::string name : {"trn1", "trn2"}) {
    const std::string path =
        std::string(TILELAB_SOURCE_DIR) + "/sim/machines/" + name + ".json";
    CHECK(json::parse(read_text(path)) == preset(name));
  }
}

namespace {
// Builds a bf16 -> bf16 PE transpose on `m`; throws when the machine does not allow it.
void bf16_pe_transpose(const Machine& m) {
  ProgramBuilder b(m, "t");
  const Tile in = b.sbuf_tile("in", 128, 64, DType::bf16);
  const Tile out = b.psum_tile("out", 64, 128, DType::bf16);
  b.pe_transpose(b.view(out), b.view(in));
}
}  // namespace

TEST_CASE("machine: the 16-bit PE-transpose output is a capability key", "[sim][machine]") {
  CHECK_FALSE(trn1().pe_transpose_16bit_output_supported);
  CHECK(trn2().pe_transpose_16bit_output_supported);
  CHECK_NOTHROW(bf16_pe_transpose(trn2()));
  CHECK_THAT(error_of([] { bf16_pe_transpose(trn1()); }),
             Contains("pe_transpose: dst dtype bf16 not allowed on machine 'trn1'") &&
                 Contains("pe_transpose_16bit_output_supported"));

  // The key decides, not the NeuronCore version.
  json v2_with = preset("trn1");
  v2_with["parameters"]["pe_transpose_16bit_output_supported"]["value"] = true;
  const Machine enabled = parse_machine_json(v2_with.dump(), "v2_with.json");
  CHECK(enabled.nc_version == 2);
  CHECK_NOTHROW(bf16_pe_transpose(enabled));
  const Machine disabled = load_machine("trn2", {"pe_transpose_16bit_output_supported=false"});
  CHECK(disabled.nc_version == 3);
  CHECK_THAT(error_of([&] { bf16_pe_transpose(disabled); }),
             Contains("pe_transpose_16bit_output_supported"));

  // A capability key left out of a machine file means the capability is off.
  json without = preset("trn2");
  without["parameters"].erase("pe_transpose_16bit_output_supported");
  const Machine absent = parse_machine_json(without.dump(), "without.json");
  CHECK_FALSE(absent.pe_transpose_16bit_output_supported);
  CHECK_THAT(absent.source_of_key.at("pe_transpose_16bit_output_supported"), Contains("absent"));
  CHECK_THAT(error_of([&] { bf16_pe_transpose(absent); }),
             Contains("pe_transpose_16bit_output_supported"));

  json bad = preset("trn2");
  bad["parameters"]["pe_transpose_16bit_output_supported"]["value"] = "yes";
  CHECK_THAT(error_for(bad), Contains("key 'pe_transpose_16bit_output_supported'") &&
                                 Contains("expected a boolean") && Contains("\"yes\""));
  CHECK_THAT(error_of([] { load_machine("trn2", {"pe_transpose_16bit_output_supported=2"}); }),
             Contains("key 'pe_transpose_16bit_output_supported'") &&
                 Contains("expected a boolean") && Contains("got 2"));
}
