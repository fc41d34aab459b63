#include "cpu_features.hpp"

#include <cstdlib>
#include <string_view>

#include "score_options.hpp"
#include "tilelab/attention.hpp"
#include "tilelab/error.hpp"

namespace tilelab::detail {

bool cpu_isa_capped_at_avx2() {
  static const bool capped = [] {
    const char* value = std::getenv("TILELAB_MAX_CPU_ISA");
    if (value == nullptr) return false;
    const std::string_view isa(value);
    TILELAB_REQUIRE(isa == "avx2" || isa == "avx512")
        << "TILELAB_MAX_CPU_ISA: got '" << isa << "', expected 'avx2' or 'avx512' (or unset)";
    return isa == "avx2";
  }();
  return capped;
}

bool cpu_runs_avx512() {
  static const bool supported = !cpu_isa_capped_at_avx2() && __builtin_cpu_supports("avx512f") &&
                                __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512vl") &&
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
  return detail::cpu_prefers_bf16_dot_products();
}

}  // namespace tilelab
