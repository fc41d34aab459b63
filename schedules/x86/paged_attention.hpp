// The x86 schedule of the flash paged attention pipeline
// (generators/paged_attention_generator.cpp); stages in schedules/tile/paged_attention.hpp.
#pragma once

#include "Halide.h"
#include "schedules/tile/paged_attention.hpp"

namespace tilelab::schedules {

// Rows per query tile of the cpu schedule (divides 128, so a tile never spans two heads).
inline constexpr int kPagedCpuQueryTile = 32;

// Schedules `stages` for an x86 CPU (AVX-512, AVX2 or baseline, from `target`).
void schedule_paged_attention_x86(PagedAttentionStages& stages, const Halide::Target& target);

}  // namespace tilelab::schedules
