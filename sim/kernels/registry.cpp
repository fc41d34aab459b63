// Kernel registry.
#include "sim/kernels/registry.hpp"

#include <charconv>

#include <tilelab/error.hpp>

namespace tilelab::sim {

namespace {

// Every kernel, in the order `tilelab sim --help` lists them.
void register_all_kernels(KernelRegistry& registry) {
  register_paged_attention(registry);
  register_matmul_tutorial(registry);
  register_flash_prefill(registry);
}

}  // namespace

void KernelRegistry::add(KernelInfo kernel) {
  for (const auto& k : kernels_)
    TILELAB_CHECK(k.name != kernel.name) << "kernel '" << kernel.name << "' registered twice";
  kernels_.push_back(std::move(kernel));
}

const KernelInfo& KernelRegistry::find(const std::string& name) const {
  for (const auto& k : kernels_)
    if (k.name == name) return k;
  std::string known;
  for (const auto& k : kernels_) known += " " + k.name;
  throw Error("kernel '" + name + "': unknown; known kernels:" + known);
}

const KernelRegistry& kernel_registry() {
  static const KernelRegistry registry = [] {
    KernelRegistry r;
    register_all_kernels(r);
    return r;
  }();
  return registry;
}

KernelParameters resolve_parameters(const KernelInfo& kernel, const KernelParameters& given) {
  KernelParameters resolved;
  for (const auto& p : kernel.parameters) resolved[p.name] = p.default_value;
  for (const auto& [name, value] : given) {
    TILELAB_REQUIRE(resolved.count(name))
        << "kernel '" << kernel.name << "': unknown parameter '" << name << "'; see --help";
    resolved[name] = value;
  }
  return resolved;
}

bool parse_integer(const std::string& text, int64_t& value) {
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  return !text.empty() && error == std::errc() && stop == end;
}

int64_t parameter_int(const KernelParameters& parameters, const std::string& name,
                      int64_t min_value, int64_t max_value) {
  const auto it = parameters.find(name);
  TILELAB_REQUIRE(it != parameters.end()) << "parameter '" << name << "' is missing";
  int64_t value = 0;
  TILELAB_REQUIRE(parse_integer(it->second, value))
      << "parameter '" << name << "': expected a whole number in [" << min_value << ", "
      << max_value << "], got '" << it->second << "'";
  TILELAB_REQUIRE(value >= min_value && value <= max_value)
      << "parameter '" << name << "': " << value << " outside [" << min_value << ", " << max_value
      << "]";
  return value;
}

std::string parameter_choice(const KernelParameters& parameters, const std::string& name,
                             const std::vector<std::string>& allowed) {
  const auto it = parameters.find(name);
  TILELAB_REQUIRE(it != parameters.end()) << "parameter '" << name << "' is missing";
  std::string list;
  for (const auto& a : allowed) {
    if (a == it->second) return a;
    list += (list.empty() ? "" : ", ") + a;
  }
  throw Error("parameter '" + name + "': '" + it->second + "' is not one of " + list);
}

DType parameter_dtype(const KernelParameters& parameters, const std::string& name) {
  const std::string d = parameter_choice(parameters, name, {"bf16", "fp16", "fp32"});
  return d == "bf16" ? DType::bf16 : d == "fp16" ? DType::fp16 : DType::fp32;
}

}  // namespace tilelab::sim
