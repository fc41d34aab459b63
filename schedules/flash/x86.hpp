// The x86 schedule of the flash attention forward pipeline
// (generators/flash/flash_attention_generator.cpp); stages in generators/flash/stages.hpp.
#pragma once

#include "Halide.h"
#include "generators/flash/stages.hpp"

namespace tilelab::schedules {

using generators::FlashAttentionStages;

// Schedules `stages` for an x86 CPU (AVX-512 or AVX2 or baseline, from `target`); `head_dim` is the
// head dimension Expr the fast paths specialize on.
void schedule_flash_attention_x86(FlashAttentionStages& stages, const Halide::Target& target,
                                  const Halide::Expr& head_dim);

}  // namespace tilelab::schedules
