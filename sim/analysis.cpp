// Critical path, idle-time attribution and flat metrics of a timed run.
#include "analysis.hpp"

#include <algorithm>
#include <map>

namespace tilelab::sim {
namespace {

bool is_dma(const Instruction& instr) {
  return instr.dma != kNone;
}

// Buffer name without a pool's "[k]" suffix, so that waits on rotating buffers aggregate.
std::string base_name(const std::string& name) {
  const auto bracket = name.find('[');
  return bracket == std::string::npos ? name : name.substr(0, bracket);
}

double percent(double part, double whole) {
  return whole > 0 ? 100.0 * part / whole : 0.0;
}

}  // namespace

std::string unit_of(const Program& p, uint32_t i) {
  const Instruction& instr = p.instructions[i];
  return is_dma(instr) ? "dma" : std::string(engine_name(instr.engine));
}

const char* wait_reason_name(WaitReason reason) {
  switch (reason) {
    case WaitReason::none:
      return "none";
    case WaitReason::dependency:
      return "dependency";
    case WaitReason::port:
      return "port";
    case WaitReason::dma_engine:
      return "dma_engine";
    case WaitReason::hbm:
      return "hbm";
    case WaitReason::dma_trigger:
      return "dma_trigger";
  }
  return "?";
}

std::vector<uint32_t> critical_path(const Program& p, const TimingResult& t) {
  const size_t n = p.instructions.size();
  uint32_t current = kNone;
  double latest = -1;
  for (uint32_t i = 0; i < n; ++i)
    if (t.instructions[i].end_ns > latest) {
      latest = t.instructions[i].end_ns;
      current = i;
    }
  std::vector<uint32_t> path;
  std::vector<uint8_t> visited(n, 0);
  while (current != kNone && !visited[current]) {
    visited[current] = 1;
    path.push_back(current);
    const InstructionTiming& it = t.instructions[current];
    uint32_t next = kNone;
    if (is_dma(p.instructions[current]) && it.transfer_reason == WaitReason::dma_engine &&
        it.transfer_wait_on != kNone) {
      next = it.transfer_wait_on;
    } else if (it.wait_on != kNone) {
      next = it.wait_on;
    } else if (it.engine_previous != kNone &&
               it.start_ns <= t.instructions[it.engine_previous].issue_end_ns + 1e-9) {
      next = it.engine_previous;
    }
    current = next;
  }
  std::reverse(path.begin(), path.end());
  return path;
}

namespace {

// Units as indices: the engines in Engine order, then DMA.
constexpr int kDmaUnit = kEngineCount;
constexpr int kUnitCount = kEngineCount + 1;

int unit_index(const Program& p, uint32_t i) {
  const Instruction& instr = p.instructions[i];
  return is_dma(instr) ? kDmaUnit : static_cast<int>(instr.engine);
}

std::string unit_name(int unit) {
  return unit == kDmaUnit ? "dma" : std::string(engine_name(static_cast<Engine>(unit)));
}

// What an idle gap waited on, as a small index (its name: blame_name): a unit, through a shared
// port or not, the engine's own queue order, or the program start.
constexpr int kPortBlame = kUnitCount;  // kPortBlame + unit: "port:<unit>"
constexpr int kEngineOrderBlame = 2 * kUnitCount;
constexpr int kProgramStartBlame = kEngineOrderBlame + 1;
constexpr int kBlameKinds = kProgramStartBlame + 1;

std::string blame_name(int blame) {
  if (blame < kUnitCount) return unit_name(blame);
  if (blame < kEngineOrderBlame) return "port:" + unit_name(blame - kPortBlame);
  return blame == kEngineOrderBlame ? "engine_order" : "program_start";
}

// What a wait waited on, "dma_copy -> rhs_tiles" (the opcode and its target buffer's name
// without a pool's "[k]"), as a number: the opcode and the base name's index (kNone: no target).
// The label is made a string once per distinct key, not once per wait.
class WaitLabels {
 public:
  explicit WaitLabels(const Program& p) : p_(p), base_of_buffer_(p.buffers.size(), kNone) {}

  uint64_t key(uint32_t i) {
    const Instruction& instr = p_.instructions[i];
    uint32_t target = kNone;
    if (instr.operands[kDst].valid())
      target = instr.operands[kDst].tile;
    else if (instr.dma != kNone && p_.dmas[instr.dma].hbm.tensor != kNone)
      target = p_.dmas[instr.dma].hbm.tensor;
    const uint32_t base = target == kNone ? kNone : base_id(target);
    return (uint64_t(base) << 8) | uint64_t(instr.opcode);
  }

  std::string label(uint64_t key) const {
    const uint32_t base = uint32_t(key >> 8);
    return std::string(opcode_name(static_cast<Opcode>(key & 0xff))) + " -> " +
           (base == kNone ? std::string() : base_names_[base]);
  }

 private:
  uint32_t base_id(uint32_t buffer) {
    if (base_of_buffer_[buffer] == kNone) {
      const std::string base = base_name(p_.buffers[buffer].name);
      const auto [it, added] = ids_.emplace(base, uint32_t(base_names_.size()));
      if (added) base_names_.push_back(base);
      base_of_buffer_[buffer] = it->second;
    }
    return base_of_buffer_[buffer];
  }

  const Program& p_;
  std::vector<uint32_t> base_of_buffer_;
  std::map<std::string, uint32_t> ids_;
  std::vector<std::string> base_names_;
};

}  // namespace

std::vector<double> idle_before(const Program& p, const TimingResult& t) {
  std::vector<double> gaps(p.instructions.size(), 0.0);
  std::array<double, kEngineCount> last_end{};
  for (uint32_t i = 0; i < p.instructions.size(); ++i) {
    const int e = static_cast<int>(p.instructions[i].engine);
    const double gap = t.instructions[i].start_ns - last_end[e];
    if (gap > 1e-9) gaps[i] = gap;
    last_end[e] = t.instructions[i].issue_end_ns;
  }
  return gaps;
}

std::array<EngineIdleTime, kEngineCount> attribute_idle_time(const Program& p,
                                                             const TimingResult& t) {
  // Sums per key in instruction order (as the string-keyed maps they become summed them), turned
  // into the name-ordered maps only once at the end, so that the sort below sees the same input.
  struct Sum {
    double idle_ns = 0;
    uint64_t waits = 0;
  };
  std::array<std::array<Sum, kBlameKinds>, kEngineCount> blame{};
  std::array<std::array<bool, kBlameKinds>, kEngineCount> blamed{};
  std::array<std::map<uint64_t, Sum>, kEngineCount> top;
  WaitLabels labels(p);
  const std::vector<double> gaps = idle_before(p, t);
  std::array<double, kEngineCount> last_end{};
  std::array<bool, kEngineCount> started{};
  for (uint32_t i = 0; i < p.instructions.size(); ++i) {
    const Instruction& instr = p.instructions[i];
    const InstructionTiming& it = t.instructions[i];
    const int e = static_cast<int>(instr.engine);
    const double gap = gaps[i];
    if (gap > 0) {
      int kind;
      if (it.wait_on != kNone) {
        kind = (it.wait_reason == WaitReason::port ? kPortBlame : 0) + unit_index(p, it.wait_on);
        Sum& w = top[e][labels.key(it.wait_on)];
        w.idle_ns += gap;
        ++w.waits;
      } else {
        kind = started[e] ? kEngineOrderBlame : kProgramStartBlame;
      }
      blame[e][kind].idle_ns += gap;
      ++blame[e][kind].waits;
      blamed[e][kind] = true;
    }
    last_end[e] = it.issue_end_ns;
    started[e] = true;
  }
  std::array<EngineIdleTime, kEngineCount> out;
  for (int e = 0; e < kEngineCount; ++e) {
    std::map<std::string, BlameEntry> by_name;
    for (int kind = 0; kind < kBlameKinds; ++kind)
      if (blamed[e][kind]) {
        const std::string name = blame_name(kind);
        by_name[name] = BlameEntry{name, blame[e][kind].idle_ns, blame[e][kind].waits};
      }
    const double tail = t.total_ns - last_end[e];
    if (tail > 1e-9) {
      auto& entry = by_name["program_end"];
      entry.waited_on = "program_end";
      entry.idle_ns += tail;
      ++entry.waits;
    }
    std::map<std::string, TopWait> top_by_name;
    for (const auto& [key, sum] : top[e]) {
      const std::string label = labels.label(key);
      top_by_name[label] = TopWait{label, sum.idle_ns, sum.waits};
    }
    EngineIdleTime& idle = out[e];
    for (auto& [key, entry] : by_name) idle.blame.push_back(entry);
    std::sort(idle.blame.begin(), idle.blame.end(),
              [](const BlameEntry& a, const BlameEntry& b) { return a.idle_ns > b.idle_ns; });
    for (auto& [key, w] : top_by_name) idle.top_waits.push_back(w);
    std::sort(idle.top_waits.begin(), idle.top_waits.end(),
              [](const TopWait& a, const TopWait& b) { return a.idle_ns > b.idle_ns; });
    if (idle.top_waits.size() > 5) idle.top_waits.resize(5);
  }
  return out;
}

std::vector<Metric> flat_metrics(const Report& r) {
  std::vector<Metric> m;
  auto add = [&m](std::string name, const char* unit, double value) {
    m.push_back({std::move(name), unit, value});
  };
  add("total_time_ns", "ns", r.total_time_ns);
  add("total_time_us", "us", r.total_time_ns / 1e3);
  add("total_time_cycles", "cycles", r.total_time_cycles);
  add("instruction_count", "count", double(r.instruction_count));
  for (int e = 0; e < kEngineCount; ++e) {
    const std::string name(engine_name(static_cast<Engine>(e)));
    const EngineSummary* found = nullptr;
    for (const auto& engine : r.engines)
      if (engine.name == name) found = &engine;
    add(name + "_instruction_count", "count", found ? double(found->instruction_count) : 0.0);
    add(name + "_active_time_ns", "ns", found ? found->active_time_ns : 0.0);
    add(name + "_active_time_percent", "percent", found ? found->active_time_percent : 0.0);
    add(name + "_idle_time_ns", "ns", found ? found->idle_time_ns : r.total_time_ns);
  }
  add("dma_active_time_ns", "ns", r.dma_active_time_ns);
  add("dma_active_time_percent", "percent", r.dma_active_time_percent);
  add("dma_transfer_count", "count", double(r.dma_transfer_count));
  add("dma_transfer_total_bytes", "bytes", double(r.dma_transfer_total_bytes));
  add("dma_transfer_average_bytes", "bytes", r.dma_transfer_average_bytes);
  add("dma_achieved_gbps", "GB/s", r.dma_achieved_gbps);
  add("dma_peak_gbps", "GB/s", r.dma_peak_gbps);
  add("dma_utilization_percent", "percent", r.dma_utilization_percent);
  add("hbm_read_bytes", "bytes", double(r.hbm_read_bytes));
  add("hbm_write_bytes", "bytes", double(r.hbm_write_bytes));
  add("hbm_peak_gbps", "GB/s", r.hbm_peak_gbps);
  add("mbu_estimated_percent", "percent", r.mbu_estimated_percent);
  for (Opcode kind : {Opcode::dma_copy, Opcode::dma_gather, Opcode::dma_transpose}) {
    const std::string name(opcode_name(kind));
    const DmaKindSummary* found = nullptr;
    for (const auto& k : r.dma_by_kind)
      if (k.kind == name) found = &k;
    add(name + "_transfers", "count", found ? double(found->transfers) : 0.0);
    add(name + "_bytes", "bytes", found ? double(found->bytes) : 0.0);
    add(name + "_average_bytes_per_partition", "bytes",
        found ? found->average_bytes_per_partition : 0.0);
    add(name + "_active_time_ns", "ns", found ? found->active_time_ns : 0.0);
    add(name + "_achieved_gbps", "GB/s", found ? found->achieved_gbps : 0.0);
    add(name + "_utilization_percent", "percent", found ? found->utilization_percent : 0.0);
    add(name + "_engines_used", "count", found ? double(found->engines_used) : 0.0);
  }
  add("hardware_flops", "flops", r.hardware_flops);
  add("transpose_flops", "flops", r.transpose_flops);
  add("peak_flops_per_s", "flops/s", r.peak_flops_per_s);
  add("hfu_percent", "percent", r.hfu_percent);
  add("mfu_percent", "percent", r.mfu_percent);
  add("peak_sbuf_bytes_per_partition", "bytes", double(r.peak_sbuf_bytes_per_partition));
  add("sbuf_bytes_per_partition", "bytes", double(r.sbuf_bytes_per_partition));
  add("peak_sbuf_percent", "percent",
      percent(double(r.peak_sbuf_bytes_per_partition), double(r.sbuf_bytes_per_partition)));
  add("peak_psum_bytes_per_partition", "bytes", double(r.peak_psum_bytes_per_partition));
  add("psum_bytes_per_partition", "bytes", double(r.psum_bytes_per_partition));
  add("peak_psum_percent", "percent",
      percent(double(r.peak_psum_bytes_per_partition), double(r.psum_bytes_per_partition)));
  add("dependency_region_merges", "count", double(r.dependency_region_merges));
  add("dependency_records_merged", "count", double(r.dependency_records_merged));
  add("critical_path_instructions", "count", double(r.critical_path_instructions));
  std::vector<std::string> units;
  for (int e = 0; e < kEngineCount; ++e) units.emplace_back(engine_name(static_cast<Engine>(e)));
  units.emplace_back("dma");
  for (const std::string& unit : units) {
    const auto it = r.critical_path_ns_by_unit.find(unit);
    add("critical_path_" + unit + "_ns", "ns",
        it == r.critical_path_ns_by_unit.end() ? 0.0 : it->second);
  }
  return m;
}

}  // namespace tilelab::sim
