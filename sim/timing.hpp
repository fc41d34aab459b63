// Timing engine: turns a program into per-instruction start/end times. Each instruction's tile
// regions give RAW/WAR/WAW dependencies that become semaphore waits between engines; engines run
// their queues in order and overlap; DMA transfers run on the DMA model.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "isa.hpp"
#include "program.hpp"

namespace tilelab::sim {

// What decided when an instruction (or a DMA transfer) could start.
enum class WaitReason : uint8_t {
  none,         // started at time 0 or right after the previous instruction of its queue
  dependency,   // waited for a producer / earlier reader (semaphore)
  port,         // shared SBUF/PSUM port held by another engine (NC-v2)
  dma_engine,   // DMA transfer waited for a busy DMA engine
  hbm,          // DMA transfer limited by the HBM bandwidth cap
  dma_trigger,  // DMA transfer waited for its trigger and start latency
};

struct InstructionTiming {
  double start_ns = 0;           // execution (compute) or trigger (DMA) start on its engine queue
  double issue_end_ns = 0;       // end of the work on the engine queue
  double end_ns = 0;             // completion (DMA: last piece done)
  double transfer_start_ns = 0;  // DMA: first piece start
  uint32_t wait_on = kNone;      // instruction that bound start_ns (dependency or port)
  uint32_t transfer_wait_on = kNone;  // DMA: instruction holding the engine that delayed it
  uint32_t engine_previous = kNone;   // previous instruction of the same engine queue
  WaitReason wait_reason = WaitReason::none;
  WaitReason transfer_reason = WaitReason::none;
};

// One DMA piece, recorded only when TimingOptions::record_dma_pieces is set.
struct DmaPieceTiming {
  uint32_t instruction = 0;
  uint16_t engine = 0;
  uint16_t queue = 0;
  uint64_t bytes = 0;
  double start_ns = 0;
  double end_ns = 0;
};

// Per buffer, the dependency tracker keeps at most this many distinct read (and write) regions;
// one more merges them into a single conservative record over their union, which can only add
// waits (TimingResult::region_merges counts it).
inline constexpr size_t kMaxAccessRecords = 512;

struct TimingOptions {
  bool record_dma_pieces = false;
};

struct TimingResult {
  std::vector<InstructionTiming> instructions;
  std::vector<DmaPieceTiming> dma_pieces;
  double total_ns = 0;
  std::array<double, kEngineCount> engine_active_ns{};
  std::array<uint64_t, kEngineCount> engine_instructions{};
  std::vector<double> dma_engine_busy_ns;
  std::vector<uint64_t> dma_engine_bytes;
  std::vector<uint64_t> dma_engine_pieces;
  uint64_t hbm_read_bytes = 0;
  uint64_t hbm_write_bytes = 0;
  // Times a buffer's access list exceeded kMaxAccessRecords and was merged into one record, and
  // the records folded by those merges. Nonzero means some waits may be conservative.
  uint64_t region_merges = 0;
  uint64_t region_records_merged = 0;
  // The machine whose timing parameters were simulated (the report's peaks come from it).
  Machine machine;
};

// Simulates the program's timing without data. Deterministic; linear in the instruction count.
TimingResult simulate_timing(const Program& program, const TimingOptions& options = {});
// The same with the timing parameters of `machine` (clocks, costs, DMA bandwidth, ...), so that a
// sweep over them reuses one built program. Throws tilelab::Error naming the key when `machine`
// differs from the program's machine in a build-time limit (machine_build_limits()).
TimingResult simulate_timing(const Program& program, const Machine& machine,
                             const TimingOptions& options = {});

}  // namespace tilelab::sim
