// Per-instruction engine cost formulas (engine cycles), exactly as documented in the NKI ISA
// ("Estimated instruction cost"), plus the machine's stride penalty and perf modes.
#pragma once

#include "isa.hpp"
#include "machine.hpp"
#include "program.hpp"

namespace tilelab::sim {

double engine_clock_ghz(const Machine& machine, Engine engine);

// Engine cycles of a compute instruction on its engine. For DMA instructions: the cycles the
// triggering engine spends issuing it (descriptor generation on GpSimd for indirect DMA).
double instruction_cycles(const Program& program, const Instruction& instr);

// Fraction of per-engine DMA bandwidth a transfer reaches: the efficiency curve at its bytes per
// descriptor (contiguous run, at most the bytes per partition), times the DMA-transpose factor.
double dma_efficiency_factor(const Machine& machine, const DmaRecord& dma);

// Duration in ns of one DMA piece of `bytes` moved by one DMA engine for the given transfer:
// fixed cost + bytes / (bandwidth x efficiency(bytes per partition)), with the DMA-transpose
// efficiency on top.
double dma_piece_ns(const Machine& machine, const DmaRecord& dma, uint64_t bytes);

}  // namespace tilelab::sim
