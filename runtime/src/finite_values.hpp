// Whether tensor values are all finite, from their bits: the callers that route work to the
// generated dense kernels check V with it, since those kernels multiply a masked key's V row by
// P = 0 (docs/attention_options.md promises that NaN or inf there never reaches the output).
#pragma once

#include <cstdint>

#include "tilelab/tensor.hpp"

namespace tilelab::detail {

// `count` contiguous values of `dtype` (fp32, bf16 or fp16).
bool every_value_finite(const void* data, std::int64_t count, DType dtype);

// Every element of a rank-4 view of fp32, bf16 or fp16 whose innermost stride is 1 (in parallel
// over its rows).
bool every_value_finite(const TensorView& view);

}  // namespace tilelab::detail
