// The x86 schedule of the flash attention forward pipeline
// (generators/flash/flash_attention_generator.cpp); stages in generators/flash/stages.hpp.
#pragma once

#include "Halide.h"
#include "generators/flash/stages.hpp"
#include "tilelab/error.hpp"

namespace tilelab::schedules {

using generators::FlashAttentionStages;

// Whether `target` has AVX-512 BF16 dot products (vdpbf16ps): Zen 4 and later, Sapphire Rapids
// and later (Halide names no separate feature; these imply it).
inline bool target_has_bf16_dot_products(const Halide::Target& target) {
  return target.has_feature(Halide::Target::AVX512_Zen4) ||
         target.has_feature(Halide::Target::AVX512_Zen5) ||
         target.has_feature(Halide::Target::AVX512_SapphireRapids);
}

// Whether a kernel (forward, block-sparse or backward) runs on bf16 products: asked for (the
// generators' bf16_products param, which needs bf16 inputs), not decode, and a target that has
// them.
inline bool uses_bf16_products(bool requested, const Halide::Type& io_type, bool decode,
                               const Halide::Target& target) {
  TILELAB_REQUIRE(!requested || io_type == Halide::BFloat(16))
      << "bf16_products: needs io_type bfloat16, got " << io_type;
  return requested && !decode && target_has_bf16_dot_products(target);
}

// Schedules `stages` for an x86 CPU (AVX-512 or AVX2 or baseline, from `target`); `head_dim` is the
// head dimension Expr the fast paths specialize on.
void schedule_flash_attention_x86(FlashAttentionStages& stages, const Halide::Target& target,
                                  const Halide::Expr& head_dim);

// Schedules everything from the stages that feed the scores to `state` (the loop nest per
// (query tile io, kv head hk, batch b) described in x86.cpp), leaving out and lse to the caller:
// shared by the dense forward and the block-sparse forward, whose outputs and per-row lookups
// differ. The state of one tile is computed at `tile`, the caller's (parallel) loop over tiles of
// the Func that reads the finished state, so that it stays in cache from its initialization to
// its last read; per-tile lookups belong there too.
void schedule_online_softmax_x86(FlashAttentionStages& stages, const Halide::Target& target,
                                 const Halide::Expr& head_dim, const Halide::LoopLevel& tile);

}  // namespace tilelab::schedules
