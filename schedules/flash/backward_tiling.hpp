// The flash-attention backward kernels' tiling, read by their generator
// (generators/flash/flash_attention_backward_generator.cpp) and by the runtime that calls them.
// Apart from tiling.hpp so that editing it does not regenerate the forward kernels.
#pragma once

#include "schedules/flash/tiling.hpp"

namespace tilelab::schedules::flash {

// A 32-row × 32-key tile of P and dS. With a causal mask a 32-row tile sees whole 32-key blocks up
// to its diagonal; with 64-key blocks every other tile's diagonal block was half masked (1.78x less
// work than without the mask at S 512, against 1.88x). The backward merges no online softmax per
// block, so small blocks cost little. Zen 4, 2 threads, same-process A/B against 64-key blocks:
// fp32 causal 1.03-1.05x faster at S 512, 1.03x at 1024, 1.02x at 2048; bf16 causal 1.01-1.02x;
// without a mask 0.99x.
inline constexpr FlashAttentionTiling kBackwardTiling{32, 32, false};
// Row tiles per group, the rows a task keeps in cache while its key blocks pass.
inline constexpr int kBackwardGroupTiles = 8;

}  // namespace tilelab::schedules::flash
