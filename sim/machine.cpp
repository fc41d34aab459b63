// Machine JSON loading and validation.
#include "machine.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>
#include <tilelab/error.hpp>

#include "common/json_input.hpp"
#include "machine_presets.hpp"

namespace tilelab::sim {
namespace {

using nlohmann::json;

enum class Kind { integer, number, boolean, curve };

// One accepted parameter: its kind, allowed range and where it lands in Machine.
struct KeySpec {
  const char* key;
  Kind kind;
  double min;
  double max;
  std::function<void(Machine&, const json&)> assign;
  std::function<json(const Machine&)> read;
  // Capability keys may be left out of a machine file: the feature is then unsupported.
  bool capability = false;
};

template <typename T>
KeySpec integer_key(const char* key, T Machine::* field, double min, double max) {
  return {key,
          Kind::integer,
          min,
          max,
          [field](Machine& m, const json& v) { m.*field = static_cast<T>(v.get<int64_t>()); },
          [field](const Machine& m) { return json(int64_t(m.*field)); }};
}
KeySpec number_key(const char* key, double Machine::* field, double min, double max) {
  return {key,
          Kind::number,
          min,
          max,
          [field](Machine& m, const json& v) { m.*field = v.get<double>(); },
          [field](const Machine& m) { return json(m.*field); }};
}
KeySpec bool_key(const char* key, bool Machine::* field) {
  return {key,
          Kind::boolean,
          0,
          1,
          [field](Machine& m, const json& v) { m.*field = v.get<bool>(); },
          [field](const Machine& m) { return json(m.*field); }};
}
KeySpec capability_key(const char* key, bool Machine::* field) {
  KeySpec spec = bool_key(key, field);
  spec.capability = true;
  return spec;
}

const std::vector<KeySpec>& key_specs() {
  static const std::vector<KeySpec> specs = {
      integer_key("nc_version", &Machine::nc_version, 2, 3),
      integer_key("partitions", &Machine::partitions, 1, 128),
      integer_key("sbuf_bytes_per_partition", &Machine::sbuf_bytes_per_partition, 1, 1 << 30),
      integer_key("psum_bytes_per_partition", &Machine::psum_bytes_per_partition, 1, 1 << 30),
      integer_key("psum_banks", &Machine::psum_banks, 1, 64),
      integer_key("psum_bank_bytes_per_partition", &Machine::psum_bank_bytes_per_partition, 4,
                  1 << 30),
      number_key("tensor_clock_ghz", &Machine::tensor_clock_ghz, 0.01, 100),
      number_key("vector_clock_ghz", &Machine::vector_clock_ghz, 0.01, 100),
      number_key("scalar_clock_ghz", &Machine::scalar_clock_ghz, 0.01, 100),
      number_key("gpsimd_clock_ghz", &Machine::gpsimd_clock_ghz, 0.01, 100),
      number_key("sync_clock_ghz", &Machine::sync_clock_ghz, 0.01, 100),
      number_key("tensor_peak_bf16_tflops", &Machine::tensor_peak_bf16_tflops, 0.001, 1e6),
      integer_key("matmul_max_contraction", &Machine::matmul_max_contraction, 1, 1024),
      integer_key("matmul_max_stationary_free", &Machine::matmul_max_stationary_free, 1, 1024),
      integer_key("matmul_max_moving_free", &Machine::matmul_max_moving_free, 1, 1 << 16),
      integer_key("matmul_stationary_floor_cycles", &Machine::matmul_stationary_floor_cycles, 0,
                  1 << 20),
      integer_key("matmul_fp32_cost_multiplier", &Machine::matmul_fp32_cost_multiplier, 1, 64),
      integer_key("transpose_free_floor_cycles", &Machine::transpose_free_floor_cycles, 0, 1 << 20),
      integer_key("engine_max_free_elements_sbuf", &Machine::engine_max_free_elements_sbuf, 1,
                  1 << 30),
      integer_key("engine_max_free_elements_psum", &Machine::engine_max_free_elements_psum, 1,
                  1 << 30),
      integer_key("bn_stats_max_free_elements", &Machine::bn_stats_max_free_elements, 1, 1 << 20),
      capability_key("pe_transpose_16bit_output_supported",
                     &Machine::pe_transpose_16bit_output_supported),
      integer_key("min_ii_cycles", &Machine::min_ii_cycles, 0, 1 << 20),
      integer_key("activation_reduce_extra_cycles", &Machine::activation_reduce_extra_cycles, 0,
                  1 << 20),
      integer_key("gpsimd_start_overhead_cycles", &Machine::gpsimd_start_overhead_cycles, 0,
                  1 << 20),
      integer_key("stride_penalty_threshold_bytes", &Machine::stride_penalty_threshold_bytes, 1,
                  1 << 20),
      number_key("stride_penalty_factor", &Machine::stride_penalty_factor, 1, 64),
      integer_key("engine_access_overhead_cycles", &Machine::engine_access_overhead_cycles, 0,
                  1 << 20),
      bool_key("engine_access_overhead_applied", &Machine::engine_access_overhead_applied),
      number_key("vector_16bit_copy_speedup_contiguous",
                 &Machine::vector_16bit_copy_speedup_contiguous, 1, 64),
      number_key("vector_16bit_copy_speedup_other", &Machine::vector_16bit_copy_speedup_other, 1,
                 64),
      number_key("vector_tensor_tensor_16bit_sbuf_speedup",
                 &Machine::vector_tensor_tensor_16bit_sbuf_speedup, 1, 64),
      bool_key("vector_gpsimd_share_sbuf_port", &Machine::vector_gpsimd_share_sbuf_port),
      bool_key("vector_scalar_share_psum_port", &Machine::vector_scalar_share_psum_port),
      integer_key("semaphore_wait_cycles", &Machine::semaphore_wait_cycles, 0, 1 << 20),
      integer_key("dma_engines", &Machine::dma_engines, 1, 128),
      integer_key("dma_queues_per_engine", &Machine::dma_queues_per_engine, 1, 256),
      integer_key("dma_partitions_per_engine", &Machine::dma_partitions_per_engine, 1, 128),
      number_key("dma_bytes_per_ns_per_engine", &Machine::dma_bytes_per_ns_per_engine, 1e-3, 1e6),
      number_key("dma_fixed_cost_ns_per_piece", &Machine::dma_fixed_cost_ns_per_piece, 0, 1e7),
      number_key("dma_descriptor_ns", &Machine::dma_descriptor_ns, 0, 1e7),
      number_key("dma_start_latency_ns", &Machine::dma_start_latency_ns, 0, 1e9),
      integer_key("dma_trigger_cycles", &Machine::dma_trigger_cycles, 0, 1 << 20),
      {"dma_efficiency_curve", Kind::curve, 0, 1,
       [](Machine& m, const json& v) {
         m.dma_efficiency_curve.clear();
         for (const auto& point : v)
           m.dma_efficiency_curve.push_back({point[0].get<double>(), point[1].get<double>()});
       },
       [](const Machine& m) {
         json curve = json::array();
         for (const auto& point : m.dma_efficiency_curve)
           curve.push_back({point.bytes_per_partition, point.efficiency});
         return curve;
       }},
      bool_key("dma_transpose_supported", &Machine::dma_transpose_supported),
      number_key("dma_transpose_efficiency_hbm_to_sbuf",
                 &Machine::dma_transpose_efficiency_hbm_to_sbuf, 0.001, 1),
      number_key("dma_transpose_efficiency_sbuf_to_sbuf",
                 &Machine::dma_transpose_efficiency_sbuf_to_sbuf, 0.001, 1),
      integer_key("swdge_descriptor_fixed_cycles", &Machine::swdge_descriptor_fixed_cycles, 0,
                  1 << 20),
      number_key("swdge_descriptor_cycles_per_partition",
                 &Machine::swdge_descriptor_cycles_per_partition, 0, 1 << 20),
      number_key("hbm_bytes_per_ns", &Machine::hbm_bytes_per_ns, 1e-3, 1e7),
  };
  return specs;
}

const KeySpec* find_spec(const std::string& key) {
  for (const auto& spec : key_specs())
    if (key == spec.key) return &spec;
  return nullptr;
}

std::string kind_name(Kind kind) {
  switch (kind) {
    case Kind::integer:
      return "an integer";
    case Kind::number:
      return "a number";
    case Kind::boolean:
      return "a boolean";
    case Kind::curve:
      return "a list of [bytes_per_partition, efficiency] pairs";
  }
  return "?";
}

// Checks type and range of one parameter value; throws naming the key.
void check_value(const std::string& where, const KeySpec& spec, const json& value) {
  const std::string prefix = where + ": key '" + spec.key + "': ";
  switch (spec.kind) {
    case Kind::integer:
    case Kind::number: {
      const bool ok_type = spec.kind == Kind::integer
                               ? value.is_number_integer() ||
                                     (value.is_number_float() &&
                                      std::floor(value.get<double>()) == value.get<double>())
                               : value.is_number();
      TILELAB_REQUIRE(ok_type) << prefix << "expected " << kind_name(spec.kind) << ", got "
                               << json_excerpt(value);
      const double v = value.get<double>();
      TILELAB_REQUIRE(v >= spec.min && v <= spec.max)
          << prefix << "value " << json_excerpt(value) << " is out of range; allowed [" << spec.min
          << ", " << spec.max << "]";
      break;
    }
    case Kind::boolean:
      TILELAB_REQUIRE(value.is_boolean())
          << prefix << "expected a boolean, got " << json_excerpt(value);
      break;
    case Kind::curve: {
      TILELAB_REQUIRE(value.is_array() && !value.empty())
          << prefix << "expected " << kind_name(spec.kind) << ", got " << json_excerpt(value);
      double previous_bytes = 0;
      for (const auto& point : value) {
        TILELAB_REQUIRE(point.is_array() && point.size() == 2 && point[0].is_number() &&
                        point[1].is_number())
            << prefix << "expected [bytes_per_partition, efficiency] pairs, got "
            << json_excerpt(point);
        const double bytes = point[0].get<double>();
        const double eff = point[1].get<double>();
        TILELAB_REQUIRE(bytes > previous_bytes)
            << prefix << "bytes_per_partition must increase strictly, got " << bytes << " after "
            << previous_bytes;
        TILELAB_REQUIRE(eff > 0 && eff <= 1) << prefix << "efficiency must be in (0, 1], got "
                                             << eff << " at " << bytes << " bytes per partition";
        previous_bytes = bytes;
      }
      break;
    }
  }
}

// Cross-key consistency: numbers that must agree with each other.
void check_consistency(const std::string& where, const Machine& m) {
  TILELAB_REQUIRE(m.psum_banks * m.psum_bank_bytes_per_partition == m.psum_bytes_per_partition)
      << where << ": key 'psum_bytes_per_partition': " << m.psum_bytes_per_partition
      << " must equal psum_banks x psum_bank_bytes_per_partition = " << m.psum_banks << " x "
      << m.psum_bank_bytes_per_partition;
  TILELAB_REQUIRE(m.dma_engines * m.dma_partitions_per_engine == m.partitions)
      << where << ": key 'dma_partitions_per_engine': " << m.dma_partitions_per_engine
      << " x dma_engines " << m.dma_engines << " must equal partitions " << m.partitions;
  TILELAB_REQUIRE(m.matmul_max_contraction <= m.partitions)
      << where << ": key 'matmul_max_contraction': " << m.matmul_max_contraction
      << " exceeds partitions " << m.partitions;
  TILELAB_REQUIRE(m.matmul_max_stationary_free <= m.partitions)
      << where << ": key 'matmul_max_stationary_free': " << m.matmul_max_stationary_free
      << " exceeds partitions " << m.partitions << " (the stationary free axis becomes the "
      << "output partition axis)";
  TILELAB_REQUIRE(m.matmul_max_moving_free * 4 <= m.psum_bank_bytes_per_partition)
      << where << ": key 'matmul_max_moving_free': " << m.matmul_max_moving_free
      << " fp32 outputs do not fit one PSUM bank of " << m.psum_bank_bytes_per_partition << " B";
  const double derived_tflops = m.tensor_peak_flops_per_ns() / 1000.0;
  TILELAB_REQUIRE(std::abs(derived_tflops - m.tensor_peak_bf16_tflops) <=
                  0.05 * m.tensor_peak_bf16_tflops)
      << where << ": key 'tensor_peak_bf16_tflops': " << m.tensor_peak_bf16_tflops
      << " disagrees with partitions^2 x 2 x tensor_clock_ghz = " << derived_tflops
      << " by more than 5%";
  TILELAB_REQUIRE(m.dma_efficiency_curve.back().efficiency >= 0.5)
      << where << ": key 'dma_efficiency_curve': the last point should be near full efficiency, "
      << "got " << m.dma_efficiency_curve.back().efficiency;
}

}  // namespace

double Machine::dma_efficiency(double bytes_per_partition) const {
  const auto& curve = dma_efficiency_curve;
  if (curve.empty()) return 1.0;
  if (bytes_per_partition <= curve.front().bytes_per_partition)
    return std::max(
        1e-6, curve.front().efficiency * bytes_per_partition / curve.front().bytes_per_partition);
  if (bytes_per_partition >= curve.back().bytes_per_partition) return curve.back().efficiency;
  for (size_t i = 1; i < curve.size(); ++i) {
    if (bytes_per_partition <= curve[i].bytes_per_partition) {
      const double x0 = std::log2(curve[i - 1].bytes_per_partition);
      const double x1 = std::log2(curve[i].bytes_per_partition);
      const double t = (std::log2(bytes_per_partition) - x0) / (x1 - x0);
      return curve[i - 1].efficiency + t * (curve[i].efficiency - curve[i - 1].efficiency);
    }
  }
  return curve.back().efficiency;
}

double Machine::tensor_peak_flops_per_ns() const {
  return double(partitions) * partitions * 2.0 * tensor_clock_ghz;
}

Machine parse_machine_json(const std::string& text, const std::string& origin,
                           const std::vector<std::string>& overrides) {
  const json doc = parse_user_json(text, origin);
  TILELAB_REQUIRE(doc.is_object())
      << origin << ": expected a JSON object at the top level, got " << json_excerpt(doc);
  static const std::set<std::string> top_keys = {"schema",      "schema_version", "name",
                                                 "description", "sources",        "parameters"};
  for (const auto& [key, value] : doc.items()) {
    TILELAB_REQUIRE(top_keys.count(key))
        << origin << ": unknown top-level key '" << key
        << "'; allowed: schema, schema_version, name, description, sources, parameters";
  }
  TILELAB_REQUIRE(doc.contains("schema") && doc["schema"] == "tilelab.machine")
      << origin << ": key 'schema': expected \"tilelab.machine\", got "
      << (doc.contains("schema") ? json_excerpt(doc["schema"]) : std::string("nothing"));
  TILELAB_REQUIRE(doc.contains("schema_version") && doc["schema_version"].is_number_integer() &&
                  doc["schema_version"] == 1)
      << origin << ": key 'schema_version': expected 1, got "
      << (doc.contains("schema_version") ? json_excerpt(doc["schema_version"])
                                         : std::string("nothing"));
  TILELAB_REQUIRE(doc.contains("name") && doc["name"].is_string())
      << origin << ": key 'name': expected a string";
  TILELAB_REQUIRE(doc.contains("sources") && doc["sources"].is_object())
      << origin << ": key 'sources': expected an object mapping source tags to references";
  TILELAB_REQUIRE(doc.contains("parameters") && doc["parameters"].is_object())
      << origin << ": key 'parameters': expected an object of {\"value\", \"source\"} entries";

  Machine machine;
  machine.name = doc["name"].get<std::string>();
  if (doc.contains("description")) {
    TILELAB_REQUIRE(doc["description"].is_string())
        << origin << ": key 'description': expected a string";
    machine.description = doc["description"].get<std::string>();
  }
  const json& sources = doc["sources"];
  for (const auto& [tag, reference] : sources.items())
    TILELAB_REQUIRE(reference.is_string())
        << origin << ": key 'sources." << tag << "': expected a string (a reference), got "
        << json_excerpt(reference);

  // Collect values (file, then overrides) before assigning so that overrides may fill gaps.
  std::map<std::string, json> values;
  for (const auto& [key, entry] : doc["parameters"].items()) {
    const KeySpec* spec = find_spec(key);
    TILELAB_REQUIRE(spec) << origin << ": unknown key 'parameters." << key
                          << "' (not a machine parameter; check the spelling)";
    TILELAB_REQUIRE(entry.is_object() && entry.contains("value") && entry.contains("source"))
        << origin << ": key '" << key
        << "': expected an object {\"value\": ..., \"source\": ...}, got " << json_excerpt(entry);
    for (const auto& [field, unused] : entry.items()) {
      (void)unused;
      TILELAB_REQUIRE(field == "value" || field == "source" || field == "note")
          << origin << ": key '" << key << "': unknown field '" << field
          << "'; allowed: value, source, note";
    }
    TILELAB_REQUIRE(entry["source"].is_string())
        << origin << ": key '" << key << "': 'source' must be a string naming a 'sources' tag";
    const std::string tag = entry["source"].get<std::string>();
    TILELAB_REQUIRE(sources.contains(tag))
        << origin << ": key '" << key << "': source '" << tag << "' is not defined in 'sources'";
    values[key] = entry["value"];
    machine.source_of_key[key] = tag + ": " + sources[tag].get<std::string>();
  }
  for (const std::string& assignment : overrides) {
    const auto eq = assignment.find('=');
    TILELAB_REQUIRE(eq != std::string::npos && eq > 0)
        << "machine override '" << assignment << "': expected key=value";
    const std::string key = assignment.substr(0, eq);
    TILELAB_REQUIRE(find_spec(key))
        << "machine override '" << assignment << "': unknown key '" << key << "'";
    json value;
    try {
      const std::string shown =
          assignment.size() > 100 ? assignment.substr(0, 100) + "..." : assignment;
      value = parse_user_json(assignment.substr(eq + 1), "machine override '" + shown + "'");
    } catch (const Error& e) {
      throw Error(std::string(e.what()) + "; expected a JSON number, boolean or array");
    }
    values[key] = value;
    machine.source_of_key[key] = "override";
  }
  for (const auto& spec : key_specs()) {
    const auto it = values.find(spec.key);
    if (it == values.end() && spec.capability) {
      spec.assign(machine, json(false));
      machine.source_of_key[spec.key] = "absent from the machine file: capability off";
      continue;
    }
    TILELAB_REQUIRE(it != values.end()) << origin << ": missing key 'parameters." << spec.key
                                        << "' (" << kind_name(spec.kind) << ")";
    check_value(origin, spec, it->second);
    spec.assign(machine, it->second);
  }
  check_consistency(origin, machine);
  return machine;
}

const std::vector<MachineField>& machine_fields() {
  static const std::vector<MachineField> fields = [] {
    std::vector<MachineField> out;
    for (const auto& spec : key_specs()) {
      std::string kind = kind_name(spec.kind);
      kind = kind.substr(kind.find(' ') + 1);  // "an integer" -> "integer"
      if (spec.kind == Kind::curve) kind = "curve";
      out.push_back({spec.key, kind, spec.min, spec.max});
    }
    return out;
  }();
  return fields;
}

const std::vector<std::string>& machine_build_limits() {
  static const std::vector<std::string> limits = {
      "nc_version",
      "partitions",
      "sbuf_bytes_per_partition",
      "psum_bytes_per_partition",
      "psum_banks",
      "psum_bank_bytes_per_partition",
      "matmul_max_contraction",
      "matmul_max_stationary_free",
      "matmul_max_moving_free",
      "engine_max_free_elements_sbuf",
      "engine_max_free_elements_psum",
      "bn_stats_max_free_elements",
      "pe_transpose_16bit_output_supported",
      "dma_transpose_supported",
      "dma_engines",
      "dma_queues_per_engine",
      "dma_partitions_per_engine",
  };
  return limits;
}

void require_same_build_limits(const Machine& built_for, const Machine& timing) {
  for (const std::string& key : machine_build_limits()) {
    const KeySpec* spec = find_spec(key);
    TILELAB_CHECK(spec) << "build limit '" << key << "' is not a machine key";
    const json built = spec->read(built_for), given = spec->read(timing);
    TILELAB_REQUIRE(built == given)
        << "machine: '" << key << "' is a build-time limit; the program was built for "
        << json_excerpt(built) << ", got " << json_excerpt(given)
        << " (rebuild the program to change it; timing parameters may differ)";
  }
}

nlohmann::json machine_field_value(const Machine& machine, const std::string& name) {
  const KeySpec* spec = find_spec(name);
  TILELAB_REQUIRE(spec) << "machine field '" << name << "': unknown";
  return spec->read(machine);
}

void set_machine_field(Machine& machine, const std::string& name, const nlohmann::json& value) {
  const KeySpec* spec = find_spec(name);
  TILELAB_REQUIRE(spec) << "machine field '" << name << "': unknown";
  const std::string where = "machine '" + machine.name + "'";
  check_value(where, *spec, value);
  Machine changed = machine;
  spec->assign(changed, value);
  check_consistency(where, changed);
  changed.source_of_key[name] = "override";
  machine = std::move(changed);
}

std::vector<std::string> machine_preset_names() {
  std::vector<std::string> names;
  for (const auto& preset : detail::machine_presets()) names.push_back(preset.name);
  return names;
}

std::string machine_preset_json(const std::string& name) {
  for (const auto& preset : detail::machine_presets())
    if (name == preset.name) return preset.json;
  std::string known;
  for (const auto& preset : detail::machine_presets()) known += std::string(" ") + preset.name;
  throw Error("machine '" + name + "': no such preset; known:" + known);
}

Machine load_machine(const std::string& preset_or_path, const std::vector<std::string>& overrides) {
  for (const auto& preset : detail::machine_presets())
    if (preset_or_path == preset.name)
      return parse_machine_json(preset.json, std::string(preset.name) + ".json (preset)",
                                overrides);
  std::string known;
  for (const auto& preset : detail::machine_presets()) known += std::string(" ") + preset.name;
  std::error_code error;
  const auto status = std::filesystem::status(preset_or_path, error);
  if (!std::filesystem::exists(status))
    throw Error("machine '" + preset_or_path +
                "': neither a preset nor an existing JSON file; presets:" + known);
  TILELAB_REQUIRE(!std::filesystem::is_directory(status))
      << "machine '" << preset_or_path << "': is a directory, expected a preset or a JSON file; "
      << "presets:" << known;
  std::ifstream file(preset_or_path, std::ios::binary);
  std::stringstream buffer;
  buffer << file.rdbuf();
  TILELAB_REQUIRE(file.is_open() && !file.bad())
      << "machine '" << preset_or_path << "': cannot read the file: " << std::strerror(errno);
  return parse_machine_json(buffer.str(), preset_or_path, overrides);
}

}  // namespace tilelab::sim
