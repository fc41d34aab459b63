// x86 schedule of flash paged attention (generators/paged/paged_attention_generator.cpp).
//
// Target assumptions: AVX-512 (16 fp32 lanes, 32 zmm registers) first, then AVX2+FMA (8 lanes, 16
// ymm), then SSE baseline (4 lanes). Zen 4 runs 512-bit FMAs at one per cycle (two 256-bit pipes).
//
// fp32, and mixed precision on CPUs without AVX-512 BF16 (the bf16 nest is described below).
// Before the main loop, once per call (parallel over large tiles and kv heads): the context K is
// gathered through the block table into fp32 with the tile's column order innermost (key_t), V
// into fp32 rows (value_t); the new tokens' K/V likewise. That is one pass over what the kernel
// reads anyway; regathering per 32-row query tile cost ~1 op per K element against 2 FMAs.
// Loop nest per (query tile io of 32 rows, kv head hk), parallel over both:
//   for each large tile rk of the context the runtime lists for the tile (every large tile
//   whose mask is not all zero for the tile's rows; schedules/paged/masked_tiles.hpp):
//     masked / score   32 × LTS, register tiles of 8 rows × (2·VL columns) = 16 accumulators
//                      (AVX-512: 2 K vectors + 8 q broadcasts per d → 16 FMAs, 10 loads)
//     block_max, block_sum   rfactor'd into VL-lane partials: vertical ops, one horizontal
//                      reduction per row and tile
//     prob             exp(s - m) over contiguous columns; bf16 rounding when mixed
//     block_pv         (4·VL head dims) × 4 rows = 16 accumulators per register tile
//     state merge      (m, l, o): o · rescale + block_pv, two FMAs per element
//   then the new tokens' tile with the same stages, and o / l.
// Register budget (AVX-512): 16 accumulators + 2–8 operands, at most 26/32 zmm. AVX2 (16 ymm):
// half the rows per register tile, 8 accumulators (flash::accumulator_registers).
// Buffers per task: scores and P of 32 × LTS fp32 each (256 KiB each at LTS = 2048) in L2.
//
// Measured (H 8/2, d 128, seq_q 256, context 4096, block_size 32, LTS 2048, mixed precision;
// median of 5, 2 threads; GFLOP/s count every score, masked ones included):
//   AMD EPYC Zen 3 (AVX2), 2026-11-23: 75-84 ms = 55-61 GFLOP/s = 27-30% of the fp32 FMA peak
//     measured in the same run (203 GFLOP/s, tilelab_machine_peak); tile schedule 174 ms (13%).
//   Zen 4 (AVX-512), 2026-11 (peak not recorded): 23 ms mixed precision and fp32, about 200
//     GFLOP/s, vs 106 ms for the tile schedule. The per-call K/V pre-pass is
// ~8% of the time. With numpy's OpenBLAS threads spinning on the same 2 cores (after an einsum)
// the same call takes 80-130 ms: set OPENBLAS_NUM_THREADS=1 when measuring.
// Tried: gathering and transposing K per (query tile, large tile) as the tile schedule does:
// 132 ms (the transpose is ~1 op per K element against 2 FMAs per element at 32 rows).
// Continuous batching (bench/paged's default batch: 4 prefill + 12 decode requests, H 32/8,
// d 128, seq_q 512, context 16384, mixed precision; 2 threads on AMD EPYC Zen 3 (AVX2), 2 cores
// shared with other jobs, 2026-11-23, 4 alternating runs each): computing every large tile took
// 3933-8817 ms (1.50-1.67× our dense flash attention in the same runs); listing only the large
// tiles each 32-row block's mask touches (24 of 128 (block, large tile) pairs, 3 calls, one per
// list length; the K/V pre-pass runs per call over the large tiles the call lists, ~6% of the
// time) takes 997-2481 ms (0.38-0.45× the dense kernel): about 4× faster in the same conditions.
//
// Mixed precision on AVX-512 BF16 targets (Zen 4, Sapphire Rapids and later) runs another nest,
// the dense flash forward's bf16 one: rows vectorized (the 32-row query tile is two vectors),
// columns broadcast. Once per call: K gathered into bf16 rows in column order, V interleaved in
// column pairs, and each task's mask transposed into row vectors (uint8; the same for every head
// of the task, so this is not repeated per head). Per (query tile, kv head), per large tile:
//   masked / score   (2·VL rows) × 8 columns = 16 accumulators; per pair of head dims 2 q-pair
//                    vectors and 8 broadcast K pairs → 16 vdpbf16ps
//   block_max, block_sum, prob   vertical over the columns, exp per score
//   prob_pairs       P rounded to bf16, interleaved in column pairs
//   block_pv         4 V-pair vectors × 4 broadcast P pairs → 16 vdpbf16ps
// The task's row count is bound to kPagedCpuQueryTile: with a run-time row stride the row-vector
// loads of P became 2-lane gathers. Measured on the default batch (Zen 4, 2 threads, 2026-11-26,
// bench/paged/bench_serving.py): 310 ms with the fp32-FMA nest, 138 ms with this one (0.71× the
// time of PyTorch SDPA run per sequence in the same run); the dot-product loops then take about
// two thirds of the time, at about 70% of the bf16 dot peak.
#include "schedules/paged/x86.hpp"

#include "schedules/flash/x86_shared.hpp"

namespace tilelab::schedules {

using namespace Halide;

namespace {

// `f` once per call, before the query tiles: parallel over (large tile, kv head), `lanes` of `var`
// per vector. Returns `f` for more scheduling.
Func at_root_per_kv_tile(Func f, const PagedAttentionStages& s, const Var& var, int lanes) {
  Var kv_tile("kv_tile");
  return f.compute_root()
      .fuse(s.lt, s.hk, kv_tile)
      .parallel(kv_tile)
      .vectorize(var, lanes, TailStrategy::GuardWithIf);
}

// The per-call operands and the key-tile stages of the bf16-products nest: rows vectorized (the
// query tile's 32 rows are two vectors), columns broadcast, as the dense flash forward's bf16 nest.
void schedule_bf16_products(PagedAttentionStages& s, const Target& target, const Var& tile,
                            const Var& dout) {
  const int VL = target.natural_vector_size<float>();
  Var kv_tile("kv_tile"), iii("iii"), ci("ci"), iio("iio"), din("din"), dvo("dvo"), dvi("dvi");
  // K rows and V pairs once per call (specialized on the fast head dims, whose reads need no
  // clamp: clamped, every load was a gather).
  for (KeyTileStages* t : {&s.context, &s.active}) {
    at_root_per_kv_tile(t->key_rows, s, s.d, VL);
    at_root_per_kv_tile(t->value_pairs, s, s.d, VL).vectorize(s.cp);
    for (int dims : flash::fast_head_dims(target)) {
      t->key_rows.specialize(s.head_dim == dims);
      t->value_pairs.specialize(s.head_dim == dims);
    }
  }
  // The tasks' masks in row vectors, once per call.
  for (KeyTileStages* t : {&s.context, &s.active}) {
    t->visible.compute_root()
        .reorder_storage(s.ii, s.c)
        .reorder(s.ii, s.c)
        .fuse(s.lt, s.io, kv_tile)
        .parallel(kv_tile)
        .vectorize(s.ii, 2 * VL);
  }
  // q · scale in pairs of head dims: two row vectors interleaved.
  s.query_pairs.compute_at(s.final_out, tile).vectorize(s.dp).vectorize(s.ii, VL);

  auto schedule_key_tile = [&](KeyTileStages& t, const LoopLevel& at) {
    // Scores with rows innermost: the dense forward's register tiles, (2·VL rows) × 8 columns,
    // 16 accumulators; per pair of head dims 2 row vectors of q pairs, 8 broadcast K pairs, 16
    // vdpbf16ps.
    const auto [tile_rows, tile_columns] = flash::score_register_tile(target, s.query_tile);
    t.masked.compute_at(at)
        .reorder_storage(s.ii, s.c)
        .tile(s.ii, s.c, iii, ci, tile_rows, tile_columns)
        .vectorize(iii, VL)
        .unroll(iii)
        .unroll(ci);
    t.score_products.reorder_storage(s.ii, s.c);
    flash::schedule_score_pair_products(t.score_products, s.ii, s.c, t.rdp, t.rd,
                                        LoopLevel(t.masked, s.ii), VL);
    // Row statistics are vertical over the columns.
    for (Func f : {t.block_max, t.block_sum}) {
      f.compute_at(at).vectorize(s.ii, VL);
      f.update().reorder(s.ii, t.rj).vectorize(s.ii, VL).unroll(t.rj, 4);
    }
    t.prob_f32.compute_at(at).reorder_storage(s.ii, s.c).reorder(s.ii, s.c).vectorize(s.ii, VL);
    t.prob_pairs.compute_at(at).vectorize(s.cp).vectorize(s.ii, VL);
  };
  schedule_key_tile(s.context, LoopLevel(s.state, s.rk));
  schedule_key_tile(s.active, LoopLevel(s.final_out, tile));

  // Context P·V per register tile of the merge: 4 V vectors of (column pair) × VL head dims, 4
  // broadcast P pairs, 16 vdpbf16ps.
  flash::schedule_tile_product(s.context.block_pv, s.d, s.ii, s.context.rjo,
                               LoopLevel(s.state, dout), VL, s.context.rjp);
  // The new tokens' P·V: the same register tiles, for the whole query tile.
  s.active.block_pv.compute_at(s.final_out, tile).vectorize(s.d, VL, TailStrategy::GuardWithIf);
  s.active.block_pv.update()
      .split(s.d, dout, din, 4 * VL, TailStrategy::RoundUp)
      .split(s.ii, iio, iii, flash::register_tile_extent(target, 4))
      .split(din, dvo, dvi, VL)
      .reorder(s.active.rjp, dvi, dvo, iii, s.active.rjo, dout, iio)
      .atomic()
      .vectorize(s.active.rjp)
      .vectorize(dvi)
      .unroll(dvo)
      .unroll(iii);
}

}  // namespace

void schedule_paged_attention_x86(PagedAttentionStages& s, const Target& target) {
  const int VL = target.natural_vector_size<float>();  // 16 (AVX-512), 8 (AVX2) or 4 (SSE)
  const int QT = s.query_tile;
  // Register tiles: score 2 column vectors × score_rows, P·V 4 head-dim vectors × pv_rows.
  const int score_rows = std::min(QT, flash::register_tile_extent(target, 2));
  const int pv_rows = std::min(QT, flash::register_tile_extent(target, 4));
  Var tile("tile"), co("co"), ci("ci"), iio("iio"), iii("iii"), dout("dout"), din("din"), u("u");
  Var dvo("dvo"), dvi("dvi");

  // A task's rows: the runtime passes kPagedCpuQueryTile of them, and constant row strides keep
  // the row-vector loads dense.
  s.out.bound(s.i, 0, QT).vectorize(s.d, VL, TailStrategy::GuardWithIf).parallel(s.h);

  // One task per (query tile, kv head).
  s.final_out.compute_root().fuse(s.io, s.hk, tile).parallel(tile);
  s.final_out.vectorize(s.d, VL, TailStrategy::GuardWithIf);
  s.final_sum.compute_at(s.final_out, tile).vectorize(s.ii, VL);
  s.final_max.compute_at(s.final_out, tile).vectorize(s.ii, VL);
  s.query_t.compute_at(s.final_out, tile).vectorize(s.ii, VL);
  s.active_limit.compute_at(s.final_out, tile).vectorize(s.ii, VL);

  s.state.compute_at(s.final_out, tile).vectorize(s.d, VL, TailStrategy::GuardWithIf);
  Stage merge = s.state.update();
  // Head dims are rounded up to the register tile (extra columns read a clamped V and are never
  // stored to out); fast paths for 128 and 64 have no rounding.
  for (int dims : {128, 64}) {
    merge.specialize(s.head_dim == dims)
        .split(s.d, dout, din, std::min(dims, 4 * VL), TailStrategy::RoundUp)
        .split(s.ii, iio, iii, pv_rows)
        .reorder(din, iii, dout, iio, s.io, s.hk, s.rk)
        .vectorize(din, VL)
        .unroll(iii);
  }
  merge.split(s.d, dout, din, VL, TailStrategy::RoundUp)
      .split(s.ii, iio, iii, pv_rows)
      .reorder(din, iii, dout, iio, s.io, s.hk, s.rk)
      .vectorize(din)
      .unroll(iii);

  // Tile maxima kept for the whole query tile, one more computed per large tile (sliding window).
  s.context.block_max.store_at(s.final_out, tile);
  s.running_max.compute_at(s.state, s.rk).vectorize(s.ii, VL);
  s.running_max.update().reorder(s.ii, s.rb).vectorize(s.ii, VL);
  s.rescale.compute_at(s.state, s.rk).vectorize(s.ii, VL);

  if (s.bf16_products) {
    schedule_bf16_products(s, target, tile, dout);
    return;
  }
  // Once per call: gathered, converted K (columns innermost) and V (head dims innermost).
  for (KeyTileStages* t : {&s.context, &s.active}) {
    at_root_per_kv_tile(t->key_t, s, s.c, VL);
    at_root_per_kv_tile(t->value_t, s, s.d, VL);
  }

  auto schedule_key_tile = [&](KeyTileStages& t, const LoopLevel& at) {
    t.masked.compute_at(at)
        .tile(s.c, s.ii, co, iio, ci, iii, 2 * VL, score_rows)
        .reorder(ci, iii, co, iio)
        .vectorize(ci, VL)
        .unroll(ci)
        .unroll(iii);
    t.score.compute_at(t.masked, co).vectorize(s.c, VL).unroll(s.c).unroll(s.ii);
    t.score.update().reorder(s.c, s.ii, t.rd).vectorize(s.c, VL).unroll(s.c).unroll(s.ii);
    // Row reductions over columns: VL-lane partials first.
    for (Func f : {t.block_max, t.block_sum}) {
      RVar rjo("rjo"), rji("rji");
      Func partial = f.update().split(t.rj, rjo, rji, VL).rfactor(rji, u);
      partial.compute_at(at).vectorize(u);
      partial.update().reorder(u, rjo, s.ii).vectorize(u);
      f.compute_at(at);
    }
    t.prob_f32.compute_at(at).vectorize(s.c, VL);
    t.prob.compute_at(at).vectorize(s.c, VL);
  };
  schedule_key_tile(s.context, LoopLevel(s.state, s.rk));
  schedule_key_tile(s.active, LoopLevel(s.final_out, tile));

  // Context P·V per register tile of the merge.
  s.context.block_pv.compute_at(s.state, dout)
      .split(s.d, dvo, dvi, VL)
      .vectorize(dvi)
      .unroll(dvo)
      .unroll(s.ii);
  s.context.block_pv.update()
      .split(s.d, dvo, dvi, VL)
      .reorder(dvi, dvo, s.ii, s.context.rj)
      .vectorize(dvi)
      .unroll(dvo)
      .unroll(s.ii);
  // New tokens' P·V: the same register tiles, computed for the whole query tile.
  s.active.block_pv.compute_at(s.final_out, tile).vectorize(s.d, VL, TailStrategy::GuardWithIf);
  s.active.block_pv.update()
      .split(s.d, dout, din, 4 * VL, TailStrategy::GuardWithIf)
      .split(s.ii, iio, iii, pv_rows)
      .split(din, dvo, dvi, VL)
      .reorder(dvi, dvo, iii, s.active.rj, dout, iio)
      .vectorize(dvi)
      .unroll(dvo)
      .unroll(iii);
}

}  // namespace tilelab::schedules
