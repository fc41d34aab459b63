// The stages of the flash paged attention pipeline (generators/paged_attention_generator.cpp),
// shared by its schedules, and the tile-machine schedule that mirrors the NKI kernel's tiling.
#pragma once

#include "Halide.h"

namespace tilelab::schedules {

// The stages of one key-tile pass of the online softmax (the NKI kernel's _flash_attention_core):
// built twice, for the prior-context large tiles (lt = large tile) and for the new tokens' own
// keys (one tile; its lt is always 0). Dimensions, innermost first: c column of the key tile
// (score column, as the tensor engine consumes it), d head dim, ii row within a query tile,
// io query tile, hk kv head. Tiles in SBUF/PSUM are (partition, free) with free innermost.
struct KeyTileStages {
  Halide::Func key_t{"key_t"};          // (c, d, lt, hk) K tile transposed: partition d, free c
  Halide::Func value_t{"value_t"};      // (d, c, lt, hk) V row of column c (context: read from the
                                        // loaded layout, partition c mod 128)
  Halide::Func score{"score"};          // (c, ii, lt, io, hk) q·k fp32 (the PSUM tile)
  Halide::Func masked{"masked"};        // (c, ii, lt, io, hk) score where visible, else -9984
  Halide::Func block_max{"block_max"};  // (ii, lt, io, hk) max over the tile's columns
  Halide::Func prob_f32{"prob_f32"};    // (c, ii, lt, io, hk) exp(masked - running max)
  Halide::Func prob{"prob"};            // (c, ii, lt, io, hk) P in the kernel dtype (bf16 mixed)
  Halide::Func prob_t{"prob_t"};        // (ii, c, lt, io, hk) P transposed: partition c, free ii
  Halide::Func block_sum{"block_sum"};  // (ii, lt, io, hk) Σ prob_f32 (ScalarE's reduce)
  Halide::Func block_pv{"block_pv"};    // (d, ii, lt, io, hk) Σ P·V, fp32 accumulation
  Halide::RVar rd;                      // head dim, reduced by score
  Halide::RVar rj;                      // tile columns, reduced by block_max / block_sum / block_pv
};

struct PagedAttentionStages {
  Halide::Var c{"c"}, d{"d"}, ii{"ii"}, io{"io"}, hk{"hk"}, lt{"lt"}, i{"i"}, h{"h"}, b{"b"};
  // The 128-partition KV gathers, (d, tb, p, ld, lt, hk): partition p of load ld holds
  // tiled_block_size tokens (tb) of one cache block piece, head dims d innermost.
  Halide::Var tb{"tb"}, p{"p"}, ld{"ld"};
  Halide::Func key_loaded{"key_loaded"};
  Halide::Func value_loaded{"value_loaded"};
  Halide::Func query_t{"query_t"};            // (ii, d, io, hk) q · scale in the kernel dtype
  Halide::Func active_limit{"active_limit"};  // (ii, io) new-token columns the row's tile may see
  KeyTileStages context, active;
  Halide::Func running_max{"running_max"};  // (ii, lt, io, hk) max over context tiles 0..lt
  Halide::Func rescale{"rescale"};      // (ii, lt, io, hk) exp(running max lt-1 - running max lt)
  Halide::Func state{"state"};          // (d, ii, io, hk) Tuple(m, l, o) after the context tiles
  Halide::Func final_max{"final_max"};  // (ii, io, hk) max including the new tokens' tile
  Halide::Func final_sum{"final_sum"};  // (ii, io, hk) softmax denominator
  Halide::Func final_out{"final_out"};  // (d, ii, io, hk) normalized output, fp32
  Halide::Func out{"out"};              // (d, i, h, b)
  Halide::RVar rk;                      // context large tiles, reduced by state
  Halide::RVar rb;                      // context tiles 0..lt, reduced by running_max
  Halide::Expr head_dim;                // d, for the schedules' specializations
  int query_tile = 0;                   // rows per query tile
  bool mixed_precision = false;
  bool kv_is_f32 = false;  // K/V inputs are fp32: the gathers are plain copies
};

// The tile-machine schedule: 128-row query tiles (the partition dim), per large tile a
// 128-partition K and V gather with the block size tiling factor, an explicit K transpose,
// 128 × 512 fp32 score tiles (one PSUM bank), the P transpose, and P·V accumulated over
// 128-column pieces. See paged_attention.cpp for what differs from the NKI kernel.
void schedule_paged_attention_tile(PagedAttentionStages& stages, const Halide::Target& target);

}  // namespace tilelab::schedules
