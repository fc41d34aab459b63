// Finite-value checks from bits (finite_values.hpp).
#include "finite_values.hpp"

#include <cstdint>

#include "cpu_features.hpp"
#include "tilelab/detail/fp32_classes.hpp"
#include "tilelab/error.hpp"

namespace tilelab::detail {
namespace {

// Whether every element of `count` values of `dtype` (bf16, fp16 or fp32 bits) is finite.
template <typename Bits, Bits kExponentBits>
bool every_value_finite(const Bits* bits, std::int64_t count) {
  return run_compiled_for_cpu([&]() TILELAB_ALWAYS_INLINE {
    unsigned non_finite = 0;
    for (std::int64_t i = 0; i < count; ++i) {
      non_finite |= (bits[i] & kExponentBits) == kExponentBits ? 1u : 0u;
    }
    return non_finite == 0;
  });
}

}  // namespace

bool every_value_finite(const void* data, std::int64_t count, DType dtype) {
  switch (dtype) {
    case DType::f32:
      return every_value_finite<std::uint32_t, kFp32PlusInfinityBits>(
          static_cast<const std::uint32_t*>(data), count);
    case DType::bf16:
      return every_value_finite<std::uint16_t, 0x7f80>(static_cast<const std::uint16_t*>(data),
                                                       count);
    case DType::f16:
      return every_value_finite<std::uint16_t, 0x7c00>(static_cast<const std::uint16_t*>(data),
                                                       count);
    default:
      break;
  }
  TILELAB_CHECK(false) << "every_value_finite: values of dtype " << dtype_name(dtype);
  return false;
}

bool every_value_finite(const TensorView& view) {
  TILELAB_CHECK(view.rank() == 4 && view.stride(3) == 1)
      << "every_value_finite: expected a rank-4 view with innermost stride 1, got "
      << view.describe();
  const std::int64_t outer = view.dim(0) * view.dim(1), rows = view.dim(2), count = view.dim(3);
  const auto element = static_cast<std::int64_t>(dtype_size(view.dtype()));
  const auto* base = static_cast<const char*>(view.data());
  bool finite = true;
#pragma omp parallel for schedule(static) reduction(&& : finite)
  for (std::int64_t n = 0; n < outer; ++n) {
    const char* first =
        base + (n / view.dim(1) * view.stride(0) + n % view.dim(1) * view.stride(1)) * element;
    for (std::int64_t r = 0; r < rows; ++r) {
      finite =
          finite && every_value_finite(first + r * view.stride(2) * element, count, view.dtype());
    }
  }
  return finite;
}

}  // namespace tilelab::detail
