// tilelab::nki helpers that need no generated kernel: reorder_context_mask and
// reshape_and_cache (nki.hpp).
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

#include "nki_validate.hpp"
#include "schedules/paged/kv_tiling.hpp"
#include "tilelab/nki.hpp"

namespace tilelab::nki {

using arguments::require_dtype;
using arguments::require_shape;
using arguments::shape_of;

void reorder_context_mask(const TensorView& mask, std::int64_t large_tile_size,
                          std::int64_t block_size, const TensorView& out) {
  TILELAB_REQUIRE(mask.rank() == 2)
      << "mask: expected rank 2 [seq_q, context_len + seq_q], got rank " << mask.rank()
      << " with shape " << shape_of(mask);
  require_dtype(mask, "mask", DType::i32);
  require_shape(out, "out", "[seq_q, context_len + seq_q]", {mask.dim(0), mask.dim(1)});
  require_dtype(out, "out", DType::i32);
  require_shape(mask, "mask", "[seq_q, context_len + seq_q]", {-1, -1});
  TILELAB_REQUIRE(!mask.overlaps(out)) << "out: must not overlap mask";
  TILELAB_REQUIRE(large_tile_size >= 128 &&
                  std::has_single_bit(static_cast<std::uint64_t>(large_tile_size)))
      << "LARGE_TILE_SZ: expected a power of two >= 128 (at least one 128-partition load of a "
         "power-of-two number of cache blocks), got "
      << large_tile_size;
  TILELAB_REQUIRE(block_size >= 1 && block_size <= large_tile_size &&
                  std::has_single_bit(static_cast<std::uint64_t>(block_size)))
      << "block_size: expected a power of two <= LARGE_TILE_SZ (" << large_tile_size << "), got "
      << block_size;
  const std::int64_t seq_q = mask.dim(0), context_len = mask.dim(1) - seq_q;
  TILELAB_REQUIRE(context_len >= 0 && context_len % large_tile_size == 0)
      << "mask: expected shape [seq_q, context_len + seq_q] with context_len a multiple of "
         "LARGE_TILE_SZ ("
      << large_tile_size << "), got shape " << shape_of(mask);
  // The columns of each large tile in the order the kernel's K/V gather lays them out.
  using KvGatherTiling = schedules::paged::KvGatherTiling<std::int64_t>;
  const KvGatherTiling tiling =
      KvGatherTiling::derived(std::countr_zero(static_cast<std::uint64_t>(large_tile_size)),
                              std::countr_zero(static_cast<std::uint64_t>(block_size)));
  const auto* from = static_cast<const std::int32_t*>(mask.data());
  auto* to = static_cast<std::int32_t*>(out.data());
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < seq_q; ++i) {
    for (std::int64_t col = 0; col < mask.dim(1); ++col) {
      std::int64_t source = col;
      if (col < context_len) {
        const std::int64_t tile_start = col / large_tile_size * large_tile_size;
        source = tile_start + tiling.token_of_column(col - tile_start);
      }
      to[i * out.stride(0) + col * out.stride(1)] =
          from[i * mask.stride(0) + source * mask.stride(1)];
    }
  }
}

void reshape_and_cache(const TensorView& key, const TensorView& value, const TensorView& kv_cache,
                       const TensorView& slot_mapping) {
  require_shape(key, "key", "[num_tokens, n_kv_heads, d]", {-1, -1, -1});
  const std::int64_t num_tokens = key.dim(0), num_kv_heads = key.dim(1), head_dim = key.dim(2);
  require_shape(value, "value", "[num_tokens, n_kv_heads, d]",
                {num_tokens, num_kv_heads, head_dim});
  require_shape(kv_cache, "kv_cache", "[2, num_blocks, n_kv_heads, block_size, d]",
                {2, -1, num_kv_heads, -1, head_dim});
  require_shape(slot_mapping, "slot_mapping", "[num_tokens]", {num_tokens});
  TILELAB_REQUIRE_TYPE(key.dtype() != DType::i32)
      << "key: expected dtype float32, float16 or bfloat16, got " << dtype_name(key.dtype());
  require_dtype(value, "value", key.dtype());
  require_dtype(kv_cache, "kv_cache", key.dtype());
  require_dtype(slot_mapping, "slot_mapping", DType::i32);
  for (const auto& [view, name] :
       {std::pair{&key, "key"}, {&value, "value"}, {&slot_mapping, "slot_mapping"}}) {
    TILELAB_REQUIRE(!kv_cache.overlaps(*view)) << "kv_cache: must not overlap " << name;
  }
  const std::int64_t block_size = kv_cache.dim(3);
  const std::int64_t slots = kv_cache.dim(1) * block_size;
  const auto* slot_of = static_cast<const std::int32_t*>(slot_mapping.data());
  for (std::int64_t t = 0; t < num_tokens; ++t) {
    const std::int64_t slot = slot_of[t * slot_mapping.stride(0)];
    TILELAB_REQUIRE(slot < slots) << "slot_mapping: expected slots below num_blocks · block_size = "
                                  << slots << " (or negative to skip), got " << slot << " at index "
                                  << t;
  }
  const std::size_t element = dtype_size(key.dtype());
  // Sequential over tokens so that a repeated slot keeps the later token, as in vLLM.
  for (std::int64_t t = 0; t < num_tokens; ++t) {
    const std::int64_t slot = slot_of[t * slot_mapping.stride(0)];
    if (slot < 0) continue;
    const std::int64_t block = slot / block_size, offset = slot % block_size;
    for (int kv = 0; kv < 2; ++kv) {
      const TensorView& source = kv == 0 ? key : value;
      for (std::int64_t hk = 0; hk < num_kv_heads; ++hk) {
        for (std::int64_t d = 0; d < head_dim; ++d) {
          const std::int64_t to = kv * kv_cache.stride(0) + block * kv_cache.stride(1) +
                                  hk * kv_cache.stride(2) + offset * kv_cache.stride(3) +
                                  d * kv_cache.stride(4);
          const std::int64_t from =
              t * source.stride(0) + hk * source.stride(1) + d * source.stride(2);
          std::memcpy(static_cast<char*>(kv_cache.data()) + to * element,
                      static_cast<const char*>(source.data()) + from * element, element);
        }
      }
    }
  }
}

}  // namespace tilelab::nki
