// paged_attention (validate, then the paged kernel), flash_attention's calls with score options
// or fp8 k/v on the same kernel, and reshape_and_cache_flash, the cache writer.
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "attention_problem.hpp"
#include "dtype_convert.hpp"
#include "paged_problem.hpp"
#include "score_options.hpp"
#include "tilelab/detail/argument_checks.hpp"
#include "tilelab/error.hpp"
#include "tilelab/threading.hpp"

namespace tilelab {

namespace detail {

void flash_attention_on_paged_kernel(const AttentionProblem& dense) {
  const std::int64_t B = dense.batch, M = dense.q_len, N = dense.kv_len;
  // The batch as one paged problem, so that one parallel plan covers every (entry, kv head):
  // entry b is sequence b of M query tokens, and k[b], v[b] are its one cache block of N keys.
  PagedProblem problem;
  problem.dtype = dense.dtype;
  problem.cache_dtype = dense.kv_dtype;
  problem.num_tokens = B * M;
  problem.q_heads = dense.q_heads;
  problem.kv_heads = dense.kv_heads;
  problem.head_dim = dense.head_dim;
  problem.num_blocks = B;
  problem.block_size = N;
  problem.num_seqs = B;
  problem.seq_lens.assign(B, N);
  problem.query_starts.resize(B + 1);
  problem.block_table.resize(B);
  for (std::int64_t b = 0; b <= B; ++b) problem.query_starts[b] = b * M;
  for (std::int64_t b = 0; b < B; ++b) problem.block_table[b] = static_cast<std::int32_t>(b);
  problem.max_blocks_per_seq = 1;
  problem.scale = dense.scale;
  problem.causal = dense.causal;
  problem.score = dense.score;
  problem.k_scale = dense.k_scale;
  problem.v_scale = dense.v_scale;
  problem.fp32_probabilities = dense.fp32_probabilities;
  // Paged positions put the queries last (N - M + row); the dense ones are row + offset.
  problem.position_shift = dense.position_offset - (N - M);
  // q, out [B, H, M, D] as tokens [B * M, H, D]: token b * M + m is at b * stride(0) + m *
  // stride(2), so the per-sequence stride is stride(0) - M * stride(2). lse [B, H, M] likewise.
  const auto tokens = [&](const TensorView& view, std::initializer_list<int> dims,
                          std::int64_t& seq_stride) {
    std::int64_t shape[3], strides[3];
    int i = 0;
    for (int dim : dims) {
      shape[i] = dim == 2 ? B * M : view.dim(dim);
      strides[i] = view.stride(dim);
      ++i;
    }
    seq_stride = view.stride(0) - M * view.stride(2);
    return TensorView(view.data(), view.dtype(), static_cast<int>(dims.size()), shape, strides);
  };
  problem.query = tokens(dense.q, {2, 1, 3}, problem.query_seq_stride);
  problem.out = tokens(dense.out, {2, 1, 3}, problem.out_seq_stride);
  if (dense.lse) problem.lse = tokens(*dense.lse, {2, 1}, problem.lse_seq_stride);
  problem.key_cache = dense.k;
  problem.value_cache = dense.v;
  paged_kernel_attention(problem);
}

}  // namespace detail

void paged_attention(const TensorView& query, const TensorView& key_cache,
                     const TensorView& value_cache, const TensorView& block_table,
                     const TensorView& seq_lens, const TensorView& query_start_loc,
                     const TensorView& out, const PagedAttentionOptions& options) {
  detail::PagedProblem problem = detail::validate_paged_attention(
      query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, options);
  problem.computed_elsewhere = detail::sequences_for_generated_prefill(problem);
  detail::generated_prefill_attention(problem, problem.computed_elsewhere);
  detail::paged_kernel_attention(problem);
}

namespace {

// Writes each token's [Hkv, D] rows of `source` into `cache` at its slot; a cache of another
// dtype than the source's (fp8) stores value / scale.
template <DType source_dtype, DType cache_dtype>
void write_slots(const TensorView& source, const TensorView& cache,
                 const std::vector<std::int32_t>& slots, std::int64_t block_size, float scale) {
  using SourceTraits = detail::ElementTraits<source_dtype>;
  using CacheTraits = detail::ElementTraits<cache_dtype>;
  const auto* src = static_cast<const typename SourceTraits::Storage*>(source.data());
  auto* dst = static_cast<typename CacheTraits::Storage*>(cache.data());
  const std::int64_t tokens = source.dim(0), heads = source.dim(1), head_dim = source.dim(2);
  // Heads in parallel, tokens in order within a head: when two tokens name one slot the later
  // one wins.
#pragma omp parallel for schedule(static) num_threads(num_threads())
  for (std::int64_t h = 0; h < heads; ++h) {
    for (std::int64_t t = 0; t < tokens; ++t) {
      const std::int64_t slot = slots[t];
      if (slot < 0) continue;
      const auto* from = src + t * source.stride(0) + h * source.stride(1);
      auto* to = dst + (slot / block_size) * cache.stride(0) + h * cache.stride(1) +
                 (slot % block_size) * cache.stride(2);
      for (std::int64_t d = 0; d < head_dim; ++d) {
        const float value = SourceTraits::to_float(from[d * source.stride(2)]);
        to[d * cache.stride(3)] =
            CacheTraits::from_float(source_dtype == cache_dtype ? value : value / scale);
      }
    }
  }
}

template <DType source_dtype>
void write_slots_to(const TensorView& source, const TensorView& cache,
                    const std::vector<std::int32_t>& slots, std::int64_t block_size, float scale) {
  switch (cache.dtype()) {
    case DType::f8e4m3fn:
      return write_slots<source_dtype, DType::f8e4m3fn>(source, cache, slots, block_size, scale);
    case DType::f8e5m2:
      return write_slots<source_dtype, DType::f8e5m2>(source, cache, slots, block_size, scale);
    default:
      return write_slots<source_dtype, source_dtype>(source, cache, slots, block_size, scale);
  }
}

void write_slots_any(const TensorView& source, const TensorView& cache,
                     const std::vector<std::int32_t>& slots, std::int64_t block_size, float scale) {
  switch (source.dtype()) {
    case DType::f32:
      return write_slots_to<DType::f32>(source, cache, slots, block_size, scale);
    case DType::f16:
      return write_slots_to<DType::f16>(source, cache, slots, block_size, scale);
    case DType::bf16:
      return write_slots_to<DType::bf16>(source, cache, slots, block_size, scale);
    case DType::i32:
    case DType::f8e4m3fn:
    case DType::f8e5m2:
      break;
  }
  TILELAB_CHECK(false) << "reshape_and_cache_flash: dtype " << dtype_name(source.dtype())
                       << " passed validation";
}

}  // namespace

void reshape_and_cache_flash(const TensorView& key, const TensorView& value,
                             const TensorView& key_cache, const TensorView& value_cache,
                             const TensorView& slot_mapping, float k_scale, float v_scale) {
  using namespace detail;
  require_rank(key, "key", 3, "[num_tokens, Hkv, D]");
  require_rank(key_cache, "key_cache", 4, "[num_blocks, Hkv, block_size, D]");
  TILELAB_REQUIRE_TYPE(is_attention_dtype(key.dtype()))
      << "key: expected dtype float32, float16 or bfloat16, got " << dtype_name(key.dtype());
  TILELAB_REQUIRE_TYPE(value.dtype() == key.dtype())
      << "value: expected dtype " << dtype_name(key.dtype()) << " (the dtype of key), got "
      << dtype_name(value.dtype());
  TILELAB_REQUIRE_TYPE(key_cache.dtype() == key.dtype() || is_fp8(key_cache.dtype()))
      << "key_cache: expected dtype " << dtype_name(key.dtype())
      << " (the dtype of key), float8_e4m3fn or float8_e5m2, got " << dtype_name(key_cache.dtype());
  TILELAB_REQUIRE_TYPE(value_cache.dtype() == key_cache.dtype())
      << "value_cache: expected dtype " << dtype_name(key_cache.dtype())
      << " (the dtype of key_cache), got " << dtype_name(value_cache.dtype());
  const std::int64_t tokens = key.dim(0), heads = key.dim(1), head_dim = key.dim(2);
  require_shape(value, "value", "[num_tokens, Hkv, D] (the shape of key)",
                {tokens, heads, head_dim});
  require_shape(key_cache, "key_cache", "[num_blocks, Hkv, block_size, D] (Hkv and D of key)",
                {-1, heads, -1, head_dim});
  require_shape(value_cache, "value_cache", "[num_blocks, Hkv, block_size, D] (that of key_cache)",
                {key_cache.dim(0), heads, key_cache.dim(2), head_dim});
  TILELAB_REQUIRE(key_cache.dim(2) >= 1)
      << "key_cache: expected block_size >= 1, got " << shape_of(key_cache);
  TILELAB_REQUIRE_TYPE(slot_mapping.dtype() == DType::i32)
      << "slot_mapping: expected dtype int32, got " << dtype_name(slot_mapping.dtype());
  require_shape(slot_mapping, "slot_mapping", "[num_tokens]", {tokens});
  for (const auto& [view, name] : {std::pair<const TensorView*, const char*>{&key, "key"},
                                   {&value, "value"},
                                   {&key_cache, "key_cache"},
                                   {&value_cache, "value_cache"},
                                   {&slot_mapping, "slot_mapping"}}) {
    require_addressable(*view, name);
  }
  require_kv_scales(key_cache.dtype(), k_scale, v_scale);
  for (const auto& [scale, name] :
       {std::pair<float, const char*>{k_scale, "k_scale"}, {v_scale, "v_scale"}}) {
    TILELAB_REQUIRE(scale != 0.0f)
        << name << ": expected a finite, nonzero value (the stored values are divided by it), got "
        << scale;
  }
  require_no_self_overlap(key_cache, "key_cache");
  require_no_self_overlap(value_cache, "value_cache");
  require_disjoint(key_cache, "key_cache", value_cache, "value_cache");
  for (const auto& [cache, cache_name] :
       {std::pair<const TensorView*, const char*>{&key_cache, "key_cache"},
        {&value_cache, "value_cache"}}) {
    require_disjoint(*cache, cache_name, key, "key");
    require_disjoint(*cache, cache_name, value, "value");
    require_disjoint(*cache, cache_name, slot_mapping, "slot_mapping");
  }

  const std::int64_t block_size = key_cache.dim(2);
  const std::int64_t slot_count = key_cache.dim(0) * block_size;
  const auto* mapping = static_cast<const std::int32_t*>(slot_mapping.data());
  std::vector<std::int32_t> slots(tokens);
  for (std::int64_t t = 0; t < tokens; ++t) {
    slots[t] = mapping[t * slot_mapping.stride(0)];
    TILELAB_REQUIRE(slots[t] < slot_count)
        << "slot_mapping: expected slots < num_blocks x block_size = " << key_cache.dim(0) << " x "
        << block_size << " = " << slot_count << " (negative: skipped), got " << slots[t]
        << " at index " << t;
  }
  write_slots_any(key, key_cache, slots, block_size, k_scale);
  write_slots_any(value, value_cache, slots, block_size, v_scale);
}

}  // namespace tilelab
