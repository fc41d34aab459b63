// The paged-attention kernel's K/V gather tiling, written once for every layer. The Halide
// generator instantiates it with Halide::Expr (the generated code derives it from runtime shapes,
// with shifts rather than divisions); the schedule description, the runtime and the simulator
// instantiate it with std::int64_t. Plain C++: this header does not include Halide.
//
// A large tile (LARGE_TILE_SZ prior-context tokens, a power of two number of cache blocks) is
// gathered in loads that each span up to kPartitionTile SBUF partitions. When a large tile has
// fewer blocks than partitions, each block is cut into `tiling factor` pieces so that one load
// still spans every partition (the NKI kernel's block-size tiling trick): partition p of load
// `ld` holds tokens [sub · tiled, (sub + 1) · tiled) of block ld · (partitions / factor) + p /
// factor, sub = p mod factor, tiled = block_size / factor, partitions = the partitions one load
// spans (all of them for the derived factor). The tensor engine consumes the large tile's
// columns load by load, piece token by piece token, partition by partition:
//   column = ld · load_columns + token_in_piece · partitions + p.
#pragma once

#include <algorithm>
#include <cstdint>

namespace tilelab::schedules::paged {

// B_P_SIZE: SBUF/PSUM partitions = query rows per tile = partitions one K/V load spans.
inline constexpr int kPartitionTile = 128;
inline constexpr int kLog2PartitionTile = 7;
// B_F_SIZE: score columns per matmul = one 2 KiB PSUM bank of fp32.
inline constexpr int kFreeTile = 512;
// The largest REDUCTION_TILE (score columns whose exp-sums are reduced together).
inline constexpr int kMaxReductionTile = 2048;

// REDUCTION_TILE for a tile of `columns` score columns: min(2048, columns / 2), the NKI kernel's
// rule for both the large tiles and the new tokens' tile.
template <typename Int>
Int reduction_tile(const Int& columns) {
  using std::min;
  return min(Int(kMaxReductionTile), columns / 2);
}

// Every quantity is a power of two and kept as its log2, so that the generated code shifts.
template <typename Int>
struct KvGatherTiling {
  Int log2_block_size;
  Int log2_blocks_per_large_tile;
  Int log2_tiling_factor;
  // Partitions one load spans: min(partitions, blocks per large tile × tiling factor); a
  // constant for the derived factor, so that the generated code keeps constant masks.
  Int log2_partitions_per_load;

  // The factor the kernel derives: partitions / blocks per large tile when that exceeds 1.
  static Int log2_derived_tiling_factor(const Int& log2_blocks_per_large_tile) {
    using std::max;
    return max(Int(kLog2PartitionTile) - log2_blocks_per_large_tile, Int(0));
  }
  static KvGatherTiling derived(const Int& log2_large_tile_size, const Int& log2_block_size) {
    const Int blocks = log2_large_tile_size - log2_block_size;
    return {log2_block_size, blocks, log2_derived_tiling_factor(blocks), Int(kLog2PartitionTile)};
  }
  // A forced factor (the simulator's override; 0 is a factor of 1, the trick turned off).
  static KvGatherTiling forced(const Int& log2_large_tile_size, const Int& log2_block_size,
                               const Int& log2_tiling_factor) {
    using std::min;
    const Int blocks = log2_large_tile_size - log2_block_size;
    return {log2_block_size, blocks, log2_tiling_factor,
            min(Int(kLog2PartitionTile), blocks + log2_tiling_factor)};
  }

  // Tokens each partition holds per load: block_size / tiling factor.
  Int log2_tiled_block_size() const { return log2_block_size - log2_tiling_factor; }
  // Loads per large tile, for K and for V each (at least 1).
  Int log2_loads_per_large_tile() const {
    using std::max;
    return log2_blocks_per_large_tile + log2_tiling_factor - log2_partitions_per_load;
  }
  // Cache blocks one load covers: partitions per load / tiling factor.
  Int log2_blocks_per_load() const { return log2_partitions_per_load - log2_tiling_factor; }
  // Score columns one load feeds the tensor engine: partitions per load × tiled block size.
  Int log2_load_columns() const { return log2_partitions_per_load + log2_tiled_block_size(); }

  // The same quantities as counts.
  Int tiling_factor() const { return Int(1) << log2_tiling_factor; }
  Int tiled_block_size() const { return Int(1) << log2_tiled_block_size(); }
  Int partitions_per_load() const { return Int(1) << log2_partitions_per_load; }
  Int loads_per_large_tile() const { return Int(1) << log2_loads_per_large_tile(); }

  // Where column `c` of a large tile lives: its load, its partition and its token within that
  // partition's piece.
  Int load_of_column(const Int& c) const { return c >> log2_load_columns(); }
  Int partition_of_column(const Int& c) const {
    return c & ((Int(1) << log2_partitions_per_load) - Int(1));
  }
  Int piece_token_of_column(const Int& c) const {
    return (c >> log2_partitions_per_load) & ((Int(1) << log2_tiled_block_size()) - Int(1));
  }
  // The block of the large tile (0 .. blocks per large tile - 1) partition `p` of load `ld` holds.
  Int block_of(const Int& ld, const Int& p) const {
    return (ld << log2_blocks_per_load()) + (p >> log2_tiling_factor);
  }
  // The token within its cache block of token `piece_token` of partition `p`'s piece.
  Int token_in_block_of(const Int& p, const Int& piece_token) const {
    return ((p & ((Int(1) << log2_tiling_factor) - Int(1))) << log2_tiled_block_size()) +
           piece_token;
  }
  // The prior-context token (block of the tile · block_size + token in block) column `c` holds:
  // what reorder_context_mask maps a column back to.
  Int token_of_column(const Int& c) const {
    const Int p = partition_of_column(c);
    return (block_of(load_of_column(c), p) << log2_block_size) +
           token_in_block_of(p, piece_token_of_column(c));
  }
};

}  // namespace tilelab::schedules::paged
