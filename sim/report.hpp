// Reports of a timed run: a profiler-style summary (engines, DMA, TensorE flops, memory), idle-time
// blame and the critical path (computed by analysis.hpp); as versioned JSON
// (docs/sim_report.schema.json), a Chrome/Perfetto trace and a text table.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "program.hpp"
#include "timing.hpp"

namespace tilelab::sim {

inline constexpr const char* kReportSchema = "tilelab.sim_report";
inline constexpr int kReportSchemaVersion = 3;

// Idle time of one engine attributed to what it waited on.
struct BlameEntry {
  std::string waited_on;  // "dma", "tensor", ..., "port:vector", "program_start", "program_end"
  double idle_ns = 0;
  uint64_t waits = 0;
};
struct TopWait {
  std::string waited_on;  // e.g. "dma_copy -> rhs_tiles"
  double idle_ns = 0;
  uint64_t waits = 0;
};

struct EngineSummary {
  std::string name;
  double clock_ghz = 0;
  uint64_t instruction_count = 0;
  double active_time_ns = 0;
  double active_time_percent = 0;
  double active_cycles = 0;
  double idle_time_ns = 0;
  std::vector<BlameEntry> idle_blame;  // largest first
  std::vector<TopWait> top_waits;      // up to 5, largest first
};

struct DmaEngineSummary {
  int engine = 0;
  double busy_time_ns = 0;
  double utilization_percent = 0;
  uint64_t bytes = 0;
  uint64_t pieces = 0;
};

struct DmaQueueSummary {
  int queue = 0;
  uint64_t transfers = 0;
  uint64_t bytes = 0;
  double active_time_ns = 0;
  double active_time_percent = 0;
};

struct BytesHistogramBucket {
  uint64_t bytes_per_partition_min = 0;  // inclusive
  uint64_t bytes_per_partition_max = 0;  // exclusive
  uint64_t transfers = 0;
  uint64_t bytes = 0;
};

// The transfers of one DMA opcode (dma_copy, dma_gather, ...): how well they used the engines.
struct DmaKindSummary {
  std::string kind;  // opcode name
  uint64_t transfers = 0;
  uint64_t bytes = 0;
  double average_bytes_per_partition = 0;
  double active_time_ns = 0;       // union of this kind's transfer intervals
  double achieved_gbps = 0;        // bytes / active_time_ns
  double utilization_percent = 0;  // achieved_gbps / peak_gbps x 100
  int engines_used = 0;            // DMA engines any transfer of this kind touched
};

struct CriticalPathSegment {
  std::string unit;  // engine name or "dma"
  uint64_t instructions = 0;
  double start_ns = 0;
  double end_ns = 0;
  double contributed_ns = 0;
  std::string first_instruction;
};

// What the instructions of one kernel source line did (front ends that record source lines,
// such as tilelab.nki): each instruction counts for its innermost line.
struct SourceLineSummary {
  uint32_t source = kNone;  // index into Report::sources
  uint64_t instructions = 0;
  std::map<std::string, double> busy_ns;  // per engine queue: issue time of its instructions
  uint64_t dma_transfers = 0;
  uint64_t dma_bytes = 0;
  double critical_path_ns = 0;  // its share of the (telescoped) critical path
  double idle_blamed_ns = 0;    // idle time of engine queues that waited on its instructions

  double busy_total_ns() const {
    double total = 0;
    for (const auto& [engine, ns] : busy_ns) total += ns;
    return total;
  }
};

struct Report {
  std::string kernel;
  std::map<std::string, std::string> parameters;
  std::string machine;
  uint64_t instruction_count = 0;
  double total_time_ns = 0;
  double total_time_cycles = 0;  // at the TensorE clock
  std::vector<EngineSummary> engines;

  // DMA.
  double dma_active_time_ns = 0;
  double dma_active_time_percent = 0;
  uint64_t dma_transfer_count = 0;
  uint64_t dma_transfer_total_bytes = 0;
  double dma_transfer_average_bytes = 0;
  std::vector<BytesHistogramBucket> dma_bytes_per_partition_histogram;
  std::vector<DmaEngineSummary> dma_engines;
  std::vector<DmaQueueSummary> dma_queues;
  double dma_achieved_gbps = 0;
  double dma_peak_gbps = 0;
  uint64_t hbm_read_bytes = 0;
  uint64_t hbm_write_bytes = 0;
  double hbm_peak_gbps = 0;
  double mbu_estimated_percent = 0;
  // Bytes / (peak DMA bandwidth x dma_active_time): how much of the DMA engines' bandwidth the
  // transfers used while any was moving data.
  double dma_utilization_percent = 0;
  std::vector<DmaKindSummary> dma_by_kind;

  // TensorE.
  double hardware_flops = 0;   // all PE work incl. transposes
  double transpose_flops = 0;  // identity matmuls of pe_transpose
  double peak_flops_per_s = 0;
  double hfu_percent = 0;
  double mfu_percent = 0;  // excluding transposes

  // Memory.
  int64_t peak_sbuf_bytes_per_partition = 0;
  int64_t sbuf_bytes_per_partition = 0;
  int64_t peak_psum_bytes_per_partition = 0;
  int64_t psum_bytes_per_partition = 0;
  // Times the dependency tracker merged a buffer's access records into one conservative record
  // (more than kMaxAccessRecords live regions) and the records it folded: waits after a merge can
  // be longer than the program's dependencies require.
  uint64_t dependency_region_merges = 0;
  uint64_t dependency_records_merged = 0;

  // Critical path (telescoped: contributions sum to total_time_ns).
  std::map<std::string, double> critical_path_ns_by_unit;
  std::vector<CriticalPathSegment> critical_path;
  uint64_t critical_path_instructions = 0;
  bool critical_path_truncated = false;

  // Source lines (empty unless the program recorded them), rows in source id order.
  std::vector<SourceLocation> sources;
  std::vector<SourceLineSummary> by_line;
};

struct ReportOptions {
  std::string kernel;
  std::map<std::string, std::string> parameters;
  size_t max_critical_path_segments = 200;
  // False: engines' idle_blame and top_waits stay empty (sweeps read the flat metrics only, which
  // do not use them; attributing every idle gap is a fifth of the report's time).
  bool idle_blame = true;
};

Report make_report(const Program& program, const TimingResult& timing,
                   const ReportOptions& options = {});

// The report as JSON ("schema": "tilelab.sim_report", "schema_version": kReportSchemaVersion).
nlohmann::json report_json(const Report& report);
// A human-readable table (with the by-line table when the report has source lines).
std::string report_text(const Report& report);
// The by-line table alone: the `max_rows` costliest lines (busy time plus idle time caused).
std::string by_line_text(const Report& report, size_t max_rows = 30);
// Chrome trace event JSON text (Perfetto opens it): one track per engine queue, per DMA queue and,
// when the timing recorded pieces, per DMA engine. Stops after `max_events` events (noted in
// metadata). Written as text, without a document tree: a trace has a few events per instruction.
std::string chrome_trace(const Program& program, const TimingResult& timing,
                         size_t max_events = 500000);

}  // namespace tilelab::sim
