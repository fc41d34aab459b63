// Kernel registry: tile programs the CLI and tests can build by name, each with documented
// parameters. A kernel defines register_<kernel>(KernelRegistry&) and is listed once in
// register_all_kernels() (registry.cpp); its sources are listed in sim/CMakeLists.txt.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "sim/machine.hpp"
#include "sim/program.hpp"

namespace tilelab::sim {

struct KernelParameter {
  std::string name;
  std::string default_value;
  std::string help;
};

// Parameter name -> value, as given on the command line (key=value).
using KernelParameters = std::map<std::string, std::string>;

struct KernelInfo {
  std::string name;
  std::string description;
  std::string default_machine;
  std::vector<KernelParameter> parameters;
  // Builds the program for `machine`; `parameters` holds every declared parameter (defaults
  // filled in). Throws tilelab::Error on invalid values.
  std::function<Program(const Machine& machine, const KernelParameters& parameters)> build;
  // Optional: HBM inputs whose values matter for a functional run (indices, masks), by tensor
  // name; the CLI fills the other inputs with random numbers.
  std::function<std::map<std::string, std::vector<float>>(const KernelParameters& parameters)>
      functional_inputs;
  // The main-job kernels: without --json/--trace/--html the CLI writes report.json, trace.json
  // and report.html (into --out-dir, default the current directory).
  bool writes_reports_by_default = false;
  // Parameter overrides (KEY=VALUE) simulated beside the run and compared in the HTML and text
  // summary unless --no-compare; --compare adds more.
  std::vector<std::string> default_comparisons;
};

class KernelRegistry {
 public:
  void add(KernelInfo kernel);
  // Throws tilelab::Error listing the known kernels when `name` is not registered.
  const KernelInfo& find(const std::string& name) const;
  const std::vector<KernelInfo>& kernels() const { return kernels_; }

 private:
  std::vector<KernelInfo> kernels_;
};

// The registration of each kernel, defined beside its parameter parsing.
void register_paged_attention(KernelRegistry& registry);
void register_matmul_tutorial(KernelRegistry& registry);
void register_flash_prefill(KernelRegistry& registry);

// All kernels of sim/kernels/ (built on first use).
const KernelRegistry& kernel_registry();

// Fills defaults and rejects parameters the kernel does not declare.
KernelParameters resolve_parameters(const KernelInfo& kernel, const KernelParameters& given);

// `text` as a whole decimal integer (an optional '-', then digits; no spaces, '+', hex or
// exponent) that fits int64; false otherwise.
bool parse_integer(const std::string& text, int64_t& value);

// Typed access for kernel builders; errors name the parameter and the value.
int64_t parameter_int(const KernelParameters& parameters, const std::string& name,
                      int64_t min_value = INT64_MIN, int64_t max_value = INT64_MAX);
std::string parameter_choice(const KernelParameters& parameters, const std::string& name,
                             const std::vector<std::string>& allowed);
DType parameter_dtype(const KernelParameters& parameters, const std::string& name);

}  // namespace tilelab::sim
