// DMA model: a transfer is split by partition across the DMA engines (each serves a fixed group of
// partitions); each engine runs its pieces in FIFO order; HBM bandwidth is capped for all engines.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "sim/isa.hpp"
#include "sim/machine.hpp"
#include "sim/program.hpp"

namespace tilelab::sim {

// Queue a transfer triggered from `trigger` goes to when DmaOptions::queue is not given.
int default_dma_queue(Engine trigger);

// DMA engines serving partitions [partition_start, partition_start + partitions): engine e serves
// partitions [e * k, (e + 1) * k) with k = dma_partitions_per_engine.
struct DmaEngineSpan {
  int first = 0;
  int end = 0;  // exclusive
};
DmaEngineSpan dma_engine_span(const Machine& machine, uint32_t partition_start,
                              uint32_t partitions);

// Fraction of per-engine DMA bandwidth a transfer reaches: the efficiency curve at its bytes per
// partition (the curve measures transfers of that size), times the DMA-transpose factor.
double dma_efficiency_factor(const Machine& machine, const DmaRecord& dma);

// Cost of the pieces of one transfer: every piece has the same bytes per partition, hence the same
// efficiency, so the rate is computed once per transfer.
struct DmaPieceCost {
  double fixed_ns = 0;
  double bytes_per_ns = 0;  // per-engine bandwidth x efficiency
  uint64_t run_bytes = 1;   // contiguous bytes per descriptor
  double descriptor_ns = 0;

  // The engine is bound by its bandwidth (fixed cost + bytes / (bandwidth x efficiency)) and by
  // its descriptor rate (one contiguous run per descriptor_ns): element-strided transfers are
  // descriptor-bound.
  double ns(uint64_t bytes) const {
    const double streaming = fixed_ns + static_cast<double>(bytes) / bytes_per_ns;
    const double runs = static_cast<double>((bytes + run_bytes - 1) / run_bytes);
    return std::max(streaming, runs * descriptor_ns);
  }
};
DmaPieceCost dma_piece_cost(const Machine& machine, const DmaRecord& dma);

// Duration in ns of one DMA piece of `bytes` moved by one DMA engine for the given transfer.
double dma_piece_ns(const Machine& machine, const DmaRecord& dma, uint64_t bytes);

// One engine's share of a transfer.
struct DmaPiece {
  int engine = 0;
  uint64_t bytes = 0;
  double duration_ns = 0;
  double hbm_ns = 0;  // the time HBM takes to serve `bytes` at its peak rate
};

// Splits `dma` into per-engine pieces (one per engine of dma_engine_span), each costed by
// dma_piece_cost. Writes at most machine.dma_engines pieces into `out`.
int split_dma(const Machine& machine, const DmaRecord& dma, DmaPiece* out);
// The same with the transfer's cost already computed (dma_piece_cost(machine, dma)).
int split_dma(const Machine& machine, const DmaRecord& dma, const DmaPieceCost& cost,
              DmaPiece* out);

// Result of scheduling one transfer.
struct DmaSchedule {
  double first_start_ns = 0;
  double end_ns = 0;
  // The instruction that held the engine which delayed the last-finishing piece (kNone if the
  // transfer started as soon as its data could move).
  uint32_t blocked_by = kNone;
  bool hbm_bound = false;
};

// Per-engine FIFO state of the DMA engines and the shared HBM cursor.
class DmaScheduler {
 public:
  explicit DmaScheduler(const Machine& machine);

  // Schedules transfer `instruction` whose data may start moving at `ready_ns`. `on_piece` (if
  // not null) receives each piece with its times.
  template <typename OnPiece>
  DmaSchedule schedule(uint32_t instruction, const DmaRecord& dma, double ready_ns,
                       OnPiece&& on_piece);

  const std::vector<double>& engine_busy_ns() const { return busy_ns_; }
  const std::vector<uint64_t>& engine_bytes() const { return bytes_; }
  const std::vector<uint64_t>& engine_pieces() const { return pieces_; }

 private:
  const Machine& machine_;
  std::vector<double> free_at_;
  std::vector<uint32_t> owner_;
  std::vector<double> busy_ns_;
  std::vector<uint64_t> bytes_;
  std::vector<uint64_t> pieces_;
  double hbm_cursor_ = 0;
  std::vector<DmaPiece> scratch_;

  // dma_piece_cost of the last transfer, by what it depends on: consecutive transfers of a
  // program mostly share it, and it takes a logarithm.
  struct CostKey {
    uint64_t bytes_per_partition = UINT64_MAX;
    uint64_t run_bytes = 0;
    bool transpose = false;
    bool touches_hbm = false;
    bool operator==(const CostKey&) const = default;
  };
  const DmaPieceCost& cost_of(const DmaRecord& dma);
  CostKey cost_key_;
  DmaPieceCost cost_;
};

template <typename OnPiece>
DmaSchedule DmaScheduler::schedule(uint32_t instruction, const DmaRecord& dma, double ready_ns,
                                   OnPiece&& on_piece) {
  const int count = split_dma(machine_, dma, cost_of(dma), scratch_.data());
  const bool touches_hbm = dma.hbm.tensor != kNone;
  DmaSchedule result;
  result.first_start_ns = 1e300;
  for (int i = 0; i < count; ++i) {
    const DmaPiece& piece = scratch_[i];
    const int e = piece.engine;
    const double start = free_at_[e] > ready_ns ? free_at_[e] : ready_ns;
    double end = start + piece.duration_ns;
    bool hbm_bound = false;
    if (touches_hbm) {
      // Fluid HBM model: HBM serves bytes at its peak rate in arrival order.
      hbm_cursor_ = (hbm_cursor_ > start ? hbm_cursor_ : start) + piece.hbm_ns;
      if (hbm_cursor_ > end) {
        end = hbm_cursor_;
        hbm_bound = true;
      }
    }
    if (end > result.end_ns) {
      result.end_ns = end;
      result.blocked_by = free_at_[e] > ready_ns ? owner_[e] : kNone;
      result.hbm_bound = hbm_bound;
    }
    if (start < result.first_start_ns) result.first_start_ns = start;
    busy_ns_[e] += end - start;
    bytes_[e] += piece.bytes;
    ++pieces_[e];
    free_at_[e] = end;
    owner_[e] = instruction;
    on_piece(e, piece.bytes, start, end);
  }
  if (count == 0) result.first_start_ns = result.end_ns = ready_ns;
  return result;
}

}  // namespace tilelab::sim
