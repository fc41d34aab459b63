// The x86 schedule of the flash paged attention pipeline
// (generators/paged/paged_attention_generator.cpp); stages in generators/paged/stages.hpp.
#pragma once

#include "Halide.h"
#include "generators/paged/stages.hpp"
#include "schedules/paged/masked_tiles.hpp"

namespace tilelab::schedules {

using generators::KeyTileStages;
using generators::PagedAttentionStages;

// Schedules `stages` for an x86 CPU (AVX-512, AVX2 or baseline, from `target`).
void schedule_paged_attention_x86(PagedAttentionStages& stages, const Halide::Target& target);

}  // namespace tilelab::schedules
