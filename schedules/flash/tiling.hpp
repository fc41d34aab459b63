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
};

// Prefill: 32-row tiles keep 2 row vectors × 8 keys of scores in registers (schedules/flash/x86).
inline constexpr FlashAttentionTiling kPrefillTiling{64, 32, false};
// Prefill without a causal mask: 128-key blocks halve the per-block work (block statistics, the
// merge, register-tile set-up) per key, which 64-key blocks keep for causal calls, where they skip
// more of the masked triangle (B1 H16 S512 D128 on Zen 4, 2 threads: bf16 full 7.7 vs 8.0 ms,
// causal 5.0 vs 4.7-4.9 ms). For causal calls, 128-key blocks measured side by side 2-4% slower
// at S 512, even at 1024 and 0-7% faster at 2048-4096: too little to switch on length.
inline constexpr FlashAttentionTiling kPrefillWideTiling{128, 32, false};
// Decode: 4-row tiles, e.g. one token of a GQA group of 4.
inline constexpr FlashAttentionTiling kDecodeTiling{64, 4, true};
// Backward: a 32-row × 64-key tile of P and dS.
inline constexpr FlashAttentionTiling kBackwardTiling{64, 32, false};
// Backward: row tiles per group, the rows a task keeps in cache while its key blocks pass.
inline constexpr int kBackwardGroupTiles = 8;

// Rows per kv head (query rows × GQA group) up to which the runtime runs the decode kernels: up to
// 8 rows two 4-row passes over K/V still beat one 32-row prefill tile, whose rows would be mostly
// padding.
inline constexpr std::int64_t kDecodeMaxRows = 8;

// The tiling of a generated variant: "prefill", "prefill_wide" or "decode".
inline FlashAttentionTiling tiling_of_variant(std::string_view variant) {
  if (variant == "decode") return kDecodeTiling;
  if (variant == "prefill_wide") return kPrefillWideTiling;
  TILELAB_REQUIRE(variant == "prefill") << "variant: expected \"prefill\", \"prefill_wide\" or "
                                           "\"decode\", got \""
                                        << variant << "\"";
  return kPrefillTiling;
}

}  // namespace tilelab::schedules::flash
