// The block-sparse attention kernels' tiling and task list, one description read by the Halide
// generator (generators/blocksparse/) and by the runtime that builds the tasks
// (runtime/src/generated_blocksparse.cpp). Plain C++; apart from tiling.hpp so that editing it
// does not regenerate the dense kernels.
#pragma once

#include <string_view>

#include "schedules/flash/tiling.hpp"
#include "tilelab/error.hpp"

namespace tilelab::schedules::flash {

// Block-sparse forward: tasks of 32 rows (prefill; also 64 for the kernels on fp32 FMAs, below)
// or 4 rows (decode: a sequence's last query with its GQA group folded in) over key tiles
// of 64 keys; a layout block of another size spans ceil(block_size / 64) tiles, the last one
// masked past the block's end.
inline constexpr FlashAttentionTiling kBlockSparsePrefillTiling{64, 32, false};
// Prefill on fp32 FMAs: 64-row tasks widen (fp16, bf16) and read each key tile once per 64 rows.
inline constexpr FlashAttentionTiling kBlockSparsePrefillTallTiling{64, 64, false};
inline constexpr FlashAttentionTiling kBlockSparseDecodeTiling{64, 4, true};

// The fields of one block-sparse task (up to a block-sparse tiling's query_tile rows: query rows of
// one sequence inside one layout row block, times the query heads folded into the task), in the
// order the kernel reads them from its task list. The task's key blocks (its layout row, or the
// union of its heads' rows) are a sorted run of the kernel's column list.
enum class BlockSparseTaskField : int {
  query_token,     // packed index of the task's first query row
  rows,            // query rows (per head) in the task, 1 .. query_tile / folded heads
  query_position,  // the first row's position in its sequence (keys: positions 0 .. key_count-1)
  key_token,       // packed index of the sequence's first key
  key_count,       // the sequence's keys
  head_group,      // the task's query heads: head_group · F .. head_group · F + F - 1
  column_begin,    // where the task's key blocks start in the kernel's column list
};
inline constexpr int kBlockSparseTaskFields = 7;

// The block-sparse tiling of a generated variant: "prefill", "prefill_tall" or "decode".
inline FlashAttentionTiling blocksparse_tiling_of_variant(std::string_view variant) {
  if (variant == "decode") return kBlockSparseDecodeTiling;
  if (variant == "prefill_tall") return kBlockSparsePrefillTallTiling;
  TILELAB_REQUIRE(variant == "prefill")
      << "variant: expected \"prefill\", \"prefill_tall\" or \"decode\", got \"" << variant << "\"";
  return kBlockSparsePrefillTiling;
}

}  // namespace tilelab::schedules::flash
