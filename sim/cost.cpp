// Cost formulas. Sources: nki.isa docstrings (I), NeuronCore-v2/v3 architecture guides (AR2/AR3).
#include "cost.hpp"

#include <algorithm>

namespace tilelab::sim {
namespace {

double max_ii(const Machine& m, double streaming_cycles) {
  return std::max(static_cast<double>(m.min_ii_cycles), streaming_cycles);
}

const Buffer& buffer(const Program& p, const TileRef& ref) {
  return p.buffers[ref.tile];
}

bool in_psum(const Program& p, const TileRef& ref) {
  return ref.valid() && buffer(p, ref).memory == Memory::psum;
}

// Innermost free stride above the threshold halves SBUF bandwidth (AR2); broadcast (stride 0) and
// PSUM operands are not penalised.
double stride_factor(const Program& p, const Machine& m, const Instruction& instr) {
  for (const TileRef& ref : instr.operands) {
    if (!ref.valid()) continue;
    const Buffer& b = buffer(p, ref);
    if (b.memory != Memory::sbuf || ref.free_count <= 1) continue;
    if (int64_t(ref.free_stride) * dtype_size(b.dtype) > m.stride_penalty_threshold_bytes)
      return m.stride_penalty_factor;
  }
  return 1.0;
}

// NC-v3 VectorE perf modes for copies and tensor_scalar (AR3): 4x for 16-bit SBUF->SBUF
// contiguous data, 2x for 16-bit data that is strided or has one side in PSUM.
double vector_16bit_speedup(const Program& p, const Machine& m, const TileRef& dst,
                            const TileRef& src) {
  if (!is_16bit_float(buffer(p, dst).dtype) || !is_16bit_float(buffer(p, src).dtype)) return 1.0;
  const bool sbuf_only = !in_psum(p, dst) && !in_psum(p, src);
  if (sbuf_only && dst.contiguous() && src.contiguous())
    return m.vector_16bit_copy_speedup_contiguous;
  return m.vector_16bit_copy_speedup_other;
}

}  // namespace

double engine_clock_ghz(const Machine& m, Engine engine) {
  switch (engine) {
    case Engine::tensor:
      return m.tensor_clock_ghz;
    case Engine::vector:
      return m.vector_clock_ghz;
    case Engine::scalar:
      return m.scalar_clock_ghz;
    case Engine::gpsimd:
      return m.gpsimd_clock_ghz;
    case Engine::sync:
      return m.sync_clock_ghz;
  }
  return 1.0;
}

double instruction_cycles(const Program& p, const Machine& m, const Instruction& instr) {
  const TileRef& dst = instr.operands[kDst];
  const TileRef& src0 = instr.operands[kSrc0];
  const TileRef& src1 = instr.operands[kSrc1];
  const double access_overhead =
      m.engine_access_overhead_applied ? m.engine_access_overhead_cycles : 0.0;
  switch (instr.opcode) {
    case Opcode::dma_copy:
    case Opcode::dma_transpose:
      return m.dma_trigger_cycles;
    case Opcode::dma_gather:
      // SWDGE: GpSimd writes one descriptor per gathered row (no published cost; see machine).
      return m.dma_trigger_cycles + m.swdge_descriptor_fixed_cycles +
             m.swdge_descriptor_cycles_per_partition * p.dmas[instr.dma].partitions;
    case Opcode::matmul: {
      // max(min(64, N_stationary), N_moving); x4 for fp32 inputs (I).
      const double n_stationary = src0.free_count;
      const double n_moving = src1.free_count;
      double cycles = std::max(
          std::min(static_cast<double>(m.matmul_stationary_floor_cycles), n_stationary), n_moving);
      if (buffer(p, src0).dtype == DType::fp32 || buffer(p, src1).dtype == DType::fp32)
        cycles *= m.matmul_fp32_cost_multiplier;
      return cycles;
    }
    case Opcode::pe_transpose: {
      // max(P, min(64, F)) (I).
      const double partitions = src0.partition_count;
      const double free = src0.free_count;
      return std::max(partitions,
                      std::min(static_cast<double>(m.transpose_free_floor_cycles), free));
    }
    case Opcode::activation: {
      // max(MIN_II, N); with a fused reduce, + MIN_II for ActReadAccumulator (I).
      double cycles = max_ii(m, src0.free_count * stride_factor(p, m, instr));
      if (instr.flags & kFlagReduce) cycles += m.activation_reduce_extra_cycles;
      return cycles + access_overhead;
    }
    case Opcode::tensor_tensor:
    case Opcode::select: {
      // max(MIN_II, N) with one input in PSUM and the other in SBUF, or all-bf16 add/mul/sub on
      // contiguous SBUF data; otherwise max(MIN_II, 2N) (I). select follows the same rule
      // (inferred). NC-v3: 2x for 16-bit inputs both in SBUF (AR3).
      const TileRef& a = instr.opcode == Opcode::select ? src1 : src0;
      const TileRef& b = instr.opcode == Opcode::select ? src0 : src1;
      const bool one_psum = in_psum(p, a) != in_psum(p, b);
      const auto op = static_cast<AluOp>(instr.op0);
      const bool bf16_fast = instr.opcode == Opcode::tensor_tensor && !in_psum(p, a) &&
                             !in_psum(p, b) && buffer(p, a).dtype == DType::bf16 &&
                             buffer(p, b).dtype == DType::bf16 &&
                             buffer(p, dst).dtype == DType::bf16 &&
                             (op == AluOp::add || op == AluOp::multiply || op == AluOp::subtract) &&
                             a.contiguous() && b.contiguous() && dst.contiguous();
      double streaming = (one_psum || bf16_fast) ? dst.free_count : 2.0 * dst.free_count;
      if (!in_psum(p, a) && !in_psum(p, b) && is_16bit_float(buffer(p, a).dtype) &&
          is_16bit_float(buffer(p, b).dtype))
        streaming /= m.vector_tensor_tensor_16bit_sbuf_speedup;
      return max_ii(m, streaming * stride_factor(p, m, instr)) + access_overhead;
    }
    case Opcode::tensor_tensor_scan:
      // max(MIN_II, 2N) (I, nki.isa.tensor_tensor_scan).
      return max_ii(m, 2.0 * dst.free_count * stride_factor(p, m, instr)) + access_overhead;
    case Opcode::tensor_scalar:
    case Opcode::tensor_copy: {
      // max(MIN_II, N) (I); NC-v3 VectorE perf modes (AR3).
      double streaming = dst.free_count;
      if (instr.engine == Engine::vector) streaming /= vector_16bit_speedup(p, m, dst, src0);
      return max_ii(m, streaming * stride_factor(p, m, instr)) + access_overhead;
    }
    case Opcode::tensor_reduce: {
      // N/2 when input and output are bf16 and the op is add or max, else N; MIN_II floor (I).
      const auto op = static_cast<AluOp>(instr.op0);
      const bool half = buffer(p, src0).dtype == DType::bf16 &&
                        buffer(p, dst).dtype == DType::bf16 &&
                        (op == AluOp::add || op == AluOp::max);
      const double streaming = half ? src0.free_count / 2.0 : src0.free_count;
      return max_ii(m, streaming * stride_factor(p, m, instr)) + access_overhead;
    }
    case Opcode::bn_stats:
      // max(MIN_II, N) (I, nki.isa.bn_stats).
      return max_ii(m, src0.free_count * stride_factor(p, m, instr)) + access_overhead;
    case Opcode::bn_aggr:
      // max(MIN_II, 13 * (N / 3)) (I, nki.isa.bn_aggr).
      return max_ii(m, 13.0 * (src0.free_count / 3) * stride_factor(p, m, instr)) + access_overhead;
    case Opcode::memset: {
      // max(MIN_II, N/2) for 0 in bf16/fp16, else max(MIN_II, N) (I).
      const bool half = instr.imm0 == 0.0f && is_16bit_float(buffer(p, dst).dtype);
      const double streaming = half ? dst.free_count / 2.0 : dst.free_count;
      return max_ii(m, streaming * stride_factor(p, m, instr)) + access_overhead;
    }
    case Opcode::iota:
      // 150 + N GpSimd cycles (I).
      return m.gpsimd_start_overhead_cycles + static_cast<double>(dst.free_count);
    case Opcode::count:
      break;
  }
  return 0;
}

double instruction_cycles(const Program& p, const Instruction& instr) {
  return instruction_cycles(p, p.machine, instr);
}

}  // namespace tilelab::sim
