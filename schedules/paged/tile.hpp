// The tile-machine schedule of the flash paged attention pipeline, mirroring the NKI kernel's
// tiling; the stages it places are in generators/paged/stages.hpp.
#pragma once

#include "Halide.h"
#include "generators/paged/stages.hpp"

namespace tilelab::schedules {

using generators::KeyTileStages;
using generators::PagedAttentionStages;

// The tile-machine schedule: 128-row query tiles (the partition dim), per large tile a
// 128-partition K and V gather with the block size tiling factor, an explicit K transpose,
// 128 × 512 fp32 score tiles (one PSUM bank), the P transpose, and P·V accumulated over
// 128-column pieces. See paged_attention.cpp for what differs from the NKI kernel.
void schedule_paged_attention_tile(PagedAttentionStages& stages, const Halide::Target& target);

}  // namespace tilelab::schedules
