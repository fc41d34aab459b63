// Functional executor.
#include "functional.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include <sleef.h>
#include <tilelab/detail/bf16_rounding.hpp>
#include <tilelab/error.hpp>

namespace tilelab::sim {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float round_bf16(float value) {
  return std::bit_cast<float>(
      tilelab::detail::round_fp32_bits_to_bf16(std::bit_cast<uint32_t>(value)));
}

// Rounds to a binary format with `mantissa_bits` fraction bits, smallest normal exponent
// `min_exponent` and largest finite `max_finite` (subnormals included).
float round_binary(float value, int mantissa_bits, int min_exponent, float max_finite,
                   float overflow) {
  if (std::isnan(value) || std::isinf(value) || value == 0.0f) return value;
  const double magnitude = std::fabs(static_cast<double>(value));
  int exponent = 0;
  std::frexp(magnitude, &exponent);  // magnitude = m * 2^exponent, m in [0.5, 1)
  const int leading = std::max(exponent - 1, min_exponent);
  const double quantum = std::ldexp(1.0, leading - mantissa_bits);
  const double rounded = std::nearbyint(magnitude / quantum) * quantum;  // ties to even
  const double result = rounded > max_finite ? overflow : rounded;
  return static_cast<float>(value < 0 ? -result : result);
}

float alu(AluOp op, float a, float b) {
  switch (op) {
    case AluOp::bypass:
      return a;
    case AluOp::add:
      return a + b;
    case AluOp::subtract:
      return a - b;
    case AluOp::multiply:
      return a * b;
    case AluOp::divide:
      return a / b;
    // NaN propagates so that reads of uninitialised memory stay visible.
    case AluOp::max:
      return std::isnan(a) || std::isnan(b) ? kNaN : (a > b ? a : b);
    case AluOp::min:
      return std::isnan(a) || std::isnan(b) ? kNaN : (a < b ? a : b);
  }
  return a;
}

float activate(ActFunc func, float x) {
  switch (func) {
    case ActFunc::copy:
      return x;
    case ActFunc::exp:
      return Sleef_expf_u10(x);
    case ActFunc::log:
      return Sleef_logf_u10(x);
    case ActFunc::square:
      return x * x;
    case ActFunc::relu:
      return x > 0 ? x : 0.0f;
    case ActFunc::sigmoid:
      return 1.0f / (1.0f + Sleef_expf_u10(-x));
    case ActFunc::tanh:
      return Sleef_tanhf_u10(x);
    case ActFunc::reciprocal:
      return 1.0f / x;
    case ActFunc::sqrt:
      return std::sqrt(x);
    case ActFunc::rsqrt:
      return 1.0f / std::sqrt(x);
    case ActFunc::abs:
      return std::fabs(x);
  }
  return x;
}

}  // namespace

namespace {

// acc[m][n] += sum_k stationary[k][m] * moving[k][n], each element summed in ascending k with a
// rounding after every multiply and add (no fused multiply-add), so that results do not depend
// on the CPU. Four rows of m share each load of a moving row; AVX2 where the CPU has it.
[[gnu::target_clones("avx2", "default")]] void accumulate_product(const float* stationary,
                                                                  const float* moving, float* acc,
                                                                  uint32_t k_size, uint32_t m_size,
                                                                  uint32_t n_size) {
  // Blocks of four rows are independent: large products split them over OpenMP threads (the
  // sums, and so the results, are the same for any thread count).
  const int64_t blocks = m_size / 4;
  const bool parallel = uint64_t(k_size) * m_size * n_size >= (uint64_t(1) << 20);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t block = 0; block < blocks; ++block) {
    const uint32_t m = static_cast<uint32_t>(block) * 4;
    float* __restrict out0 = acc + size_t(m) * n_size;
    float* __restrict out1 = out0 + n_size;
    float* __restrict out2 = out1 + n_size;
    float* __restrict out3 = out2 + n_size;
    for (uint32_t k = 0; k < k_size; ++k) {
      const float* a = stationary + size_t(k) * m_size + m;
      const float a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
      const float* __restrict row = moving + size_t(k) * n_size;
      for (uint32_t n = 0; n < n_size; ++n) {
        out0[n] += a0 * row[n];
        out1[n] += a1 * row[n];
        out2[n] += a2 * row[n];
        out3[n] += a3 * row[n];
      }
    }
  }
  for (uint32_t m = static_cast<uint32_t>(blocks) * 4; m < m_size; ++m) {
    float* __restrict out = acc + size_t(m) * n_size;
    for (uint32_t k = 0; k < k_size; ++k) {
      const float a = stationary[size_t(k) * m_size + m];
      const float* __restrict row = moving + size_t(k) * n_size;
      for (uint32_t n = 0; n < n_size; ++n) out[n] += a * row[n];
    }
  }
}

}  // namespace

float round_to_dtype(float value, DType dtype) {
  switch (dtype) {
    case DType::fp32:
      return value;
    case DType::bf16:
      return round_bf16(value);
    case DType::fp16:
      return round_binary(value, 10, -14, 65504.0f, std::numeric_limits<float>::infinity());
    case DType::fp8_e4m3:
      return round_binary(value, 3, -6, 448.0f, kNaN);
    case DType::int32:
      return std::nearbyint(value);
    case DType::uint8:
      // Stored as float (exact for 0..255); saturates like a cast to an unsigned byte.
      return std::isnan(value) ? value : std::clamp(std::nearbyint(value), 0.0f, 255.0f);
  }
  return value;
}

FunctionalExecutor::FunctionalExecutor(const Program& program)
    : program_(program), floats_(program.buffers.size()), ints_(program.buffers.size()) {}

void FunctionalExecutor::ensure(uint32_t buffer) {
  const Buffer& b = program_.buffers[buffer];
  const size_t n = size_t(b.partitions) * b.free_elements;
  if (b.dtype == DType::int32) {
    // NaN's bit pattern: an uninitialised index shows up as an out-of-range row.
    if (ints_[buffer].size() != n) ints_[buffer].assign(n, 0x7FC00000);
  } else if (floats_[buffer].size() != n) {
    floats_[buffer].assign(n, kNaN);
  }
}

Tensor FunctionalExecutor::find(const std::string& name) const {
  for (uint32_t i = 0; i < program_.buffers.size(); ++i)
    if (program_.buffers[i].memory == Memory::hbm && program_.buffers[i].name == name)
      return Tensor{i};
  throw Error("tensor '" + name + "': no HBM tensor of that name in program '" + program_.name +
              "'");
}

void FunctionalExecutor::set_tensor(Tensor tensor, std::span<const float> values) {
  TILELAB_REQUIRE(tensor.id < program_.buffers.size() &&
                  program_.buffers[tensor.id].memory == Memory::hbm)
      << "set_tensor: not an HBM tensor (id " << tensor.id << ")";
  const Buffer& b = program_.buffers[tensor.id];
  TILELAB_REQUIRE(values.size() == b.free_elements)
      << "set_tensor '" << b.name << "': expected " << b.free_elements << " values, got "
      << values.size();
  ensure(tensor.id);
  for (size_t i = 0; i < values.size(); ++i) store(tensor.id, i, values[i]);
}

void FunctionalExecutor::set_tensor(const std::string& name, std::span<const float> values) {
  set_tensor(find(name), values);
}

std::vector<float> FunctionalExecutor::tensor(Tensor tensor) const {
  TILELAB_REQUIRE(tensor.id < program_.buffers.size() &&
                  program_.buffers[tensor.id].memory == Memory::hbm)
      << "tensor: not an HBM tensor (id " << tensor.id << ")";
  const Buffer& b = program_.buffers[tensor.id];
  std::vector<float> out(b.free_elements, kNaN);
  if (b.dtype == DType::int32) {
    for (size_t i = 0; i < ints_[tensor.id].size(); ++i) out[i] = float(ints_[tensor.id][i]);
  } else if (!floats_[tensor.id].empty()) {
    out = floats_[tensor.id];
  }
  return out;
}

std::vector<float> FunctionalExecutor::tensor(const std::string& name) const {
  return tensor(find(name));
}

std::vector<float> FunctionalExecutor::tile(Tile tile) const {
  TILELAB_REQUIRE(tile.id < program_.buffers.size()) << "tile: no tile with id " << tile.id;
  const Buffer& b = program_.buffers[tile.id];
  std::vector<float> out(size_t(b.partitions) * b.free_elements, kNaN);
  for (size_t i = 0; i < out.size(); ++i) {
    if (b.dtype == DType::int32 && !ints_[tile.id].empty()) out[i] = float(ints_[tile.id][i]);
    if (b.dtype != DType::int32 && !floats_[tile.id].empty()) out[i] = floats_[tile.id][i];
  }
  return out;
}

void FunctionalExecutor::store_int(uint32_t buffer, uint64_t index, float value) {
  // Out-of-range and NaN values saturate like a float->int conversion with clamping.
  const float r = std::isnan(value) ? 0.0f : std::nearbyint(value);
  ints_[buffer][index] = r >= 2147483647.0f    ? INT32_MAX
                         : r <= -2147483648.0f ? INT32_MIN
                                               : static_cast<int32_t>(r);
}

void FunctionalExecutor::read_row(const TileRef& ref, uint32_t p, float* out) const {
  const Buffer& b = program_.buffers[ref.tile];
  const uint64_t base = uint64_t(ref.partition_start + p) * b.free_elements;
  if (b.dtype == DType::int32) {
    const int32_t* row = ints_[ref.tile].data() + base;
    for (uint32_t j = 0; j < ref.free_count; ++j) out[j] = float(row[ref.free_element(j)]);
    return;
  }
  const float* row = floats_[ref.tile].data() + base;
  if (ref.contiguous()) {
    std::copy(row + ref.free_offset, row + ref.free_offset + ref.free_count, out);
    return;
  }
  for (uint32_t j = 0; j < ref.free_count; ++j) out[j] = row[ref.free_element(j)];
}

void FunctionalExecutor::write_row(const TileRef& ref, uint32_t p, const float* values) {
  const Buffer& b = program_.buffers[ref.tile];
  const uint64_t base = uint64_t(ref.partition_start + p) * b.free_elements;
  if (b.dtype == DType::int32) {
    for (uint32_t j = 0; j < ref.free_count; ++j)
      store_int(ref.tile, base + ref.free_element(j), values[j]);
    return;
  }
  float* row = floats_[ref.tile].data() + base;
  const bool contiguous = ref.contiguous();
  switch (b.dtype) {
    case DType::fp32:
      if (contiguous)
        std::copy(values, values + ref.free_count, row + ref.free_offset);
      else
        for (uint32_t j = 0; j < ref.free_count; ++j) row[ref.free_element(j)] = values[j];
      return;
    case DType::bf16:
      for (uint32_t j = 0; j < ref.free_count; ++j)
        row[contiguous ? ref.free_offset + j : ref.free_element(j)] = round_bf16(values[j]);
      return;
    default:
      for (uint32_t j = 0; j < ref.free_count; ++j)
        row[ref.free_element(j)] = round_to_dtype(values[j], b.dtype);
      return;
  }
}

void FunctionalExecutor::run() {
  run(0, program_.instructions.size());
}

void FunctionalExecutor::run(size_t begin, size_t end) {
  TILELAB_REQUIRE(begin <= end && end <= program_.instructions.size())
      << "run: instructions [" << begin << ", " << end << ") outside the program's "
      << program_.instructions.size();
  for (size_t i = begin; i < end; ++i) {
    const Instruction& instr = program_.instructions[i];
    for (const TileRef& ref : instr.operands)
      if (ref.valid()) ensure(ref.tile);
    if (instr.dma != kNone && program_.dmas[instr.dma].hbm.tensor != kNone)
      ensure(program_.dmas[instr.dma].hbm.tensor);
    if (opcode_info(instr.opcode).dma)
      execute_dma(instr);
    else
      execute(instr);
  }
}

void FunctionalExecutor::execute_dma(const Instruction& instr) {
  const DmaRecord& d = program_.dmas[instr.dma];
  const TileRef& dst = instr.operands[kDst];
  const TileRef& src = instr.operands[kSrc0];
  const HbmPattern& h = d.hbm;
  // Element offset of free index j in the HBM pattern for partition p.
  auto hbm_offset = [&h](uint64_t p, uint64_t j) {
    int64_t offset = h.offset + int64_t(p) * h.partition_stride;
    for (int dim = h.rank - 1; dim >= 0; --dim) {
      offset += int64_t(j % uint64_t(h.counts[dim])) * h.strides[dim];
      j /= uint64_t(h.counts[dim]);
    }
    return uint64_t(offset);
  };
  switch (instr.opcode) {
    case Opcode::dma_copy:
      if (d.hbm_is_source) {
        for (uint32_t p = 0; p < dst.partition_count; ++p)
          for (uint32_t j = 0; j < dst.free_count; ++j)
            store(dst, p, j, load(h.tensor, hbm_offset(p, j)));
      } else if (d.hbm_is_destination) {
        for (uint32_t p = 0; p < src.partition_count; ++p)
          for (uint32_t j = 0; j < src.free_count; ++j)
            store(h.tensor, hbm_offset(p, j), load(src, p, j));
      } else {
        for (uint32_t p = 0; p < dst.partition_count; ++p)
          for (uint32_t j = 0; j < dst.free_count; ++j) store(dst, p, j, load(src, p, j));
      }
      return;
    case Opcode::dma_gather: {
      const TileRef& index = instr.operands[kAux0];
      const Buffer& t = program_.buffers[h.tensor];
      const int64_t rows = int64_t(h.partitions);  // rows of the gathered (batch of the) tensor
      for (uint32_t p = 0; p < dst.partition_count; ++p) {
        const int32_t row = ints_[index.tile][uint64_t(index.partition_start + p) *
                                                  program_.buffers[index.tile].free_elements +
                                              index.free_offset];
        TILELAB_REQUIRE(row >= 0 && row < rows)
            << "dma_gather: index tile '" << program_.buffers[index.tile].name << "' partition "
            << p << " holds row " << row << "; tensor '" << t.name << "' has rows [0, " << rows
            << ")";
        for (uint32_t j = 0; j < dst.free_count; ++j)
          store(dst, p, j, load(h.tensor, uint64_t(row) * h.partition_stride + h.offset + j));
      }
      return;
    }
    case Opcode::dma_transpose:
      // dst[f, p] = src[p, f]
      for (uint32_t f = 0; f < dst.partition_count; ++f)
        for (uint32_t p = 0; p < dst.free_count; ++p)
          store(dst, f, p, h.tensor != kNone ? load(h.tensor, hbm_offset(p, f)) : load(src, p, f));
      return;
    default:
      TILELAB_CHECK(false) << "not a DMA opcode";
  }
}

void FunctionalExecutor::execute(const Instruction& instr) {
  const TileRef& dst = instr.operands[kDst];
  const TileRef& src0 = instr.operands[kSrc0];
  const TileRef& src1 = instr.operands[kSrc1];
  const TileRef& aux0 = instr.operands[kAux0];
  const TileRef& aux1 = instr.operands[kAux1];
  switch (instr.opcode) {
    case Opcode::matmul: {
      // PSUM[m, n] (+)= sum_k stationary[k, m] * moving[k, n], accumulated in fp32 in k order.
      // The builder guarantees float operands and an fp32 PSUM dst: rows are read and written
      // in place (fp32 needs no rounding).
      const bool accumulate = instr.flags & kFlagAccumulate;
      const uint32_t k_size = src0.partition_count, m_size = dst.partition_count,
                     n_size = dst.free_count;
      auto row = [&](const TileRef& ref, uint32_t p) {
        return floats_[ref.tile].data() +
               uint64_t(ref.partition_start + p) * program_.buffers[ref.tile].free_elements;
      };
      std::vector<float> stationary(size_t(k_size) * m_size), moving(size_t(k_size) * n_size),
          acc(size_t(m_size) * n_size);
      for (uint32_t k = 0; k < k_size; ++k) {
        const float* s = row(src0, k);
        const float* v = row(src1, k);
        for (uint32_t m = 0; m < m_size; ++m)
          stationary[size_t(k) * m_size + m] = s[src0.free_element(m)];
        for (uint32_t n = 0; n < n_size; ++n)
          moving[size_t(k) * n_size + n] = v[src1.free_element(n)];
      }
      for (uint32_t m = 0; m < m_size; ++m) {
        const float* out = row(dst, m);
        for (uint32_t n = 0; n < n_size; ++n)
          acc[size_t(m) * n_size + n] = accumulate ? out[dst.free_element(n)] : 0.0f;
      }
      accumulate_product(stationary.data(), moving.data(), acc.data(), k_size, m_size, n_size);
      for (uint32_t m = 0; m < m_size; ++m) {
        float* out = row(dst, m);
        for (uint32_t n = 0; n < n_size; ++n)
          out[dst.free_element(n)] = acc[size_t(m) * n_size + n];
      }
      return;
    }
    case Opcode::pe_transpose: {
      // dst[f, p] = src[p, f], one source row at a time.
      std::vector<float> row(src0.free_count);
      for (uint32_t p = 0; p < dst.free_count; ++p) {
        read_row(src0, p, row.data());
        for (uint32_t f = 0; f < dst.partition_count; ++f) store(dst, f, p, row[f]);
      }
      return;
    }
    case Opcode::activation: {
      const auto func = static_cast<ActFunc>(instr.op0);
      std::vector<float> row(dst.free_count);
      for (uint32_t p = 0; p < dst.partition_count; ++p) {
        const float scale = (instr.flags & kFlagScalar0Tile) ? load(aux0, p, 0) : instr.imm0;
        const float bias = src1.valid() ? load(src1, p, 0) : 0.0f;
        read_row(src0, p, row.data());
        for (float& x : row) x = activate(func, x * scale + bias);
        write_row(dst, p, row.data());
        if (instr.flags & kFlagReduce) {
          float sum = 0.0f;  // of the activated values before they are rounded to dst's dtype
          for (const float x : row) sum += x;
          store(aux1, p, 0, sum);
        }
      }
      return;
    }
    case Opcode::tensor_tensor: {
      const auto op = static_cast<AluOp>(instr.op0);
      std::vector<float> a(dst.free_count), b(dst.free_count);
      for (uint32_t p = 0; p < dst.partition_count; ++p) {
        read_row(src0, p, a.data());
        read_row(src1, p, b.data());
        for (size_t j = 0; j < a.size(); ++j) a[j] = alu(op, a[j], b[j]);
        write_row(dst, p, a.data());
      }
      return;
    }
    case Opcode::tensor_tensor_scan: {
      // The running value stays fp32 inside VectorE; only the stored results are rounded.
      const auto op0 = static_cast<AluOp>(instr.op0);
      const auto op1 = static_cast<AluOp>(instr.op1);
      const bool reverse0 = instr.flags & kFlagReverse0;
      const bool reverse1 = instr.flags & kFlagReverse1;
      std::vector<float> a(dst.free_count), b(dst.free_count);
      for (uint32_t p = 0; p < dst.partition_count; ++p) {
        float state = (instr.flags & kFlagScalar0Tile) ? load(aux0, p, 0) : instr.imm0;
        read_row(src0, p, a.data());
        read_row(src1, p, b.data());
        for (size_t j = 0; j < a.size(); ++j) {
          const float t = reverse0 ? alu(op0, state, a[j]) : alu(op0, a[j], state);
          state = reverse1 ? alu(op1, b[j], t) : alu(op1, t, b[j]);
          a[j] = state;
        }
        write_row(dst, p, a.data());
      }
      return;
    }
    case Opcode::tensor_scalar: {
      const auto op0 = static_cast<AluOp>(instr.op0);
      const auto op1 = static_cast<AluOp>(instr.op1);
      std::vector<float> row(dst.free_count);
      for (uint32_t p = 0; p < dst.partition_count; ++p) {
        const float s0 = (instr.flags & kFlagScalar0Tile) ? load(src1, p, 0) : instr.imm0;
        const float s1 = (instr.flags & kFlagScalar1Tile) ? load(aux0, p, 0) : instr.imm1;
        read_row(src0, p, row.data());
        for (float& x : row) {
          x = alu(op0, x, s0);
          if (op1 != AluOp::bypass) x = alu(op1, x, s1);
        }
        write_row(dst, p, row.data());
      }
      return;
    }
    case Opcode::tensor_reduce: {
      const auto op = static_cast<AluOp>(instr.op0);
      std::vector<float> row(src0.free_count);
      for (uint32_t p = 0; p < dst.partition_count; ++p) {
        read_row(src0, p, row.data());
        float acc = row[0];
        for (size_t j = 1; j < row.size(); ++j) acc = alu(op, acc, row[j]);
        store(dst, p, 0, (instr.flags & kFlagNegate) ? -acc : acc);
      }
      return;
    }
    case Opcode::bn_stats: {
      // Per parity: count, mean and the sum of squared deviations (variance x count), in fp32.
      std::vector<float> row(src0.free_count);
      for (uint32_t p = 0; p < dst.partition_count; ++p) {
        read_row(src0, p, row.data());
        float out[6];
        for (uint32_t parity = 0; parity < 2; ++parity) {
          float count = 0.0f, sum = 0.0f;
          for (size_t j = parity; j < row.size(); j += 2) {
            sum += row[j];
            count += 1.0f;
          }
          const float mean = count > 0.0f ? sum / count : 0.0f;
          float squares = 0.0f;
          for (size_t j = parity; j < row.size(); j += 2)
            squares += (row[j] - mean) * (row[j] - mean);
          out[3 * parity] = count;
          out[3 * parity + 1] = mean;
          out[3 * parity + 2] = squares;
        }
        write_row(dst, p, out);
      }
      return;
    }
    case Opcode::bn_aggr: {
      // Chan et al.'s combination of (count, mean, M2) groups; variance = M2 / count.
      std::vector<float> row(src0.free_count);
      for (uint32_t p = 0; p < dst.partition_count; ++p) {
        read_row(src0, p, row.data());
        float count = 0.0f, mean = 0.0f, m2 = 0.0f;
        for (size_t g = 0; g + 2 < row.size(); g += 3) {
          const float n = row[g], group_mean = row[g + 1], group_m2 = row[g + 2];
          if (n == 0.0f) continue;  // an empty group (the odd half of a one-element row)
          const float total = count + n;
          const float delta = group_mean - mean;
          mean += delta * (n / total);
          m2 += group_m2 + delta * delta * (count * n / total);
          count = total;
        }
        const float out[2] = {mean, count > 0.0f ? m2 / count : 0.0f};
        write_row(dst, p, out);
      }
      return;
    }
    case Opcode::tensor_copy: {
      std::vector<float> row(dst.free_count);
      for (uint32_t p = 0; p < dst.partition_count; ++p) {
        read_row(src0, p, row.data());
        write_row(dst, p, row.data());
      }
      return;
    }
    case Opcode::select: {
      std::vector<float> condition(dst.free_count), x(dst.free_count), y(dst.free_count);
      for (uint32_t p = 0; p < dst.partition_count; ++p) {
        read_row(src0, p, condition.data());
        read_row(src1, p, x.data());
        if (instr.flags & kFlagSelectYTile)
          read_row(aux0, p, y.data());
        else
          std::fill(y.begin(), y.end(), instr.imm0);
        for (size_t j = 0; j < x.size(); ++j) x[j] = condition[j] != 0.0f ? x[j] : y[j];
        write_row(dst, p, x.data());
      }
      return;
    }
    case Opcode::memset: {
      const std::vector<float> row(dst.free_count, instr.imm0);
      for (uint32_t p = 0; p < dst.partition_count; ++p) write_row(dst, p, row.data());
      return;
    }
    case Opcode::iota: {
      const int64_t base = static_cast<int64_t>(instr.imm0);
      const int64_t free_step = static_cast<int64_t>(instr.imm1);
      for (uint32_t p = 0; p < dst.partition_count; ++p)
        for (uint32_t j = 0; j < dst.free_count; ++j) {
          // Computed in int32, then cast to the destination dtype (I).
          const auto value = static_cast<int32_t>(base + int64_t(p) * instr.extra + j * free_step);
          const Buffer& b = program_.buffers[dst.tile];
          if (b.dtype == DType::int32)
            ints_[dst.tile][uint64_t(dst.partition_start + p) * b.free_elements +
                            dst.free_element(j)] = value;
          else
            store(dst, p, j, static_cast<float>(value));
        }
      return;
    }
    default:
      TILELAB_CHECK(false) << "unexpected opcode " << opcode_name(instr.opcode);
  }
}

}  // namespace tilelab::sim
