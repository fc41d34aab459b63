// The loop structure shared by the flash attention x86 schedules (schedules/flash/x86.cpp forward,
// x86_backward.cpp backward): accumulators at root, parallel over (tile, kv head, batch), and
// accumulated over (head dim, rows or keys) in register tiles of accumulator_registers vectors.
#pragma once

#include <algorithm>
#include <optional>
#include <span>
#include <vector>

#include "Halide.h"
#include "schedules/flash/tiling.hpp"

namespace tilelab::schedules::flash {

// Vector registers one register tile's accumulators may take: half the register file, the other
// half for the tile's operands (row or head-dim vectors, broadcasts) and the loop. AVX-512 has 32
// zmm registers, AVX2 and SSE 16: with 16 accumulators there too, every AVX2 tile spilled
// accumulators to the stack and shuffled the rest between registers on each key. Halved on an AMD
// EPYC Zen 3 (AVX2, 2 threads, alternating builds): forward B1 H16 S1024 D128 full fp32 102-108
// -> 81-87 ms, bf16 104-134 -> 77-78; backward S512 fp32 80-111 -> 45-63, bf16 78-85 -> 48-50.
// The AVX-512 kernels are unchanged, instruction for instruction.
inline int accumulator_registers(const Halide::Target& target) {
  return target.has_feature(Halide::Target::AVX512) ? 16 : 8;
}

// The second extent (rows or keys) of a register tile `vectors` vectors wide: as many as
// accumulator_registers allows (AVX-512: 2 vectors × 8 or 4 × 4; AVX2: 2 × 4 or 4 × 2).
inline int register_tile_extent(const Halide::Target& target, int vectors) {
  return std::max(1, accumulator_registers(target) / vectors);
}

// The register tile of q·k products (and of dP) over a query tile of `query_tile` rows: rows in the
// vector lanes, up to two vectors of them, × as many keys as the accumulators allow.
struct ScoreRegisterTile {
  int rows, keys;
};
inline ScoreRegisterTile score_register_tile(const Halide::Target& target, int query_tile) {
  const int lanes = target.natural_vector_size<float>();
  const int rows = std::min(query_tile, 2 * lanes);
  return {rows, register_tile_extent(target, (rows + lanes - 1) / lanes)};
}

// `f` at root, its pure stage and its update (loops `order`, innermost first) both parallel over
// (`outer`, `kv_head`, `batch`) fused into `tile`, head dims vectorized in the pure stage; returns
// the update.
inline Halide::Stage schedule_parallel_accumulator(Halide::Func f, const Halide::Var& outer,
                                                   const Halide::Var& kv_head,
                                                   const Halide::Var& batch, const Halide::Var& d,
                                                   const std::vector<Halide::VarOrRVar>& order,
                                                   int lanes, const Halide::Var& tile) {
  f.compute_root()
      .fuse(outer, kv_head, tile)
      .fuse(tile, batch, tile)
      .parallel(tile)
      .vectorize(d, lanes, Halide::TailStrategy::GuardWithIf);
  Halide::Stage update = f.update();
  update.reorder(order).fuse(outer, kv_head, tile).fuse(tile, batch, tile).parallel(tile);
  return update;
}

// `transposed` from `by_row` (generators/flash/row_transpose.hpp) for `row_count` rows: the
// tile's rows read first, each as stored (head dims contiguous; rows at addresses the row's query
// and head give, which vectorizing over rows would turn into per-lane gathers), then transposed in
// registers a block of kRowTransposeHeadDims head dims at a time: one dense load of the block of
// all rows, a shuffle, one dense store. (Read a block at a time instead, 32 rows × 8 head dims
// before each shuffle, the reads came out of memory in short bursts: B1 H16 S512 D128 fp32 on Zen
// 4, 2 threads, alternating builds, results bit-identical: causal 1.01-1.03x faster with the whole
// rows first, full 1.006-1.016x; the backward within noise.)
inline void schedule_row_transpose(Halide::Func transposed, Halide::Func by_row,
                                   const Halide::Var& rows, const Halide::Var& d, int row_count) {
  using Halide::TailStrategy;
  Halide::Var dblock("dblock"), din("din");
  transposed.split(d, dblock, din, kRowTransposeHeadDims, TailStrategy::GuardWithIf)
      .reorder(rows, din, dblock)
      .vectorize(rows, row_count)
      .vectorize(din);
  // by_row(din, rows, dblock, ...): a row's blocks in turn, so that each row is read in order.
  const std::vector<Halide::Var> args = by_row.args();
  by_row.compute_at(transposed, Halide::Var::outermost())
      .reorder(args[0], args[2], args[1])
      .vectorize(args[0])
      .unroll(args[2], 4, TailStrategy::GuardWithIf);
}

// Head dims with fast paths: specialized, and split into register tiles without rounding. None on
// the x86-64 baseline target, which serves CPUs without AVX2 only: its one generic path generates
// a backward kernel in under half the time (Zen 3, f32 with score options: 31 -> 12 s).
inline std::span<const int> fast_head_dims(const Halide::Target& target) {
  static constexpr int kDims[] = {128, 64};
  if (!target.has_feature(Halide::Target::AVX2)) return {};
  return kDims;
}

// Splits an update over (d, second) into register tiles: head dims rounded up to
// `head_dim_vectors` vectors (fast paths for D = 64 and 128, which need no rounding) or else one
// vector, × `second_tile` of `second`, unrolled. `dout` is the loop over head-dim tiles, where
// each tile's product is computed (schedule_tile_product).
// The fast paths unroll the head-dim vectors too: the tile's add into the accumulator then reads
// its product at constant offsets (the forward's fp32 merge, Emerald Rapids: 3-5% faster).
inline void split_register_tiles(Halide::Stage stage, const Halide::Target& target,
                                 const Halide::Var& d, const Halide::Var& second, int second_tile,
                                 const Halide::Expr& head_dim, int lanes, const Halide::Var& dout,
                                 int head_dim_vectors = 4) {
  using Halide::TailStrategy;
  Halide::Var din("din"), so("so"), si("si"), dvo("dvo"), dvi("dvi");
  for (int dims : fast_head_dims(target)) {
    stage.specialize(head_dim == dims)
        .split(d, dout, din, std::min(dims, head_dim_vectors * lanes), TailStrategy::RoundUp)
        .split(second, so, si, second_tile)
        .reorder(din, si, dout, so)
        .split(din, dvo, dvi, lanes)
        .vectorize(dvi)
        .unroll(dvo)
        .unroll(si);
  }
  stage.split(d, dout, din, lanes, TailStrategy::RoundUp)
      .split(second, so, si, second_tile)
      .reorder(din, si, dout, so)
      .vectorize(din)
      .unroll(si);
}

// split_register_tiles without specializations (a stage computed with another may have none):
// 2 head-dim vectors (rounded up) × `second_tile` of `second`.
inline void split_register_tiles_unspecialized(Halide::Stage stage, const Halide::Var& d,
                                               const Halide::Var& second, int second_tile,
                                               int lanes, const Halide::Var& dout) {
  using Halide::TailStrategy;
  Halide::Var din("din"), so("so"), si("si");
  stage.split(d, dout, din, 2 * lanes, TailStrategy::RoundUp)
      .split(second, so, si, second_tile)
      .reorder(din, si, dout, so)
      .vectorize(din, lanes)
      .unroll(si);
}

// The q·k products of one score register tile on bf16 pairs, f(rows, cols) = Σ over (`pair`,
// `r`), computed at `level`: rows in vectors of `lanes`, unrolled with the columns; per pair of
// head dims, row vectors of q pairs and broadcast K pairs feed one vdpbf16ps per accumulator.
inline void schedule_score_pair_products(Halide::Func f, const Halide::Var& rows,
                                         const Halide::Var& cols, const Halide::RVar& pair,
                                         const Halide::RVar& r, const Halide::LoopLevel& level,
                                         int lanes) {
  f.compute_at(level).vectorize(rows, lanes).unroll(rows).unroll(cols);
  f.update()
      .reorder(pair, rows, cols, r)
      .atomic()
      .vectorize(pair)
      .vectorize(rows, lanes)
      .unroll(rows)
      .unroll(cols);
}

// The product of one register tile, f(d, second) = Σ over `r`, computed at `level` (the `dout`
// loop of split_register_tiles): head dims in vectors, `second` unrolled, the accumulators in
// registers. With `pair` (bf16 products: `r` counts pairs, `pair` of extent 2 within one), the
// pair and the head-dim vector form one 2·lanes-wide bf16 operand, and the atomic vectorized pair
// reduction becomes one vdpbf16ps per accumulator. `r_outer`, when given, is reduced outside `r`
// (groups of keys).
inline void schedule_tile_product(Halide::Func f, const Halide::Var& d, const Halide::Var& second,
                                  const Halide::RVar& r, const Halide::LoopLevel& level, int lanes,
                                  const std::optional<Halide::RVar>& pair = std::nullopt,
                                  const std::optional<Halide::RVar>& r_outer = std::nullopt) {
  Halide::Var dvo("dvo"), dvi("dvi");
  f.compute_at(level).split(d, dvo, dvi, lanes).vectorize(dvi).unroll(dvo).unroll(second);
  Halide::Stage update = f.update();
  update.split(d, dvo, dvi, lanes);
  std::vector<Halide::VarOrRVar> order;
  if (pair) order.push_back(*pair);
  order.insert(order.end(), {dvi, dvo, second, r});
  if (r_outer) order.push_back(*r_outer);
  update.reorder(order);
  if (pair) update.atomic().vectorize(*pair);
  update.vectorize(dvi).unroll(dvo).unroll(second);
}

}  // namespace tilelab::schedules::flash
