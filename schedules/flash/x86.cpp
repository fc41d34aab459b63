// x86 schedule of flash attention forward (generators/flash/flash_attention_generator.cpp).
//
// Target assumptions: AVX-512 (16 fp32 lanes, 32 zmm registers) first, then AVX2+FMA (8 lanes, 16
// ymm), then SSE baseline (4 lanes). Zen 4 runs 512-bit FMAs at one per cycle (two 256-bit pipes).
//
// Loop nest per (query tile io, kv head hk, batch b), parallel over the three fused:
//   query_t            QT×D, transposed once per tile so rows are contiguous
//   for each key block rk (causal: its keys right of the tile's last visible key skipped from
//                       the group of 8 after it; blocks wholly right skipped too, or with
//                       split_state reduced over no key)
//     masked / score   QT×KB, register tiles of (2·VL rows) × 8 keys = 16 accumulators
//                       (AVX-512: 2 row vectors + 8 key broadcasts per d → 16 FMAs, 10 loads;
//                       AVX2, 16 ymm: × 4 keys, 8 accumulators, flash::accumulator_registers)
//     block_max, running_max, rescale, prob, block_sum: vertical ops over rows (no horizontal
//                       reductions); exps are per score and per (row, block), never per output
//     block_pv         (2·VL head dims) × 8 rows = 16 accumulators per register tile
//                       (AVX-512: 2 V vectors + 8 prob broadcasts per key → 16 FMAs, 10 loads;
//                       bf16 pairs and decode: (4·VL) × 4, 4 V vectors + 4 broadcasts; AVX2:
//                       half the rows)
//     state merge      (m, l, o): o · rescale + block_pv, two FMAs per element; kernels
//                       without a causal mask keep (m, l) per row (split_state), one FMA
//   out, lse           the tile's rows normalized and written to the outputs (row layout)
// Register budget: AVX-512 16 accumulators + 2–4 operands, 20/32 zmm; AVX2 8 + 2–4, 12/16 ymm.
//
// Tried: merging per block with max/exp inside the Tuple update (the textbook block-wise merge).
// The rescale then depends on the state, so it is computed per output element: one or two exps
// per (d, row, block), about a third of the FMA work at D = 128, KB = 64. Keeping the running
// max as its own Func (recomputed from stored block maxima) moves the exps to per-row work.
// Key blocks: 128 (kPrefillWideTiling: 4-8% faster than 64 in fp32 and bf16, with a bias or not,
// measured side by side on Zen 4; 32 was slower), 64 for the score options. The probabilities'
// exps are exp_nonpositive (online_softmax.hpp): 1.23 ulp, and the loop over 16 scores (loads, mask
// and store included) 25 instructions, or 20 at bf16 accuracy, against 33 with Halide's exp;
// Halide's took 13% of a one-thread bf16 call (B1 H16 S512 D128). Same-process A/B on Zen 4:
// fp32 1.01x faster, bf16 (at bf16 accuracy) 1.04-1.05x. Tried, no gain: Halide's fast_exp (within
// noise); software prefetch of the next K/V block in decode (0-10% slower on Zen 3: the hardware
// prefetchers already follow the two streams; Halide prefetch two blocks ahead, no change on Zen
// 4); no initialization pass for the state (undef, block 0 writes): the select per
// merged element cost what the pass did; 64-row query tiles for bf16 products (Zen 4: full no
// faster, causal slower; the tiles that widen K and V gain: kPrefillWideTallTiling).
//
// Causal tiles stop at their last visible key to within a group of 8 keys (define_online_softmax):
// a where clause on the groups trims the reductions' loops, and the scores and probabilities are
// computed for the groups reached only because the reductions read them at groups clamped to the
// tile's last (bounds inference takes an RDom's box, not its predicate), into storage of a whole
// block (bound_storage: the computed extent varies, and a buffer of varying size went to the heap).
// B1 H16 S512 D128 fp32 on Zen 4, 2 threads, causal against full, alternating: 1.45-1.50x with
// blocks skipped whole, 1.64-1.75x with the groups. (A where clause on the keys themselves, tried
// first, kept an if per key in the innermost loop and was 1.5x slower.)
//
// bf16 with bf16 products (AVX-512 BF16 targets): the same nest on paired operands. q·k: 2 row
// vectors of (head-dim pair) × 16 rows and 8 key-pair broadcasts read from K in place → 16
// vdpbf16ps. P·V: 4 vectors of (key pair) × 16 head dims from V interleaved in key pairs once per
// call, 4 broadcast P pairs → 16 vdpbf16ps. P is rounded to bf16 once per (tile, block).
#include "schedules/flash/x86.hpp"

#include <optional>

#include "schedules/flash/x86_shared.hpp"

namespace tilelab::schedules {

using namespace Halide;

namespace {

// `f`, indexed (..., d, ..., jb, hk, b), once per call before the query tiles: parallel over
// (key block, kv head, batch), head dims in vectors (inside `pair`'s lanes when given), and
// specialized like the merge, so that the fast head dims read without a clamp.
void at_root_per_key_block(Func f, const FlashAttentionStages& s, const Target& target,
                           const Expr& head_dim, int lanes,
                           const std::optional<Var>& pair = std::nullopt) {
  Var blocks("blocks");
  f.compute_root().fuse(s.jb, s.hk, blocks).fuse(blocks, s.b, blocks).parallel(blocks);
  if (pair) f.vectorize(*pair);
  f.vectorize(s.d, lanes, TailStrategy::GuardWithIf);
  for (int dims : flash::fast_head_dims(target)) f.specialize(head_dim == dims);
}

// A bias that varies across a tile's rows, `transposed(rows, keys) = by_row(keys, rows)` for the
// keys of one score register tile, computed at `tile` (the register tile's loop over keys,
// inside the consumer's specialization for such a bias, so that a bias broadcast over rows never
// computes it): each row's keys read as stored (one dense load, where the rows in the vector
// lanes would make every score vector a 16-lane gather), then transposed in registers.
void schedule_bias_transpose(Func transposed, Func by_row, const LoopLevel& tile, const Var& rows,
                             const Var& keys, int lanes, int tile_keys) {
  transposed.compute_at(tile).vectorize(rows, lanes).unroll(rows).vectorize(keys, tile_keys);
  by_row.compute_at(transposed, Var::outermost()).vectorize(keys, tile_keys).unroll(rows);
}

}  // namespace

void schedule_flash_attention_x86(FlashAttentionStages& s, const Target& target,
                                  const Expr& head_dim) {
  const int VL = target.natural_vector_size<float>();
  // The outputs in the row layout, a query tile per iteration, parallel over (tile, kv head,
  // batch): each tile's state is computed, normalized and written in one iteration. (Computed in
  // a buffer of rows and then copied out by (query, head), the copy and the buffer's extra
  // traffic took 4-5% of B1 H16 S512 D128 fp32, Zen 4, 1 and 2 threads.)
  Var tile("tile"), tile_row("tile_row");
  s.out.split(s.row, tile, tile_row, s.query_tile, TailStrategy::GuardWithIf)
      .fuse(tile, s.hk, tile)
      .fuse(tile, s.b, tile)
      .parallel(tile)
      .vectorize(s.d, VL, TailStrategy::GuardWithIf);
  const LoopLevel at_tile(s.out, tile);
  schedule_online_softmax_x86(s, target, head_dim, at_tile);
  const int RV = std::min(VL, s.query_tile);
  for (Func f : {s.row_query, s.row_key_limit, s.row_head, s.row_lse_and_scale}) {
    f.compute_at(at_tile).vectorize(s.ii, RV);
  }
  // Score options only.
  for (Func f : {s.row_key_first, s.row_slope, s.row_sink}) {
    if (f.defined()) f.compute_at(at_tile).vectorize(s.ii, RV);
  }
}

void schedule_online_softmax_x86(FlashAttentionStages& s, const Target& target,
                                 const Expr& head_dim, const LoopLevel& tile) {
  const int VL = target.natural_vector_size<float>();  // 16 (AVX-512), 8 (AVX2) or 4 (SSE)
  const int QT = s.query_tile;
  const auto [score_rows, score_keys] = flash::score_register_tile(target, QT);
  // block_pv register tiles: fp32 products take (2·VL head dims) × 8 rows, so that the slice of a
  // 128-key block's V that every row tile reads in turn is 16 KiB at D = 128 and stays in L1 (at
  // 4·VL it was 32 KiB, beside the tile's 16 KiB of P: Emerald Rapids, whose two 512-bit FMA pipes
  // outran the L2 reads, B1 H16 S512 D128 fp32 full 10.3-10.8 ms against 12.0-12.1, the rest
  // unchanged). bf16 pairs and decode tiles keep (4·VL) × 4. Tried on Zen 4, no gain: VL × 16
  // rows (one V vector, 16 FMAs on embedded P broadcasts, an 8 KiB V slice): fp32 full 1.04x faster
  // on one thread but 0.98x on two (15 alternating runs), causal 0.98x; unrolling the 8 keys of a
  // group, one thread: fp32 probabilities 0.95x, D = 64 0.97x, causal 1.03x (and unrolled where a
  // group is a whole block, each block-sparse kernel took over 7 minutes to generate).
  const int pv_vectors = s.bf16_products || QT < 8 ? 4 : 2;
  const int pv_rows = std::min(QT, flash::register_tile_extent(target, pv_vectors));
  const int RV = std::min(VL, QT);  // lanes for per-row vectors (never pad rows)
  Var dout("dout"), iii("iii"), jjo("jjo"), jji("jji");

  // The running state of one tile (io, hk, b): with split_state, o alone in the merge's loop nest
  // and (m, l) per row fused into its block loop (below); `state` is then inlined.
  Func merged = s.split_state ? s.out_sum : s.state;
  merged.compute_at(tile).vectorize(s.d, VL, TailStrategy::GuardWithIf);
  Stage merge = merged.update();
  // Not peeled at rk = 0 (rescale's jb == 0, now that jb is rk): the peeled copy lost the head-dim
  // fast paths, and its V loads became gathers.
  merge.never_partition(s.rk);
  merge.reorder(s.d, s.ii, s.rk, s.io, s.hk, s.b);
  // Head dims are rounded up to the register tile (extra columns read a clamped V and are never
  // stored to out); fast paths for 64 and 128 have no rounding.
  flash::split_register_tiles(merge, target, s.d, s.ii, pv_rows, head_dim, VL, dout, pv_vectors);
  if (s.split_state) {
    // (m, l) of the tile's rows, updated in the merge's block loop: the stages computed per block
    // serve both. Against (m, l) stored per head dim beside o (three times the state, 48 KiB of a
    // 32-row tile at D = 128, past Zen 4's 32 KiB L1, and two of the merge's three stores): B1 H16
    // S512 D128 full, Zen 4, 2 threads, alternating builds, results bit-identical: fp32
    // 1.02-1.05x faster, bf16 1.05-1.08x. Halide does not trim the fused loop to the blocks a
    // where clause keeps: a causal tile's blocks past its last key are visited, but reduce no key
    // (define_online_softmax) and compute no q·k (define_scores); their merge is skipped.
    s.row_stats.compute_at(tile).vectorize(s.ii, RV);
    s.row_stats.update()
        .reorder(s.ii, s.rk, s.io, s.hk, s.b)
        .vectorize(s.ii, RV)
        .compute_with(merge, s.rk);
  }

  if (s.bf16_products) {
    // bf16 operands in pairs: q once per tile, P once per (tile, block); K in place.
    // Pairs of head dims copied along a row (each a 32-bit move): vectorizing over rows made
    // every lane a gather of two bf16 values from a different row.
    s.query_bf16.compute_at(tile)
        .reorder(s.dp, s.dh, s.ii)
        .vectorize(s.dp)
        .unroll(s.dh, 4, TailStrategy::GuardWithIf);
    if (s.value_pairs_shared_by_tiles) {
      // V in key pairs once per call, before the tiles: every query tile of a kv head reads the
      // same blocks, and interleaving them per tile cost about 5% of the call. (Specialized like
      // the merge: the fast head dims read V without a clamp.)
      at_root_per_key_block(s.value_bf16, s, target, head_dim, VL, s.jp);
    } else {
      s.value_bf16.compute_at(merged, s.rk)
          .bound_extent(s.jb, 1)
          .vectorize(s.jp)
          .vectorize(s.d, VL, TailStrategy::GuardWithIf);
    }
    s.prob_bf16.compute_at(merged, s.rk).vectorize(s.jp).vectorize(s.ii, RV);
  } else {
    s.query_t.compute_at(tile);
    if (!s.decode) flash::schedule_row_transpose(s.query_t, s.query_rows, s.ii, s.d, QT);
  }
  if (s.operands_at_root && !s.bf16_products) {
    // V (and 16-bit K) in fp32 once per call, before the tiles, specialized like the merge: the
    // score options variant's merge loop starts at a window's first block, and converted per
    // (tile, block) or read in place, their clamped head-dim loads became gathers.
    at_root_per_key_block(s.value_f32, s, target, head_dim, VL);
    if (!s.value_is_f32) at_root_per_key_block(s.key_f32, s, target, head_dim, VL);
  } else if (!s.value_is_f32 && !s.decode && !s.bf16_products) {
    // 16-bit K and V: converted to fp32 once per (tile, block), reused by every row of the tile
    // (with 64-row tiles, kPrefillWideTallTiling, half as often). Decode tiles have 4 rows: there
    // the conversion is fused into the loads instead.
    for (Func f : {s.key_f32, s.value_f32}) {
      f.compute_at(merged, s.rk)
          .bound_extent(s.jb, 1)
          .vectorize(s.d, VL, TailStrategy::GuardWithIf);
    }
  }

  if (!s.decode) {
    s.masked.compute_at(merged, s.rk)
        .tile(s.ii, s.jj, iii, jji, score_rows, score_keys)
        .vectorize(iii, VL)
        .unroll(iii)
        .unroll(jji);
    if (s.bf16_products) {
      // Per pair of head dims: 2 row vectors of (q pair) × 16 rows, 8 key-pair broadcasts, 16
      // vdpbf16ps into 16 accumulators.
      flash::schedule_score_pair_products(s.score_products, s.ii, s.jj, s.rdp, s.rd,
                                          LoopLevel(s.masked, s.ii), VL);
    } else {
      s.score.compute_at(s.masked, s.ii).vectorize(s.ii, VL).unroll(s.ii).unroll(s.jj);
      s.score.update().reorder(s.ii, s.jj, s.rd).vectorize(s.ii, VL).unroll(s.ii).unroll(s.jj);
    }
  } else {
    // Decode: partial sums of (QT rows) × (K keys: 4, AVX2 2) in head-dim lanes, QT·K registers;
    // per lane vector of d, QT query loads and K key loads feed QT·K FMAs. Then one horizontal
    // sum per score.
    const int lanes = s.decode_lanes, keys = flash::register_tile_extent(target, QT);
    s.query_t.reorder_storage(s.d, s.ii);  // head dim contiguous, for the lane-wise loads
    s.masked.compute_at(merged, s.rk).split(s.jj, jjo, jji, keys).vectorize(s.ii, RV);
    s.score.compute_at(s.masked, jjo).unroll(s.ii).unroll(s.jj);
    s.score.update().reorder(s.ii, s.jj, s.rl).atomic().vectorize(s.rl).unroll(s.ii).unroll(s.jj);
    s.score_partial.compute_at(s.masked, jjo).vectorize(s.dl, lanes).unroll(s.ii).unroll(s.jj);
    s.score_partial.update()
        .reorder(s.dl, s.ii, s.jj, s.rd)
        .vectorize(s.dl, lanes)
        .unroll(s.ii)
        .unroll(s.jj);
  }

  // A bias broadcast over rows and query heads is one load per key, not a gather across the rows
  // in the lanes (B1 H16 S512 D128 with a [1, 1, 1, N] fp32 bias, Emerald Rapids, 2 threads: fp32
  // 11.6-12.5 -> 9.8-10.3 ms, bf16 11.5-11.6 -> 9.9-10.1, as fast as without a bias). One that
  // varies by row is read a row at a time and transposed (schedule_bias_transpose; with a
  // [1, Hq, 512, 512] bias, fp32 B1 H8 on one thread 11.7-11.9 -> 10.6-11.3 ms against 10.0-10.3
  // without, bf16 H16 on two 11.8 -> 11.1-11.3 against 9.8). The transposition costs each bias
  // kernel about 6 s of generator time, 16 s with 64-row tiles. (The backward's P, which gathers
  // such a bias too, gained 2% from it for 40 s per kernel: left as it is.)
  if (s.bias_row_stride.defined()) {
    s.masked.specialize(s.bias_row_stride == 0).specialize(s.bias_head_stride == 0);
    schedule_bias_transpose(s.bias_t, s.bias_rows, LoopLevel(s.masked, s.jj), s.ii, s.jj, VL,
                            score_keys);
  }

  // Block maxima are kept for the whole tile (store_at) and computed per block: the sliding
  // window computes each block once while running_max reads blocks 0..rk.
  s.block_max.store_at(tile).compute_at(merged, s.rk).vectorize(s.ii, RV);
  s.running_max.compute_at(merged, s.rk).vectorize(s.ii, RV);
  s.running_max.update().reorder(s.ii, s.rb).vectorize(s.ii, RV);
  s.rescale.compute_at(merged, s.rk).vectorize(s.ii, RV);
  s.block_sum.compute_at(merged, s.rk).vectorize(s.ii, RV);
  // The block reductions run per row vector with the accumulator in a register (their consumers'
  // buffers are dynamically sized, so accumulating there went through memory on every key).
  s.block_max_in_block.compute_at(s.block_max, s.ii).vectorize(s.ii);
  s.block_sum_in_block.compute_at(s.block_sum, s.ii).vectorize(s.ii);
  for (Func f : {s.block_max_in_block, s.block_sum_in_block}) {
    f.update().reorder(s.ii, s.rj, s.rjg).vectorize(s.ii).unroll(s.rj, 4);
  }
  s.prob.compute_at(merged, s.rk).vectorize(s.ii, RV).unroll(s.jj, 4);

  // Keys in groups (rjg); bf16 products reduce a group's keys in pairs (rjp within, rjo over the
  // pairs, rjpg over the groups).
  const RVar keys = s.bf16_products ? s.rjo : s.rj;
  const std::optional<RVar> pair = s.bf16_products ? std::optional<RVar>(s.rjp) : std::nullopt;
  flash::schedule_tile_product(s.block_pv, s.d, s.ii, keys, LoopLevel(merged, dout), VL, pair,
                               s.bf16_products ? s.rjpg : s.rjg);
  // Each per-block stage is computed for block rk alone, but bounds inference, bounding jb by the
  // merge's where clause as min(last live block, rk), cannot see that: its loops over jb had an
  // unknown trip count (a memset call and reloads of the register tile per P·V tile) and its
  // buffers a dynamic, heap-allocated size. One block, said once. Not after a window's first
  // block (the score options variant), whose merge starts at a block that varies by tile: there
  // the bounded stages computed wrong values, and block_pv's index kept max(first block, rk) - rk,
  // which made the bf16 pairs' atomic vectorization fall back to scalar code.
  if (!s.operands_at_root) {
    for (Func f : {s.masked, s.prob, s.block_sum, s.rescale, s.block_pv}) f.bound_extent(s.jb, 1);
    if (s.bf16_products) s.prob_bf16.bound_extent(s.jb, 1);
  }
  // A causal tile's scores and probabilities are computed for the keys it reaches, which vary by
  // block and tile: stored in buffers of a whole block, not of varying size (on the heap).
  if (!s.decode) {
    s.masked.bound_storage(s.jj, s.key_block);
    s.prob.bound_storage(s.jj, s.key_block);
    if (s.bf16_products) s.prob_bf16.bound_storage(s.jo, s.key_block / 2);
  }
}

}  // namespace tilelab::schedules
