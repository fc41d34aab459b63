// The stages of the flash paged attention pipeline
// (generators/paged/paged_attention_generator.cpp), beside the algorithm that defines them; its
// schedules (schedules/paged/{x86,tile}) place them.
#pragma once

#include <vector>

#include "Halide.h"
#include "schedules/tile/footprint.hpp"

namespace tilelab::generators {

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
  Halide::RVar rd;                      // head dim (pairs of head dims: bf16 products), by score
  Halide::RVar rj;                      // tile columns, reduced by block_max / block_sum / block_pv

  // bf16 products (PagedAttentionStages::bf16_products): the operands of q·k and P·V laid out in
  // pairs along the reduced dimension, one 32-bit lane holding the two bf16 values a vdpbf16ps
  // lane multiplies and adds.
  Halide::Func key_rows{"key_rows"};              // (d, c, lt, hk) K of column c, bf16
  Halide::Func value_pairs{"value_pairs"};        // (cp, d, co, lt, hk) V of column 2·co + cp
  Halide::Func score_products{"score_products"};  // (c, ii, lt, io, hk) Σ over whole pairs of q·k
  Halide::Func prob_pairs{"prob_pairs"};          // (cp, ii, co, lt, io, hk) P of column 2·co + cp
  // (c, ii, lt, task) the mask of a task's rows (the same for every head), uint8.
  Halide::Func visible{"visible"};
  Halide::RVar rdp;       // the head dim within a pair, by score_products
  Halide::RVar rjp, rjo;  // the column within a pair and the pairs, by block_pv
};

struct PagedAttentionStages {
  Halide::Var c{"c"}, d{"d"}, ii{"ii"}, io{"io"}, hk{"hk"}, lt{"lt"}, i{"i"}, h{"h"}, b{"b"};
  // The 128-partition KV gathers, (d, tb, p, ld, lt, hk): partition p of load ld holds
  // tiled_block_size tokens (tb) of one cache block piece, head dims d innermost.
  Halide::Var tb{"tb"}, p{"p"}, ld{"ld"};
  // Pairs (bf16 products): dp / cp the head dim / column within a pair, dh / co the pair.
  Halide::Var dp{"dp"}, dh{"dh"}, cp{"cp"}, co{"co"};
  Halide::Func key_loaded{"key_loaded"};
  Halide::Func value_loaded{"value_loaded"};
  Halide::Func query_t{"query_t"};            // (ii, d, io, hk) q · scale in the kernel dtype
  Halide::Func query_pairs{"query_pairs"};    // (dp, ii, dh, io, hk) bf16 products: q · scale,
                                              // head dims 2·dh + dp (0 past an odd head_dim)
  Halide::Func active_limit{"active_limit"};  // (ii, io) new-token columns the row's tile may see
  KeyTileStages context, active;
  Halide::Func running_max{"running_max"};  // (ii, lt, io, hk) max over context tiles 0..lt
  Halide::Func rescale{"rescale"};      // (ii, lt, io, hk) exp(running max lt-1 - running max lt)
  Halide::Func state{"state"};          // (d, ii, io, hk) Tuple(m, l, o) after the context tiles
  Halide::Func final_max{"final_max"};  // (ii, io, hk) max including the new tokens' tile
  Halide::Func final_sum{"final_sum"};  // (ii, io, hk) softmax denominator
  Halide::Func final_out{"final_out"};  // (d, ii, io, hk) normalized output, fp32
  Halide::Func out{"out"};              // tile: (d, i, h, b); cpu: (d, ii, io, hk) (rows per task)
  Halide::RVar rk;                      // context large tiles, reduced by state
  Halide::RVar rb;                      // context tiles 0..lt, reduced by running_max
  Halide::Expr head_dim;                // d, for the schedules' specializations
  int query_tile = 0;                   // rows per query tile
  bool mixed_precision = false;
  bool kv_is_f32 = false;  // K/V inputs are fp32: the gathers are plain copies
  // cpu schedule, mixed precision, a CPU with AVX-512 BF16: q·k and P·V run on vdpbf16ps. The
  // products of bf16 values are exact in fp32 either way; only the order of the fp32 sums differs.
  bool bf16_products = false;

  // Where the tile schedule holds each stage on the machine (the footprint pass reads these):
  // SBUF over the 128 partitions (query rows ii, or the gather partitions p; prob_t's partition
  // is the key column within a 128-column chunk), SBUF over head_dim partitions for the
  // contraction operands key_t and query_t, PSUM for score (one 128 × 512 fp32 bank) and
  // block_pv. Tensor-engine operands are stored in the kernel dtype.
  static std::vector<schedules::TileMemoryTag> tile_memory_tags() {
    using Tag = schedules::TileMemoryTag;
    constexpr auto sbuf = Tag::Memory::sbuf, psum = Tag::Memory::psum;
    constexpr auto rows = Tag::Partitions::rows, head_dim = Tag::Partitions::head_dim;
    constexpr auto fp32 = Tag::Element::fp32, kernel = Tag::Element::kernel_dtype;
    return {{"key_loaded", sbuf, rows, kernel}, {"value_loaded", sbuf, rows, kernel},
            {"key_t", sbuf, head_dim, kernel},  {"query_t", sbuf, head_dim, kernel},
            {"value_t", sbuf, rows, kernel},    {"masked", sbuf, rows, fp32},
            {"prob", sbuf, rows, kernel},       {"prob_t", sbuf, rows, kernel},
            {"prob_f32", sbuf, rows, fp32},     {"block_max", sbuf, rows, fp32},
            {"running_max", sbuf, rows, fp32},  {"rescale", sbuf, rows, fp32},
            {"block_sum", sbuf, rows, fp32},    {"state", sbuf, rows, fp32},
            {"final_max", sbuf, rows, fp32},    {"final_sum", sbuf, rows, fp32},
            {"active_limit", sbuf, rows, fp32}, {"score", psum, rows, fp32},
            {"block_pv", psum, rows, fp32}};
  }
};

}  // namespace tilelab::generators
