#include "cpu_features.hpp"

#include "score_options.hpp"
#include "tilelab/attention.hpp"

namespace tilelab::detail {

bool cpu_has_bf16_dot_products() {
  static const bool supported =
      __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vbmi");
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
