// The tile schedule's per-partition SBUF/PSUM footprint, computed at generator time from the
// lowered pipeline's own Allocate nodes.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "Halide.h"

namespace tilelab::schedules {

// Where the tile machine holds one stage of a pipeline: declared on the stages struct beside the
// algorithm (e.g. generators/paged/stages.hpp), read by the footprint pass.
struct TileMemoryTag {
  enum class Memory { sbuf, psum };
  enum class Partitions { rows, head_dim };   // 128 partitions, or d (the contraction dim)
  enum class Element { fp32, kernel_dtype };  // kernel_dtype: bf16 with mixed precision
  std::string stage;  // Func name; rfactor intermediates (name + suffix) match by prefix
  Memory memory = Memory::sbuf;
  Partitions partitions = Partitions::rows;
  Element element = Element::fp32;
};

// What the footprint is evaluated for: the pipeline's allocation sizes depend on runtime shapes
// (LARGE_TILE_SZ is a kernel argument; d, seq_q and the context come from the buffers), so they
// are evaluated at one configuration the generator chooses (the paged generator: the default
// problem of schedules/paged/default_problem.hpp).
struct FootprintConfig {
  int large_tile_size = 0;
  int head_dim = 0;
  int block_size = 0;
  int seq_q = 0;
  int context_len = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  bool mixed_precision = true;
  std::vector<TileMemoryTag> stages;  // allocations of other Funcs are listed as not counted
  std::string json_path;
};

// Adds a custom lowering pass to `pipeline` that sums, over nested allocation scopes, the bytes per
// partition of the SBUF- and PSUM-resident stages of one (query tile, kv head) task and writes
// them (and the per-buffer figures) to config.json_path. The check against a machine's capacity
// is a test (tests/cross/footprint_test.cpp), so no machine file is read at build time.
void add_tile_footprint_check(Halide::Pipeline pipeline, const FootprintConfig& config);

}  // namespace tilelab::schedules
