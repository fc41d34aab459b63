// The x86 schedule of the flash attention backward pipeline
// (generators/flash/flash_attention_backward_generator.cpp); stages in
// generators/flash/backward_stages.hpp.
#pragma once

#include "Halide.h"
#include "generators/flash/backward_stages.hpp"

namespace tilelab::schedules {

using generators::FlashBackwardStages;

// Schedules `stages` for an x86 CPU (AVX-512 or AVX2 or baseline, from `target`); `head_dim` is the
// head dimension Expr the fast paths specialize on.
void schedule_flash_attention_backward_x86(FlashBackwardStages& stages,
                                           const Halide::Target& target,
                                           const Halide::Expr& head_dim);

}  // namespace tilelab::schedules
