// Flash paged attention tile program (vLLM nki_flash_attn.py @ 05eaa6ee, flash_paged_attention):
// block-table transform, vectorized K/V gathers with the block-size tiling trick, PE transposes,
// the running-max flash core per query tile and head, the causal new-token tile, normalization.
#include "sim/kernels/flash_paged_attention.hpp"

#include <algorithm>
#include <cmath>

#include <tilelab/detail/argument_checks.hpp>
#include <tilelab/error.hpp>

#include "sim/kernels/lib/flash_attention.hpp"

namespace tilelab::sim {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The kernel's own tiles (the flash core's are in lib::FlashWorkspace).
struct Buffers {
  TilePool k_gathered;  // [rows, chunks·d] cache dtype: the gather lands here
  TilePool k_cast;      // [rows, chunks·d] kernel dtype (only when the cache dtype differs)
  TilePool v_gathered;  // as k_gathered, for V
  TilePool k_t;         // [d, tile] kernel dtype: K transposed, columns in kernel order
  TilePool v;           // [P, chunks·d] kernel dtype
  TilePool mask;        // [P, tile] uint8
  TilePool kt_psum;     // [P, bank] fp32 PSUM: grouped K transposes
};

class Builder {
 public:
  Builder(const Machine& machine, const FlashPagedAttentionConfig& config)
      : m_(machine),
        c_(config),
        s_(effective_schedule(config)),
        b_(machine, "flash_paged_attention") {}

  Program build();

 private:
  void allocate();
  void load_block_tables();
  Tile transform_block_tables(int64_t head);
  void load_context_tile(int64_t head_index_tile_column, Tile index, Tile& k_t, Tile& v);
  void load_active_tile(int64_t head, Tile& k_t, Tile& v);
  // Key tile `key_tile` (what it fixes: k_t, v, keys, score and reduction tiles, causality)
  // against every query tile and query head of kv head `head`, reading the mask columns
  // [mask_column, mask_column + keys).
  void attend(int64_t head, const lib::FlashKeyTile& key_tile, int64_t mask_column);
  void finalize(int64_t head);

  const Machine& m_;
  const FlashPagedAttentionConfig& c_;
  const schedules::PagedAttentionSchedule s_;  // with the tiling factor applied
  ProgramBuilder b_;
  KvTileLayout layout_{};

  // Shapes.
  int64_t P_ = 0, d_ = 0, heads_ = 0, kv_heads_ = 0, group_ = 0, seq_q_ = 0, q_tiles_ = 0;
  int64_t large_ = 0, large_tiles_ = 0, blocks_per_tile_ = 0, bank_fp32_ = 0;
  int64_t chunks_ = 0;  // key chunks of `rows_per_load` per large tile
  DType kernel_dtype_ = DType::bf16, acc_dtype_ = DType::fp32;
  float scale_ = 1;

  Tensor query_, key_, value_, kv_cache_, block_tables_, mask_, output_;
  std::vector<Tile> block_tables_sbuf_;  // one per 128 large tiles
  Tile bt_folded_{}, bt_fp32_{};
  TilePool index_pool_{}, bt_psum_{};
  Buffers x_;
  lib::FlashWorkspace ws_;
};

void Builder::allocate() {
  const int64_t tile_max = std::max(large_, seq_q_);
  const int64_t active_chunks = seq_q_ / P_;
  const int64_t chunk_max = std::max(chunks_, active_chunks);
  const int64_t rows = layout_.partitions_per_load();
  const int kv = s_.kv_buffers;
  const int p = static_cast<int>(P_);
  const int d = static_cast<int>(d_);
  auto sbuf = [&](const char* name, int partitions, int64_t free, DType dtype, int buffers) {
    return b_.pool(name, Memory::sbuf, partitions, free, dtype, buffers);
  };
  x_.k_gathered = sbuf("k_gathered", static_cast<int>(rows), chunks_ * d_, c_.dtype, kv);
  x_.v_gathered = c_.dtype == kernel_dtype_
                      ? TilePool{}
                      : sbuf("v_gathered", static_cast<int>(rows), chunks_ * d_, c_.dtype, kv);
  x_.k_cast = c_.dtype == kernel_dtype_
                  ? TilePool{}
                  : sbuf("k_cast", static_cast<int>(rows), chunks_ * d_, kernel_dtype_, 1);
  x_.k_t = sbuf("cur_k_tile", d, tile_max, kernel_dtype_, kv);
  x_.v = sbuf("cur_v_tile", p, chunk_max * d_, kernel_dtype_, kv);
  x_.mask = sbuf("cur_mask", p, tile_max, DType::uint8, 2);
  lib::FlashWorkspaceShape shape;
  shape.partitions = P_;
  shape.head_dim = d_;
  shape.max_keys = tile_max;
  shape.max_score_pieces = ceil_div(tile_max, s_.free_tile);
  shape.max_reductions =
      std::max(large_ / s_.reduction_tile(), seq_q_ / schedules::paged::reduction_tile(seq_q_));
  shape.max_chunks = chunk_max;
  shape.accumulator_slots = q_tiles_ * group_;
  shape.input_dtype = c_.dtype;
  shape.kernel_dtype = kernel_dtype_;
  shape.acc_dtype = acc_dtype_;
  // PSUM: 8 banks = 2 score + 2 P-transpose + 2 P·V (the workspace) + 1 K-transpose + 1
  // block-table transpose.
  ws_ = lib::allocate_flash_workspace(b_, shape);
  x_.kt_psum = b_.pool("k_t_psum", Memory::psum, p, bank_fp32_, DType::fp32, 1);
}

// load_block_tables: the table seen as (large tiles, blocks per tile), large tiles on partitions,
// in chunks of P.
void Builder::load_block_tables() {
  for (int64_t chunk = 0; chunk < ceil_div(large_tiles_, P_); ++chunk) {
    const int64_t tiles = std::min(P_, large_tiles_ - chunk * P_);
    const Tile t = b_.sbuf_tile("block_tables_sbuf[" + std::to_string(chunk) + "]",
                                static_cast<int>(tiles), blocks_per_tile_, DType::int32);
    b_.dma_copy(b_.view(t),
                b_.hbm_pattern(block_tables_, chunk * P_ * blocks_per_tile_, blocks_per_tile_,
                               static_cast<int>(tiles), {{blocks_per_tile_, 1}}));
    block_tables_sbuf_.push_back(t);
  }
  const int64_t tiles = std::min(P_, large_tiles_);
  const int64_t row_elements = blocks_per_tile_ * layout_.tiling_factor();
  bt_folded_ =
      b_.sbuf_tile("block_tables_folded", static_cast<int>(tiles), row_elements, DType::int32);
  bt_fp32_ = b_.sbuf_tile("block_tables_fp32", static_cast<int>(tiles),
                          layout_.partitions_per_load(), DType::fp32);
  index_pool_ = b_.pool("block_tables_transposed", Memory::sbuf,
                        static_cast<int>(layout_.partitions_per_load()),
                        layout_.loads_per_large_tile() * large_tiles_, DType::int32, 2);
  bt_psum_ = b_.pool("block_tables_psum", Memory::psum,
                     static_cast<int>(layout_.partitions_per_load()), tiles, DType::fp32, 1);
}

// transform_block_tables_for_indirect_load: row of the flattened cache for (block, head, piece)
// = (block·n_kv_heads + head)·f + piece, then transposed so that the rows of one gather lie on
// the partitions: index[l][p, tile] for gather l of large tile `tile`.
Tile Builder::transform_block_tables(int64_t head) {
  const int64_t f = layout_.tiling_factor();
  const int64_t rows = layout_.partitions_per_load();
  const Tile index = b_.next(index_pool_);
  for (size_t chunk = 0; chunk < block_tables_sbuf_.size(); ++chunk) {
    const Tile bt = block_tables_sbuf_[chunk];
    const int tiles = static_cast<int>(b_.view(bt).partition_count);
    // Fold heads and pieces on GpSimd (integer ALU; keeps VectorE free): one strided write per
    // piece j, (block · n_kv_heads·f) + (head·f + j).
    for (int64_t j = 0; j < f; ++j)
      b_.tensor_scalar(b_.view(bt_folded_, 0, tiles, j, blocks_per_tile_, f),
                       b_.view(bt, 0, tiles, 0, blocks_per_tile_), AluOp::multiply,
                       Scalar::constant(static_cast<float>(kv_heads_ * f)), AluOp::add,
                       Scalar::constant(static_cast<float>(head * f + j)), Engine::gpsimd);
    // Transpose on the PE array (through fp32: exact below 2^24, checked in build()).
    for (int64_t load = 0; load < layout_.loads_per_large_tile(); ++load) {
      const TileRef src = b_.view(bt_folded_, 0, tiles, load * rows, rows);
      const TileRef as_float = b_.view(bt_fp32_, 0, tiles, 0, rows);
      b_.tensor_copy(as_float, src, Engine::gpsimd);
      const Tile psum = b_.next(bt_psum_);
      const TileRef transposed = b_.view(psum, 0, static_cast<int>(rows), 0, tiles);
      b_.pe_transpose(transposed, as_float);
      b_.tensor_copy(b_.view(index, 0, static_cast<int>(rows),
                             load * large_tiles_ + static_cast<int64_t>(chunk) * P_, tiles),
                     transposed, Engine::vector);
    }
  }
  return index;
}

// load_kv_tile_from_cache: `loads` gathers of `rows` rows (tiled_block_size·d contiguous elements
// each) for K and for V, then K transposed on the PE array into (d, keys).
void Builder::load_context_tile(int64_t tile, Tile index, Tile& k_t, Tile& v) {
  const int64_t rows = layout_.partitions_per_load();
  const int64_t run = layout_.tiled_block_size() * d_;
  const Tile k_gathered = b_.next(x_.k_gathered);
  lib::gather_kv(b_, k_gathered, kv_cache_, 0, index, tile, large_tiles_,
                 layout_.loads_per_large_tile(), rows, run);
  Tile k_source = k_gathered;
  if (c_.dtype != kernel_dtype_) {  // nl.copy(loaded, dtype=kernel_dtype)
    k_source = b_.next(x_.k_cast);
    b_.tensor_copy(b_.view(k_source), b_.view(k_gathered), Engine::gpsimd);
  }
  // Chunk j of the gathered tile holds token piece j of every row: transposing it gives score
  // columns [j·rows, (j+1)·rows). A PSUM bank takes bank_fp32 / rows of them; ScalarE evicts
  // (VectorE carries the masked fill and the max reductions).
  k_t = b_.next(x_.k_t);
  std::vector<TileRef> sources;
  for (int64_t j = 0; j < chunks_; ++j)
    sources.push_back(b_.view(k_source, 0, static_cast<int>(rows), j * d_, d_));
  lib::transpose_chunks(b_, k_t, d_, sources, rows, std::max<int64_t>(1, bank_fp32_ / rows),
                        s_.transpose, Engine::scalar, x_.kt_psum);
  v = b_.next(x_.v);
  if (c_.dtype == kernel_dtype_) {
    lib::gather_kv(b_, v, kv_cache_, 1, index, tile, large_tiles_, layout_.loads_per_large_tile(),
                   rows, run);
  } else {
    const Tile v_gathered = b_.next(x_.v_gathered);
    lib::gather_kv(b_, v_gathered, kv_cache_, 1, index, tile, large_tiles_,
                   layout_.loads_per_large_tile(), rows, run);
    b_.tensor_copy(b_.view(v, 0, static_cast<int>(rows), 0, chunks_ * d_), b_.view(v_gathered),
                   Engine::gpsimd);
  }
}

// The new tokens: K (d, seq_q) in one load, V in P-row loads (natural order: no reordering).
void Builder::load_active_tile(int64_t head, Tile& k_t, Tile& v) {
  const int d = static_cast<int>(d_);
  const int p = static_cast<int>(P_);
  k_t = b_.next(x_.k_t);
  v = b_.next(x_.v);
  if (c_.dtype == kernel_dtype_) {
    b_.dma_copy(b_.view(k_t, 0, d, 0, seq_q_), b_.hbm_rows(key_, 0, d_, 0, seq_q_, head));
    for (int64_t chunk = 0; chunk < seq_q_ / P_; ++chunk)
      b_.dma_copy(b_.view(v, 0, p, chunk * d_, d_),
                  b_.hbm_rows(value_, chunk * P_, P_, 0, d_, head));
    return;
  }
  // Cast copies through the raw gather buffers (free during this phase).
  const Tile raw = b_.sbuf_tile("key_raw", d, seq_q_, c_.dtype);
  b_.dma_copy(b_.view(raw), b_.hbm_rows(key_, 0, d_, 0, seq_q_, head));
  b_.tensor_copy(b_.view(k_t, 0, d, 0, seq_q_), b_.view(raw), Engine::gpsimd);
  b_.release(raw);
  const Tile v_raw = b_.sbuf_tile("value_raw", p, seq_q_ / P_ * d_, c_.dtype);
  for (int64_t chunk = 0; chunk < seq_q_ / P_; ++chunk)
    b_.dma_copy(b_.view(v_raw, 0, p, chunk * d_, d_),
                b_.hbm_rows(value_, chunk * P_, P_, 0, d_, head));
  b_.tensor_copy(b_.view(v, 0, p, 0, seq_q_ / P_ * d_), b_.view(v_raw), Engine::gpsimd);
  b_.release(v_raw);
}

// out = o · exp(m - l) in the kernel dtype, stored to output[head·group + i_q_h, tile].
void Builder::attend(int64_t head, const lib::FlashKeyTile& key_tile, int64_t mask_column) {
  for (int64_t i = 0; i < q_tiles_; ++i) {
    const Tile mask = b_.next(x_.mask);
    b_.dma_copy(b_.view(mask, 0, static_cast<int>(P_), 0, key_tile.keys),
                b_.hbm_rows(mask_, i * P_, P_, mask_column, key_tile.keys));
    for (int64_t qh = 0; qh < group_; ++qh) {
      lib::FlashKeyTile x = key_tile;
      x.q = lib::load_flash_query(b_, ws_, query_, head * group_ + qh, i * P_, P_, scale_);
      x.mask = mask;
      if (x.causal) x.query_row0 = i * P_;
      lib::flash_core(b_, ws_, x, lib::flash_accumulator(b_, ws_, i * group_ + qh), s_.transpose);
    }
  }
}

void Builder::finalize(int64_t head) {
  for (int64_t qh = 0; qh < group_; ++qh)
    for (int64_t i = 0; i < q_tiles_; ++i)
      lib::finalize_flash(b_, ws_, lib::flash_accumulator(b_, ws_, i * group_ + qh),
                          b_.hbm_rows(output_, i * P_, P_, 0, d_, head * group_ + qh), P_);
}

Program Builder::build() {
  const auto& shape = c_.shape;
  s_.validate(shape);
  TILELAB_REQUIRE(s_.partition_tile == m_.partitions)
      << "partition_tile (B_P_SIZE): " << s_.partition_tile << " but machine '" << m_.name
      << "' has " << m_.partitions << " partitions";
  bank_fp32_ = m_.psum_bank_bytes_per_partition / dtype_size(DType::fp32);
  TILELAB_REQUIRE(s_.free_tile == bank_fp32_)
      << "free_tile (B_F_SIZE): " << s_.free_tile << " but one PSUM bank of machine '" << m_.name
      << "' holds " << bank_fp32_ << " fp32";
  TILELAB_REQUIRE(s_.free_tile <= m_.matmul_max_moving_free)
      << "free_tile (B_F_SIZE): " << s_.free_tile << " exceeds matmul_max_moving_free "
      << m_.matmul_max_moving_free;
  TILELAB_REQUIRE(c_.dtype == DType::bf16 || c_.dtype == DType::fp16 || c_.dtype == DType::fp32)
      << "dtype: expected bf16, fp16 or fp32, got " << dtype_name(c_.dtype);
  TILELAB_REQUIRE(s_.transpose != schedules::TransposeMethod::dma || m_.dma_transpose_supported)
      << "transpose: 'dma' needs a machine with DMA transposes (NeuronCore-v3); machine '"
      << m_.name << "' has dma_transpose_supported = false; use transpose=pe";
  layout_ = kv_tile_layout(c_);

  P_ = s_.partition_tile;
  d_ = shape.head_dim;
  heads_ = shape.num_heads;
  kv_heads_ = shape.num_kv_heads;
  group_ = heads_ / kv_heads_;
  seq_q_ = shape.query_len;
  q_tiles_ = seq_q_ / P_;
  large_ = s_.large_tile_size;
  blocks_per_tile_ = s_.num_blocks_per_large_tile();
  large_tiles_ = shape.num_active_blocks * s_.block_size / large_;
  chunks_ = large_ / layout_.partitions_per_load();
  kernel_dtype_ = s_.mixed_precision ? DType::bf16 : c_.dtype;
  acc_dtype_ = s_.mixed_precision ? DType::fp32 : c_.dtype;
  scale_ = tilelab::detail::resolve_softmax_scale(c_.softmax_scale, d_);
  TILELAB_REQUIRE(c_.num_cache_blocks >= 1)
      << "num_cache_blocks: expected at least 1, got " << c_.num_cache_blocks;
  const int64_t cache_rows = c_.num_cache_blocks * kv_heads_ * layout_.tiling_factor();
  TILELAB_REQUIRE(cache_rows < (int64_t(1) << 24))
      << "num_cache_blocks: " << c_.num_cache_blocks << " blocks x " << kv_heads_
      << " kv heads x tiling factor " << layout_.tiling_factor()
      << " rows exceed 2^24 (block-table rows are transposed through fp32)";

  query_ = b_.hbm_tensor("query", {1, heads_, d_, seq_q_}, c_.dtype);
  key_ = b_.hbm_tensor("key", {1, kv_heads_, d_, seq_q_}, c_.dtype);
  value_ = b_.hbm_tensor("value", {1, kv_heads_, seq_q_, d_}, c_.dtype);
  kv_cache_ = b_.hbm_tensor("kv_cache", {2, cache_rows, layout_.tiled_block_size() * d_}, c_.dtype);
  block_tables_ = b_.hbm_tensor("block_tables", {shape.num_active_blocks}, DType::int32);
  mask_ = b_.hbm_tensor("mask", {seq_q_, shape.num_active_blocks * s_.block_size + seq_q_},
                        DType::uint8);
  output_ = b_.hbm_tensor("output", {1, heads_, seq_q_, d_}, c_.dtype);

  load_block_tables();
  allocate();
  const int64_t context_len = large_tiles_ * large_;
  // The new tokens form one tile of seq_q keys: B_F_SIZE = min(seq_q, free_tile),
  const int64_t active_score_tile = std::min(seq_q_, s_.free_tile);
  const int64_t active_reduction = schedules::paged::reduction_tile(seq_q_);

  for (int64_t head = 0; head < kv_heads_; ++head) {
    const Tile index = transform_block_tables(head);
    for (int64_t tile = 0; tile < large_tiles_; ++tile) {
      lib::FlashKeyTile context;
      load_context_tile(tile, index, context.k_t, context.v);
      context.keys = large_;
      context.score_tile = s_.free_tile;
      context.rows = layout_.partitions_per_load();
      context.reduction = s_.reduction_tile();
      context.initialize = tile == 0;
      attend(head, context, tile * large_);
    }
    // The new tokens, with the causal mask and tile skipping.
    lib::FlashKeyTile active;
    load_active_tile(head, active.k_t, active.v);
    active.keys = seq_q_;
    active.score_tile = active_score_tile;
    active.rows = P_;
    active.reduction = active_reduction;
    active.causal = true;
    active.initialize = false;
    attend(head, active, context_len);
    finalize(head);
  }
  return b_.finish();
}

}  // namespace

schedules::PagedAttentionSchedule effective_schedule(const FlashPagedAttentionConfig& config) {
  config.schedule.validate();
  return config.schedule;
}

KvTileLayout kv_tile_layout(const FlashPagedAttentionConfig& config) {
  return effective_schedule(config).kv_gather_tiling();
}

std::vector<int64_t> context_token_of_column(const KvTileLayout& layout, int64_t large_tile_size) {
  std::vector<int64_t> token(static_cast<size_t>(large_tile_size));
  for (int64_t c = 0; c < large_tile_size; ++c)
    token[static_cast<size_t>(c)] = layout.token_of_column(c);
  return token;
}

std::vector<uint8_t> reorder_context_mask(const std::vector<uint8_t>& mask, int64_t query_len,
                                          int64_t context_len, const KvTileLayout& layout,
                                          int64_t large_tile_size) {
  const int64_t columns = context_len + query_len;
  TILELAB_REQUIRE(static_cast<int64_t>(mask.size()) == query_len * columns)
      << "mask: expected " << query_len << " x " << columns << " elements, got " << mask.size();
  TILELAB_REQUIRE(context_len % large_tile_size == 0)
      << "mask: context length " << context_len << " is not a multiple of large_tile_size "
      << large_tile_size;
  const std::vector<int64_t> token = context_token_of_column(layout, large_tile_size);
  std::vector<uint8_t> out(mask);
  for (int64_t q = 0; q < query_len; ++q)
    for (int64_t tile = 0; tile < context_len / large_tile_size; ++tile)
      for (int64_t c = 0; c < large_tile_size; ++c)
        out[size_t(q * columns + tile * large_tile_size + c)] =
            mask[size_t(q * columns + tile * large_tile_size + token[size_t(c)])];
  return out;
}

namespace {
FlashPagedAttentionConfig config_of(const schedules::PagedAttentionSchedule& schedule,
                                    const PagedAttentionBatchShape& batch, int64_t num_heads,
                                    int64_t num_kv_heads, int64_t head_dim, DType dtype) {
  FlashPagedAttentionConfig config;
  config.schedule = schedule;
  config.shape = {num_heads, num_kv_heads, head_dim, batch.query_len, batch.num_active_blocks};
  config.num_cache_blocks = batch.num_cache_blocks;
  config.dtype = dtype;
  return config;
}
}  // namespace

FlashPagedAttentionConfig paged_attention_config(const schedules::PagedAttentionSchedule& schedule,
                                                 const std::vector<PagedAttentionRequest>& requests,
                                                 int64_t num_heads, int64_t num_kv_heads,
                                                 int64_t head_dim, DType dtype) {
  return config_of(schedule, paged_attention_batch_shape(requests, schedule), num_heads,
                   num_kv_heads, head_dim, dtype);
}

PagedAttentionRun paged_attention_run(const schedules::PagedAttentionSchedule& schedule,
                                      const std::vector<PagedAttentionRequest>& requests,
                                      int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                                      DType dtype, uint32_t seed) {
  PagedAttentionRun r;
  r.batch = make_paged_attention_batch(requests, schedule, seed);
  r.config =
      config_of(schedule, {r.batch.query_len, r.batch.num_active_blocks, r.batch.num_cache_blocks},
                num_heads, num_kv_heads, head_dim, dtype);
  return r;
}

Program build_flash_paged_attention(const Machine& machine,
                                    const FlashPagedAttentionConfig& config) {
  return Builder(machine, config).build();
}

}  // namespace tilelab::sim
