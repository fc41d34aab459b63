// Shape checks shared by the runtime's entry points and the Python bindings: each throws
// tilelab::Error naming the argument, with what was given and what is allowed.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

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

// Checks on tensor arguments of the attention entry points (flash, block-sparse).

inline bool is_attention_dtype(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16;
}

inline void require_rank(const TensorView& view, const char* name, int rank, const char* layout) {
  TILELAB_REQUIRE(view.rank() == rank) << name << ": expected rank " << rank << " " << layout
                                       << ", got rank " << view.rank() << " " << shape_of(view);
}

// Pointer and strides: what every tensor argument needs before its addresses can be reasoned about.
inline void require_addressable(const TensorView& view, const char* name) {
  TILELAB_REQUIRE(view.data() != nullptr) << name << ": expected a non-null data pointer, got null";
  for (int i = 0; i < view.rank(); ++i) {
    TILELAB_REQUIRE(view.stride(i) >= 0)
        << name << ": expected non-negative strides, got " << view.describe();
  }
}

// q, k, v and out of an attention call: q's dtype is one attention takes (float32, float16,
// bfloat16), k, v and out share it, and all four are addressable.
inline void require_attention_operands(const TensorView& q, const TensorView& k,
                                       const TensorView& v, const TensorView& out) {
  TILELAB_REQUIRE_TYPE(is_attention_dtype(q.dtype()))
      << "q: expected dtype float32, float16 or bfloat16, got " << dtype_name(q.dtype());
  const std::pair<const TensorView*, const char*> same_dtype[] = {
      {&k, "k"}, {&v, "v"}, {&out, "out"}};
  for (const auto& [view, name] : same_dtype) {
    TILELAB_REQUIRE_TYPE(view->dtype() == q.dtype())
        << name << ": expected dtype " << dtype_name(q.dtype()) << " (the dtype of q), got "
        << dtype_name(view->dtype());
  }
  for (const auto& [view, name] :
       {std::pair<const TensorView*, const char*>{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}}) {
    require_addressable(*view, name);
  }
}

// True when two different indices of `view` can map to the same element. Sufficient test: with
// dims of extent > 1 sorted by stride, each stride must step past everything the inner dims span.
// Layouts that interleave dims without colliding are rare and are reported as overlapping.
inline bool overlaps_itself(const TensorView& view) {
  std::vector<std::array<std::int64_t, 2>> dims;  // {stride, extent}
  for (int i = 0; i < view.rank(); ++i) {
    if (view.dim(i) > 1) dims.push_back({view.stride(i), view.dim(i)});
  }
  std::sort(dims.begin(), dims.end());
  std::int64_t inner_span = 1;  // elements covered by the dims already visited
  for (const auto& [stride, extent] : dims) {
    if (stride < inner_span) return true;  // includes stride 0 with extent > 1
    inner_span = stride * (extent - 1) + inner_span;
  }
  return false;
}

inline void require_disjoint(const TensorView& written, const char* written_name,
                             const TensorView& other, const char* other_name) {
  TILELAB_REQUIRE(!written.overlaps(other))
      << written_name << ": expected memory disjoint from " << other_name << ", got "
      << written_name << " " << written.describe() << " overlapping " << other_name << " "
      << other.describe();
}

inline void require_no_self_overlap(const TensorView& written, const char* name) {
  TILELAB_REQUIRE(!overlaps_itself(written))
      << name << ": expected a view whose elements have distinct addresses, got "
      << written.describe() << " (some elements alias)";
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

// Reads and checks a prefix-sum array (cu_seqlens, query_start_loc): int32, rank 1,
// num_seqs + 1 >= 2 entries, 0 first, non-decreasing, `total` last.
inline std::vector<std::int32_t> read_prefix_sums(const TensorView& prefix_sums, const char* name,
                                                  std::int64_t total, const char* total_name) {
  TILELAB_REQUIRE_TYPE(prefix_sums.dtype() == DType::i32)
      << name << ": expected dtype int32, got " << dtype_name(prefix_sums.dtype());
  require_rank(prefix_sums, name, 1, "[num_seqs + 1]");
  require_addressable(prefix_sums, name);
  const std::int64_t entries = prefix_sums.dim(0);
  TILELAB_REQUIRE(entries >= 2) << name
                                << ": expected num_seqs + 1 >= 2 entries (at least one sequence), "
                                   "got "
                                << entries;
  const auto* data = static_cast<const std::int32_t*>(prefix_sums.data());
  std::vector<std::int32_t> values(entries);
  for (std::int64_t n = 0; n < entries; ++n) values[n] = data[n * prefix_sums.stride(0)];
  TILELAB_REQUIRE(values[0] == 0) << name << ": expected 0 at index 0, got " << values[0];
  for (std::int64_t n = 1; n < entries; ++n) {
    TILELAB_REQUIRE(values[n] >= values[n - 1])
        << name << ": expected non-decreasing prefix sums, got " << values[n - 1] << " then "
        << values[n] << " at index " << n;
  }
  TILELAB_REQUIRE(values.back() == total)
      << name << ": expected the last entry to be " << total_name << " = " << total << ", got "
      << values.back() << " at index " << entries - 1;
  return values;
}

// The scale of flash_attention, blocksparse_attention and paged_attention: the given one or
// 1/sqrt(head_dim) computed in fp32; finite either way.
inline float resolve_attention_scale(const std::optional<float>& given, std::int64_t head_dim) {
  const float scale = given.value_or(1.0f / std::sqrt(static_cast<float>(head_dim)));
  TILELAB_REQUIRE(std::isfinite(scale)) << "scale: expected a finite value, got " << scale;
  return scale;
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
