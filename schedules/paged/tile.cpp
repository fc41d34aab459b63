// Tile-machine schedule of flash paged attention (generators/paged/paged_attention_generator.cpp):
// the loop nest of vLLM's NKI kernel on a NeuronCore, run as CPU code so that its numerics (tile
// order, merge order, bf16 rounding points) can be checked against the fp64 reference and the
// simulator.
//
// Target assumptions: the NeuronCore-like machine of DESIGN.md, 128 SBUF/PSUM partitions, PSUM
// banks of 512 fp32 per partition. On the CPU this schedule runs on whatever x86 target it is
// compiled for; it is vectorized along free dims only so the tests stay fast, never reordered
// for the CPU's sake.
//
// Loop nest per (query tile io = 128 rows of one query head, kv head hk), parallel over both:
//   query_t            (d partitions, 128 free) q · scale, kernel dtype
//   for each large tile rk of the prior context:
//     key_loaded /     loads_per_large_tile loads of (128 partitions, tiled_block_size · d free):
//     value_loaded       partition p reads one piece of a cache block (block_size_tiling_factor
//                        pieces per block) through the block table
//     key_t            K transpose: (d partitions, LARGE_TILE_SZ free)
//     score / masked   LARGE_TILE_SZ / 512 PSUM tiles of (128 rows, 512 columns) fp32, masked
//                        into the (128, LARGE_TILE_SZ) score buffer with -9984
//     block_max        per-row max over the large tile (rfactor'd per 512-column PSUM tile)
//     prob / prob_t    exp(s - m) (ScalarE, kernel dtype) and its 128 × 128 transposes
//     block_sum        Σ exp per row, in pieces of the reduction tile (min(2048, LTS / 2))
//     block_pv         (128 rows, d) PSUM accumulation over LARGE_TILE_SZ / 128 matmuls
//     state            o · exp(m_prev - m) + P·V, l likewise, fp32
//   the new tokens' tile: the same stages with K already transposed in HBM and seq_q columns
//   out                o / l, rounded to the kernel dtype
//
// Budget (SBUF per partition, bf16 mixed precision, LTS = 2048, d = 128): K tile 2048 · 2 B = 4
// KiB, V tile 16 · 128 · 2 B = 4 KiB, scores 2048 · 4 B = 8 KiB, P and Pᵀ 2 · 4 KiB, o/m/l ~0.5
// KiB: ~24 KiB of 192 KiB; PSUM: one 2 KiB score bank + one (128, d) fp32 P·V bank. The footprint
// pass that checks this per schedule belongs to the simulator.
//
// Differs from the NKI kernel: K/V large tiles are gathered per (query tile, large tile) instead
// of once per large tile for all query tiles (the running max is recomputed from stored tile
// maxima, which needs the large-tile loop inside the query-tile loop); on the machine the
// simulator kernel shares the gather. The final normalization divides by l instead of multiplying
// by exp(m - lse) (fp32 rounding only).
//
// Measured (H 8/2, d 128, seq_q 256, context 4096, block_size 32, LTS 2048, 2 threads): AMD EPYC
// Zen 3 (AVX2), 2026-11-23: 174 ms = 26 GFLOP/s = 13% of the fp32 FMA peak measured in the same
// run (cpu schedule: 75-84 ms); Zen 4, 2026-11 (peak not recorded): 106 ms (cpu schedule: 23 ms).
// A test-harness speed, not a target.
// Most of it is the per-tile K transpose and P transpose copies and scalar P·V, as intended.
#include "schedules/paged/tile.hpp"

namespace tilelab::schedules {

using namespace Halide;

void schedule_paged_attention_tile(PagedAttentionStages& s, const Target& target) {
  const int VL = target.natural_vector_size<float>();
  constexpr int kFreeTile = 512, kPartitions = 128;
  Var tile("tile"), co("co"), ci("ci"), u("u");
  RVar rjo("rjo"), rji("rji");

  s.out.vectorize(s.d, VL, TailStrategy::GuardWithIf).parallel(s.h);

  // One task per (query tile, kv head); its o/m/l state stays local (the SBUF accumulators).
  s.final_out.compute_root().fuse(s.io, s.hk, tile).parallel(tile);
  s.final_out.vectorize(s.d, VL, TailStrategy::GuardWithIf);
  s.final_sum.compute_at(s.final_out, tile);
  s.final_max.compute_at(s.final_out, tile);
  s.query_t.compute_at(s.final_out, tile).vectorize(s.ii, VL);
  s.active_limit.compute_at(s.final_out, tile);

  s.state.compute_at(s.final_out, tile).vectorize(s.d, VL, TailStrategy::GuardWithIf);
  s.state.update()
      .reorder(s.d, s.ii, s.io, s.hk, s.rk)
      .vectorize(s.d, VL, TailStrategy::GuardWithIf);

  // Per large tile: the gathers and the K transpose.
  s.key_loaded.compute_at(s.state, s.rk).vectorize(s.d, VL, TailStrategy::GuardWithIf);
  s.value_loaded.compute_at(s.state, s.rk).vectorize(s.d, VL, TailStrategy::GuardWithIf);
  s.context.key_t.compute_at(s.state, s.rk).vectorize(s.c, VL);
  // Tile maxima kept for the whole query tile, one more computed per large tile (sliding window).
  s.context.block_max.store_at(s.final_out, tile).compute_at(s.state, s.rk);
  s.running_max.compute_at(s.state, s.rk);
  s.rescale.compute_at(s.state, s.rk);

  auto schedule_key_tile = [&](KeyTileStages& t, const LoopLevel& at, int free_tile) {
    // Scores: 128 × free_tile PSUM tiles, masked into the score buffer.
    t.masked.compute_at(at).split(s.c, co, ci, free_tile).reorder(ci, s.ii, co).vectorize(ci, VL);
    t.score.compute_at(t.masked, co).vectorize(s.c, VL);
    t.score.update().reorder(s.c, t.rd, s.ii).vectorize(s.c, VL);
    // Row maxima per PSUM tile, then across tiles.
    Func tile_max = t.block_max.update().split(t.rj, rjo, rji, free_tile).rfactor(rjo, u);
    tile_max.compute_at(at);
    tile_max.update().reorder(rji, s.ii, u);
    t.block_max.compute_at(at);
    // P (ScalarE), its transpose, the exp-sum and P·V.
    t.prob.compute_at(at).vectorize(s.c, VL);
    t.prob_t.compute_at(at)
        .split(s.c, co, ci, kPartitions)
        .reorder(s.ii, ci, co)
        .vectorize(s.ii, VL);
    t.block_sum.compute_at(at);
    t.block_pv.compute_at(at).vectorize(s.d, VL, TailStrategy::GuardWithIf);
    t.block_pv.update().reorder(s.d, t.rj, s.ii).vectorize(s.d, VL, TailStrategy::GuardWithIf);
  };
  schedule_key_tile(s.context, LoopLevel(s.state, s.rk), kFreeTile);
  s.active.key_t.compute_at(s.final_out, tile).vectorize(s.c, VL);
  schedule_key_tile(s.active, LoopLevel(s.final_out, tile), kPartitions);
}

}  // namespace tilelab::schedules
