// Report assembly and output formats.
#include "report.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <sstream>
#include <string_view>

#include "analysis.hpp"
#include "cost.hpp"
#include "dma/dma.hpp"
#include "text.hpp"

namespace tilelab::sim {
namespace {

using nlohmann::json;

bool is_dma(const Instruction& instr) {
  return instr.dma != kNone;
}

// Length of the union of [start, end) intervals.
double union_length(std::vector<std::pair<double, double>>& intervals) {
  std::sort(intervals.begin(), intervals.end());
  double total = 0, covered_until = -1e300;
  for (const auto& [start, end] : intervals) {
    if (end <= covered_until) continue;
    total += end - std::max(start, covered_until);
    covered_until = end;
  }
  return total;
}

double percent(double part, double whole) {
  return whole > 0 ? 100.0 * part / whole : 0.0;
}

}  // namespace

namespace {
// Fills r.sources and r.by_line when the program recorded source lines. contributed_ns[k] is
// the time path[k] adds to the critical path.
void summarize_source_lines(const Program& p, const TimingResult& t,
                            const std::vector<uint32_t>& path,
                            const std::vector<double>& contributed_ns, Report& r);
}  // namespace

Report make_report(const Program& p, const TimingResult& t, const ReportOptions& options) {
  // The machine the run was timed on: its limits are the program's, its peaks and clocks those
  // the timing used.
  const Machine& m = t.machine;
  Report r;
  r.kernel = options.kernel.empty() ? p.name : options.kernel;
  r.parameters = options.parameters;
  r.machine = m.name;
  r.instruction_count = p.instructions.size();
  r.total_time_ns = t.total_ns;
  r.total_time_cycles = t.total_ns * m.tensor_clock_ghz;

  // --- engines and idle-time blame ---
  const size_t n = p.instructions.size();
  std::array<EngineIdleTime, kEngineCount> idle{};
  if (options.idle_blame) idle = attribute_idle_time(p, t);
  for (int e = 0; e < kEngineCount; ++e) {
    EngineSummary s;
    s.name = std::string(engine_name(static_cast<Engine>(e)));
    s.clock_ghz = engine_clock_ghz(m, static_cast<Engine>(e));
    s.instruction_count = t.engine_instructions[e];
    s.active_time_ns = t.engine_active_ns[e];
    s.active_time_percent = percent(s.active_time_ns, t.total_ns);
    s.active_cycles = s.active_time_ns * s.clock_ghz;
    s.idle_time_ns = t.total_ns - s.active_time_ns;
    s.idle_blame = std::move(idle[e].blame);
    s.top_waits = std::move(idle[e].top_waits);
    r.engines.push_back(std::move(s));
  }

  // --- DMA ---
  // Per kind (opcode), queue and size bucket: small arrays filled in instruction order, emitted in
  // the order of the name- or number-keyed maps they replace.
  std::vector<std::pair<double, double>> all_intervals;
  std::array<std::vector<std::pair<double, double>>, kOpcodeCount> kind_intervals;
  std::array<DmaKindSummary, kOpcodeCount> kinds{};
  std::array<std::vector<bool>, kOpcodeCount> kind_engines;
  constexpr int kQueues = 256;  // DmaRecord::queue is a uint8_t
  std::vector<std::vector<std::pair<double, double>>> queue_intervals(kQueues);
  std::vector<DmaQueueSummary> queues(kQueues);
  constexpr int kBuckets = 64;  // floor(log2(bytes per partition)) of a uint64_t
  std::array<BytesHistogramBucket, kBuckets> histogram{};
  const size_t engine_flags = size_t(std::max(m.dma_engines, 1));
  for (uint32_t i = 0; i < n; ++i) {
    const Instruction& instr = p.instructions[i];
    if (!is_dma(instr)) continue;
    const DmaRecord& d = p.dmas[instr.dma];
    const InstructionTiming& it = t.instructions[i];
    all_intervals.emplace_back(it.transfer_start_ns, it.end_ns);
    queue_intervals[d.queue].emplace_back(it.transfer_start_ns, it.end_ns);
    const int kind = static_cast<int>(instr.opcode);
    kind_intervals[kind].emplace_back(it.transfer_start_ns, it.end_ns);
    auto& k = kinds[kind];
    ++k.transfers;
    k.bytes += d.bytes();
    k.average_bytes_per_partition += double(d.bytes_per_partition);
    auto& engines_touched = kind_engines[kind];
    engines_touched.resize(engine_flags, false);
    // The engines split_dma uses: a range that starts inside an engine's partitions still
    // touches every engine it overlaps.
    const DmaEngineSpan span = dma_engine_span(m, d.partition_start, d.partitions);
    for (int engine = span.first; engine < span.end; ++engine)
      if (size_t(engine) < engines_touched.size()) engines_touched[size_t(engine)] = true;
    auto& q = queues[d.queue];
    q.queue = d.queue;
    ++q.transfers;
    q.bytes += d.bytes();
    ++r.dma_transfer_count;
    r.dma_transfer_total_bytes += d.bytes();
    // floor(log2(x)) of a positive integer is its bit width - 1 (exact, unlike log2 in double).
    const int bucket = d.bytes_per_partition == 0
                           ? 0
                           : static_cast<int>(std::bit_width(d.bytes_per_partition)) - 1;
    auto& h = histogram[size_t(bucket)];
    h.bytes_per_partition_min = uint64_t(1) << bucket;
    h.bytes_per_partition_max = uint64_t(1) << (bucket + 1);
    ++h.transfers;
    h.bytes += d.bytes();
  }
  r.dma_active_time_ns = union_length(all_intervals);
  r.dma_active_time_percent = percent(r.dma_active_time_ns, t.total_ns);
  r.dma_transfer_average_bytes =
      r.dma_transfer_count ? double(r.dma_transfer_total_bytes) / r.dma_transfer_count : 0.0;
  for (int q = 0; q < kQueues; ++q) {
    if (queues[size_t(q)].transfers == 0) continue;
    DmaQueueSummary& summary = queues[size_t(q)];
    summary.active_time_ns = union_length(queue_intervals[size_t(q)]);
    summary.active_time_percent = percent(summary.active_time_ns, t.total_ns);
    r.dma_queues.push_back(summary);
  }
  for (const BytesHistogramBucket& h : histogram)
    if (h.transfers > 0) r.dma_bytes_per_partition_histogram.push_back(h);
  for (size_t e = 0; e < t.dma_engine_busy_ns.size(); ++e) {
    DmaEngineSummary s;
    s.engine = static_cast<int>(e);
    s.busy_time_ns = t.dma_engine_busy_ns[e];
    s.utilization_percent = percent(s.busy_time_ns, t.total_ns);
    s.bytes = t.dma_engine_bytes[e];
    s.pieces = t.dma_engine_pieces[e];
    r.dma_engines.push_back(s);
  }
  r.dma_peak_gbps = m.dma_bytes_per_ns_per_engine * m.dma_engines;  // B/ns == GB/s
  r.dma_achieved_gbps = t.total_ns > 0 ? r.dma_transfer_total_bytes / t.total_ns : 0.0;
  r.dma_utilization_percent =
      r.dma_active_time_ns > 0
          ? percent(r.dma_transfer_total_bytes / r.dma_active_time_ns, r.dma_peak_gbps)
          : 0.0;
  // Kinds by name, as the report has always listed them.
  std::map<std::string_view, int> kinds_by_name;
  for (int kind = 0; kind < kOpcodeCount; ++kind)
    if (kinds[kind].transfers > 0) kinds_by_name[opcode_name(static_cast<Opcode>(kind))] = kind;
  for (const auto& [name, kind] : kinds_by_name) {
    DmaKindSummary& k = kinds[kind];
    k.kind = std::string(name);
    k.average_bytes_per_partition /= double(k.transfers);
    k.active_time_ns = union_length(kind_intervals[kind]);
    k.achieved_gbps = k.active_time_ns > 0 ? k.bytes / k.active_time_ns : 0.0;
    k.utilization_percent = percent(k.achieved_gbps, r.dma_peak_gbps);
    k.engines_used =
        static_cast<int>(std::count(kind_engines[kind].begin(), kind_engines[kind].end(), true));
    r.dma_by_kind.push_back(k);
  }
  r.hbm_read_bytes = t.hbm_read_bytes;
  r.hbm_write_bytes = t.hbm_write_bytes;
  r.hbm_peak_gbps = m.hbm_bytes_per_ns;
  r.mbu_estimated_percent =
      t.total_ns > 0
          ? percent((t.hbm_read_bytes + t.hbm_write_bytes) / t.total_ns, m.hbm_bytes_per_ns)
          : 0.0;

  // --- TensorE ---
  for (const Instruction& instr : p.instructions) {
    if (instr.opcode == Opcode::matmul) {
      r.hardware_flops += 2.0 * instr.operands[kSrc0].partition_count *
                          instr.operands[kSrc0].free_count * instr.operands[kSrc1].free_count;
    } else if (instr.opcode == Opcode::pe_transpose) {
      // An identity matmul: stationary [P, F] against a [P, P] identity.
      const double flops = 2.0 * instr.operands[kSrc0].partition_count *
                           instr.operands[kSrc0].free_count * instr.operands[kSrc0].partition_count;
      r.hardware_flops += flops;
      r.transpose_flops += flops;
    }
  }
  r.peak_flops_per_s = m.tensor_peak_flops_per_ns() * 1e9;
  const double peak_flops = m.tensor_peak_flops_per_ns() * t.total_ns;
  r.hfu_percent = percent(r.hardware_flops, peak_flops);
  r.mfu_percent = percent(r.hardware_flops - r.transpose_flops, peak_flops);

  // --- memory ---
  r.peak_sbuf_bytes_per_partition = p.peak_sbuf_bytes_per_partition;
  r.sbuf_bytes_per_partition = m.sbuf_bytes_per_partition;
  r.peak_psum_bytes_per_partition = p.peak_psum_bytes_per_partition;
  r.psum_bytes_per_partition = m.psum_bytes_per_partition;
  r.dependency_region_merges = t.region_merges;
  r.dependency_records_merged = t.region_records_merged;

  // --- critical path ---
  const std::vector<uint32_t> path = critical_path(p, t);
  r.critical_path_instructions = path.size();
  // Units by index (engines, then DMA), summed in path order and named once at the end.
  constexpr int kDmaUnit = kEngineCount;
  std::array<double, kEngineCount + 1> ns_by_unit{};
  std::array<bool, kEngineCount + 1> on_path{};
  int segment_unit = -1;  // unit of r.critical_path.back()
  double previous_end = 0;
  std::vector<double> contributed_ns;  // per path instruction, for the by-line table
  contributed_ns.reserve(path.size());
  for (uint32_t i : path) {
    const InstructionTiming& it = t.instructions[i];
    const double contributed = std::max(0.0, it.end_ns - previous_end);
    previous_end = std::max(previous_end, it.end_ns);
    contributed_ns.push_back(contributed);
    const int unit = is_dma(p.instructions[i]) ? kDmaUnit : int(p.instructions[i].engine);
    ns_by_unit[unit] += contributed;
    on_path[unit] = true;
    if (segment_unit != unit) {
      if (r.critical_path.size() >= options.max_critical_path_segments) {
        r.critical_path_truncated = true;
        continue;
      }
      segment_unit = unit;
      CriticalPathSegment s;
      s.unit = unit_of(p, i);
      s.start_ns = it.start_ns;
      s.first_instruction = std::string("#")
                                .append(std::to_string(i))
                                .append(" ")
                                .append(p.describe(p.instructions[i]));
      r.critical_path.push_back(std::move(s));
    }
    CriticalPathSegment& s = r.critical_path.back();
    ++s.instructions;
    s.end_ns = it.end_ns;
    s.contributed_ns += contributed;
  }
  for (int unit = 0; unit <= kDmaUnit; ++unit)
    if (on_path[unit])
      r.critical_path_ns_by_unit[unit == kDmaUnit ? "dma"
                                                  : std::string(engine_name(Engine(unit)))] =
          ns_by_unit[unit];
  summarize_source_lines(p, t, path, contributed_ns, r);
  return r;
}

namespace {
void summarize_source_lines(const Program& p, const TimingResult& t,
                            const std::vector<uint32_t>& path,
                            const std::vector<double>& contributed_ns, Report& r) {
  const bool any = std::any_of(p.instructions.begin(), p.instructions.end(),
                               [](const Instruction& i) { return i.source != kNone; });
  if (!any) return;
  r.sources = p.sources;
  std::vector<SourceLineSummary> rows(p.sources.size());
  for (uint32_t s = 0; s < rows.size(); ++s) rows[s].source = s;
  for (uint32_t i = 0; i < p.instructions.size(); ++i) {
    const Instruction& instr = p.instructions[i];
    if (instr.source == kNone) continue;
    SourceLineSummary& row = rows[instr.source];
    ++row.instructions;
    const InstructionTiming& it = t.instructions[i];
    row.busy_ns[std::string(engine_name(instr.engine))] += it.issue_end_ns - it.start_ns;
    if (instr.dma != kNone) {
      ++row.dma_transfers;
      row.dma_bytes += p.dmas[instr.dma].bytes();
    }
  }
  for (size_t k = 0; k < path.size(); ++k)
    if (p.instructions[path[k]].source != kNone)
      rows[p.instructions[path[k]].source].critical_path_ns += contributed_ns[k];
  const std::vector<double> gaps = idle_before(p, t);
  for (uint32_t i = 0; i < p.instructions.size(); ++i) {
    const uint32_t waited = t.instructions[i].wait_on;
    if (gaps[i] > 0 && waited != kNone && p.instructions[waited].source != kNone)
      rows[p.instructions[waited].source].idle_blamed_ns += gaps[i];
  }
  for (SourceLineSummary& row : rows)
    if (row.instructions > 0 || row.idle_blamed_ns > 0) r.by_line.push_back(std::move(row));
}
}  // namespace

json report_json(const Report& r) {
  json j;
  j["schema"] = kReportSchema;
  j["schema_version"] = kReportSchemaVersion;
  j["kernel"] = r.kernel;
  j["parameters"] = r.parameters;
  j["machine"] = r.machine;
  j["instruction_count"] = r.instruction_count;
  j["total_time_ns"] = r.total_time_ns;
  j["total_time_cycles"] = r.total_time_cycles;
  json engines = json::array();
  for (const auto& e : r.engines) {
    json blame = json::array();
    for (const auto& b : e.idle_blame)
      blame.push_back(
          {{"waited_on", b.waited_on}, {"idle_time_ns", b.idle_ns}, {"waits", b.waits}});
    json waits = json::array();
    for (const auto& w : e.top_waits)
      waits.push_back(
          {{"waited_on", w.waited_on}, {"idle_time_ns", w.idle_ns}, {"waits", w.waits}});
    engines.push_back({{"name", e.name},
                       {"clock_ghz", e.clock_ghz},
                       {"instruction_count", e.instruction_count},
                       {"active_time_ns", e.active_time_ns},
                       {"active_time_percent", e.active_time_percent},
                       {"active_cycles", e.active_cycles},
                       {"idle_time_ns", e.idle_time_ns},
                       {"idle_blame", blame},
                       {"top_waits", waits}});
  }
  j["engines"] = engines;
  json histogram = json::array();
  for (const auto& h : r.dma_bytes_per_partition_histogram)
    histogram.push_back({{"bytes_per_partition_min", h.bytes_per_partition_min},
                         {"bytes_per_partition_max", h.bytes_per_partition_max},
                         {"transfers", h.transfers},
                         {"bytes", h.bytes}});
  json dma_engines = json::array();
  for (const auto& e : r.dma_engines)
    dma_engines.push_back({{"engine", e.engine},
                           {"busy_time_ns", e.busy_time_ns},
                           {"utilization_percent", e.utilization_percent},
                           {"bytes", e.bytes},
                           {"pieces", e.pieces}});
  json dma_queues = json::array();
  for (const auto& q : r.dma_queues)
    dma_queues.push_back({{"queue", q.queue},
                          {"transfers", q.transfers},
                          {"bytes", q.bytes},
                          {"active_time_ns", q.active_time_ns},
                          {"active_time_percent", q.active_time_percent}});
  json by_kind = json::array();
  for (const auto& k : r.dma_by_kind)
    by_kind.push_back({{"kind", k.kind},
                       {"transfers", k.transfers},
                       {"bytes", k.bytes},
                       {"average_bytes_per_partition", k.average_bytes_per_partition},
                       {"active_time_ns", k.active_time_ns},
                       {"achieved_gbps", k.achieved_gbps},
                       {"utilization_percent", k.utilization_percent},
                       {"engines_used", k.engines_used}});
  j["dma"] = {{"dma_active_time_ns", r.dma_active_time_ns},
              {"dma_active_time_percent", r.dma_active_time_percent},
              {"dma_transfer_count", r.dma_transfer_count},
              {"dma_transfer_total_bytes", r.dma_transfer_total_bytes},
              {"dma_transfer_average_bytes", r.dma_transfer_average_bytes},
              {"bytes_per_partition_histogram", histogram},
              {"engines", dma_engines},
              {"queues", dma_queues},
              {"achieved_gbps", r.dma_achieved_gbps},
              {"peak_gbps", r.dma_peak_gbps},
              {"hbm_read_bytes", r.hbm_read_bytes},
              {"hbm_write_bytes", r.hbm_write_bytes},
              {"hbm_peak_gbps", r.hbm_peak_gbps},
              {"mbu_estimated_percent", r.mbu_estimated_percent},
              {"dma_utilization_percent", r.dma_utilization_percent},
              {"by_kind", by_kind}};
  j["tensor"] = {{"hardware_flops", r.hardware_flops},
                 {"transpose_flops", r.transpose_flops},
                 {"peak_flops_per_s", r.peak_flops_per_s},
                 {"hfu_percent", r.hfu_percent},
                 {"mfu_percent", r.mfu_percent}};
  j["memory"] = {{"peak_sbuf_bytes_per_partition", r.peak_sbuf_bytes_per_partition},
                 {"sbuf_bytes_per_partition", r.sbuf_bytes_per_partition},
                 {"peak_sbuf_percent", percent(double(r.peak_sbuf_bytes_per_partition),
                                               double(r.sbuf_bytes_per_partition))},
                 {"peak_psum_bytes_per_partition", r.peak_psum_bytes_per_partition},
                 {"psum_bytes_per_partition", r.psum_bytes_per_partition},
                 {"peak_psum_percent", percent(double(r.peak_psum_bytes_per_partition),
                                               double(r.psum_bytes_per_partition))},
                 {"dependency_region_merges", r.dependency_region_merges},
                 {"dependency_records_merged", r.dependency_records_merged}};
  json segments = json::array();
  for (const auto& s : r.critical_path)
    segments.push_back({{"unit", s.unit},
                        {"instructions", s.instructions},
                        {"start_ns", s.start_ns},
                        {"end_ns", s.end_ns},
                        {"contributed_ns", s.contributed_ns},
                        {"first_instruction", s.first_instruction}});
  j["critical_path"] = {{"instructions", r.critical_path_instructions},
                        {"time_ns_by_unit", r.critical_path_ns_by_unit},
                        {"segments", segments},
                        {"truncated", r.critical_path_truncated}};
  json sources = json::array();
  for (size_t i = 0; i < r.sources.size(); ++i) {
    const SourceLocation& s = r.sources[i];
    sources.push_back({{"id", i},
                       {"file", s.file},
                       {"line", s.line},
                       {"function", s.function},
                       {"text", s.text},
                       {"caller", s.caller == kNone ? json(nullptr) : json(s.caller)}});
  }
  json by_line = json::array();
  for (const SourceLineSummary& row : r.by_line) {
    const SourceLocation& s = r.sources[row.source];
    by_line.push_back({{"source", row.source},
                       {"file", s.file},
                       {"line", s.line},
                       {"function", s.function},
                       {"text", s.text},
                       {"instructions", row.instructions},
                       {"busy_ns", row.busy_ns},
                       {"dma_transfers", row.dma_transfers},
                       {"dma_bytes", row.dma_bytes},
                       {"critical_path_ns", row.critical_path_ns},
                       {"idle_blamed_ns", row.idle_blamed_ns}});
  }
  j["sources"] = sources;
  j["by_line"] = by_line;
  return j;
}

std::string report_text(const Report& r) {
  std::ostringstream out;
  char line[512];
  std::snprintf(line, sizeof line,
                "kernel %s on %s: %zu instructions, total %.3f us (%.0f TensorE cycles)\n",
                r.kernel.c_str(), r.machine.c_str(), size_t(r.instruction_count),
                r.total_time_ns / 1e3, r.total_time_cycles);
  out << line;
  if (!r.parameters.empty()) {
    out << "parameters:";
    for (const auto& [k, v] : r.parameters) out << " " << k << "=" << v;
    out << "\n";
  }
  out << "\nengine   instructions   active_us  active_%  idle blamed on (largest first)\n";
  for (const auto& e : r.engines) {
    std::snprintf(line, sizeof line, "%-8s %12llu %11.3f %8.1f  ", e.name.c_str(),
                  static_cast<unsigned long long>(e.instruction_count), e.active_time_ns / 1e3,
                  e.active_time_percent);
    out << line;
    for (size_t i = 0; i < e.idle_blame.size() && i < 3; ++i) {
      std::snprintf(line, sizeof line, "%s%s %.1f us", i ? ", " : "",
                    e.idle_blame[i].waited_on.c_str(), e.idle_blame[i].idle_ns / 1e3);
      out << line;
    }
    out << "\n";
  }
  std::snprintf(line, sizeof line,
                "\nDMA: %llu transfers, %.1f MiB (avg %.1f KiB), active %.3f us (%.1f%%), "
                "achieved %.1f GB/s of %.1f GB/s peak\n",
                static_cast<unsigned long long>(r.dma_transfer_count),
                r.dma_transfer_total_bytes / 1048576.0, r.dma_transfer_average_bytes / 1024.0,
                r.dma_active_time_ns / 1e3, r.dma_active_time_percent, r.dma_achieved_gbps,
                r.dma_peak_gbps);
  out << line;
  std::snprintf(line, sizeof line,
                "HBM: read %.1f MiB, written %.1f MiB, MBU %.1f%% of %.1f GB/s\n",
                r.hbm_read_bytes / 1048576.0, r.hbm_write_bytes / 1048576.0,
                r.mbu_estimated_percent, r.hbm_peak_gbps);
  out << line;
  std::snprintf(line, sizeof line,
                "DMA utilization while active: %.1f%% of peak (bytes / (peak x active time))\n",
                r.dma_utilization_percent);
  out << line;
  for (const auto& k : r.dma_by_kind) {
    std::snprintf(line, sizeof line,
                  "  %-13s %6llu transfers %9.1f MiB, %7.0f B/partition avg, %2d engines, "
                  "%7.1f GB/s while active = %5.1f%% of peak\n",
                  k.kind.c_str(), static_cast<unsigned long long>(k.transfers), k.bytes / 1048576.0,
                  k.average_bytes_per_partition, k.engines_used, k.achieved_gbps,
                  k.utilization_percent);
    out << line;
  }
  out << "bytes/partition histogram:";
  for (const auto& h : r.dma_bytes_per_partition_histogram)
    out << " [" << h.bytes_per_partition_min << "," << h.bytes_per_partition_max
        << "):" << h.transfers;
  out << "\nDMA engine utilization %:";
  for (const auto& e : r.dma_engines) {
    std::snprintf(line, sizeof line, " %.0f", e.utilization_percent);
    out << line;
  }
  out << "\nDMA queues:";
  for (const auto& q : r.dma_queues) {
    std::snprintf(line, sizeof line, " q%d %llu transfers %.1f%% active;", q.queue,
                  static_cast<unsigned long long>(q.transfers), q.active_time_percent);
    out << line;
  }
  std::snprintf(line, sizeof line,
                "\nTensorE: %.3g hardware flops (%.3g transpose), HFU %.2f%%, MFU %.2f%%\n",
                r.hardware_flops, r.transpose_flops, r.hfu_percent, r.mfu_percent);
  out << line;
  std::snprintf(line, sizeof line,
                "SBUF peak %lld of %lld B/partition; PSUM peak %lld of %lld B/partition\n",
                static_cast<long long>(r.peak_sbuf_bytes_per_partition),
                static_cast<long long>(r.sbuf_bytes_per_partition),
                static_cast<long long>(r.peak_psum_bytes_per_partition),
                static_cast<long long>(r.psum_bytes_per_partition));
  out << line;
  if (r.dependency_region_merges > 0) {
    std::snprintf(line, sizeof line,
                  "dependency tracking merged access records %llu times (%llu records): some waits "
                  "may be longer than the program requires\n",
                  static_cast<unsigned long long>(r.dependency_region_merges),
                  static_cast<unsigned long long>(r.dependency_records_merged));
    out << line;
  }
  out << "critical path (" << r.critical_path_instructions << " instructions):";
  for (const auto& [unit, ns] : r.critical_path_ns_by_unit) {
    std::snprintf(line, sizeof line, " %s %.3f us (%.1f%%);", unit.c_str(), ns / 1e3,
                  percent(ns, r.total_time_ns));
    out << line;
  }
  out << "\n";
  if (!r.by_line.empty()) out << by_line_text(r);
  return out.str();
}

std::string by_line_text(const Report& r, size_t max_rows) {
  // The lines that cost most: busy time plus the idle time they caused.
  std::vector<const SourceLineSummary*> rows;
  for (const SourceLineSummary& row : r.by_line) rows.push_back(&row);
  auto cost = [](const SourceLineSummary* row) {
    return row->busy_total_ns() + row->idle_blamed_ns;
  };
  // Ties keep the lines' order (rows point into r.by_line in order). std::sort with the explicit
  // tie-break, not std::stable_sort, whose buffer (get_temporary_buffer) is deprecated in C++17.
  std::sort(rows.begin(), rows.end(), [&](const SourceLineSummary* a, const SourceLineSummary* b) {
    const auto cost_a = cost(a), cost_b = cost(b);
    return cost_a != cost_b ? cost_a > cost_b : std::less<>{}(a, b);
  });
  std::ostringstream out;
  char line[512];
  out << "\nby source line (" << r.by_line.size() << " lines, costliest first):\n"
      << "  line                      instr   busy_us  crit_us  idle_caused_us  dma_KiB  source\n";
  for (size_t i = 0; i < rows.size() && i < max_rows; ++i) {
    const SourceLineSummary& row = *rows[i];
    const SourceLocation& s = r.sources[row.source];
    std::snprintf(line, sizeof line, "  %-24.24s %7llu %9.3f %8.3f %15.3f %8.1f  %.60s\n",
                  s.short_label().c_str(), static_cast<unsigned long long>(row.instructions),
                  row.busy_total_ns() / 1e3, row.critical_path_ns / 1e3, row.idle_blamed_ns / 1e3,
                  row.dma_bytes / 1024.0, s.text.c_str());
    out << line;
  }
  if (rows.size() > max_rows) out << "  ... " << rows.size() - max_rows << " more lines\n";
  return out.str();
}

namespace {

// Whether one of the eight bytes of `word` may need an escape in a JSON string (a control
// character, '"' or '\\'); never false when one does. The trace's strings are mostly operand
// descriptions without any: tested a word at a time, they are copied at memory speed.
bool may_need_escape(uint64_t word) {
  constexpr uint64_t kOnes = 0x0101010101010101, kHighBits = 0x8080808080808080;
  const auto has_zero_byte = [](uint64_t x) { return (x - kOnes) & ~x & kHighBits; };
  const uint64_t below_space = (word - kOnes * 0x20) & ~word & kHighBits;
  return (below_space | has_zero_byte(word ^ (kOnes * '"')) |
          has_zero_byte(word ^ (kOnes * '\\'))) != 0;
}

uint64_t word_at(std::string_view text, size_t i) {
  uint64_t word;
  std::memcpy(&word, text.data() + i, sizeof word);
  return word;
}

// JSON text appended in place, for the trace: with a document tree (nlohmann::json), building,
// serializing and freeing the default paged batch's 100,000 events took 0.8 s and 230 MB of a
// 0.9-1.0 s, 274 MB run of `tilelab sim paged-attention`; written directly, the run took
// 0.2-0.35 s and 48 MB (Zen 4), and 0.11-0.16 s once descriptions no longer went through streams.
void append_json_string(std::string& out, std::string_view text) {
  out += '"';
  size_t run = 0;  // start of the characters not yet appended, which need no escape
  for (size_t i = 0; i < text.size(); ++i) {
    while (i + 8 <= text.size() && !may_need_escape(word_at(text, i))) i += 8;
    if (i == text.size()) break;
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out.append(text, run, i - run);
    run = i + 1;
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default: {
        char escaped[8];
        std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
        out += escaped;
      }
    }
  }
  out.append(text, run, text.size() - run);
  out += '"';
}

// The shortest text that reads back as `value`; null for NaN and infinities, as JSON has neither.
void append_json_number(std::string& out, double value) {
  if (!std::isfinite(value)) {
    out += "null";
    return;
  }
  char digits[32];
  const auto end = std::to_chars(digits, digits + sizeof digits, value).ptr;
  out.append(digits, end);
}

// The events of a Chrome trace, each an object of the "traceEvents" array.
class TraceEvents {
 public:
  explicit TraceEvents(std::string& out) : out_(out) {}

  // A metadata event naming process `pid`, or thread `tid` of it.
  void name_process(int pid, std::string_view name) { metadata("process_name", pid, -1, name); }
  void name_thread(int pid, int tid, std::string_view name) {
    metadata("thread_name", pid, tid, name);
  }
  // A complete ("X") event from start_ns to end_ns, with `args` already a JSON object.
  void slice(std::string_view name, int pid, int tid, double start_ns, double end_ns,
             std::string_view args) {
    begin();
    out_ += "{\"ph\":\"X\",\"name\":";
    append_json_string(out_, name);
    out_ += ",\"pid\":";
    append_decimal(out_, pid);
    out_ += ",\"tid\":";
    append_decimal(out_, tid);
    out_ += ",\"ts\":";
    append_json_number(out_, start_ns / 1e3);
    out_ += ",\"dur\":";
    append_json_number(out_, (end_ns - start_ns) / 1e3);
    out_ += ",\"args\":";
    out_ += args;
    out_ += '}';
  }

 private:
  void begin() {
    if (!first_) out_ += ',';
    first_ = false;
  }
  void metadata(std::string_view kind, int pid, int tid, std::string_view name) {
    begin();
    out_ += "{\"ph\":\"M\",\"name\":";
    append_json_string(out_, kind);
    out_ += ",\"pid\":";
    append_decimal(out_, pid);
    if (tid >= 0) {
      out_ += ",\"tid\":";
      append_decimal(out_, tid);
    }
    out_ += ",\"args\":{\"name\":";
    append_json_string(out_, name);
    out_ += "}}";
  }

  std::string& out_;
  bool first_ = true;
};

}  // namespace

std::string chrome_trace(const Program& p, const TimingResult& t, size_t max_events) {
  std::string out;
  out.reserve(std::min(max_events, p.instructions.size() * 2 + t.dma_pieces.size()) * 160 + 512);
  out += "{\"traceEvents\":[";
  TraceEvents events(out);
  events.name_process(1, "engines");
  events.name_process(2, "dma queues");
  events.name_process(3, "dma engines");
  for (int e = 0; e < kEngineCount; ++e)
    events.name_thread(1, e, engine_name(static_cast<Engine>(e)));
  // Transfers of one queue overlap in time (they run on different DMA engines); trace viewers
  // need properly nested slices per track, so each queue gets as many lanes as it has overlap.
  std::vector<std::vector<double>> queue_lane_end(p.machine.dma_queues_per_engine);
  std::vector<bool> engine_named(p.machine.dma_engines, false);
  size_t count = 0;
  bool truncated = false;
  std::string name, args, text;
  for (uint32_t i = 0; i < p.instructions.size(); ++i) {
    if (count >= max_events) {
      truncated = true;
      break;
    }
    const Instruction& instr = p.instructions[i];
    const InstructionTiming& it = t.instructions[i];
    name.assign(opcode_name(instr.opcode));
    if (instr.opcode == Opcode::activation)
      name.append(".").append(act_func_name(ActFunc(instr.op0)));
    if (instr.opcode == Opcode::tensor_tensor || instr.opcode == Opcode::tensor_scalar ||
        instr.opcode == Opcode::tensor_reduce)
      name.append(".").append(alu_op_name(AluOp(instr.op0)));
    args.assign("{\"instruction\":");
    append_decimal(args, i);
    args += ",\"operands\":";
    text.clear();
    p.append_description(text, instr);
    append_json_string(args, text);
    if (instr.source != kNone) {
      const SourceLocation& source = p.sources[instr.source];
      text.assign(source.file).append(":");
      append_decimal(text, source.line);
      args += ",\"source\":";
      append_json_string(args, text);
    }
    args += '}';
    std::string_view slice_name = name;
    if (is_dma(instr)) slice_name = text.assign("trigger ").append(name);
    events.slice(slice_name, 1, static_cast<int>(instr.engine), it.start_ns, it.issue_end_ns, args);
    ++count;
    if (is_dma(instr)) {
      const int q = p.dmas[instr.dma].queue;
      auto& lanes = queue_lane_end[q];
      size_t lane = 0;
      while (lane < lanes.size() && lanes[lane] > it.transfer_start_ns) ++lane;
      if (lane == lanes.size()) {
        lanes.push_back(0);
        events.name_thread(
            2, q * 1000 + int(lane),
            "queue " + std::to_string(q) + (lane ? " #" + std::to_string(lane) : ""));
      }
      lanes[lane] = std::max(lanes[lane], it.end_ns);
      events.slice(name, 2, q * 1000 + int(lane), it.transfer_start_ns, it.end_ns, args);
      ++count;
    }
  }
  for (const DmaPieceTiming& piece : t.dma_pieces) {
    if (count >= max_events) {
      truncated = true;
      break;
    }
    if (!engine_named[piece.engine]) {
      events.name_thread(3, piece.engine, "dma engine " + std::to_string(piece.engine));
      engine_named[piece.engine] = true;
    }
    args.assign("{\"instruction\":");
    append_decimal(args, piece.instruction);
    args += ",\"bytes\":";
    append_decimal(args, piece.bytes);
    args += ",\"queue\":";
    append_decimal(args, piece.queue);
    args += '}';
    events.slice(opcode_name(p.instructions[piece.instruction].opcode), 3, piece.engine,
                 piece.start_ns, piece.end_ns, args);
    ++count;
  }
  out += "],\"displayTimeUnit\":\"ns\",\"metadata\":{\"program\":";
  append_json_string(out, p.name);
  out += ",\"machine\":";
  append_json_string(out, p.machine.name);
  out += ",\"truncated\":";
  out += truncated ? "true" : "false";
  out += "}}";
  return out;
}

}  // namespace tilelab::sim
