// DMA engine mapping, piece cost, split and scheduler state.
#include "dma.hpp"

#include <algorithm>

namespace tilelab::sim {

int default_dma_queue(Engine trigger) {
  switch (trigger) {
    case Engine::sync:
      return 0;
    case Engine::scalar:
      return 1;
    case Engine::gpsimd:
      return 2;
    case Engine::vector:
      return 3;
    case Engine::tensor:
      return 4;
  }
  return 0;
}

DmaEngineSpan dma_engine_span(const Machine& m, uint32_t partition_start, uint32_t partitions) {
  const uint32_t per_engine = static_cast<uint32_t>(m.dma_partitions_per_engine);
  const uint32_t last = partition_start + partitions;  // exclusive
  const uint32_t first_engine = partition_start / per_engine;
  uint32_t end_engine = first_engine;
  while (end_engine * per_engine < last && end_engine < uint32_t(m.dma_engines)) ++end_engine;
  return DmaEngineSpan{static_cast<int>(first_engine), static_cast<int>(end_engine)};
}

double dma_efficiency_factor(const Machine& m, const DmaRecord& dma) {
  double efficiency =
      m.dma_efficiency(static_cast<double>(std::max<uint64_t>(dma.bytes_per_partition, 1)));
  if (dma.transpose)
    efficiency *= dma.hbm.tensor != kNone ? m.dma_transpose_efficiency_hbm_to_sbuf
                                          : m.dma_transpose_efficiency_sbuf_to_sbuf;
  return efficiency;
}

DmaPieceCost dma_piece_cost(const Machine& m, const DmaRecord& dma) {
  const uint64_t run_bytes =
      std::clamp<uint64_t>(dma.run_bytes, 1, std::max<uint64_t>(dma.bytes_per_partition, 1));
  return DmaPieceCost{m.dma_fixed_cost_ns_per_piece,
                      m.dma_bytes_per_ns_per_engine * dma_efficiency_factor(m, dma), run_bytes,
                      m.dma_descriptor_ns};
}

double dma_piece_ns(const Machine& m, const DmaRecord& dma, uint64_t bytes) {
  return dma_piece_cost(m, dma).ns(bytes);
}

int split_dma(const Machine& m, const DmaRecord& dma, DmaPiece* out) {
  return split_dma(m, dma, dma_piece_cost(m, dma), out);
}

int split_dma(const Machine& m, const DmaRecord& dma, const DmaPieceCost& cost, DmaPiece* out) {
  const uint32_t per_engine = static_cast<uint32_t>(m.dma_partitions_per_engine);
  const uint32_t first = dma.partition_start;
  const uint32_t last = dma.partition_start + dma.partitions;  // exclusive
  const DmaEngineSpan span = dma_engine_span(m, dma.partition_start, dma.partitions);
  int count = 0;
  // Pieces mostly have one size (whole engines' partitions): each size is costed once.
  DmaPiece costed{0, UINT64_MAX, 0, 0};
  for (uint32_t e = uint32_t(span.first); e < uint32_t(span.end); ++e) {
    const uint32_t lo = std::max(first, e * per_engine);
    const uint32_t hi = std::min(last, (e + 1) * per_engine);
    const uint64_t bytes = uint64_t(hi - lo) * dma.bytes_per_partition;
    if (bytes != costed.bytes) {
      costed.bytes = bytes;
      costed.duration_ns = cost.ns(bytes);
      costed.hbm_ns = static_cast<double>(bytes) / m.hbm_bytes_per_ns;
    }
    costed.engine = static_cast<int>(e);
    out[count++] = costed;
  }
  return count;
}

const DmaPieceCost& DmaScheduler::cost_of(const DmaRecord& dma) {
  const CostKey key{dma.bytes_per_partition, dma.run_bytes, dma.transpose, dma.hbm.tensor != kNone};
  if (!(key == cost_key_)) {
    cost_key_ = key;
    cost_ = dma_piece_cost(machine_, dma);
  }
  return cost_;
}

DmaScheduler::DmaScheduler(const Machine& machine)
    : machine_(machine),
      free_at_(machine.dma_engines, 0.0),
      owner_(machine.dma_engines, kNone),
      busy_ns_(machine.dma_engines, 0.0),
      bytes_(machine.dma_engines, 0),
      pieces_(machine.dma_engines, 0),
      scratch_(machine.dma_engines) {}

}  // namespace tilelab::sim
