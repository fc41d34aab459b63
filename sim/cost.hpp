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
// The same on `machine`'s timing parameters (its build-time limits equal the program's).
double instruction_cycles(const Program& program, const Machine& machine, const Instruction& instr);

}  // namespace tilelab::sim
