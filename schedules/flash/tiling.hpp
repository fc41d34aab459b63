// The flash-attention kernels' tiling, one description read by the Halide generator (as its
// `variant` generator param) and by the runtime that picks among the generated kernels. Plain C++.
#pragma once

#include <cstdint>
#include <string_view>

#include "tilelab/error.hpp"

namespace tilelab::schedules::flash {

struct FlashAttentionTiling {
  int key_block = 64;   // keys per online-softmax block
  int query_tile = 32;  // rows (query × GQA group) sharing one pass over a K/V block
  // Few rows per kv head: q·k accumulates with the head dim in the vector lanes (per-lane partial
  // sums, one horizontal sum per score) instead of the rows.
  bool decode = false;
  // The merge keeps (m, l) once per row, in a Func of its own updated in the merge's block loop
  // (FlashAttentionStages::split_state), instead of per head dim beside o. That fused loop visits
  // every key block: a causal tile's blocks past its last key cost their rows' statistics and
  // zeroed register tiles, not their keys.
  bool split_state = false;
};

// Prefill: 32-row tiles keep 2 row vectors × 8 keys of scores in registers (schedules/flash/x86).
// For the kernels with the score options, whose merge starts at a window's first block.
inline constexpr FlashAttentionTiling kPrefillTiling{64, 32, false};
// Every other prefill kernel, causal or not, with a bias or not: 128-key blocks halve the
// per-block work (block statistics, the merge, register-tile set-up) per key, and a causal tile's
// keys stop at its diagonal to within 8 keys whatever the block. Against 64-key blocks, Zen 4:
// without a bias, B1 H16 S512 D128, 2 threads, alternating: causal fp32 1.05x faster, fp16 1.03x,
// bf16 1.07x (Hq 32, Hkv 8, S 2048 bf16 1.05x); with a [1, 16, 512, 512] fp32 bias, one thread,
// CPU time, alternating: fp32 full 1.08x, causal 1.05x, bf16 1.09x and 1.05x, the kernels that
// widen K and V 1.02-1.04x; bf16 with fp32 probabilities, no bias, 1.03-1.04x.
inline constexpr FlashAttentionTiling kPrefillWideTiling{128, 32, false, true};
// Prefill whose 16-bit K and V are widened to fp32 per (query tile, key block), for products on
// fp32 FMAs: 64-row tiles widen each block once per 64 rows instead of 32. B1 H16 S512 D128 on
// Emerald Rapids, 2 threads, 64-key blocks: bf16 full 11.0 -> 10.3 ms, causal 6.9 -> 6.5; fp16
// full 10.8 -> 10.0. fp32, read in place, was no faster. The runtime picks them per call
// (prefers_tall_query_tiles).
inline constexpr FlashAttentionTiling kPrefillWideTallTiling{128, 64, false, true};
// Decode: 4-row tiles, e.g. one token of a GQA group of 4.
inline constexpr FlashAttentionTiling kDecodeTiling{64, 4, true};

// Head dims per block of a query tile's row transpose (generators/flash/row_transpose.hpp): one
// block of the tile's rows, 32 × 8 fp32, is one shuffle in registers.
inline constexpr int kRowTransposeHeadDims = 8;

// Rows per kv head (query rows × GQA group) up to which the runtime runs the decode kernels: up to
// 8 rows two 4-row passes over K/V still beat one 32-row prefill tile, whose rows would be mostly
// padding.
inline constexpr std::int64_t kDecodeMaxRows = 8;

// The fixed cost of a query tile that widens K and V, in rows' worth of products: widening each
// key block, the row transpose, the state's set-up and the finish. Fitted to the tall tiles'
// gains on Emerald Rapids: about 5 at S 512 (16 vs 8 tiles per head) and about 13 for short
// prefill (8 sequences, Hq 32, Hkv 8, 4-16 query tokens over 1 k of context).
inline constexpr std::int64_t kWideningTileCostRows = 8;

// The modeled time of `tiles` query tiles of `tile_rows` rows that widen K and V, run in parallel
// on `threads`: the rounds of parallel tiles times a tile's cost, its rows (padding included) plus
// kWideningTileCostRows. Taller tiles pad more rows and give fewer tasks to the threads.
inline std::int64_t widening_tiles_cost(std::int64_t tiles, std::int64_t tile_rows,
                                        std::int64_t threads) {
  const std::int64_t rounds = (tiles + threads - 1) / threads;
  return rounds * (tile_rows + kWideningTileCostRows);
}

// Whether a call with `rows_per_kv_head` rows in each of `kv_heads` (batch × kv heads) runs
// faster on kPrefillWideTallTiling than on kPrefillWideTiling (both widening K and V per tile).
inline bool prefers_tall_query_tiles(std::int64_t rows_per_kv_head, std::int64_t kv_heads,
                                     std::int64_t threads) {
  const auto cost = [&](std::int64_t tile_rows) {
    const std::int64_t tiles = kv_heads * ((rows_per_kv_head + tile_rows - 1) / tile_rows);
    return widening_tiles_cost(tiles, tile_rows, threads);
  };
  return cost(kPrefillWideTallTiling.query_tile) < cost(kPrefillWideTiling.query_tile);
}

// The tiling of a generated variant: "prefill", "prefill_wide", "prefill_wide_tall" or "decode".
inline FlashAttentionTiling tiling_of_variant(std::string_view variant) {
  if (variant == "decode") return kDecodeTiling;
  if (variant == "prefill_wide") return kPrefillWideTiling;
  if (variant == "prefill_wide_tall") return kPrefillWideTallTiling;
  TILELAB_REQUIRE(variant == "prefill")
      << "variant: expected \"prefill\", \"prefill_wide\", \"prefill_wide_tall\" or "
         "\"decode\", got \""
      << variant << "\"";
  return kPrefillTiling;
}

}  // namespace tilelab::schedules::flash
