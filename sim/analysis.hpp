// Analyses of a timed run shared by the report, the CLI and the Python bindings: the critical
// path, what each engine's idle time waited on, and the flat metrics (one number per name, each
// with its unit) that sweep tables and Report attributes use.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "program.hpp"
#include "report.hpp"
#include "timing.hpp"

namespace tilelab::sim {

// The unit that executes instruction `i`: "dma" for DMA transfers, else its engine's name.
std::string unit_of(const Program& program, uint32_t i);

// "none", "dependency", "port", "dma_engine", "hbm", "dma_trigger".
const char* wait_reason_name(WaitReason reason);
inline constexpr std::array<WaitReason, 6> kWaitReasons = {
    WaitReason::none,       WaitReason::dependency, WaitReason::port,
    WaitReason::dma_engine, WaitReason::hbm,        WaitReason::dma_trigger};

// The instructions that determined the total time, in time order: walked back from the last
// instruction to finish through the wait (dependency, port, DMA engine or queue order) that set
// each start.
std::vector<uint32_t> critical_path(const Program& program, const TimingResult& timing);

// Per engine (indexed by Engine): idle time attributed to what it waited on, largest first, and
// the (up to 5) instructions waited on longest.
struct EngineIdleTime {
  std::vector<BlameEntry> blame;
  std::vector<TopWait> top_waits;
};
std::array<EngineIdleTime, kEngineCount> attribute_idle_time(const Program& program,
                                                             const TimingResult& timing);
// Per instruction: the idle time of its engine queue just before it started (0 when it started
// right after the previous instruction of that queue). The waited-on instruction is
// timing.instructions[i].wait_on; attribute_idle_time and the by-line table read these gaps.
std::vector<double> idle_before(const Program& program, const TimingResult& timing);

// One number of the flat summary.
struct Metric {
  std::string name;
  const char* unit;  // "ns", "us", "cycles", "count", "bytes", "percent", "GB/s", "flops", ...
  double value;
};

// The report as flat metrics. Every engine, DMA kind and critical-path unit appears (zeros when
// unused), so every report yields the same names in the same order.
std::vector<Metric> flat_metrics(const Report& report);

}  // namespace tilelab::sim
