// tilelab::nki::flash_paged_attention: validation (the NKI kernel's constraints via
// PagedAttentionSchedule), dtype conversion around the generated kernels, the kernel call.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cpu_features.hpp"
#include "dtype_convert.hpp"
#include "halide_glue.hpp"
#include "nki_validate.hpp"
#include "paged_cpu_fp32.h"
#include "paged_cpu_mixed.h"
#include "paged_tile_fp32.h"
#include "paged_tile_mixed.h"
#include "schedules/paged/masked_tiles.hpp"
#include "schedules/paged/schedule.hpp"
#include "tilelab/error.hpp"
#include "tilelab/nki.hpp"

namespace tilelab::nki {
namespace {

using arguments::require_dtype;
using arguments::require_shape;
using arguments::shape_of;
using schedules::PagedAttentionTiling;
using tilelab::detail::HalideView;

// Element `offset` (in elements) of a float-like view as float.
float load(const TensorView& view, std::int64_t offset) {
  switch (view.dtype()) {
    case DType::f32:
      return static_cast<const float*>(view.data())[offset];
    case DType::bf16:
      return detail::bf16_bits_to_float(static_cast<const std::uint16_t*>(view.data())[offset]);
    case DType::f16:
      return detail::f16_bits_to_float(static_cast<const std::uint16_t*>(view.data())[offset]);
    case DType::i32:
    case DType::f8e4m3fn:
    case DType::f8e5m2:
      break;
  }
  return 0.0f;
}

void store(const TensorView& view, std::int64_t offset, float value) {
  switch (view.dtype()) {
    case DType::f32:
      static_cast<float*>(view.data())[offset] = value;
      return;
    case DType::bf16:
      static_cast<std::uint16_t*>(view.data())[offset] = detail::float_to_bf16_bits(value);
      return;
    case DType::f16:
      static_cast<std::uint16_t*>(view.data())[offset] = detail::float_to_f16_bits(value);
      return;
    case DType::i32:
    case DType::f8e4m3fn:
    case DType::f8e5m2:
      return;
  }
}

// A contiguous tensor owned here, for inputs converted to the kernel's dtype.
struct OwnedTensor {
  std::vector<std::uint32_t> storage;  // 4-byte units keep every dtype aligned
  TensorView view;

  OwnedTensor(DType dtype, const std::vector<std::int64_t>& shape) {
    std::int64_t count = 1;
    std::vector<std::int64_t> strides(shape.size());
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      strides[d] = count;
      count *= shape[d];
    }
    storage.resize(static_cast<std::size_t>((count * dtype_size(dtype) + 3) / 4 + 1));
    view = TensorView(storage.data(), dtype, static_cast<int>(shape.size()), shape.data(),
                      strides.data());
  }
};

std::vector<std::int64_t> shape_vector(const TensorView& view) {
  std::vector<std::int64_t> shape(static_cast<std::size_t>(view.rank()));
  for (int d = 0; d < view.rank(); ++d) shape[d] = view.dim(d);
  return shape;
}

// Copies `from` into `to` (same shape), converting (rounding to nearest even) between dtypes.
void convert(const TensorView& from, const TensorView& to) {
  const std::int64_t count = from.numel();
#pragma omp parallel for schedule(static)
  for (std::int64_t linear = 0; linear < count; ++linear) {
    store(to, to.element_offset(linear), load(from, from.element_offset(linear)));
  }
}

OwnedTensor converted(const TensorView& from, DType dtype) {
  OwnedTensor result(dtype, shape_vector(from));
  convert(from, result.view);
  return result;
}

using PagedKernel = int (*)(halide_buffer_t*, halide_buffer_t*, halide_buffer_t*, halide_buffer_t*,
                            halide_buffer_t*, halide_buffer_t*, float, int32_t, halide_buffer_t*,
                            halide_buffer_t*, int32_t, int32_t, int32_t, halide_buffer_t*);

PagedKernel pick_kernel(PagedSchedule schedule, bool mixed_precision) {
  if (schedule == PagedSchedule::tile) return mixed_precision ? paged_tile_mixed : paged_tile_fp32;
  return mixed_precision ? paged_cpu_mixed : paged_cpu_fp32;
}

// Σ x² and max |x| over a contiguous row, in fp32 (NaN or inf make the sum NaN or inf).
struct RowMagnitudes {
  float sum_squares = 0, largest = 0;
};
// The loops, inlined into both versions of run_compiled_for_cpu. (Written in its lambda instead,
// the loop lost its `omp simd` vectorization.)
TILELAB_ALWAYS_INLINE inline RowMagnitudes bf16_row_magnitudes_of(const std::uint16_t* row,
                                                                  std::int64_t length) {
  float sum = 0, largest = 0;
#pragma omp simd reduction(+ : sum) reduction(max : largest)
  for (std::int64_t e = 0; e < length; ++e) {
    const float x = detail::bf16_bits_to_float(row[e]);
    sum += x * x;
    largest = std::max(largest, std::abs(x));
  }
  return {sum, largest};
}
TILELAB_ALWAYS_INLINE inline RowMagnitudes f32_row_magnitudes_of(const float* row,
                                                                 std::int64_t length) {
  float sum = 0, largest = 0;
#pragma omp simd reduction(+ : sum) reduction(max : largest)
  for (std::int64_t e = 0; e < length; ++e) {
    sum += row[e] * row[e];
    largest = std::max(largest, std::abs(row[e]));
  }
  return {sum, largest};
}
RowMagnitudes bf16_row_magnitudes(const std::uint16_t* row, std::int64_t length) {
  return detail::run_compiled_for_cpu(
      [&]() TILELAB_ALWAYS_INLINE { return bf16_row_magnitudes_of(row, length); });
}
RowMagnitudes f32_row_magnitudes(const float* row, std::int64_t length) {
  return detail::run_compiled_for_cpu(
      [&]() TILELAB_ALWAYS_INLINE { return f32_row_magnitudes_of(row, length); });
}
// A bound on the exact sum of `terms` squares whose fp32 sum (in any order) is `sum`: each
// addition rounds by at most 2^-24 relative, so that error stays below terms · 2^-23 relative,
// and a square that underflows loses less than 2^-126.
double upper_bound_of_fp32_sum(float sum, std::int64_t terms) {
  const auto n = static_cast<double>(terms);
  return static_cast<double>(sum) * (1.0 + n * 0x1p-23) + n * 0x1p-126;
}

// The largest squared Euclidean norm over `count` vectors of `length` elements of `view` (vector
// n starts at element offset first(n), its elements `step` apart), and the largest |element|;
// +inf when an element is not finite.
struct Magnitudes {
  double max_norm2 = 0, max_abs = 0;
};
template <typename First>
Magnitudes magnitudes(const TensorView& view, std::int64_t count, std::int64_t length,
                      std::int64_t step, First first) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  double max_norm2 = 0, max_abs = 0;
#pragma omp parallel for schedule(static) reduction(max : max_norm2, max_abs)
  for (std::int64_t n = 0; n < count; ++n) {
    double norm2 = 0, largest = 0;
    const std::int64_t base = first(n);
    if (step == 1 && (view.dtype() == DType::bf16 || view.dtype() == DType::f32)) {
      // Contiguous rows (K and V): vectorized, in fp32 (this pass reads all of K and V; scalar,
      // it took a tenth of the call).
      const RowMagnitudes row =
          view.dtype() == DType::bf16
              ? bf16_row_magnitudes(static_cast<const std::uint16_t*>(view.data()) + base, length)
              : f32_row_magnitudes(static_cast<const float*>(view.data()) + base, length);
      norm2 = upper_bound_of_fp32_sum(row.sum_squares, length);
      largest = row.largest;
    } else {
      auto scan = [&](auto element_at) {
        for (std::int64_t e = 0; e < length; ++e) {
          const double x = element_at(base + e * step);
          norm2 += x * x;
          largest = std::max(largest, std::abs(x));
        }
      };
      if (view.dtype() == DType::bf16) {
        const auto* bits = static_cast<const std::uint16_t*>(view.data());
        scan([&](std::int64_t at) { return detail::bf16_bits_to_float(bits[at]); });
      } else if (view.dtype() == DType::f32) {
        const auto* values = static_cast<const float*>(view.data());
        scan([&](std::int64_t at) { return values[at]; });
      } else {
        scan([&](std::int64_t at) { return load(view, at); });
      }
    }
    if (!std::isfinite(norm2) || !std::isfinite(largest)) norm2 = largest = kInf;
    max_norm2 = std::max(max_norm2, norm2);
    max_abs = std::max(max_abs, largest);
  }
  return {max_norm2, max_abs};
}

// One call of the cpu kernel: query blocks that compute the same number of context large tiles,
// and those tiles (tiles[task · count + n], ascending per task).
struct CpuCall {
  std::vector<std::int32_t> blocks, tiles;
  std::int32_t count = 0, first_tile = 0, last_tile = 0;
};

// Which context large tiles each query block of the cpu schedule needs: live[block · num_tiles +
// tile] is 0 when the tile's mask is all zero on the block and every query position of the
// block sees a key (context, or new tokens below active_column_limit); otherwise 1.
std::vector<char> live_large_tiles(const TensorView& mask, std::int64_t seq_q,
                                   std::int64_t context_len, std::int64_t large_tile_size) {
  namespace paged = schedules::paged;
  constexpr std::int64_t kRows = schedules::kPagedCpuQueryTile;
  const std::int64_t num_blocks = paged::cpu_query_blocks(seq_q);
  const std::int64_t num_tiles = context_len / large_tile_size;
  std::vector<char> live(static_cast<std::size_t>(num_blocks * num_tiles), 1);
  const auto* m = static_cast<const std::int32_t*>(mask.data());
  const std::int64_t row_stride = mask.stride(0), column_stride = mask.stride(1);
  auto any_set = [&](std::int64_t row, std::int64_t begin, std::int64_t end) {
    for (std::int64_t col = begin; col < end; ++col) {
      if (m[row * row_stride + col * column_stride] != 0) return true;
    }
    return false;
  };
#pragma omp parallel for schedule(dynamic)
  for (std::int64_t block = 0; block < num_blocks; ++block) {
    char* block_live = live.data() + block * num_tiles;
    std::fill(block_live, block_live + num_tiles, char{0});
    bool every_row_sees_a_key = true;
    for (std::int64_t row = block * kRows; row < (block + 1) * kRows; ++row) {
      const std::int64_t limit = std::min(paged::active_column_limit(row, seq_q), seq_q);
      bool sees = any_set(row, context_len, context_len + limit);
      for (std::int64_t tile = 0; tile < num_tiles; ++tile) {
        if (block_live[tile] && sees) continue;  // nothing more to learn from this row
        if (any_set(row, tile * large_tile_size, (tile + 1) * large_tile_size)) {
          block_live[tile] = 1;
          sees = true;
        }
      }
      every_row_sees_a_key = every_row_sees_a_key && sees;
    }
    if (!every_row_sees_a_key) std::fill(block_live, block_live + num_tiles, char{1});
  }
  return live;
}

// The calls of the cpu kernel for `live` (live_large_tiles): one per number of large tiles a
// block computes.
std::vector<CpuCall> plan_cpu_calls(const std::vector<char>& live, std::int64_t num_blocks,
                                    std::int64_t num_tiles) {
  std::map<std::int32_t, CpuCall> calls;
  for (std::int64_t block = 0; block < num_blocks; ++block) {
    const char* block_live = live.data() + block * num_tiles;
    const auto count = static_cast<std::int32_t>(std::count(block_live, block_live + num_tiles, 1));
    CpuCall& call = calls[count];
    if (call.blocks.empty()) {
      call.count = count;
      call.first_tile = static_cast<std::int32_t>(num_tiles - 1);
    }
    call.blocks.push_back(static_cast<std::int32_t>(block));
    for (std::int64_t tile = 0; tile < num_tiles; ++tile) {
      if (!block_live[tile]) continue;
      call.tiles.push_back(static_cast<std::int32_t>(tile));
      call.first_tile = std::min(call.first_tile, static_cast<std::int32_t>(tile));
      call.last_tile = std::max(call.last_tile, static_cast<std::int32_t>(tile));
    }
  }
  std::vector<CpuCall> result;
  for (auto& [count, call] : calls) {
    // A block that computes no large tile still gets one (never read): no empty buffers.
    if (call.count == 0) call.tiles.assign(call.blocks.size(), 0);
    call.first_tile = std::min(call.first_tile, call.last_tile);
    result.push_back(std::move(call));
  }
  return result;
}

}  // namespace

void flash_paged_attention(const TensorView& query, const TensorView& key, const TensorView& value,
                           const TensorView& kv_cache, const TensorView& block_tables,
                           const TensorView& mask, const TensorView& out,
                           const FlashPagedAttentionOptions& options) {
  detail::check_cpu_isa_setting();
  // Shapes, from query and kv_cache.
  require_shape(query, "query", "[1, n_heads, d, seq_q]", {1, -1, -1, -1});
  require_shape(kv_cache, "kv_cache", "[2, num_blocks, n_kv_heads, block_size, d]",
                {2, -1, -1, -1, query.dim(2)});
  const std::int64_t num_heads = query.dim(1), head_dim = query.dim(2), seq_q = query.dim(3);
  const std::int64_t num_blocks = kv_cache.dim(1), num_kv_heads = kv_cache.dim(2);
  const std::int64_t block_size = kv_cache.dim(3);
  require_shape(key, "key", "[1, n_kv_heads, d, seq_q]", {1, num_kv_heads, head_dim, seq_q});
  require_shape(value, "value", "[1, n_kv_heads, seq_q, d]", {1, num_kv_heads, seq_q, head_dim});
  require_shape(block_tables, "block_tables", "[num_active_blocks]", {-1});
  const std::int64_t num_active_blocks = block_tables.dim(0);
  const std::int64_t context_len = num_active_blocks * block_size;
  require_shape(mask, "mask", "[seq_q, num_active_blocks * block_size + seq_q]",
                {seq_q, context_len + seq_q});
  require_shape(out, "out", "[1, n_heads, seq_q, d]", {1, num_heads, seq_q, head_dim});

  // dtypes: one float dtype for every tensor, int32 for the table and the mask.
  const DType dtype = query.dtype();
  TILELAB_REQUIRE_TYPE(dtype == DType::f32 || dtype == DType::bf16)
      << "query: expected dtype float32 or bfloat16, got " << dtype_name(dtype);
  require_dtype(key, "key", dtype);
  require_dtype(value, "value", dtype);
  require_dtype(kv_cache, "kv_cache", dtype);
  require_dtype(out, "out", dtype);
  require_dtype(block_tables, "block_tables", DType::i32);
  require_dtype(mask, "mask", DType::i32);

  // The NKI kernel's constraints, with their reasons.
  PagedAttentionTiling schedule;
  schedule.large_tile_size = options.large_tile_size;
  schedule.block_size = block_size;
  schedule.mixed_precision = options.mixed_precision;
  schedule.block_size_tiling_factor_override = options.block_size_tiling_factor_override;
  schedules::PagedAttentionShape shape;
  shape.num_heads = num_heads;
  shape.num_kv_heads = num_kv_heads;
  shape.head_dim = head_dim;
  shape.query_len = seq_q;
  shape.num_active_blocks = num_active_blocks;
  TILELAB_REQUIRE(num_blocks >= 1)
      << "kv_cache: expected at least one block, got shape " << shape_of(kv_cache);
  schedule.validate(shape);
  TILELAB_REQUIRE(schedule.block_size_tiling_factor() ==
                  schedule.derived_block_size_tiling_factor())
      << "block_size_tiling_factor_override: the generated kernels derive the block size tiling "
         "factor from large_tile_size and block_size; expected 0 or "
      << schedule.derived_block_size_tiling_factor() << ", got "
      << options.block_size_tiling_factor_override;

  const float scale = options.softmax_scale
                          ? *options.softmax_scale
                          : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  TILELAB_REQUIRE(std::isfinite(scale)) << "softmax_scale: expected a finite value, got " << scale;
  for (std::int64_t n = 0; n < num_active_blocks; ++n) {
    const std::int32_t entry =
        static_cast<const std::int32_t*>(block_tables.data())[n * block_tables.stride(0)];
    TILELAB_REQUIRE(entry >= 0 && entry < num_blocks)
        << "block_tables: expected entries in [0, " << num_blocks << ") (kv_cache blocks), got "
        << entry << " at index " << n;
  }
  // The generated kernels index with int32 offsets; the cache is compacted below when it is
  // larger, the others are the caller's to split.
  for (const auto& [view, name] : {std::pair{&query, "query"}, {&mask, "mask"}, {&out, "out"}}) {
    TILELAB_REQUIRE(detail::offsets_fit_int32(*view))
        << name << ": expected element offsets below 2^31 (the kernels index with int32), got "
        << view->describe();
  }
  for (const auto& [view, name] : {std::pair{&query, "query"},
                                   {&key, "key"},
                                   {&value, "value"},
                                   {&kv_cache, "kv_cache"},
                                   {&block_tables, "block_tables"},
                                   {&mask, "mask"}}) {
    TILELAB_REQUIRE(!out.overlaps(*view)) << "out: must not overlap " << name;
  }

  // The kernels take bf16 (mixed precision) or fp32 tensors. Other dtypes, and caches too large
  // for int32 offsets, are converted: the cache is compacted to the active blocks in table order,
  // so the copy costs what the kernel reads anyway.
  const DType kernel_dtype = options.mixed_precision ? DType::bf16 : DType::f32;
  const bool convert_inputs = dtype != kernel_dtype;
  const bool compact_cache = convert_inputs || !detail::offsets_fit_int32(kv_cache);
  std::vector<OwnedTensor> copies;
  copies.reserve(5);
  auto as_kernel_dtype = [&](const TensorView& view) -> TensorView {
    if (!convert_inputs) return view;
    copies.push_back(converted(view, kernel_dtype));
    return copies.back().view;
  };
  const TensorView q_in = as_kernel_dtype(query), k_in = as_kernel_dtype(key);
  const TensorView v_in = as_kernel_dtype(value);
  TensorView cache_in = kv_cache, table_in = block_tables;
  std::vector<std::int32_t> compact_table;
  if (compact_cache) {
    copies.emplace_back(kernel_dtype, std::vector<std::int64_t>{2, num_active_blocks, num_kv_heads,
                                                                block_size, head_dim});
    const TensorView compact = copies.back().view;
    const std::int64_t per_block = num_kv_heads * block_size * head_dim;
#pragma omp parallel for collapse(2) schedule(static)
    for (std::int64_t kv = 0; kv < 2; ++kv) {
      for (std::int64_t n = 0; n < num_active_blocks; ++n) {
        const std::int64_t block =
            static_cast<const std::int32_t*>(block_tables.data())[n * block_tables.stride(0)];
        for (std::int64_t e = 0; e < per_block; ++e) {
          const std::int64_t hk = e / (block_size * head_dim), t = e / head_dim % block_size;
          const std::int64_t d = e % head_dim;
          const std::int64_t from = kv * kv_cache.stride(0) + block * kv_cache.stride(1) +
                                    hk * kv_cache.stride(2) + t * kv_cache.stride(3) +
                                    d * kv_cache.stride(4);
          store(compact, (kv * num_active_blocks + n) * per_block + e, load(kv_cache, from));
        }
      }
    }
    cache_in = compact;
    compact_table.resize(static_cast<std::size_t>(num_active_blocks));
    for (std::int64_t n = 0; n < num_active_blocks; ++n) {
      compact_table[static_cast<std::size_t>(n)] = static_cast<std::int32_t>(n);
    }
    table_in = TensorView(compact_table.data(), DType::i32, {num_active_blocks});
  }
  std::optional<OwnedTensor> out_copy;
  TensorView out_in = out;
  if (convert_inputs) {
    out_copy.emplace(kernel_dtype, shape_vector(out));
    out_in = out_copy->view;
  }
  for (const auto& [view, name] : {std::pair{&q_in, "query"},
                                   {&k_in, "key"},
                                   {&v_in, "value"},
                                   {&cache_in, "kv_cache (its active blocks)"}}) {
    TILELAB_REQUIRE(detail::offsets_fit_int32(*view))
        << name << ": expected element offsets below 2^31 (the kernels index with int32), got "
        << view->describe();
  }

  detail::install_halide_hooks();
  HalideView hq(q_in), hk(k_in), hv(v_in), hcache(cache_in), htable(table_in), hmask(mask);
  const PagedKernel kernel = pick_kernel(options.schedule, options.mixed_precision);
  auto run = [&](halide_buffer_t* blocks, halide_buffer_t* tiles, const CpuCall& call,
                 halide_buffer_t* result) {
    detail::halide_error_message_of_thread().clear();
    const int status = kernel(hq.get(), hk.get(), hv.get(), hcache.get(), htable.get(), hmask.get(),
                              scale, static_cast<int32_t>(options.large_tile_size), blocks, tiles,
                              call.count, call.first_tile, call.last_tile, result);
    TILELAB_CHECK(status == 0) << "generated paged attention kernel failed (status " << status
                               << "): " << detail::halide_error_message_of_thread();
  };
  if (options.schedule == PagedSchedule::tile) {
    // The tile schedule computes everything and writes out itself; the cpu inputs are unused.
    std::int32_t unused = 0;
    HalideView hblocks(TensorView(&unused, DType::i32, {1}));
    HalideView htiles(TensorView(&unused, DType::i32, {1, 1}));
    HalideView hout(out_in);
    run(hblocks.get(), htiles.get(), CpuCall{}, hout.get());
  } else {
    const std::int64_t group = num_heads / num_kv_heads, rows = schedules::kPagedCpuQueryTile;
    const std::int64_t num_tiles = context_len / options.large_tile_size;
    const std::int64_t num_query_blocks = schedules::paged::cpu_query_blocks(seq_q);
    std::vector<char> live(static_cast<std::size_t>(num_query_blocks * num_tiles), 1);
    if (options.skip_masked_tiles) {
      live = live_large_tiles(mask, seq_q, context_len, options.large_tile_size);
    }
    if (std::find(live.begin(), live.end(), 0) != live.end()) {
      // The bounds of schedules/paged/masked_tiles.hpp, over what the kernel reads: q (all
      // heads and positions), the active blocks' K and V and the new tokens' K and V.
      const std::int64_t per_block = num_kv_heads * block_size;
      const auto* table = static_cast<const std::int32_t*>(table_in.data());
      auto cache_vector = [&](std::int64_t kv, std::int64_t n) {
        const std::int64_t block = table[n / per_block * table_in.stride(0)];
        const std::int64_t kv_head = n % per_block / block_size, t = n % block_size;
        return kv * cache_in.stride(0) + block * cache_in.stride(1) + kv_head * cache_in.stride(2) +
               t * cache_in.stride(3);
      };
      const std::int64_t context_vectors = num_active_blocks * per_block;
      const Magnitudes q_m = magnitudes(
          q_in, num_heads * seq_q, head_dim, q_in.stride(2),
          [&](std::int64_t n) { return n / seq_q * q_in.stride(1) + n % seq_q * q_in.stride(3); });
      const Magnitudes k_cache = magnitudes(cache_in, context_vectors, head_dim, cache_in.stride(4),
                                            [&](std::int64_t n) { return cache_vector(0, n); });
      const Magnitudes v_cache = magnitudes(cache_in, context_vectors, head_dim, cache_in.stride(4),
                                            [&](std::int64_t n) { return cache_vector(1, n); });
      const Magnitudes k_new = magnitudes(
          k_in, num_kv_heads * seq_q, head_dim, k_in.stride(2),
          [&](std::int64_t n) { return n / seq_q * k_in.stride(1) + n % seq_q * k_in.stride(3); });
      const Magnitudes v_new = magnitudes(
          v_in, num_kv_heads * seq_q, head_dim, v_in.stride(3),
          [&](std::int64_t n) { return n / seq_q * v_in.stride(1) + n % seq_q * v_in.stride(2); });
      // 1.05: the kernel's bf16 rounding of q·scale and K and its fp32 accumulation.
      const double max_abs_score = 1.05 * std::abs(static_cast<double>(scale)) *
                                   std::sqrt(q_m.max_norm2) *
                                   std::sqrt(std::max(k_cache.max_norm2, k_new.max_norm2));
      const double max_abs_value = std::max(v_cache.max_abs, v_new.max_abs);
      const bool exact = schedules::paged::masked_tiles_vanish(
          max_abs_score, max_abs_value, static_cast<double>(context_len + seq_q));
      if (!exact) std::fill(live.begin(), live.end(), char{1});
    }
    const std::vector<CpuCall> calls = plan_cpu_calls(live, num_query_blocks, num_tiles);
    const DType out_dtype = out_in.dtype();
    const std::int64_t element = dtype_size(out_dtype);
    // Every call first, then the scatter: out stays untouched if a call fails.
    std::vector<OwnedTensor> call_rows;
    call_rows.reserve(calls.size());
    for (const CpuCall& call : calls) {
      const auto tasks = static_cast<std::int64_t>(call.blocks.size());
      std::vector<std::int32_t> blocks = call.blocks, tiles = call.tiles;
      HalideView hblocks(TensorView(blocks.data(), DType::i32, {tasks}));
      HalideView htiles(TensorView(tiles.data(), DType::i32,
                                   {tasks, static_cast<std::int64_t>(tiles.size()) / tasks}));
      // Rows per task: (kv head, g · tasks + task, row in the block, d).
      call_rows.emplace_back(
          out_dtype, std::vector<std::int64_t>{num_kv_heads, group * tasks, rows, head_dim});
      HalideView hrows(call_rows.back().view);
      run(hblocks.get(), htiles.get(), call, hrows.get());
    }
    auto* to = static_cast<char*>(out_in.data());
    for (std::size_t c = 0; c < calls.size(); ++c) {
      const std::vector<std::int32_t>& blocks = calls[c].blocks;
      const auto tasks = static_cast<std::int64_t>(blocks.size());
      const auto* from = static_cast<const char*>(call_rows[c].view.data());
#pragma omp parallel for collapse(2) schedule(static)
      for (std::int64_t h = 0; h < num_heads; ++h) {
        for (std::int64_t task = 0; task < tasks; ++task) {
          for (std::int64_t r = 0; r < rows; ++r) {
            const std::int64_t i = blocks[task] * rows + r;
            // Head h = hk · group + g is at (hk, g · tasks + task).
            const char* row = from + ((h * tasks + task) * rows + r) * head_dim * element;
            const std::int64_t at = h * out_in.stride(1) + i * out_in.stride(2);
            if (out_in.stride(3) == 1) {
              std::memcpy(to + at * element, row, static_cast<std::size_t>(head_dim * element));
            } else {
              for (std::int64_t d = 0; d < head_dim; ++d) {
                std::memcpy(to + (at + d * out_in.stride(3)) * element, row + d * element,
                            static_cast<std::size_t>(element));
              }
            }
          }
        }
      }
    }
  }
  if (convert_inputs) convert(out_in, out);
}

}  // namespace tilelab::nki
