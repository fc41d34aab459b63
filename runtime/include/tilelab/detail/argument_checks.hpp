// Shape checks shared by the runtime's entry points and the Python bindings: each throws
// tilelab::Error naming the argument, with what was given and what is allowed.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>

#include "tilelab/error.hpp"
#include "tilelab/tensor.hpp"

namespace tilelab::detail {

// "[2, 3, 4]".
inline std::string shape_of(const TensorView& view) {
  std::ostringstream text;
  text << "[";
  for (int i = 0; i < view.rank(); ++i) text << (i ? ", " : "") << view.dim(i);
  text << "]";
  return text.str();
}

// `view` has rank expected.size(), dim i equal to expected[i] wherever that is >= 0, and
// non-negative strides; `layout` names the dims for the message (e.g. "[1, n_heads, d, seq_q]").
inline void require_shape(const TensorView& view, const char* name, const char* layout,
                          std::initializer_list<std::int64_t> expected) {
  TILELAB_REQUIRE(view.rank() == static_cast<int>(expected.size()))
      << name << ": expected shape " << layout << " (rank " << expected.size() << "), got shape "
      << shape_of(view) << " (rank " << view.rank() << ")";
  int i = 0;
  for (std::int64_t extent : expected) {
    TILELAB_REQUIRE(extent < 0 || view.dim(i) == extent)
        << name << ": expected shape " << layout << " with dim " << i << " = " << extent
        << ", got shape " << shape_of(view);
    ++i;
  }
  for (int d = 0; d < view.rank(); ++d) {
    TILELAB_REQUIRE(view.stride(d) >= 0 || view.dim(d) <= 1)
        << name << ": expected non-negative strides, got " << view.describe();
  }
}

// The softmax scale an attention kernel applies: the given one or, when none is given,
// 1/sqrt(head_dim); either must be finite as a float (zero and negative scales are honoured).
inline float resolve_softmax_scale(const std::optional<float>& given, std::int64_t head_dim) {
  const float scale =
      given ? *given : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  TILELAB_REQUIRE(std::isfinite(scale)) << "softmax_scale: expected a finite value, got " << scale;
  return scale;
}

// Every entry of an int32 block table (`count` entries `stride` apart) names a cache block in
// [0, num_blocks).
inline void require_block_table_entries(const std::int32_t* entries, std::int64_t count,
                                        std::int64_t stride, std::int64_t num_blocks) {
  for (std::int64_t n = 0; n < count; ++n) {
    const std::int32_t entry = entries[n * stride];
    TILELAB_REQUIRE(entry >= 0 && entry < num_blocks)
        << "block_tables: expected entries in [0, " << num_blocks << ") (kv_cache blocks), got "
        << entry << " at index " << n;
  }
}

}  // namespace tilelab::detail
