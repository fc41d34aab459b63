// x86 schedule of flash attention backward
// (generators/flash/flash_attention_backward_generator.cpp).
//
// Target assumptions as the forward's (schedules/flash/x86.cpp): AVX-512 (16 lanes, 32 zmm), then
// AVX2+FMA (8 lanes, 16 ymm), then SSE (4 lanes).
//
// Before the pass: each row's query and query head (row_query, row_member), and delta of every row.
// The pass, per task (key chunk of chunk_blocks key blocks, kv head, batch), parallel over tasks:
//  for each group rg of kBackwardGroupTiles row tiles (their rows stay in cache across the blocks)
//   dout_f32, query_f32   the group's q and dout rows as they are, in fp32 (once per group: per
//                         row tile and key block, the copies took 5% of the fp32 pass)
//   query_t, dout_t       the same rows transposed per row tile (rows contiguous; bf16
//                         products: in pairs of head dims), and each row's lse and delta
//   for each key block rc of the chunk
//     key_f32, value_f32    the block's K and V in fp32
//     for each row tile ro of the group that sees the block (causal: the others are skipped)
//       score, dprob      QT×KB, register tiles of (2·VL rows) × 8 keys = 16 accumulators
//       prob, dscore      P and dS of the tile (one exp per score), computed once for all three:
//       block_dv, block_dk  (4·VL head dims) × 4 keys = 16 accumulators over the tile's rows:
//                         Pᵀ dO and dSᵀ Q, added to grad_kv (the chunk's keys)
//       block_dq          (2·VL head dims) × 8 rows = 16 accumulators over the block's keys:
//                         dS K, added to dq_partial (the task's rows)
//       (AVX2, 16 ymm registers: each tile's second extent halved, 8 accumulators;
//       flash::accumulator_registers)
//   task_grads          both sums of the task gathered; then dk, dv from it, and grad_q sums
//                       the tasks' dq_partial in chunk order.
// A third loop nest (only what the caller's ds buffer asks for): dS per (row tile, key block).
//
// bf16 inputs on CPUs with AVX-512 BF16: score and dprob reduce the head dim on vdpbf16ps, from q
// and dout rows in pairs of head dims (query_pairs, dout_pairs, in place of query_t and dout_t)
// and K and V read in place; the products of two bf16 values are exact in fp32, so only the
// summation order changes. With bf16_probabilities, P and dS are rounded to bf16 and dV, dK and
// dQ run on vdpbf16ps too.
//
// Why one pass with partial dq sums: dq sums over key blocks and dk, dv over rows. Recomputing
// P and dP in a second pass for dq cost 4·M·N·D of 14·M·N·D FLOPs; instead, dq_partial is
// computed with grad_kv (compute_with, fused down to the row tile), so P, dP and dS are computed
// once (10·M·N·D). A task's partial dq covers all its rows (rows × D fp32), so the runtime picks
// as few chunks as keep the threads busy (detail::flash_backward_chunk_blocks); one per kv head
// when batch × kv heads suffice. Without atomics, and deterministic: the chunks are fixed by the
// shape and summed in order. Measured (Zen 4, 2 threads, B1 H16 S512 D128 fp32, with the fixes
// below): 32.2 ms, 72% of the FMA peak; the two-pass schedule took 50.3 ms, 46%.
#include "schedules/flash/x86_backward.hpp"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "schedules/flash/x86_shared.hpp"

namespace tilelab::schedules {

using namespace Halide;

namespace {

// Scores and dP of one (row tile, key block) in register tiles of `rows` × `keys`, rows in the
// vector lanes; P and dS stored for the whole tile, for the products that consume them.
void schedule_tile(FlashBackwardStages& s, generators::FlashBackwardTileStages& t,
                   const LoopLevel& level, const Target& target, const std::string& pass) {
  const int VL = target.natural_vector_size<float>();
  const auto [rows, keys] = flash::score_register_tile(target, s.query_tile);
  Var iii("iii_" + pass), jji("jji_" + pass);
  // With score options dS reads the score too (the softcap's derivative): the score tile is stored
  // at the tile's level for both, in the same register tiles.
  std::vector<Func*> tiles = {&t.prob, &t.dscore};
  if (s.score_options) tiles.push_back(&t.score);
  for (Func* f : tiles) {
    f->compute_at(level)
        .tile(s.ii, s.jj, iii, jji, rows, keys)
        .vectorize(iii, VL)
        .unroll(iii)
        .unroll(jji);
  }
  // Without a bias, or with one broadcast over rows and query heads, the tile's rows (the lanes)
  // read one bias value per key: a broadcast in place of a 16-lane gather, which took 7% of the
  // fp32 pass.
  t.prob.specialize(s.bias_row_stride == 0).specialize(s.bias_head_stride == 0);
  const Func& score_consumer = s.score_options ? t.score : t.prob;
  if (s.bf16_products) {
    // Per pair of head dims: 2 row vectors of (q pair) × 16 rows, 8 key-pair broadcasts, 16
    // vdpbf16ps into 16 accumulators (as the forward's scores).
    const std::pair<Func*, const Func*> products[] = {{&t.score_products, &score_consumer},
                                                      {&t.dprob_products, &t.dscore}};
    const RVar pairs[] = {t.rd_score_pair, t.rd_dprob_pair}, halves[] = {t.rd_score, t.rd_dprob};
    for (int n = 0; n < 2; ++n) {
      Func& f = *products[n].first;
      f.compute_at(*products[n].second, s.ii).vectorize(s.ii, VL).unroll(s.ii).unroll(s.jj);
      f.update()
          .reorder(pairs[n], s.ii, s.jj, halves[n])
          .atomic()
          .vectorize(pairs[n])
          .vectorize(s.ii, VL)
          .unroll(s.ii)
          .unroll(s.jj);
    }
    return;
  }
  if (s.score_options) {
    t.score.update()
        .tile(s.ii, s.jj, iii, jji, rows, keys)
        .reorder(iii, jji, t.rd_score, s.ii, s.jj)
        .vectorize(iii, VL)
        .unroll(iii)
        .unroll(jji);
  } else {
    t.score.compute_at(t.prob, s.ii).vectorize(s.ii, VL).unroll(s.ii).unroll(s.jj);
    t.score.update().reorder(s.ii, s.jj, t.rd_score).vectorize(s.ii, VL).unroll(s.ii).unroll(s.jj);
  }
  t.dprob.compute_at(t.dscore, s.ii).vectorize(s.ii, VL).unroll(s.ii).unroll(s.jj);
  t.dprob.update().reorder(s.ii, s.jj, t.rd_dprob).vectorize(s.ii, VL).unroll(s.ii).unroll(s.jj);
}

// q and dout rows of a tile in pairs of head dims (bf16 products), copied along each row (32-bit
// moves): vectorized over rows, every lane would be a gather.
void schedule_pairs(FlashBackwardStages& s, generators::FlashBackwardTileStages& t,
                    const LoopLevel& level) {
  for (Func* f : {&t.query_pairs, &t.dout_pairs}) {
    f->compute_at(level)
        .reorder(s.dp, s.dh, s.ii)
        .vectorize(s.dp)
        .unroll(s.dh, 4, TailStrategy::GuardWithIf);
  }
}

// Per-row inputs of the row tiles: transposed q and dout (or their pairs), lse, delta and slope.
void schedule_rows(FlashBackwardStages& s, generators::FlashBackwardTileStages& t,
                   const LoopLevel& level, int VL) {
  if (s.bf16_products) {
    schedule_pairs(s, t, level);
  } else {
    for (auto [transposed, by_row] :
         {std::pair(t.query_t, t.query_rows), {t.dout_t, t.dout_rows}}) {
      flash::schedule_row_transpose(transposed.compute_at(level), by_row, s.ii, s.d, s.query_tile);
    }
  }
  for (Func* f : {&t.row_lse, &t.row_delta, &t.row_slope}) {
    if (f->defined()) f->compute_at(level).vectorize(s.ii, VL);
  }
}

// K and V of one key block in fp32, once per block.
void schedule_keys(FlashBackwardStages& s, generators::FlashBackwardTileStages& t,
                   const LoopLevel& level, int VL) {
  for (Func* f : {&t.key_f32, &t.value_f32}) {
    f->compute_at(level).vectorize(s.d, VL, TailStrategy::GuardWithIf);
  }
}

}  // namespace

void schedule_flash_attention_backward_x86(FlashBackwardStages& s, const Target& target,
                                           const Expr& head_dim) {
  const int VL = target.natural_vector_size<float>();  // 16 (AVX-512), 8 (AVX2) or 4 (SSE)
  Var tile("tile"), hb("hb"), dout("dout");

  // delta: each row's head dim in vectors along the row (contiguous loads: vectorized over rows,
  // every load was a gather), one partial sum per lane, then the lanes added.
  Var lane("lane");
  RVar rdo("rdo"), rdi("rdi");
  s.delta.compute_root().fuse(s.h, s.b, hb).parallel(hb);
  Stage delta_update = s.delta.update();
  Func delta_lanes =
      delta_update.split(s.rd_delta, rdo, rdi, VL, TailStrategy::GuardWithIf).rfactor(rdi, lane);
  delta_update.fuse(s.h, s.b, hb).parallel(hb);
  delta_lanes.compute_at(s.delta, s.i).vectorize(lane);
  delta_lanes.update().vectorize(lane);

  for (Func f : {s.row_query, s.row_member}) {
    f.compute_root().vectorize(s.ii, VL, TailStrategy::GuardWithIf);
  }

  // The pass: dk and dv, and dq's partial sums computed with them.
  for (Func f : {s.dk, s.dv}) {
    f.fuse(s.hk, s.b, hb).parallel(hb).vectorize(s.d, VL, TailStrategy::GuardWithIf);
  }
  // Per task, in parallel: both accumulations, then their sums gathered. The accumulations loop
  // over a key block of the chunk, then a row tile, fused down to the row tile: P and dS are
  // computed there once for both. A stage computed with another may not be specialized, so dq's
  // register tiles take the unspecialized shape.
  s.task_grads.compute_root().parallel(s.task).vectorize(s.d, VL, TailStrategy::GuardWithIf);
  for (Func f : {s.grad_kv, s.dq_partial}) {
    f.compute_at(s.task_grads, s.task).vectorize(s.d, VL, TailStrategy::GuardWithIf);
  }
  Stage kv = s.grad_kv.update();
  kv.reorder(s.d, s.jj, s.ro, s.rc, s.rg, s.task);
  flash::split_register_tiles(kv, target, s.d, s.jj, flash::register_tile_extent(target, 4),
                              head_dim, VL, dout);
  Stage dq_update = s.dq_partial.update();
  dq_update.reorder(s.d, s.ii, s.ro, s.rc, s.rg, s.task);
  Var dq_out("dq_out");
  flash::split_register_tiles_unspecialized(dq_update, s.d, s.ii,
                                            flash::register_tile_extent(target, 2), VL, dq_out);
  dq_update.compute_with(kv, s.ro);
  Func fused_parent = s.grad_kv;  // the stage computed first: producers at fused loops go there
  const RVar &row_tile = s.ro, &block = s.rc;
  // bf16_probabilities: the products reduce rows in pairs (one vdpbf16ps per pair).
  const std::optional<RVar> row_pair =
      s.bf16_probabilities ? std::optional<RVar>(s.ri_pair) : std::nullopt;
  for (Func f : {s.block_dv, s.block_dk}) {
    flash::schedule_tile_product(f, s.d, s.jj, s.ri, LoopLevel(s.grad_kv, dout), VL, row_pair);
  }
  schedule_tile(s, s.key_pass, LoopLevel(fused_parent, row_tile), target, "kpass");
  // The rows of a group, per task, while its key blocks pass: computed for the whole call instead,
  // the row tiles' transposes and pairs went to memory and back (4 MB each at B1 H16 S512 D128).
  // A task of a key chunk computes its own, once per chunk: in cache, cheaper than a second read.
  const LoopLevel group_level(fused_parent, s.rg);
  schedule_rows(s, s.key_pass, group_level, VL);
  if (s.bf16_probabilities) {
    // P and dS of the tile rounded to bf16 (32 rows, the fp32 tiles' layout, per key); dout and
    // q rows interleaved in pairs once per group.
    for (Func f : {s.prob_row_pairs, s.dscore_row_pairs}) {
      f.compute_at(fused_parent, row_tile).vectorize(s.pair).vectorize(s.half, VL);
    }
    for (Func* f : {&s.dout_row_pairs, &s.query_row_pairs}) {
      f->compute_at(group_level).vectorize(s.pair).vectorize(s.d, VL, TailStrategy::GuardWithIf);
    }
  } else {
    for (Func f : {s.dout_f32, s.query_f32}) {
      f.compute_at(fused_parent, s.rg).vectorize(s.d, VL);
    }
  }
  schedule_keys(s, s.key_pass, LoopLevel(fused_parent, block), VL);
  const std::optional<RVar> key_pair =
      s.bf16_probabilities ? std::optional<RVar>(s.rj_pair) : std::nullopt;
  flash::schedule_tile_product(s.block_dq, s.d, s.ii, s.rj, LoopLevel(s.dq_partial, dq_out), VL,
                               key_pair);
  if (s.bf16_probabilities) {
    // dS of the tile in bf16 key pairs, and the block's K rows interleaved in pairs.
    s.dscore_key_pairs.compute_at(fused_parent, row_tile).vectorize(s.pair).vectorize(s.ii, VL);
    s.key_pairs.compute_at(fused_parent, block)
        .vectorize(s.pair)
        .vectorize(s.d, VL, TailStrategy::GuardWithIf);
  }
  // Buffers sized by the head dim (a run-time value) are allocated once per task, not per
  // block or tile: each allocation inside the loops was a call to the allocator.
  std::vector<Func> per_task_storage = {s.key_pass.key_f32, s.key_pass.value_f32, s.key_pairs,
                                        s.dout_f32, s.query_f32};
  for (Func f : {s.key_pass.query_t, s.key_pass.dout_t, s.key_pass.query_pairs,
                 s.key_pass.dout_pairs, s.key_pass.row_lse, s.key_pass.row_delta,
                 s.key_pass.row_slope, s.dout_row_pairs, s.query_row_pairs}) {
    if (f.defined()) per_task_storage.push_back(f);
  }
  for (Func f : per_task_storage) f.hoist_storage(s.task_grads, s.task);
  // The tiles of a (row tile, key block) pair and their register-tile products cover one key
  // block, row tile, kv head and batch. Bounds inference cannot always prove these single values
  // (they derive from the task), and a size it cannot prove constant is a heap allocation per
  // tile.
  std::vector<Func> pair_tiles = {s.key_pass.prob, s.key_pass.dscore, s.block_dv, s.block_dk,
                                  s.block_dq};
  if (s.bf16_probabilities) {
    pair_tiles.insert(pair_tiles.end(), {s.prob_row_pairs, s.dscore_row_pairs, s.dscore_key_pairs});
  }
  for (Func f : pair_tiles) {
    f.bound_storage(s.jb, 1).bound_storage(s.io, 1).bound_storage(s.hk, 1).bound_storage(s.b, 1);
  }

  // dq: the partial sums added in chunk order, per (query head, batch) as dq is written.
  s.dq.fuse(s.h, s.b, hb).parallel(hb).vectorize(s.d, VL, TailStrategy::GuardWithIf);
  s.grad_q.compute_at(s.dq, hb).vectorize(s.d, VL, TailStrategy::GuardWithIf);
  s.grad_q.update()
      .reorder(s.d, s.ii, s.rkc, s.io, s.hk, s.b)
      .vectorize(s.d, VL, TailStrategy::GuardWithIf);

  // The bias gradient: ds, tile by tile.
  Var jo("jo"), jin("jin"), rt("rt"), rin("rin");
  s.ds.tile(s.j, s.row, jo, rt, jin, rin, s.key_block, s.query_tile, TailStrategy::GuardWithIf)
      .reorder(jin, rin, jo, rt, s.hk, s.b)
      .fuse(rt, s.hk, tile)
      .fuse(tile, s.b, tile)
      .parallel(tile)
      .vectorize(jin, VL, TailStrategy::GuardWithIf);
  schedule_tile(s, s.bias_pass, LoopLevel(s.ds, jo), target, "bpass");
  schedule_rows(s, s.bias_pass, LoopLevel(s.ds, tile), VL);
  schedule_keys(s, s.bias_pass, LoopLevel(s.ds, jo), VL);
}

}  // namespace tilelab::schedules
