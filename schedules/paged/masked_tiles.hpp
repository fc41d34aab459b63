// What the cpu schedule of flash paged attention computes of a batch's mask, written once for the
// Halide generator (instantiated with Halide::Expr) and the runtime that plans the calls
// (std::int64_t, double). Plain C++: this header does not include Halide.
//
// The cpu schedule works on query blocks of kPagedCpuQueryTile query positions (one head each).
// The runtime gives every query block the list of context large tiles it computes, in order;
// the tile schedule always computes every large tile. A block may leave out a large tile whose
// mask is zero for all of its positions only when the output stays the same bit for bit; the
// rule (masked_tiles_vanish and nki_paged_attention.cpp) is:
//   - every position of the block sees at least one key (context or new tokens), and
//   - every score the kernel can compute lies in (-kMaxSkippableScore, kMaxSkippableScore)
//     (softmax_scale · max ‖q‖ · max ‖k‖ bounds it), and every V value is finite with
//     |v| · keys < 1e36, so no sum of V overflows.
// Why that suffices: a left-out tile scores -9984 everywhere, so it never raises a row's running
// max (which is at least -9984 from the first tile of the full computation on, and exceeds
// -kMaxSkippableScore once a key is seen; the kernel floors its context max at -9984 when tiles
// are left out, as the full computation's is). After the row's first visible key, the full
// computation's terms for a left-out tile are exp(-9984 - m) <= exp(-984) = 0 in fp32 and its
// rescale is exp(0) = 1: the state is unchanged. Before it, the full computation's state has
// m = -9984 and is finite, and its rescale at the first visible key is exp(-9984 - m) = 0
// exactly, which erases whatever the left-out tiles would have added. The rows' outputs agree
// except possibly in the sign of an output that is exactly zero.
#pragma once

#include <algorithm>
#include <cstdint>

#include "schedules/paged/kv_tiling.hpp"

namespace tilelab::schedules {

// Rows per query tile of the cpu schedule (divides 128, so a tile never spans two heads).
inline constexpr int kPagedCpuQueryTile = 32;

namespace paged {

// Scores (softmax_scale · q·k) of magnitude below this are far enough above the masked fill
// (-9984) that exp(-9984 - score) underflows to 0 in fp32 (exp(-984); fp32 underflows below
// exp(-104)).
inline constexpr double kMaxSkippableScore = 9000.0;

// Query blocks of the cpu schedule: seq_q is a multiple of 128, so of kPagedCpuQueryTile.
template <typename Int>
Int cpu_query_blocks(const Int& seq_q) {
  return seq_q / Int(kPagedCpuQueryTile);
}

// The new-token columns query `query` may see: those below this limit. As in the NKI kernel,
// the new tokens' tile skips score blocks of min(seq_q, 512) columns lying wholly right of the
// query's 128-row tile's first row (causal masks never see them).
template <typename Int>
Int active_column_limit(const Int& query, const Int& seq_q) {
  using std::min;
  const Int active_block = min(seq_q, Int(kFreeTile));
  const Int tile_first_query = (query >> kLog2PartitionTile) << kLog2PartitionTile;
  return (tile_first_query / active_block + Int(1)) * active_block;
}

// Whether left-out tiles provably change nothing (the rule above), from bounds over the call:
// the largest |score| the kernel can compute (softmax_scale · max ‖q‖ · max ‖k‖, with slack for
// the kernel's roundings), the largest |v| and the number of keys a row sums over. False when
// a bound is NaN or infinite.
inline bool masked_tiles_vanish(double max_abs_score, double max_abs_value, double keys) {
  return max_abs_score < kMaxSkippableScore && max_abs_value * keys < 1e36;
}

}  // namespace paged
}  // namespace tilelab::schedules
