// DMA split and scheduler state.
#include "dma.hpp"

#include <algorithm>

#include "cost.hpp"

namespace tilelab::sim {

int split_dma(const Machine& m, const DmaRecord& dma, DmaPiece* out) {
  const uint32_t per_engine = static_cast<uint32_t>(m.dma_partitions_per_engine);
  const uint32_t first = dma.partition_start;
  const uint32_t last = dma.partition_start + dma.partitions;  // exclusive
  // Every piece of a transfer has the same bytes per partition, hence the same efficiency.
  const double bytes_per_ns = m.dma_bytes_per_ns_per_engine * dma_efficiency_factor(m, dma);
  int count = 0;
  for (uint32_t e = first / per_engine; e * per_engine < last && e < uint32_t(m.dma_engines); ++e) {
    const uint32_t lo = std::max(first, e * per_engine);
    const uint32_t hi = std::min(last, (e + 1) * per_engine);
    const uint64_t bytes = uint64_t(hi - lo) * dma.bytes_per_partition;
    out[count++] = DmaPiece{static_cast<int>(e), bytes,
                            m.dma_fixed_cost_ns_per_piece + double(bytes) / bytes_per_ns};
  }
  return count;
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
