// NKI-library-level routines of flash attention, built on a ProgramBuilder: the query load, the
// online-softmax core over one tile of keys, the final normalization, grouped transposes and the
// indirect K/V gathers. Kernels own the loop structure, the HBM layouts and the K/V staging; these
// routines own the per-tile instruction sequences (the ones of vLLM's nki_flash_attn.py).
//
// Notation: P = partitions (queries per tile), d = head_dim, "kernel dtype" = the TensorE input
// dtype, "acc dtype" = the statistics/accumulator dtype. Shapes are [partitions, free elements].
#pragma once

#include <cstdint>
#include <vector>

#include "schedules/paged/schedule.hpp"
#include "sim/program.hpp"

namespace tilelab::sim::lib {

// The score written for masked keys: finite, so a fully masked tile never computes
// exp(-inf - -inf) (the NKI kernel's fill).
constexpr float kMaskedScore = -9984.0f;

// Sizes of a FlashWorkspace: the largest tile any core call of the kernel uses.
struct FlashWorkspaceShape {
  int64_t partitions = 128;       // P
  int64_t head_dim = 128;         // d
  int64_t max_keys = 0;           // keys of the largest core tile
  int64_t max_score_pieces = 0;   // largest keys / score_tile
  int64_t max_reductions = 0;     // largest keys / reduction
  int64_t max_chunks = 0;         // largest keys / rows (key chunks of P transposed)
  int64_t accumulator_slots = 1;  // (query tile, head) pairs accumulated at once
  DType input_dtype = DType::bf16;
  DType kernel_dtype = DType::bf16;
  DType acc_dtype = DType::fp32;
};

// The tiles of load_flash_query, flash_core and finalize_flash: double-buffered pools plus the
// running accumulators of every slot (o [P, slots·d], l and m [P, slots], acc dtype; l holds
// m + log(row sum)).
struct FlashWorkspace {
  int64_t partitions = 0, head_dim = 0, bank_fp32 = 0;
  DType input_dtype = DType::bf16, kernel_dtype = DType::bf16, acc_dtype = DType::fp32;
  TilePool q_raw;      // [d, P] input dtype
  TilePool q_cast;     // [d, P] kernel dtype (only when input and kernel dtypes differ)
  TilePool q;          // [d, P] kernel dtype, scaled
  TilePool qk_res;     // [P, max_keys] acc: masked scores
  TilePool max_local;  // [P, max_score_pieces] acc
  TilePool p_local;    // [P, max_keys] kernel dtype: exp(s - m)
  TilePool p_partial;  // [P, max_reductions] acc
  TilePool p_t;        // [P, max_chunks·P] kernel dtype: P transposed
  TilePool stats;      // [P, kFlashStatColumns] acc: per-row scalars of one call
  TilePool o_scaled;   // [P, d] acc
  TilePool out;        // [P, d] kernel dtype
  Tile o_all, l_all, m_all;
  TilePool qk_psum;  // [P, bank] fp32 PSUM: scores
  TilePool t_psum;   // [P, bank] fp32 PSUM: grouped P transposes
  TilePool pv_psum;  // [P, d] fp32 PSUM
};

// Allocates, in this order, the SBUF pools, the accumulators and three PSUM banks (scores, P
// transposes, P·V). A PSUM bank holds bank_fp32 = psum_bank_bytes_per_partition / 4 fp32.
FlashWorkspace allocate_flash_workspace(ProgramBuilder& b, const FlashWorkspaceShape& shape);

// Views of one slot's running (o, l, m): o [P, d], l and m [P, 1].
struct FlashAccumulator {
  TileRef o, l, m;
};
FlashAccumulator flash_accumulator(const ProgramBuilder& b, const FlashWorkspace& ws, int64_t slot);

// q = query[head, :, col0 : col0 + cols] (a [1, heads, d, seq] or [heads, d, seq] tensor) cast
// to the kernel dtype (ScalarE) and multiplied by `scale` (ScalarE). cols <= P; when cols < P
// the missing columns are zeroed first (GpSimd) so that padding rows stay finite.
// Returns the [d, P] kernel-dtype view.
TileRef load_flash_query(ProgramBuilder& b, FlashWorkspace& ws, Tensor query, int64_t head,
                         int64_t col0, int64_t cols, float scale);

// One key tile of a flash_core call.
struct FlashKeyTile {
  TileRef q;               // [d, P] kernel dtype, scaled
  Tile k_t;                // [d, >= keys] kernel dtype: K transposed, one column per key
  Tile v;                  // [>= rows, chunks·d] kernel dtype: chunk j = keys [j·rows, (j+1)·rows)
  Tile mask;               // [P, >= keys], nonzero = attend; kNone: every key attends
  int64_t keys = 0;        // multiple of score_tile, rows and reduction
  int64_t score_tile = 0;  // score columns per matmul (<= one PSUM bank)
  int64_t rows = 0;        // keys per P·V chunk (<= P)
  int64_t reduction = 0;   // columns per exp with fused row sum
  // Causal piece skipping: a score piece whose first key (key0 + k·score_tile) comes after the
  // last query row (query_row0 + P - 1) is filled with kMaskedScore instead of computed.
  bool causal = false;
  int64_t query_row0 = 0;
  int64_t key0 = 0;
  bool initialize = false;  // the slot's first tile: (o, l, m) are written, not merged
};

// _flash_attention_core: scores q^T·K_t (TensorE, PSUM) masked on VectorE, the running maximum
// and the accumulator rescale (VectorE/ScalarE), exp(s - m) with fused row sums (ScalarE), P
// transposed (transpose_chunks; PE groups evicted on ScalarE), P·V accumulated over the chunks
// (TensorE) and merged into `acc`.
void flash_core(ProgramBuilder& b, FlashWorkspace& ws, const FlashKeyTile& tile,
                const FlashAccumulator& acc, schedules::TransposeMethod transpose);

// out = o · exp(m - l) in the kernel dtype (VectorE, ScalarE), stored from its first `rows`
// partitions to `dst` (rows × d).
void finalize_flash(ProgramBuilder& b, FlashWorkspace& ws, const FlashAccumulator& acc,
                    const HbmPattern& dst, int64_t rows);

// Transposes `sources` ([r, piece_rows] each, same r) into consecutive pieces of `piece` columns
// of one PSUM bank from `psum` (TensorE), then evicts the bank to `dst_group` ([dst_rows,
// sources·piece]) in one copy on `evict_engine` (the kernel's transpose_p_local).
void transpose_into(ProgramBuilder& b, const TileRef& dst_group,
                    const std::vector<TileRef>& sources, int64_t dst_rows, int64_t piece,
                    Engine evict_engine, TilePool& psum);

// dst[0:dst_rows, j·piece : (j+1)·piece] = sources[j]^T for every j: DMA transposes (NC-v3), or
// PE transposes grouped `per_bank` to a PSUM bank and evicted on `evict_engine`.
void transpose_chunks(ProgramBuilder& b, Tile dst, int64_t dst_rows,
                      const std::vector<TileRef>& sources, int64_t piece, int64_t per_bank,
                      schedules::TransposeMethod method, Engine evict_engine, TilePool& psum);

// The K or V half (`kv` 0 or 1) of one KV tile gathered from a [2, rows, run] cache: `loads`
// gathers of `rows` partitions; gather l reads row index[p, index_col0 + l·index_stride] into
// dst[p, l·run : (l+1)·run]. index is int32 [rows, ...]; descriptors are made on GpSimd (SWDGE).
void gather_kv(ProgramBuilder& b, Tile dst, Tensor cache, int64_t kv, Tile index,
               int64_t index_col0, int64_t index_stride, int64_t loads, int64_t rows, int64_t run);

}  // namespace tilelab::sim::lib
