// PagedAttentionSchedule: the tiling of the NKI-style flash paged attention kernel, one description
// read by the Halide generator (generators/paged/paged_attention_generator.cpp), the runtime that
// calls the generated kernels, and the simulator's kernel builder. Plain C++ (no Halide).
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "schedules/paged/kv_tiling.hpp"

namespace tilelab::schedules {

// How the kernel transposes tiles (K after the gather, P before P·V).
//   pe:  identity matmul on the tensor engine into PSUM (every NeuronCore generation)
//   dma: DMA-engine transpose (NeuronCore-v3 only; the simulator checks it against the machine)
enum class TransposeMethod { pe, dma };

// "pe" / "dma".
const char* transpose_method_name(TransposeMethod method);

// The problem a schedule is applied to: the shapes of one flash_paged_attention call.
struct PagedAttentionShape {
  std::int64_t num_heads = 1;          // query heads
  std::int64_t num_kv_heads = 1;       // kv heads; num_heads is a multiple (GQA group)
  std::int64_t head_dim = 1;           // d
  std::int64_t query_len = 128;        // seq_q: new tokens of all requests, concatenated
  std::int64_t num_active_blocks = 0;  // entries of block_tables (prior context blocks)
};

// The tiling every implementation of the kernel shares (the generated CPU kernels, the runtime
// that calls them and the simulator's kernel builder), named as in vLLM's NKI kernel where it has
// them. Sizes are in tokens or elements, never bytes. The generated kernels fix partition_tile,
// free_tile and mixed_precision when they are generated and take large_tile_size and block_size
// at run time (one compiled kernel serves every valid size), deriving the rest with the same
// arithmetic (paged::KvGatherTiling).
struct PagedAttentionTiling {
  // B_P_SIZE: query rows per tile = SBUF/PSUM partitions; also the number of partitions one
  // vectorized KV load spans. The machine has 128 partitions, so only 128 is valid.
  std::int64_t partition_tile = paged::kPartitionTile;
  // B_F_SIZE: score columns per matmul = one PSUM bank of fp32 (2 KiB / 4 B = 512).
  std::int64_t free_tile = paged::kFreeTile;
  // LARGE_TILE_SZ: prior-context tokens per large tile (one K/V gather, one softmax merge).
  std::int64_t large_tile_size = 2048;
  // Tokens per KV-cache block (the cache's block_size dimension).
  std::int64_t block_size = 32;
  // bf16 tensor-engine inputs (q·scale, K, P, V) with fp32 accumulation and softmax statistics;
  // otherwise everything in fp32.
  bool mixed_precision = true;
  // 0: block_size_tiling_factor() is derived (128 / blocks per large tile when that exceeds 1).
  // Otherwise forces it: a power of two dividing block_size with blocks per large tile × factor
  // <= partition_tile (or 1, which turns the tiling trick off; loads then span fewer partitions).
  // The simulator honours any valid value; the generated CPU kernels derive the factor from
  // their runtime shapes and reject a value other than the derived one.
  std::int64_t block_size_tiling_factor_override = 0;

  // Derived, valid after validate(); computed by paged::KvGatherTiling, the arithmetic the
  // generated kernels share.
  paged::KvGatherTiling<std::int64_t> kv_gather_tiling() const;
  // Cache blocks per large tile (a power of two).
  std::int64_t num_blocks_per_large_tile() const { return large_tile_size / block_size; }
  // Pieces each block is cut into so that one vectorized load spans `partition_tile` partitions
  // (1 when a large tile has at least partition_tile blocks), unless overridden.
  std::int64_t block_size_tiling_factor() const;
  // The factor block_size_tiling_factor() derives when not overridden.
  std::int64_t derived_block_size_tiling_factor() const;
  // Partitions one vectorized load spans: min(partition_tile, blocks per tile × tiling factor).
  std::int64_t partitions_per_load() const;
  // Tokens each partition holds per load: block_size / block_size_tiling_factor.
  std::int64_t tiled_block_size() const;
  // 128-partition loads per large tile, for K and for V each.
  std::int64_t loads_per_large_tile() const;
  // Score columns whose exp-sums are reduced together (the kernel's REDUCTION_TILE).
  std::int64_t reduction_tile() const;

  // Throws tilelab::Error naming the field, the value and what is allowed, when the tiling
  // itself is invalid (independent of a problem).
  void validate() const;
  // Also checks the tiling against a problem (head_dim <= 128, context a multiple of
  // large_tile_size, query length tiling, ...); Error names the argument or field.
  void validate(const PagedAttentionShape& shape) const;

  bool operator==(const PagedAttentionTiling&) const = default;
};

// Knobs only the tile machine has: how the simulator's kernel transposes and buffers.
struct PagedAttentionTileKnobs {
  TransposeMethod transpose = TransposeMethod::pe;
  // K/V large-tile buffers in SBUF: 1 serializes gather and compute, 2 overlaps the next gather
  // with this tile's compute (double buffering), up to 4.
  int kv_buffers = 2;

  void validate() const;
  bool operator==(const PagedAttentionTileKnobs&) const = default;
};

// The schedule of the simulator's kernel: the shared tiling and the tile-machine knobs, with one
// JSON form (schedule_fields() drives it).
struct PagedAttentionSchedule : PagedAttentionTiling, PagedAttentionTileKnobs {
  static constexpr int kSchemaVersion = 1;

  void validate() const;
  void validate(const PagedAttentionShape& shape) const;

  // JSON object {"schema": "tilelab.paged_attention_schedule", "schema_version": 1, fields...};
  // derived values are written too (under "derived", ignored on read).
  std::string to_json() const;
  // Parses (with the bounded parser of common/json_input.hpp) and validates. Every bad input is a
  // tilelab::Error: malformed JSON, nesting deeper than kMaxJsonDepth, a key given twice, a
  // number beyond the double range; an unknown key, a wrong schema or version, and a value of the
  // wrong type or out of range name the key. Missing keys keep their defaults.
  static PagedAttentionSchedule from_json(const std::string& text);

  bool operator==(const PagedAttentionSchedule&) const = default;
};

// One field of the schedule: its name (the JSON key), what it means, its type and the range a
// value must lie in before validate()'s finer rules. The table drives the JSON form and is what
// front ends (CLI help, Python) list.
struct PagedAttentionScheduleField {
  using Member =
      std::variant<std::int64_t PagedAttentionSchedule::*, int PagedAttentionSchedule::*,
                   bool PagedAttentionSchedule::*, TransposeMethod PagedAttentionSchedule::*>;
  const char* name;
  const char* help;
  Member member;
  std::int64_t min_value = 0, max_value = 0;  // integers only
  bool tile_machine_only = false;             // a PagedAttentionTileKnobs field
};
const std::vector<PagedAttentionScheduleField>& paged_attention_schedule_fields();

}  // namespace tilelab::schedules
