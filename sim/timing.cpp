// Timing engine: list scheduling in program order with region-based dependency tracking.
#include "timing.hpp"

#include <algorithm>
#include <limits>

#include <tilelab/error.hpp>

#include "cost.hpp"
#include "dma/dma.hpp"
#include "host_pages.hpp"

namespace tilelab::sim {
namespace {

// Queue index of the DMA "engine" when it is the producer of a region: any consumer pays a
// semaphore wait.
constexpr uint8_t kDmaSource = kEngineCount;

// Earlier than any completion time.
constexpr double kNever = -std::numeric_limits<double>::infinity();

struct Region {
  uint32_t buffer;
  uint32_t p0, p1;
  uint64_t b0, b1;
  bool write;
};

struct AccessRecord {
  uint32_t p0, p1;
  uint64_t b0, b1;
  double done_ns;
  uint32_t instruction;
  uint8_t source;
  bool write;
};

bool overlaps(const AccessRecord& r, const Region& g) {
  return r.p0 < g.p1 && g.p0 < r.p1 && r.b0 < g.b1 && g.b0 < r.b1;
}
// Whether g holds all of `box` (a record, or a buffer's extent: anything with p0, p1, b0, b1).
template <typename Box>
bool covers(const Region& g, const Box& box) {
  return g.p0 <= box.p0 && box.p1 <= g.p1 && g.b0 <= box.b0 && box.b1 <= g.b1;
}

// Who accessed a region and when it completes.
struct Stamp {
  double done_ns;
  uint32_t instruction;
  uint8_t source;
};

// Sets r to the access of g stamped `stamp`, field by field: a record assembled on the stack and
// copied whole would stall on store forwarding (its wide loads span the narrow stores that built
// it), which measured as a large part of the simulator's time.
void assign(AccessRecord& r, const Region& g, Stamp stamp) {
  r.p0 = g.p0;
  r.p1 = g.p1;
  r.b0 = g.b0;
  r.b1 = g.b1;
  r.done_ns = stamp.done_ns;
  r.instruction = stamp.instruction;
  r.source = stamp.source;
  r.write = g.write;
}

// What the engine reads of a buffer per operand, kept apart from Buffer (names, shapes) so that
// the per-instruction lookups stay in a few cache lines.
struct BufferFacts {
  uint8_t element_size;
  Memory memory;
};

std::vector<BufferFacts> buffer_facts(const Program& p) {
  std::vector<BufferFacts> facts;
  facts.reserve(p.buffers.size());
  for (const Buffer& b : p.buffers)
    facts.push_back({static_cast<uint8_t>(dtype_size(b.dtype)), b.memory});
  return facts;
}

Region tile_region(const std::vector<BufferFacts>& facts, const TileRef& ref, bool write) {
  const int size = facts[ref.tile].element_size;
  const uint64_t last = ref.last_free_element();
  return Region{ref.tile,
                ref.partition_start,
                uint32_t(ref.partition_start) + ref.partition_count,
                uint64_t(ref.free_offset) * size,
                (last + 1) * size,
                write};
}

Region hbm_region(const std::vector<BufferFacts>& facts, const HbmPattern& h, bool write) {
  const int size = facts[h.tensor].element_size;
  int64_t last = h.offset + int64_t(h.partitions - 1) * h.partition_stride;
  for (int d = 0; d < h.rank; ++d) last += (h.counts[d] - 1) * h.strides[d];
  return Region{h.tensor, 0, 1, uint64_t(h.offset) * size, uint64_t(last + 1) * size, write};
}

// Collects the regions an instruction reads and writes; returns the count.
int collect_regions(const Program& p, const std::vector<BufferFacts>& facts,
                    const Instruction& instr, Region* out) {
  int n = 0;
  const OpcodeInfo& info = opcode_info(instr.opcode);
  for (int s = 0; s < kSlotCount; ++s) {
    const TileRef& ref = instr.operands[s];
    if (!ref.valid()) continue;
    out[n++] = tile_region(facts, ref, writes(info.operands[s]));
  }
  if (instr.dma != kNone) {
    const DmaRecord& d = p.dmas[instr.dma];
    if (d.hbm.tensor != kNone) out[n++] = hbm_region(facts, d.hbm, d.hbm_is_destination);
  }
  return n;
}

// Per-buffer access history. Reads and writes are kept apart (a read only conflicts with writes)
// and sorted by start byte, so that an overlap query only visits records near the region.
class Tracker {
 public:
  explicit Tracker(const Program& program) : program_(program), state_(program.buffers.size()) {}

  // Latest time the region's earlier conflicting accesses allow it to start, seen from `engine`
  // (same-engine producers need no semaphore). Raises `bound` and sets `by` when later.
  void constrain(const Region& g, uint8_t engine, double semaphore_ns, double& bound,
                 uint32_t& by) {
    BufferState& state = state_[g.buffer];
    if (!state.touched) constrain_predecessors(g.buffer, engine, semaphore_ns, bound, by, 0);
    // A list whose latest completion (plus the semaphore) cannot raise the bound is not scanned:
    // most regions were last accessed long before their engine is free again.
    if (state.latest_write_done + semaphore_ns > bound)
      scan(state.writes, state.max_write_span, g, engine, semaphore_ns, bound, by);
    if (g.write && state.latest_read_done + semaphore_ns > bound)
      scan(state.reads, state.max_read_span, g, engine, semaphore_ns, bound, by);
  }

  void record(const Region& g, uint32_t instruction, uint8_t source, double done_ns) {
    BufferState& state = state_[g.buffer];
    state.touched = true;
    const Stamp stamp{done_ns, instruction, source};
    if (g.write && covers(g, state.extent)) {
      // The common whole-tile (or whole-extent) write: it supersedes every record, which is what
      // the general path below would find one record at a time.
      state.reads.clear();
      state.writes.clear();
      assign(state.writes.emplace_back(), g, stamp);
      state.max_write_span = std::max(state.max_write_span, g.b1 - g.b0);
      state.latest_write_done = done_ns;
      state.latest_read_done = kNever;
      state.extent = Extent{g.p0, g.p1, g.b0, g.b1};
    } else {
      state.extent.p0 = std::min(state.extent.p0, g.p0);
      state.extent.p1 = std::max(state.extent.p1, g.p1);
      state.extent.b0 = std::min(state.extent.b0, g.b0);
      state.extent.b1 = std::max(state.extent.b1, g.b1);
      if (g.write) {
        // A write supersedes every earlier access it fully covers.
        erase_covered(state.reads, g);
        replace_covered(state.writes, state.max_write_span, g, stamp);
        state.latest_write_done = std::max(state.latest_write_done, done_ns);
      } else {
        insert(state.reads, state.max_read_span, g, stamp);
        state.latest_read_done = std::max(state.latest_read_done, done_ns);
      }
    }
    if (done_ns >= state.last_done) {
      state.last_done = done_ns;
      state.last_instruction = instruction;
    }
  }

  uint64_t merges() const { return merges_; }
  uint64_t merged_records() const { return merged_records_; }

 private:
  struct Extent {
    uint32_t p0 = UINT32_MAX, p1 = 0;
    uint64_t b0 = UINT64_MAX, b1 = 0;
  };
  // What one buffer's accesses left behind. `extent` holds every record's region (a superset
  // once records are erased one by one; empty when there are none).
  struct BufferState {
    std::vector<AccessRecord> writes, reads;  // sorted by b0
    uint64_t max_write_span = 0, max_read_span = 0;
    // At least the latest completion among each list's records (kNever when empty).
    double latest_write_done = kNever, latest_read_done = kNever;
    Extent extent;
    double last_done = -1.0;
    uint32_t last_instruction = kNone;
    bool touched = false;
  };

  // The first record with b0 >= v. Lists hold a few records (3.6 on average in the default paged
  // batch), where a linear walk beats a binary search's unpredictable branches.
  static std::vector<AccessRecord>::iterator first_at_or_after(std::vector<AccessRecord>& list,
                                                               uint64_t v) {
    if (list.size() > 16)
      return std::lower_bound(list.begin(), list.end(), v,
                              [](const AccessRecord& r, uint64_t x) { return r.b0 < x; });
    auto it = list.begin();
    while (it != list.end() && it->b0 < v) ++it;
    return it;
  }

  static auto first_candidate(std::vector<AccessRecord>& list, uint64_t b0, uint64_t max_span) {
    // Records starting at or before b0 - max_span end at or before b0: they cannot overlap.
    const uint64_t from = b0 >= max_span ? b0 - max_span + 1 : 0;
    return first_at_or_after(list, from);
  }

  // Raises `bound` to the latest completion among the records that overlap g, in list order (the
  // first of equal times wins). One pass: records before g that cannot reach it fail the overlap
  // test, and the list is sorted by b0, so it stops at g's end.
  static void scan(std::vector<AccessRecord>& list, uint64_t max_span, const Region& g,
                   uint8_t engine, double semaphore_ns, double& bound, uint32_t& by) {
    if (list.empty()) return;
    const AccessRecord* r = list.data();
    const AccessRecord* const end = r + list.size();
    if (list.size() > 16) r = &*first_candidate(list, g.b0, max_span);
    for (; r != end && r->b0 < g.b1; ++r) {
      if (!overlaps(*r, g)) continue;
      const double t = r->done_ns + (r->source == engine ? 0.0 : semaphore_ns);
      if (t > bound) {
        bound = t;
        by = r->instruction;
      }
    }
  }

  static void erase_covered(std::vector<AccessRecord>& list, const Region& g) {
    if (list.empty()) return;
    const auto first = first_at_or_after(list, g.b0);
    auto kept = first, it = first;
    for (; it != list.end() && it->b0 < g.b1; ++it)
      if (!covers(g, *it)) *kept++ = *it;
    if (kept != it) list.erase(kept, it);
  }

  // erase_covered(list, g) then insert(list, max_span, g, stamp), in one pass: the records g
  // covers include any of g's own, and g's lands where the first of them was (the first record at
  // or after g.b0), ahead of the records of the range that stay.
  void replace_covered(std::vector<AccessRecord>& list, uint64_t& max_span, const Region& g,
                       Stamp stamp) {
    max_span = std::max(max_span, g.b1 - g.b0);
    if (list.empty() || list.back().b0 < g.b0) {  // nothing at or after g.b0 to cover
      assign(list.emplace_back(), g, stamp);
      if (list.size() > kMaxAccessRecords) compact(list, max_span);
      return;
    }
    const auto first = first_at_or_after(list, g.b0);
    auto last = first;
    while (last != list.end() && last->b0 < g.b1) ++last;
    const auto kept_end =
        std::remove_if(first, last, [&](const AccessRecord& r) { return covers(g, r); });
    if (kept_end == last) {
      assign(*list.emplace(first), g, stamp);
    } else {
      std::move_backward(first, kept_end, kept_end + 1);
      assign(*first, g, stamp);
      list.erase(kept_end + 1, last);
    }
    if (list.size() > kMaxAccessRecords) compact(list, max_span);
  }

  void insert(std::vector<AccessRecord>& list, uint64_t& max_span, const Region& g, Stamp stamp) {
    if (list.empty() || list.back().b0 < g.b0) {  // past every record: nothing to merge with
      assign(list.emplace_back(), g, stamp);
      max_span = std::max(max_span, g.b1 - g.b0);
      if (list.size() > kMaxAccessRecords) compact(list, max_span);
      return;
    }
    auto it = first_at_or_after(list, g.b0);
    // Same region accessed again: keep one record with the later completion.
    for (auto same = it; same != list.end() && same->b0 == g.b0; ++same) {
      if (same->b1 == g.b1 && same->p0 == g.p0 && same->p1 == g.p1) {
        if (stamp.done_ns >= same->done_ns) assign(*same, g, stamp);
        return;
      }
    }
    assign(*list.emplace(it), g, stamp);
    max_span = std::max(max_span, g.b1 - g.b0);
    if (list.size() > kMaxAccessRecords) compact(list, max_span);
  }

  // Too many distinct regions: merge them into one conservative record over their union.
  void compact(std::vector<AccessRecord>& list, uint64_t& max_span) {
    ++merges_;
    merged_records_ += list.size();
    AccessRecord merged = list.front();
    for (const AccessRecord& r : list) {
      merged.p0 = std::min(merged.p0, r.p0);
      merged.p1 = std::max(merged.p1, r.p1);
      merged.b0 = std::min(merged.b0, r.b0);
      merged.b1 = std::max(merged.b1, r.b1);
      if (r.done_ns >= merged.done_ns) {
        merged.done_ns = r.done_ns;
        merged.instruction = r.instruction;
        merged.source = r.source;
      }
    }
    list.assign(1, merged);
    max_span = merged.b1 - merged.b0;
  }

  // First access of a tile that reuses freed memory: wait for the freed tiles' last accesses.
  void constrain_predecessors(uint32_t buffer, uint8_t engine, double semaphore_ns, double& bound,
                              uint32_t& by, int depth) {
    if (depth > 4) return;
    for (uint32_t pred : program_.buffers[buffer].predecessors) {
      const BufferState& state = state_[pred];
      if (!state.touched) {
        constrain_predecessors(pred, engine, semaphore_ns, bound, by, depth + 1);
        continue;
      }
      const double t = state.last_done + semaphore_ns;
      if (t > bound) {
        bound = t;
        by = state.last_instruction;
      }
    }
  }

  const Program& program_;
  uint64_t merges_ = 0;
  uint64_t merged_records_ = 0;
  std::vector<BufferState> state_;
};

// Shared ports on NC-v2: VectorE/GpSimd share the SBUF port, VectorE/ScalarE the PSUM port.
struct Port {
  double free_ns = 0;
  uint32_t holder = kNone;
  Engine holder_engine = Engine::sync;
};

}  // namespace

TimingResult simulate_timing(const Program& program, const TimingOptions& options) {
  return simulate_timing(program, program.machine, options);
}

TimingResult simulate_timing(const Program& program, const Machine& m,
                             const TimingOptions& options) {
  if (&m != &program.machine) require_same_build_limits(program.machine, m);
  const auto& instructions = program.instructions;
  TimingResult result;
  result.machine = m;
  // Each instruction's timing is constructed where it is filled in: a resize up front would
  // write the whole array once more (about 5% of the timing, Zen 3). Huge pages, as for the
  // program's instructions (ProgramBuilder): a first simulation faults in fewer pages.
  reserve_on_huge_pages(result.instructions, instructions.size());

  std::array<double, kEngineCount> ready{};
  std::array<uint32_t, kEngineCount> last_on_engine;
  last_on_engine.fill(kNone);
  std::array<double, kEngineCount> ns_per_cycle{};
  std::array<double, kEngineCount> semaphore_ns{};
  for (int e = 0; e < kEngineCount; ++e) {
    ns_per_cycle[e] = 1.0 / engine_clock_ghz(m, static_cast<Engine>(e));
    semaphore_ns[e] = m.semaphore_wait_cycles * ns_per_cycle[e];
  }
  Tracker tracker(program);
  const std::vector<BufferFacts> facts = buffer_facts(program);
  DmaScheduler dma(m);
  Port sbuf_port, psum_port;
  Region regions[kSlotCount + 1];

  for (uint32_t i = 0; i < instructions.size(); ++i) {
    const Instruction& instr = instructions[i];
    const int e = static_cast<int>(instr.engine);
    InstructionTiming& t = result.instructions.emplace_back();
    t.engine_previous = last_on_engine[e];

    const int region_count = collect_regions(program, facts, instr, regions);
    double bound = ready[e];
    uint32_t by = kNone;
    WaitReason reason = WaitReason::none;
    for (int r = 0; r < region_count; ++r)
      tracker.constrain(regions[r], static_cast<uint8_t>(e), semaphore_ns[e], bound, by);
    if (by != kNone) reason = WaitReason::dependency;

    // Port conflicts (NC-v2): only against the other engine sharing the port.
    bool uses_sbuf = false, uses_psum = false;
    const bool may_share_port =
        (m.vector_gpsimd_share_sbuf_port &&
         (instr.engine == Engine::vector || instr.engine == Engine::gpsimd)) ||
        (m.vector_scalar_share_psum_port &&
         (instr.engine == Engine::vector || instr.engine == Engine::scalar));
    if (instr.dma == kNone && may_share_port) {
      for (int r = 0; r < region_count; ++r) {  // without a DMA, one region per tile operand
        const Memory mem = facts[regions[r].buffer].memory;
        uses_sbuf |= mem == Memory::sbuf;
        uses_psum |= mem == Memory::psum;
      }
    }
    const bool sbuf_port_user = m.vector_gpsimd_share_sbuf_port && uses_sbuf &&
                                (instr.engine == Engine::vector || instr.engine == Engine::gpsimd);
    const bool psum_port_user = m.vector_scalar_share_psum_port && uses_psum &&
                                (instr.engine == Engine::vector || instr.engine == Engine::scalar);
    if (sbuf_port_user && sbuf_port.holder_engine != instr.engine && sbuf_port.free_ns > bound) {
      bound = sbuf_port.free_ns;
      by = sbuf_port.holder;
      reason = WaitReason::port;
    }
    if (psum_port_user && psum_port.holder_engine != instr.engine && psum_port.free_ns > bound) {
      bound = psum_port.free_ns;
      by = psum_port.holder;
      reason = WaitReason::port;
    }

    const double start = bound;
    const double engine_ns = instruction_cycles(program, m, instr) * ns_per_cycle[e];
    const double issue_end = start + engine_ns;
    double done = issue_end;
    t.start_ns = start;
    t.issue_end_ns = issue_end;
    t.wait_on = by;
    t.wait_reason = reason;
    ready[e] = issue_end;
    last_on_engine[e] = i;
    result.engine_active_ns[e] += engine_ns;
    ++result.engine_instructions[e];
    if (sbuf_port_user) sbuf_port = Port{issue_end, i, instr.engine};
    if (psum_port_user) psum_port = Port{issue_end, i, instr.engine};

    uint8_t source = static_cast<uint8_t>(e);
    if (instr.dma != kNone) {
      const DmaRecord& d = program.dmas[instr.dma];
      const double data_ready = issue_end + m.dma_start_latency_ns;
      const DmaSchedule s =
          options.record_dma_pieces
              ? dma.schedule(i, d, data_ready,
                             [&](int engine, uint64_t bytes, double ps, double pe) {
                               result.dma_pieces.push_back(
                                   DmaPieceTiming{i, uint16_t(engine), d.queue, bytes, ps, pe});
                             })
              : dma.schedule(i, d, data_ready, [](int, uint64_t, double, double) {});
      done = s.end_ns;
      t.transfer_start_ns = s.first_start_ns;
      t.transfer_wait_on = s.blocked_by;
      t.transfer_reason = s.hbm_bound             ? WaitReason::hbm
                          : s.blocked_by != kNone ? WaitReason::dma_engine
                                                  : WaitReason::dma_trigger;
      source = kDmaSource;
      if (d.hbm.tensor != kNone) {
        if (d.hbm_is_source) result.hbm_read_bytes += d.bytes();
        if (d.hbm_is_destination) result.hbm_write_bytes += d.bytes();
      }
    }
    t.end_ns = done;
    result.total_ns = std::max(result.total_ns, done);
    for (int r = 0; r < region_count; ++r) tracker.record(regions[r], i, source, done);
  }
  result.region_merges = tracker.merges();
  result.region_records_merged = tracker.merged_records();
  result.dma_engine_busy_ns = dma.engine_busy_ns();
  result.dma_engine_bytes = dma.engine_bytes();
  result.dma_engine_pieces = dma.engine_pieces();
  return result;
}

}  // namespace tilelab::sim
