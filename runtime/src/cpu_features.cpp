#include "cpu_features.hpp"

#include <cstdlib>
#include <optional>
#include <string>

#include "score_options.hpp"
#include "tilelab/attention.hpp"
#include "tilelab/error.hpp"

namespace tilelab::detail {

namespace {

// TILELAB_MAX_CPU_ISA, read once: nullopt when unset.
const std::optional<std::string>& cpu_isa_setting() {
  static const std::optional<std::string> setting = []() -> std::optional<std::string> {
    const char* value = std::getenv("TILELAB_MAX_CPU_ISA");
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  }();
  return setting;
}

}  // namespace

CpuIsa max_cpu_isa() {
  static const CpuIsa isa = [] {
    const std::optional<std::string>& setting = cpu_isa_setting();
    if (setting == "sse2") return CpuIsa::sse2;
    if (setting == "avx2") return CpuIsa::avx2;
    return CpuIsa::avx512;
  }();
  return isa;
}

void check_cpu_isa_setting() {
  const std::optional<std::string>& isa = cpu_isa_setting();
  TILELAB_REQUIRE(!isa || *isa == "sse2" || *isa == "avx2" || *isa == "avx512")
      << "TILELAB_MAX_CPU_ISA: got '" << *isa
      << "', expected 'sse2', 'avx2' or 'avx512' (or unset)";
}

bool cpu_runs_avx2() {
  static const bool supported =
      max_cpu_isa() >= CpuIsa::avx2 && __builtin_cpu_supports("x86-64-v3");
  return supported;
}

bool cpu_runs_avx512() {
  static const bool supported =
      max_cpu_isa() >= CpuIsa::avx512 && cpu_runs_avx2() && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq");
  return supported;
}

bool cpu_has_bf16_dot_products() {
  static const bool supported = cpu_runs_avx512() && __builtin_cpu_supports("avx512bf16") &&
                                __builtin_cpu_supports("avx512vbmi");
  return supported;
}

bool cpu_prefers_bf16_dot_products() {
  static const bool prefers = cpu_has_bf16_dot_products() && __builtin_cpu_is("amd");
  return prefers;
}

bool bf16_dot_products_pay_off(DType kv_dtype) {
  return is_fp8(kv_dtype) ? cpu_has_bf16_dot_products() : cpu_prefers_bf16_dot_products();
}

bool rounds_bf16_probabilities(DType dtype, DType kv_dtype, bool fp32_probabilities) {
  return dtype == DType::bf16 && !fp32_probabilities && bf16_dot_products_pay_off(kv_dtype);
}

}  // namespace tilelab::detail

namespace tilelab {

bool prefers_bf16_dot_products() {
  detail::check_cpu_isa_setting();
  return detail::cpu_prefers_bf16_dot_products();
}

}  // namespace tilelab
