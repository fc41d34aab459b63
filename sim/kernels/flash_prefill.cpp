// Flash prefill attention: the kernel on the flash-attention library routines, and its registry
// entry (`tilelab sim flash-prefill`).
#include "sim/kernels/flash_prefill.hpp"

#include <algorithm>
#include <cmath>

#include <tilelab/error.hpp>

#include "sim/kernels/lib/flash_attention.hpp"
#include "sim/kernels/registry.hpp"

namespace tilelab::sim {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

class PrefillBuilder {
 public:
  PrefillBuilder(const Machine& machine, const FlashPrefillConfig& config)
      : c_(config), b_(machine, "flash_prefill") {}

  Program build();

 private:
  void load_kv_tile(int64_t head, int64_t tile, Tile& k_t, Tile& v);
  Tile mask_for(int64_t q_tile, int64_t kv_tile);
  // Rows of query tile i (or keys of key tile j) that lie inside the sequence.
  int64_t query_rows(int64_t i) const { return std::min(P_, c_.seq_len - i * P_); }
  int64_t valid_keys(int64_t j) const { return std::min(keys_, c_.seq_len - j * keys_); }

  const FlashPrefillConfig& c_;
  ProgramBuilder b_;
  int64_t P_ = 0, d_ = 0, q_tiles_ = 0, keys_ = 0, kv_tiles_ = 0, score_tile_ = 0;
  Tensor query_, key_, value_, output_;
  TilePool k_t_, v_, mask_, positions_;
  lib::FlashWorkspace ws_;
};

// K transposed [d, keys] in one load, V as [P, chunks·d] in P-row chunks; the keys past the end
// of the sequence are zeros (masked scores, and 0 · V must stay finite).
void PrefillBuilder::load_kv_tile(int64_t head, int64_t tile, Tile& k_t, Tile& v) {
  const int d = static_cast<int>(d_);
  const int64_t key0 = tile * keys_, valid = valid_keys(tile);
  k_t = b_.next(k_t_);
  if (valid < keys_) b_.memset(b_.view(k_t, 0, d, valid, keys_ - valid), 0.0f, Engine::gpsimd);
  b_.dma_copy(b_.view(k_t, 0, d, 0, valid), b_.hbm_rows(key_, 0, d_, key0, valid, head));
  v = b_.next(v_);
  for (int64_t chunk = 0; chunk < keys_ / P_; ++chunk) {
    const int64_t rows = std::min(P_, valid - chunk * P_);
    if (rows < P_)
      b_.memset(b_.view(v, 0, static_cast<int>(P_), chunk * d_, d_), 0.0f, Engine::gpsimd);
    if (rows > 0)
      b_.dma_copy(b_.view(v, 0, static_cast<int>(rows), chunk * d_, d_),
                  b_.hbm_rows(value_, key0 + chunk * P_, rows, 0, d_, head));
  }
}

// The mask of query tile i against key tile j, or kNone when every key attends every query of
// the tile. From positions on GpSimd: attend = clamp(query - key + 1, 0, 1) when causal,
// clamp(seq_len - key, 0, 1) otherwise (the keys past the end).
Tile PrefillBuilder::mask_for(int64_t i, int64_t j) {
  const int64_t key0 = j * keys_;
  const bool ragged = valid_keys(j) < keys_;
  const bool diagonal = c_.causal && key0 + keys_ - 1 > i * P_;
  if (!ragged && !diagonal) return Tile{};
  const Tile positions = b_.next(positions_);
  const TileRef pos = b_.view(positions);
  if (c_.causal)
    b_.iota(pos, static_cast<int>(i * P_ - key0 + 1), 1, -1);
  else
    b_.iota(pos, static_cast<int>(c_.seq_len - key0), 0, -1);
  const Tile mask = b_.next(mask_);
  b_.tensor_scalar(b_.view(mask), pos, AluOp::max, Scalar::constant(0.0f), AluOp::min,
                   Scalar::constant(1.0f), Engine::gpsimd);
  return mask;
}

Program PrefillBuilder::build() {
  const Machine& m = b_.machine();
  P_ = m.partitions;
  d_ = c_.head_dim;
  TILELAB_REQUIRE(c_.num_heads >= 1 && c_.num_heads <= 4096)
      << "num_heads: " << c_.num_heads << " outside [1, 4096]";
  TILELAB_REQUIRE(c_.seq_len >= 1 && c_.seq_len <= (int64_t(1) << 20))
      << "seq_len: " << c_.seq_len << " outside [1, 1048576]";
  TILELAB_REQUIRE(d_ >= 1 && d_ <= P_) << "head_dim: " << d_ << " outside [1, " << P_
                                       << "] (the partitions of machine '" << m.name << "')";
  TILELAB_REQUIRE(c_.kv_tile >= P_ && c_.kv_tile % P_ == 0 && c_.kv_tile <= 8192)
      << "kv_tile: " << c_.kv_tile << " must be a multiple of " << P_ << " in [" << P_ << ", 8192]";
  TILELAB_REQUIRE(c_.dtype == DType::bf16 || c_.dtype == DType::fp16 || c_.dtype == DType::fp32)
      << "dtype: expected bf16, fp16 or fp32, got " << dtype_name(c_.dtype);
  TILELAB_REQUIRE(c_.softmax_scale >= 0)
      << "softmax_scale: " << c_.softmax_scale << " must be >= 0 (0: 1 / sqrt(head_dim))";
  const float scale =
      c_.softmax_scale > 0 ? c_.softmax_scale : 1.0f / std::sqrt(static_cast<float>(d_));
  q_tiles_ = ceil_div(c_.seq_len, P_);
  keys_ = std::min(c_.kv_tile, q_tiles_ * P_);
  kv_tiles_ = ceil_div(c_.seq_len, keys_);
  // Score pieces: the largest multiple of P that divides the key tile and fits a PSUM bank and
  // one matmul.
  const int64_t bank_fp32 = m.psum_bank_bytes_per_partition / dtype_size(DType::fp32);
  score_tile_ = std::min<int64_t>({keys_, bank_fp32, m.matmul_max_moving_free}) / P_ * P_;
  TILELAB_REQUIRE(score_tile_ >= P_)
      << "machine '" << m.name << "': a PSUM bank (" << bank_fp32 << " fp32) and "
      << "matmul_max_moving_free (" << m.matmul_max_moving_free << ") must hold " << P_
      << " score columns";
  while (keys_ % score_tile_ != 0) score_tile_ -= P_;

  const int64_t H = c_.num_heads, S = c_.seq_len;
  query_ = b_.hbm_tensor("query", {H, d_, S}, c_.dtype);
  key_ = b_.hbm_tensor("key", {H, d_, S}, c_.dtype);
  value_ = b_.hbm_tensor("value", {H, S, d_}, c_.dtype);
  output_ = b_.hbm_tensor("output", {H, S, d_}, c_.dtype);

  const int p = static_cast<int>(P_);
  k_t_ = b_.pool("cur_k_tile", Memory::sbuf, static_cast<int>(d_), keys_, c_.dtype, 2);
  v_ = b_.pool("cur_v_tile", Memory::sbuf, p, keys_ / P_ * d_, c_.dtype, 2);
  mask_ = b_.pool("cur_mask", Memory::sbuf, p, keys_, DType::uint8, 2);
  positions_ = b_.pool("mask_positions", Memory::sbuf, p, keys_, DType::fp32, 1);
  lib::FlashWorkspaceShape shape;
  shape.partitions = P_;
  shape.head_dim = d_;
  shape.max_keys = keys_;
  shape.max_score_pieces = keys_ / score_tile_;
  shape.max_reductions = keys_ / score_tile_;
  shape.max_chunks = keys_ / P_;
  shape.accumulator_slots = q_tiles_;
  shape.input_dtype = c_.dtype;
  shape.kernel_dtype = c_.dtype;
  shape.acc_dtype = DType::fp32;
  ws_ = lib::allocate_flash_workspace(b_, shape);

  for (int64_t head = 0; head < H; ++head) {
    for (int64_t j = 0; j < kv_tiles_; ++j) {
      Tile k_t, v;
      load_kv_tile(head, j, k_t, v);
      // Without causality the mask depends on the keys only (the end of the sequence).
      const Tile key_mask = c_.causal ? Tile{} : mask_for(0, j);
      for (int64_t i = 0; i < q_tiles_; ++i) {
        // Causal: a key tile that starts after the tile's last query row adds nothing.
        if (c_.causal && j * keys_ > i * P_ + P_ - 1) continue;
        lib::FlashKeyTile x;
        x.q = lib::load_flash_query(b_, ws_, query_, head, i * P_, query_rows(i), scale);
        x.k_t = k_t;
        x.v = v;
        x.mask = c_.causal ? mask_for(i, j) : key_mask;
        x.keys = keys_;
        x.score_tile = score_tile_;
        x.rows = P_;
        x.reduction = score_tile_;
        x.causal = c_.causal;
        x.query_row0 = i * P_;
        x.key0 = j * keys_;
        x.initialize = j == 0;
        lib::flash_core(b_, ws_, x, lib::flash_accumulator(b_, ws_, i),
                        schedules::TransposeMethod::pe);
      }
    }
    for (int64_t i = 0; i < q_tiles_; ++i)
      lib::finalize_flash(b_, ws_, lib::flash_accumulator(b_, ws_, i),
                          b_.hbm_rows(output_, i * P_, query_rows(i), 0, d_, head), query_rows(i));
  }
  return b_.finish();
}

}  // namespace

Program build_flash_prefill(const Machine& machine, const FlashPrefillConfig& config) {
  return PrefillBuilder(machine, config).build();
}

void register_flash_prefill(KernelRegistry& registry) {
  const FlashPrefillConfig defaults;
  KernelInfo info;
  info.name = "flash-prefill";
  info.description =
      "dense causal prefill attention on the flash core of paged-attention: K/V tiles loaded "
      "once per head, every query tile merged with online softmax, partial last tiles. Default: "
      "4 heads, 1000 tokens, d 128, bf16 on trn1";
  info.default_machine = "trn1";
  info.parameters = {
      {"num_heads", "4", "attention heads"},
      {"seq_len", "1000", "tokens (queries = keys), any length"},
      {"head_dim", std::to_string(defaults.head_dim), "d (<= the machine's partitions)"},
      {"kv_tile", std::to_string(defaults.kv_tile),
       "keys per softmax merge (a multiple of the partitions)"},
      {"causal", defaults.causal ? "true" : "false", "true | false: query i attends keys <= i"},
      {"dtype", "bf16", "bf16 | fp16 | fp32: query/key/value/output and TensorE inputs"},
  };
  info.build = [](const Machine& machine, const KernelParameters& p) {
    FlashPrefillConfig c;
    c.num_heads = parameter_int(p, "num_heads", 1, 4096);
    c.seq_len = parameter_int(p, "seq_len", 1, int64_t(1) << 20);
    c.head_dim = parameter_int(p, "head_dim", 1, machine.partitions);
    c.kv_tile = parameter_int(p, "kv_tile", machine.partitions, 8192);
    c.causal = parameter_choice(p, "causal", {"true", "false"}) == "true";
    c.dtype = parameter_dtype(p, "dtype");
    return build_flash_prefill(machine, c);
  };
  registry.add(std::move(info));
}

}  // namespace tilelab::sim
