// Flash paged attention tile program (vLLM nki_flash_attn.py @ 05eaa6ee, flash_paged_attention):
// block-table transform, vectorized K/V gathers with the block-size tiling trick, PE transposes,
// the running-max flash core per query tile and head, the causal new-token tile, normalization.
#include "sim/kernels/flash_paged_attention.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <sstream>

#include <tilelab/error.hpp>

#include "sim/kernels/lib/flash_attention.hpp"
#include "sim/kernels/registry.hpp"

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
  void finalize(int64_t head);

  const Machine& m_;
  const FlashPagedAttentionConfig& c_;
  const schedules::PagedAttentionSchedule s_;  // with the tiling factor applied
  ProgramBuilder b_;
  KvTileLayout layout_;

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
  const int64_t rows = layout_.rows_per_load;
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
      std::max(large_ / s_.reduction_tile(), seq_q_ / std::min<int64_t>(2048, seq_q_ / 2));
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
  const int64_t row_elements = blocks_per_tile_ * layout_.tiling_factor;
  bt_folded_ =
      b_.sbuf_tile("block_tables_folded", static_cast<int>(tiles), row_elements, DType::int32);
  bt_fp32_ = b_.sbuf_tile("block_tables_fp32", static_cast<int>(tiles), layout_.rows_per_load,
                          DType::fp32);
  index_pool_ =
      b_.pool("block_tables_transposed", Memory::sbuf, static_cast<int>(layout_.rows_per_load),
              layout_.loads * large_tiles_, DType::int32, 2);
  bt_psum_ = b_.pool("block_tables_psum", Memory::psum, static_cast<int>(layout_.rows_per_load),
                     tiles, DType::fp32, 1);
}

// transform_block_tables_for_indirect_load: row of the flattened cache for (block, head, piece)
// = (block·n_kv_heads + head)·f + piece, then transposed so that the rows of one gather lie on
// the partitions: index[l][p, tile] for gather l of large tile `tile`.
Tile Builder::transform_block_tables(int64_t head) {
  const int64_t f = layout_.tiling_factor;
  const int64_t rows = layout_.rows_per_load;
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
    for (int64_t load = 0; load < layout_.loads; ++load) {
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
  const int64_t rows = layout_.rows_per_load;
  const int64_t run = layout_.tiled_block_size * d_;
  const Tile k_gathered = b_.next(x_.k_gathered);
  lib::gather_kv(b_, k_gathered, kv_cache_, 0, index, tile, large_tiles_, layout_.loads, rows, run);
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
    lib::gather_kv(b_, v, kv_cache_, 1, index, tile, large_tiles_, layout_.loads, rows, run);
  } else {
    const Tile v_gathered = b_.next(x_.v_gathered);
    lib::gather_kv(b_, v_gathered, kv_cache_, 1, index, tile, large_tiles_, layout_.loads, rows,
                   run);
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
  chunks_ = large_ / layout_.rows_per_load;
  kernel_dtype_ = s_.mixed_precision ? DType::bf16 : c_.dtype;
  acc_dtype_ = s_.mixed_precision ? DType::fp32 : c_.dtype;
  scale_ = c_.softmax_scale > 0 ? c_.softmax_scale : 1.0f / std::sqrt(static_cast<float>(d_));
  TILELAB_REQUIRE(c_.num_cache_blocks >= 1)
      << "num_cache_blocks: expected at least 1, got " << c_.num_cache_blocks;
  const int64_t cache_rows = c_.num_cache_blocks * kv_heads_ * layout_.tiling_factor;
  TILELAB_REQUIRE(cache_rows < (int64_t(1) << 24))
      << "num_cache_blocks: " << c_.num_cache_blocks << " blocks x " << kv_heads_
      << " kv heads x tiling factor " << layout_.tiling_factor
      << " rows exceed 2^24 (block-table rows are transposed through fp32)";

  query_ = b_.hbm_tensor("query", {1, heads_, d_, seq_q_}, c_.dtype);
  key_ = b_.hbm_tensor("key", {1, kv_heads_, d_, seq_q_}, c_.dtype);
  value_ = b_.hbm_tensor("value", {1, kv_heads_, seq_q_, d_}, c_.dtype);
  kv_cache_ = b_.hbm_tensor("kv_cache", {2, cache_rows, layout_.tiled_block_size * d_}, c_.dtype);
  block_tables_ = b_.hbm_tensor("block_tables", {shape.num_active_blocks}, DType::int32);
  mask_ = b_.hbm_tensor("mask", {seq_q_, shape.num_active_blocks * s_.block_size + seq_q_},
                        DType::uint8);
  output_ = b_.hbm_tensor("output", {1, heads_, seq_q_, d_}, c_.dtype);

  load_block_tables();
  allocate();
  const int64_t context_len = large_tiles_ * large_;
  // The new tokens form one tile of seq_q keys: B_F_SIZE = min(seq_q, free_tile),
  // REDUCTION_TILE = min(2048, seq_q / 2) as in the kernel.
  const int64_t active_score_tile = std::min(seq_q_, s_.free_tile);
  const int64_t active_reduction = std::min<int64_t>(2048, seq_q_ / 2);

  for (int64_t head = 0; head < kv_heads_; ++head) {
    const Tile index = transform_block_tables(head);
    for (int64_t tile = 0; tile < large_tiles_; ++tile) {
      Tile k_t, v;
      load_context_tile(tile, index, k_t, v);
      for (int64_t i = 0; i < q_tiles_; ++i) {
        const Tile mask = b_.next(x_.mask);
        b_.dma_copy(b_.view(mask, 0, static_cast<int>(P_), 0, large_),
                    b_.hbm_rows(mask_, i * P_, P_, tile * large_, large_));
        for (int64_t qh = 0; qh < group_; ++qh) {
          lib::FlashKeyTile x;
          x.q = lib::load_flash_query(b_, ws_, query_, head * group_ + qh, i * P_, P_, scale_);
          x.k_t = k_t;
          x.v = v;
          x.mask = mask;
          x.keys = large_;
          x.score_tile = s_.free_tile;
          x.rows = layout_.rows_per_load;
          x.reduction = s_.reduction_tile();
          x.initialize = tile == 0;
          lib::flash_core(b_, ws_, x, lib::flash_accumulator(b_, ws_, i * group_ + qh),
                          s_.transpose);
        }
      }
    }
    // The new tokens, with the causal mask and tile skipping.
    Tile k_t, v;
    load_active_tile(head, k_t, v);
    for (int64_t i = 0; i < q_tiles_; ++i) {
      const Tile mask = b_.next(x_.mask);
      b_.dma_copy(b_.view(mask, 0, static_cast<int>(P_), 0, seq_q_),
                  b_.hbm_rows(mask_, i * P_, P_, context_len, seq_q_));
      for (int64_t qh = 0; qh < group_; ++qh) {
        lib::FlashKeyTile x;
        x.q = lib::load_flash_query(b_, ws_, query_, head * group_ + qh, i * P_, P_, scale_);
        x.k_t = k_t;
        x.v = v;
        x.mask = mask;
        x.keys = seq_q_;
        x.score_tile = active_score_tile;
        x.rows = P_;
        x.reduction = active_reduction;
        x.causal = true;
        x.query_row0 = i * P_;
        x.initialize = false;
        lib::flash_core(b_, ws_, x, lib::flash_accumulator(b_, ws_, i * group_ + qh), s_.transpose);
      }
    }
    finalize(head);
  }
  return b_.finish();
}

std::vector<int64_t> parse_list(const std::string& text, const std::string& name) {
  std::vector<int64_t> values;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    size_t used = 0;
    int64_t v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TILELAB_REQUIRE(used == item.size() && v >= 0)
        << "parameter '" << name << "': expected non-negative integers separated by commas, got '"
        << text << "'";
    values.push_back(v);
  }
  return values;
}

}  // namespace

schedules::PagedAttentionSchedule effective_schedule(const FlashPagedAttentionConfig& config) {
  config.schedule.validate();
  return config.schedule;
}

KvTileLayout kv_tile_layout(const FlashPagedAttentionConfig& config) {
  const schedules::PagedAttentionSchedule s = effective_schedule(config);
  KvTileLayout layout;
  layout.tiling_factor = s.block_size_tiling_factor();
  layout.tiled_block_size = s.tiled_block_size();
  layout.rows_per_load = s.partitions_per_load();
  layout.loads = s.loads_per_large_tile();
  return layout;
}

std::vector<int64_t> context_token_of_column(const KvTileLayout& layout, int64_t large_tile_size) {
  std::vector<int64_t> token(static_cast<size_t>(large_tile_size));
  const int64_t rows = layout.rows_per_load, tiled = layout.tiled_block_size;
  for (int64_t load = 0; load < layout.loads; ++load)
    for (int64_t t = 0; t < tiled; ++t)
      for (int64_t p = 0; p < rows; ++p)
        token[static_cast<size_t>((load * tiled + t) * rows + p)] = (load * rows + p) * tiled + t;
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

Program build_flash_paged_attention(const Machine& machine,
                                    const FlashPagedAttentionConfig& config) {
  return Builder(machine, config).build();
}

PagedAttentionBatch make_paged_attention_batch(const std::vector<PagedAttentionRequest>& requests,
                                               int64_t block_size, int64_t large_tile_size,
                                               int64_t partition_tile, uint32_t seed) {
  TILELAB_REQUIRE(!requests.empty()) << "requests: expected at least one request";
  TILELAB_REQUIRE(block_size >= 1 && large_tile_size % block_size == 0)
      << "block_size: " << block_size << " must divide large_tile_size " << large_tile_size;
  PagedAttentionBatch batch;
  int64_t queries = 0, blocks = 0;
  for (const auto& r : requests) {
    TILELAB_REQUIRE(r.query_len >= 1 && r.context_len >= 0)
        << "requests: query length must be >= 1 and context length >= 0, got " << r.query_len
        << " and " << r.context_len;
    queries += r.query_len;
    blocks += ceil_div(r.context_len, block_size);
  }
  const int64_t blocks_per_tile = large_tile_size / block_size;
  batch.query_len = std::max<int64_t>(1, ceil_div(queries, partition_tile)) * partition_tile;
  batch.num_active_blocks =
      std::max<int64_t>(1, ceil_div(blocks, blocks_per_tile)) * blocks_per_tile;
  // Spare cache blocks so that the table is a scattered choice, as in a long-running server.
  batch.num_cache_blocks = batch.num_active_blocks + batch.num_active_blocks / 2 + 1;
  std::vector<int32_t> free_blocks(static_cast<size_t>(batch.num_cache_blocks));
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  batch.block_tables.assign(static_cast<size_t>(batch.num_active_blocks), 0);
  for (int64_t i = 0; i < blocks; ++i) batch.block_tables[size_t(i)] = free_blocks[size_t(i)];
  // Padding entries point at a real block (any row may be read) and are masked out.
  for (int64_t i = blocks; i < batch.num_active_blocks; ++i)
    batch.block_tables[size_t(i)] = free_blocks[size_t(blocks % batch.num_cache_blocks)];

  const int64_t context = batch.num_active_blocks * block_size;
  const int64_t columns = context + batch.query_len;
  batch.mask.assign(size_t(batch.query_len * columns), 0);
  batch.request_of_row.assign(size_t(batch.query_len), -1);
  int64_t row0 = 0, block0 = 0;
  for (size_t r = 0; r < requests.size(); ++r) {
    const auto& req = requests[r];
    for (int64_t j = 0; j < req.query_len; ++j) {
      const int64_t row = row0 + j;
      batch.request_of_row[size_t(row)] = int64_t(r);
      uint8_t* line = &batch.mask[size_t(row * columns)];
      for (int64_t t = 0; t < req.context_len; ++t) line[block0 * block_size + t] = 1;
      for (int64_t k = 0; k <= j; ++k) line[context + row0 + k] = 1;  // causal among new tokens
    }
    row0 += req.query_len;
    block0 += ceil_div(req.context_len, block_size);
  }
  return batch;
}

std::vector<PagedAttentionRequest> default_paged_attention_requests() {
  // 4 prefill requests with context, then 12 decode requests (one new token each): 500 + 12 =
  // 512 query rows (4 tiles); contexts of whole 32-token blocks summing to 16384 tokens =
  // 8 large tiles of 2048.
  std::vector<PagedAttentionRequest> requests = {{160, 2048}, {96, 1024}, {128, 3072}, {116, 512}};
  for (int64_t context : {512, 1024, 768, 640, 896, 1152, 384, 1280, 640, 768, 896, 768})
    requests.push_back({1, context});
  return requests;
}

std::string format_paged_attention_requests(const std::vector<PagedAttentionRequest>& requests,
                                            bool prefill) {
  std::string out;
  for (const auto& r : requests) {
    if ((r.query_len > 1) != prefill) continue;
    if (!out.empty()) out += ",";
    out += prefill ? std::to_string(r.query_len) + ":" + std::to_string(r.context_len)
                   : std::to_string(r.context_len);
  }
  return out;
}

namespace {

std::vector<PagedAttentionRequest> requests_from(const KernelParameters& p) {
  std::vector<PagedAttentionRequest> requests;
  std::stringstream in(p.at("prefill"));
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    const auto colon = item.find(':');
    TILELAB_REQUIRE(colon != std::string::npos)
        << "parameter 'prefill': expected QUERY_LEN:CONTEXT_LEN pairs separated by commas, got '"
        << p.at("prefill") << "'";
    const auto q = parse_list(item.substr(0, colon), "prefill");
    const auto c = parse_list(item.substr(colon + 1), "prefill");
    TILELAB_REQUIRE(q.size() == 1 && c.size() == 1 && q[0] >= 1)
        << "parameter 'prefill': bad pair '" << item << "' (QUERY_LEN >= 1 : CONTEXT_LEN)";
    requests.push_back({q[0], c[0]});
  }
  for (int64_t context : parse_list(p.at("decode"), "decode")) requests.push_back({1, context});
  TILELAB_REQUIRE(!requests.empty()) << "parameters 'prefill' and 'decode': no requests given";
  return requests;
}

struct ResolvedPaged {
  FlashPagedAttentionConfig config;
  PagedAttentionBatch batch;
};

ResolvedPaged resolve_paged(const KernelParameters& p) {
  ResolvedPaged r;
  auto& s = r.config.schedule;
  s.large_tile_size = parameter_int(p, "large_tile_size", 1, 1 << 20);
  s.block_size = parameter_int(p, "block_size", 1, 1 << 20);
  s.kv_buffers = static_cast<int>(parameter_int(p, "kv_buffers", 0, 64));
  s.mixed_precision = parameter_choice(p, "mixed_precision", {"true", "false"}) == "true";
  s.transpose = parameter_choice(p, "transpose", {"pe", "dma"}) == "dma"
                    ? schedules::TransposeMethod::dma
                    : schedules::TransposeMethod::pe;
  s.validate();
  auto& shape = r.config.shape;
  shape.num_heads = parameter_int(p, "num_heads", 1, 4096);
  shape.num_kv_heads = parameter_int(p, "num_kv_heads", 1, 4096);
  shape.head_dim = parameter_int(p, "head_dim", 1, 1 << 20);
  r.config.dtype = parameter_dtype(p, "dtype");
  // The CLI's tiling_factor sets the schedule field (validated with the schedule below).
  const std::string factor = p.at("tiling_factor");
  s.block_size_tiling_factor_override =
      factor == "auto" ? 0 : parameter_int(p, "tiling_factor", 1, s.partition_tile);
  s.validate();
  const int64_t seed = parameter_int(p, "seed", 0, UINT32_MAX);
  r.batch = make_paged_attention_batch(requests_from(p), s.block_size, s.large_tile_size,
                                       s.partition_tile, static_cast<uint32_t>(seed));
  shape.query_len = r.batch.query_len;
  shape.num_active_blocks = r.batch.num_active_blocks;
  r.config.num_cache_blocks = r.batch.num_cache_blocks;
  return r;
}

}  // namespace

void tilelab_sim_register_flash_paged_attention(KernelRegistry& registry) {
  const schedules::PagedAttentionSchedule defaults;
  const auto requests = default_paged_attention_requests();
  KernelInfo info;
  info.name = "paged-attention";
  info.description =
      "vLLM NKI flash_paged_attention (per kv head: block-table transform, vectorized K/V "
      "gathers with the block-size tiling trick, PE transposes, running-max softmax, causal "
      "new-token tile). Default batch: 4 prefill requests (query:context 160:2048, 96:1024, "
      "128:3072, 116:512) + 12 decode requests (1 token each) = 512 query rows, context "
      "16384 tokens = 512 blocks of 32 = 8 large tiles of 2048; 32 q heads, 8 kv heads, d 128, "
      "bf16 on trn1";
  info.default_machine = "trn1";
  info.parameters = {
      {"num_heads", "32", "query heads"},
      {"num_kv_heads", "8", "kv heads (the kernel's grid; num_heads / num_kv_heads = GQA group)"},
      {"head_dim", "128", "d (<= 128)"},
      {"dtype", "bf16", "bf16 | fp16 | fp32: query/key/value/kv_cache/output"},
      {"block_size", std::to_string(defaults.block_size), "tokens per KV-cache block"},
      {"large_tile_size", std::to_string(defaults.large_tile_size),
       "LARGE_TILE_SZ: context tokens per gather / softmax merge"},
      {"mixed_precision", defaults.mixed_precision ? "true" : "false",
       "true: bf16 TensorE inputs, fp32 accumulation and statistics"},
      {"transpose", schedules::transpose_method_name(defaults.transpose),
       "pe | dma (dma needs NeuronCore-v3, e.g. --machine trn2)"},
      {"kv_buffers", std::to_string(defaults.kv_buffers), "K/V large-tile buffers (1-4)"},
      {"tiling_factor", "auto",
       "auto (= 128 / blocks per large tile when that is > 1) or a forced power of two; 1 "
       "turns the block-size tiling trick off"},
      {"prefill", format_paged_attention_requests(requests, true),
       "prefill requests QUERY_LEN:CONTEXT_LEN,..."},
      {"decode", format_paged_attention_requests(requests, false),
       "decode requests (1 new token each): CONTEXT_LEN,..."},
      {"seed", "1", "block placement in the cache (shuffled)"},
  };
  info.build = [](const Machine& machine, const KernelParameters& p) {
    const ResolvedPaged r = resolve_paged(p);
    return build_flash_paged_attention(machine, r.config);
  };
  info.writes_reports_by_default = true;
  // The block-size tiling trick made visible: the same batch with the trick turned off.
  info.default_comparisons = {"tiling_factor=1"};
  info.functional_inputs = [](const KernelParameters& p) {
    const ResolvedPaged r = resolve_paged(p);
    std::map<std::string, std::vector<float>> inputs;
    inputs["block_tables"].assign(r.batch.block_tables.begin(), r.batch.block_tables.end());
    const auto reordered = reorder_context_mask(
        r.batch.mask, r.batch.query_len, r.batch.num_active_blocks * r.config.schedule.block_size,
        kv_tile_layout(r.config), r.config.schedule.large_tile_size);
    inputs["mask"].assign(reordered.begin(), reordered.end());
    return inputs;
  };
  registry.add(std::move(info));
}

}  // namespace tilelab::sim
