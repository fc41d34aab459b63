// The stages of the flash attention forward pipeline
// (generators/flash/flash_attention_generator.cpp), beside the algorithm that defines them;
// schedules/flash/x86 places them.
#pragma once

#include "Halide.h"

namespace tilelab::generators {

// Keys per group of a block's reductions, where a causal tile's keys stop (define_online_softmax):
// the keys of one register tile of scores.
inline constexpr int kKeyGroup = 8;

// The pipeline's stages, named by what they hold. Dimensions, innermost first:
//   d head dim, jj key within a key block, jb key block, ii row within a query tile, io query tile,
//   hk kv head, b batch; a row is one (query head of the group, query index) pair.
struct FlashAttentionStages {
  // (din, ii, dblock, io, hk, b) fp32 q · scale row by row, as q is stored, in blocks of head
  // dims (generators/flash/row_transpose.hpp); query_t is its transpose.
  Halide::Func query_rows{"query_rows"};
  Halide::Func query_t{"query_t"};  // (ii, d, io, hk, b) fp32 q · scale, transposed: rows innermost
  Halide::Func key_f32{"key_f32"};  // (d, jj, jb, hk, b) fp32 K block
  Halide::Func value_f32{"value_f32"};          // (d, jj, jb, hk, b) fp32 V block
  Halide::Func score_partial{"score_partial"};  // (dl, ii, jj, jb, io, hk, b) decode: per-lane sums
  // bf16 products (bf16_products): operands laid out in pairs along the reduced dimension, so
  // that one 32-bit lane holds the two bf16 values a vdpbf16ps lane multiplies and adds.
  Halide::Func query_bf16{"query_bf16"};  // (dp, ii, dh, io, hk, b) q at d = 2·dh + dp, 0 past D
  Halide::Func key_bf16{"key_bf16"};      // (d, jj, jb, hk, b) K block, read in place
  Halide::Func value_rows{"value_rows"};  // (d, jj, jb, hk, b) V block, read in place, clamped
  Halide::Func value_bf16{"value_bf16"};  // (jp, d, jo, jb, hk, b) value_rows at jj = 2·jo + jp
  Halide::Func prob_bf16{"prob_bf16"};    // (jp, ii, jo, jb, io, hk, b) prob rounded to bf16
  Halide::Func score_products{"score_products"};  // (ii, jj, jb, io, hk, b) q·k, unscaled
  Halide::Func score{"score"};                    // (ii, jj, jb, io, hk, b) q·k, scaled
  Halide::Func masked{
      "masked"};  // (ii, jj, jb, io, hk, b) score + bias, or kMasked where not visible
  // With a bias: (jj, ii, jb, io, hk, b) the rows' bias as stored, keys innermost, and bias_t
  // (ii, jj, jb, io, hk, b), its transpose: rows innermost, like the scores it is added to.
  Halide::Func bias_rows{"bias_rows"};
  Halide::Func bias_t{"bias_t"};
  Halide::Func row_query{"row_query"};          // (ii, io) query index of a row
  Halide::Func row_head{"row_head"};            // (ii, io, hk) query head of a row
  Halide::Func row_key_limit{"row_key_limit"};  // (ii, io) last key the row sees
  // Score options (the score_options variant): the first key the row's window lets it see (may
  // be negative), and the row's ALiBi slope and sink (per query head).
  Halide::Func row_key_first{"row_key_first"};            // (ii, io)
  Halide::Func row_slope{"row_slope"};                    // (ii, io, hk)
  Halide::Func row_sink{"row_sink"};                      // (ii, io, hk)
  Halide::Func block_max_in_block{"block_max_in_block"};  // reduction behind block_max
  Halide::Func block_sum_in_block{"block_sum_in_block"};  // reduction behind block_sum
  Halide::Func block_max{"block_max"};                    // (ii, jb, io, hk, b) max over the block
  Halide::Func running_max{"running_max"};  // (ii, jb, io, hk, b) max over blocks 0..jb
  Halide::Func rescale{"rescale"};  // (ii, jb, io, hk, b) exp(running max jb-1 - running max jb)
  Halide::Func prob{"prob"};  // (ii, jj, jb, io, hk, b) exp(masked - running_max), 0 where masked
  Halide::Func block_sum{"block_sum"};  // (ii, jb, io, hk, b) Σ prob
  Halide::Func block_pv{"block_pv"};    // (d, ii, jb, io, hk, b) Σ prob · v
  Halide::Func state{
      "state"};  // (d, ii, io, hk, b) Tuple(running max, running sum, unnormalized out)
  // With split_state, `state` reads its parts from two Funcs that the merge updates side by side:
  // (m, l) once per row instead of once per (head dim, row) beside o.
  Halide::Func row_stats{"row_stats"};  // (ii, io, hk, b) Tuple(running max, running sum)
  Halide::Func out_sum{"out_sum"};      // (d, ii, io, hk, b) unnormalized out
  // (d, ii, io, hk, b) Tuple(out, lse) of finished rows in the state's layout.
  Halide::Func out_rows{"out_rows"};
  Halide::Func row_lse_and_scale{
      "row_lse_and_scale"};  // (ii, io, hk, b) Tuple(lse, 1 / l) of a finished row
  // (d, row, hk, b) Tuple(out, lse), row = (h mod group) · M + i (the dense forward's outputs).
  Halide::Func out{"out"};
  Halide::Var d{"d"}, jj{"jj"}, jb{"jb"}, ii{"ii"}, io{"io"}, hk{"hk"}, b{"b"}, row{"row"};
  Halide::RVar rk;  // key blocks, reduced by `state`
  Halide::RVar rd;  // head dim, reduced by `score`
  // Keys of a block, reduced by block_max / block_sum / block_pv: rj within a group of kKeyGroup
  // keys, rjg over the groups (one group of the whole block when no causal bound is given).
  Halide::RVar rj, rjg;
  Halide::RVar rl;       // decode: lanes of score_partial, reduced by `score`
  Halide::Var dl{"dl"};  // decode: lane of score_partial
  Halide::RVar rb;       // blocks 0..jb, reduced by running_max
  // bf16 products: rdp the pair within rd (rd then counts pairs); block_pv reduces the keys of a
  // block as pairs, rjp within the pair, rjo over the pairs of a group and rjpg over groups.
  Halide::RVar rdp, rjp, rjo, rjpg;
  Halide::Var dp{"dp"}, dh{"dh"}, jp{"jp"}, jo{"jo"};  // bf16 products: pair and pair index
  // q·k and P·V as bf16 × bf16 products with fp32 accumulation (vdpbf16ps); P is rounded to bf16.
  bool bf16_products = false;
  // value_bf16 depends on the block only (not the query tile): made once per call for all tiles.
  bool value_pairs_shared_by_tiles = true;
  bool value_is_f32 = false;  // K and V are fp32 already: read in place, no conversion copy
  // V (and 16-bit K) as fp32 copies made once per call (the score options variant).
  bool operands_at_root = false;
  int key_block = 0;    // keys per block
  int query_tile = 0;   // rows per query tile
  bool decode = false;  // few rows per kv head: head dim in the vector lanes for q·k
  // The merge keeps (m, l) in row_stats and o in out_sum (tiling.hpp, split_state). Its fused
  // block loop visits every key block, whatever block_is_live says; a block past a causal tile's
  // last key then reduces no key.
  bool split_state = false;
  // Prefill, when the generator bounds it (a function of io, hk, b): the last key any row of a
  // query tile sees (a causal tile's diagonal, or the last key there is). A block's reductions
  // stop at its group (define_online_softmax), and in a split_state merge a block past it computes
  // no q·k (define_scores).
  Halide::Expr tile_last_key;
  int decode_lanes = 16;  // lanes of score_partial
  // With a bias, its strides across rows and query heads: both 0 when it is broadcast over them
  // (a key padding mask), and then a tile's rows (in the vector lanes) read one value per key.
  Halide::Expr bias_row_stride, bias_head_stride;
};

}  // namespace tilelab::generators
