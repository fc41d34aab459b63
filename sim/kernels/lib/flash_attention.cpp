// Flash attention library routines (vLLM nki_flash_attn.py @ 05eaa6ee): query load, online
// softmax core, normalization, transposes and K/V gathers.
#include "sim/kernels/lib/flash_attention.hpp"

#include <algorithm>

namespace tilelab::sim::lib {
namespace {

// Columns of the per-row scalar tile `stats`.
enum StatColumn : int64_t {
  kMax = 0,
  kPrevMax,
  kNegMax,
  kAlpha,
  kRowSum,
  kLogTmp,
  kStatColumns = 8
};

TileRef stat(const ProgramBuilder& b, const FlashWorkspace& ws, Tile stats, StatColumn column) {
  return b.view(stats, 0, static_cast<int>(ws.partitions), column, 1);
}

}  // namespace

FlashWorkspace allocate_flash_workspace(ProgramBuilder& b, const FlashWorkspaceShape& shape) {
  FlashWorkspace ws;
  ws.partitions = shape.partitions;
  ws.head_dim = shape.head_dim;
  ws.bank_fp32 = b.machine().psum_bank_bytes_per_partition / dtype_size(DType::fp32);
  ws.input_dtype = shape.input_dtype;
  ws.kernel_dtype = shape.kernel_dtype;
  ws.acc_dtype = shape.acc_dtype;
  const int p = static_cast<int>(shape.partitions);
  const int d = static_cast<int>(shape.head_dim);
  const int64_t P = shape.partitions, D = shape.head_dim;
  const DType kernel = shape.kernel_dtype, acc = shape.acc_dtype;
  auto sbuf = [&](const char* name, int partitions, int64_t free, DType dtype) {
    return b.pool(name, Memory::sbuf, partitions, free, dtype, 2);
  };
  ws.q_raw = sbuf("q_sbuf_tile", d, P, shape.input_dtype);
  ws.q_cast = shape.input_dtype == kernel ? TilePool{} : sbuf("q_cast", d, P, kernel);
  ws.q = sbuf("q_tile", d, P, kernel);
  ws.qk_res = sbuf("qk_res_buf", p, shape.max_keys, acc);
  ws.max_local = sbuf("max_local", p, shape.max_score_pieces, acc);
  ws.p_local = sbuf("p_local", p, shape.max_keys, kernel);
  ws.p_partial = sbuf("p_partial_sum", p, shape.max_reductions, acc);
  // Chunk j of `rows` keys at columns [j·P, (j+1)·P); rows < P leaves partitions unused.
  ws.p_t = sbuf("p_local_transposed", p, shape.max_chunks * P, kernel);
  ws.stats = sbuf("row_stats", p, kStatColumns, acc);
  ws.o_scaled = sbuf("o_previous_scaled", p, D, acc);
  ws.out = sbuf("out", p, D, kernel);
  ws.o_all = b.sbuf_tile("o_buffer", p, shape.accumulator_slots * D, acc);
  ws.l_all = b.sbuf_tile("l_buffer", p, shape.accumulator_slots, acc);
  ws.m_all = b.sbuf_tile("m_buffer", p, shape.accumulator_slots, acc);
  ws.qk_psum = b.pool("qk_psum", Memory::psum, p, ws.bank_fp32, DType::fp32, 2);
  ws.t_psum = b.pool("p_local_t_tmp", Memory::psum, p, ws.bank_fp32, DType::fp32, 2);
  ws.pv_psum = b.pool("pv_psum", Memory::psum, p, D, DType::fp32, 2);
  return ws;
}

FlashAccumulator flash_accumulator(const ProgramBuilder& b, const FlashWorkspace& ws,
                                   int64_t slot) {
  const int p = static_cast<int>(ws.partitions);
  return {b.view(ws.o_all, 0, p, slot * ws.head_dim, ws.head_dim), b.view(ws.l_all, 0, p, slot, 1),
          b.view(ws.m_all, 0, p, slot, 1)};
}

TileRef load_flash_query(ProgramBuilder& b, FlashWorkspace& ws, Tensor query, int64_t head,
                         int64_t col0, int64_t cols, float scale) {
  const Tile raw = b.next(ws.q_raw);
  if (cols < ws.partitions)
    b.memset(b.view(raw, 0, static_cast<int>(ws.head_dim), cols, ws.partitions - cols), 0.0f,
             Engine::gpsimd);
  b.dma_copy(b.view(raw, 0, static_cast<int>(ws.head_dim), 0, cols),
             b.hbm_rows(query, 0, ws.head_dim, col0, cols, head));
  TileRef source = b.view(raw);
  if (ws.input_dtype != ws.kernel_dtype) {
    const Tile cast = b.next(ws.q_cast);
    b.tensor_copy(b.view(cast), source, Engine::scalar);
    source = b.view(cast);
  }
  const Tile q = b.next(ws.q);
  ActivationOptions scaled;
  scaled.scale = scale;
  b.activation(b.view(q), source, ActFunc::copy, scaled);
  return b.view(q);
}

void flash_core(ProgramBuilder& b, FlashWorkspace& ws, const FlashKeyTile& x,
                const FlashAccumulator& acc, schedules::TransposeMethod transpose) {
  const int p = static_cast<int>(ws.partitions);
  const int rows = static_cast<int>(x.rows);
  const int64_t P = ws.partitions, d = ws.head_dim;

  // Scores, masked fill and per-piece maxima.
  const int64_t pieces = x.keys / x.score_tile;
  const Tile qk_res = b.next(ws.qk_res);
  const Tile max_local = b.next(ws.max_local);
  for (int64_t k = 0; k < pieces; ++k) {
    const TileRef scores = b.view(qk_res, 0, p, k * x.score_tile, x.score_tile);
    const bool skip = x.causal && x.query_row0 + P <= x.key0 + k * x.score_tile;
    if (skip) {
      b.memset(scores, kMaskedScore, Engine::vector);
    } else {
      const Tile psum = b.next(ws.qk_psum);
      const TileRef qk = b.view(psum, 0, p, 0, x.score_tile);
      b.matmul(qk, x.q, b.view(x.k_t, 0, static_cast<int>(d), k * x.score_tile, x.score_tile),
               false);
      if (x.mask.id == kNone)
        b.tensor_copy(scores, qk);
      else
        b.select(scores, b.view(x.mask, 0, p, k * x.score_tile, x.score_tile), qk,
                 Scalar::constant(kMaskedScore));
    }
    b.tensor_reduce(b.view(max_local, 0, p, k, 1), scores, AluOp::max);
  }
  const Tile stats = b.next(ws.stats);
  const TileRef tile_max = stat(b, ws, stats, kMax);
  b.tensor_reduce(tile_max, b.view(max_local, 0, p, 0, pieces), AluOp::max);

  // Running maximum and the rescale of the accumulator.
  const TileRef neg_max = stat(b, ws, stats, kNegMax);
  const TileRef prev_max = stat(b, ws, stats, kPrevMax);
  TileRef o_scaled{};
  if (x.initialize) {
    b.tensor_copy(acc.m, tile_max);
  } else {
    b.tensor_copy(prev_max, acc.m);
    b.tensor_tensor(acc.m, prev_max, tile_max, AluOp::max);
  }
  b.tensor_scalar(neg_max, acc.m, AluOp::multiply, Scalar::constant(-1.0f));
  if (!x.initialize) {
    const TileRef alpha = stat(b, ws, stats, kAlpha);
    ActivationOptions shift;
    shift.bias = neg_max;
    b.activation(alpha, prev_max, ActFunc::exp, shift);
    const Tile scaled = b.next(ws.o_scaled);
    o_scaled = b.view(scaled);
    b.tensor_scalar(o_scaled, acc.o, AluOp::multiply, Scalar::per_partition(alpha));
  }

  // exp(s - m) on ScalarE with the row sums fused, per reduction tile.
  const Tile p_local = b.next(ws.p_local);
  const Tile partial = b.next(ws.p_partial);
  const int64_t reductions = x.keys / x.reduction;
  for (int64_t r = 0; r < reductions; ++r) {
    ActivationOptions exp_options;
    exp_options.bias = neg_max;
    exp_options.reduce_result = b.view(partial, 0, p, r, 1);
    b.activation(b.view(p_local, 0, p, r * x.reduction, x.reduction),
                 b.view(qk_res, 0, p, r * x.reduction, x.reduction), ActFunc::exp, exp_options);
  }
  const TileRef row_sum = stat(b, ws, stats, kRowSum);
  b.tensor_reduce(row_sum, b.view(partial, 0, p, 0, reductions), AluOp::add);

  // P transposed in chunks of `rows` keys, grouped per PSUM bank.
  const int64_t chunks = x.keys / x.rows;
  const Tile p_t = b.next(ws.p_t);
  std::vector<TileRef> sources;
  for (int64_t j = 0; j < chunks; ++j) sources.push_back(b.view(p_local, 0, p, j * x.rows, x.rows));
  const int64_t per_bank = std::max<int64_t>(1, std::min(ws.bank_fp32, x.score_tile) / P);
  transpose_chunks(b, p_t, x.rows, sources, P, per_bank, transpose, Engine::scalar, ws.t_psum);

  // P·V accumulated in one PSUM bank over the key chunks.
  const Tile pv_tile = b.next(ws.pv_psum);
  const TileRef pv = b.view(pv_tile, 0, p, 0, d);
  for (int64_t j = 0; j < chunks; ++j)
    b.matmul(pv, b.view(p_t, 0, rows, j * P, P), b.view(x.v, 0, rows, j * d, d), j > 0);

  // Merge into (o, l): l is kept as m + log(sum).
  const TileRef log_tmp = stat(b, ws, stats, kLogTmp);
  if (x.initialize) {
    b.tensor_copy(acc.o, pv);
    b.activation(log_tmp, row_sum, ActFunc::log);
    b.tensor_tensor(acc.l, log_tmp, tile_max, AluOp::add);
  } else {
    b.tensor_tensor(acc.o, o_scaled, pv, AluOp::add);
    ActivationOptions shift;
    shift.bias = neg_max;
    b.activation(log_tmp, acc.l, ActFunc::exp, shift);
    b.tensor_tensor(log_tmp, log_tmp, row_sum, AluOp::add);
    b.activation(log_tmp, log_tmp, ActFunc::log);
    b.tensor_tensor(acc.l, acc.m, log_tmp, AluOp::add);
  }
}

void finalize_flash(ProgramBuilder& b, FlashWorkspace& ws, const FlashAccumulator& acc,
                    const HbmPattern& dst, int64_t rows) {
  const Tile stats = b.next(ws.stats);
  const TileRef factor = stat(b, ws, stats, kAlpha);
  b.tensor_tensor(factor, acc.m, acc.l, AluOp::subtract);
  b.activation(factor, factor, ActFunc::exp);
  const Tile out = b.next(ws.out);
  b.tensor_scalar(b.view(out), acc.o, AluOp::multiply, Scalar::per_partition(factor));
  b.dma_copy(dst, b.view(out, 0, static_cast<int>(rows), 0, ws.head_dim));
}

void transpose_into(ProgramBuilder& b, const TileRef& dst_group,
                    const std::vector<TileRef>& sources, int64_t dst_rows, int64_t piece,
                    Engine evict_engine, TilePool& psum_pool) {
  const Tile psum = b.next(psum_pool);
  for (size_t j = 0; j < sources.size(); ++j)
    b.pe_transpose(b.view(psum, 0, static_cast<int>(dst_rows), static_cast<int64_t>(j) * piece,
                          sources[j].partition_count),
                   sources[j]);
  b.tensor_copy(
      dst_group,
      b.view(psum, 0, static_cast<int>(dst_rows), 0, static_cast<int64_t>(sources.size()) * piece),
      evict_engine);
}

void transpose_chunks(ProgramBuilder& b, Tile dst, int64_t dst_rows,
                      const std::vector<TileRef>& sources, int64_t piece, int64_t per_bank,
                      schedules::TransposeMethod method, Engine evict_engine, TilePool& psum) {
  const int r = static_cast<int>(dst_rows);
  const int64_t chunks = static_cast<int64_t>(sources.size());
  if (method == schedules::TransposeMethod::dma) {
    for (int64_t j = 0; j < chunks; ++j)
      b.dma_transpose(b.view(dst, 0, r, j * piece, piece), sources[size_t(j)]);
    return;
  }
  for (int64_t first = 0; first < chunks; first += per_bank) {
    const int64_t count = std::min(per_bank, chunks - first);
    const std::vector<TileRef> group(sources.begin() + first, sources.begin() + first + count);
    transpose_into(b, b.view(dst, 0, r, first * piece, count * piece), group, dst_rows, piece,
                   evict_engine, psum);
  }
}

void gather_kv(ProgramBuilder& b, Tile dst, Tensor cache, int64_t kv, Tile index,
               int64_t index_col0, int64_t index_stride, int64_t loads, int64_t rows, int64_t run) {
  const int r = static_cast<int>(rows);
  for (int64_t load = 0; load < loads; ++load)
    b.dma_gather(b.view(dst, 0, r, load * run, run), cache, kv,
                 b.view(index, 0, r, index_col0 + load * index_stride, 1), 0);
}

}  // namespace tilelab::sim::lib
