// The tile schedule's per-partition SBUF/PSUM footprint, computed at generator time from the
// lowered pipeline's own Allocate nodes, checked against the machine's capacity.
#pragma once

#include <map>
#include <string>

#include "Halide.h"

namespace tilelab::schedules {

// What the footprint is evaluated for: the pipeline's allocation sizes depend on runtime shapes
// (LARGE_TILE_SZ is a kernel argument; d, seq_q and the context come from the buffers), so they
// are evaluated at one configuration, by default the simulator's default paged-attention batch.
struct FootprintConfig {
  int large_tile_size = 2048;
  int head_dim = 128;
  int block_size = 32;
  int seq_q = 512;
  int context_len = 16384;
  int num_heads = 32;
  int num_kv_heads = 8;
  bool mixed_precision = true;
  long long sbuf_bytes_per_partition = 0;  // 0: not checked
  long long psum_bytes_per_partition = 0;
  std::string json_path;  // empty: not written
};

// Adds a custom lowering pass to `pipeline` that sums, over nested allocation scopes, the bytes per
// partition of the SBUF- and PSUM-resident stages of one (query tile, kv head) task, writes them
// (and the per-buffer figures) to config.json_path, and fails generation (Halide user error)
// when either exceeds the machine's capacity.
void add_tile_footprint_check(Halide::Pipeline pipeline, const FootprintConfig& config);

}  // namespace tilelab::schedules
