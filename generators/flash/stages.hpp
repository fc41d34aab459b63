// The stages of the flash attention forward pipeline
// (generators/flash/flash_attention_generator.cpp), beside the algorithm that defines them;
// schedules/flash/x86 places them.
#pragma once

#include "Halide.h"

namespace tilelab::generators {

// The pipeline's stages, named by what they hold. Dimensions, innermost first:
//   d head dim, jj key within a key block, jb key block, ii row within a query tile, io query tile,
//   hk kv head, b batch; a row is one (query head of the group, query index) pair.
struct FlashAttentionStages {
  Halide::Func query_t{"query_t"};  // (ii, d, io, hk, b) fp32 q · scale, transposed: rows innermost
  Halide::Func key_f32{"key_f32"};  // (d, jj, jb, hk, b) fp32 K block
  Halide::Func value_f32{"value_f32"};          // (d, jj, jb, hk, b) fp32 V block
  Halide::Func score_partial{"score_partial"};  // (dl, ii, jj, jb, io, hk, b) decode: per-lane sums
  Halide::Func score{"score"};                  // (ii, jj, jb, io, hk, b) q·k, scaled
  Halide::Func masked{
      "masked"};  // (ii, jj, jb, io, hk, b) score + bias, or kMasked where not visible
  Halide::Func row_query{"row_query"};                    // (ii, io) query index of a row
  Halide::Func row_head{"row_head"};                      // (ii, io, hk) query head of a row
  Halide::Func row_key_limit{"row_key_limit"};            // (ii, io) last key the row sees
  Halide::Func block_max_in_block{"block_max_in_block"};  // reduction behind block_max
  Halide::Func block_sum_in_block{"block_sum_in_block"};  // reduction behind block_sum
  Halide::Func block_max{"block_max"};                    // (ii, jb, io, hk, b) max over the block
  Halide::Func running_max{"running_max"};  // (ii, jb, io, hk, b) max over blocks 0..jb
  Halide::Func rescale{"rescale"};  // (ii, jb, io, hk, b) exp(running max jb-1 - running max jb)
  Halide::Func prob{"prob"};  // (ii, jj, jb, io, hk, b) exp(masked - running_max), 0 where masked
  Halide::Func block_sum{"block_sum"};  // (ii, jb, io, hk, b) Σ prob
  Halide::Func block_pv{"block_pv"};    // (d, ii, jb, io, hk, b) Σ prob · v
  Halide::Func state{
      "state"};             // (d, ii, io, hk, b) Tuple(running max, running sum, unnormalized out)
  Halide::Func out{"out"};  // (d, i, h, b)
  Halide::Func lse{"lse"};  // (i, h, b)
  Halide::Var d{"d"}, jj{"jj"}, jb{"jb"}, ii{"ii"}, io{"io"}, hk{"hk"}, b{"b"}, i{"i"}, h{"h"};
  Halide::RVar rk;            // key blocks, reduced by `state`
  Halide::RVar rd;            // head dim, reduced by `score`
  Halide::RVar rj;            // keys of a block, reduced by block_max / block_sum / block_pv
  Halide::RVar rl;            // decode: lanes of score_partial, reduced by `score`
  Halide::Var dl{"dl"};       // decode: lane of score_partial
  Halide::RVar rb;            // blocks 0..jb, reduced by running_max
  bool value_is_f32 = false;  // K and V are fp32 already: read in place, no conversion copy
  int key_block = 0;          // keys per block
  int query_tile = 0;         // rows per query tile
  bool decode = false;        // few rows per kv head: head dim in the vector lanes for q·k
  int decode_lanes = 16;      // lanes of score_partial
};

}  // namespace tilelab::generators
