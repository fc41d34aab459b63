// Dense (optionally causal) prefill attention as a tile program, built from the flash-attention
// library routines: K/V loaded once per head and tile of keys, every query tile merged into its
// own running (o, l, m), one normalization per query tile at the end.
#pragma once

#include <cstdint>

#include "sim/machine.hpp"
#include "sim/program.hpp"

namespace tilelab::sim {

struct FlashPrefillConfig {
  int64_t num_heads = 1;
  int64_t seq_len = 1;        // queries = keys; any length (the last tiles are partial)
  int64_t head_dim = 128;     // <= the machine's partitions
  int64_t kv_tile = 512;      // keys per flash core call: a multiple of the partitions
  bool causal = true;         // query i attends keys 0..i; otherwise every key
  DType dtype = DType::bf16;  // query, key, value, output and the TensorE inputs; fp32 statistics
  float softmax_scale = 0;    // 0: 1 / sqrt(head_dim)
};

// The HBM tensors, contiguous: "query" (num_heads, head_dim, seq_len), "key" (num_heads,
// head_dim, seq_len), "value" (num_heads, seq_len, head_dim), "output" (num_heads, seq_len,
// head_dim). Throws tilelab::Error naming the field, the value and the allowed range.
Program build_flash_prefill(const Machine& machine, const FlashPrefillConfig& config);

}  // namespace tilelab::sim
