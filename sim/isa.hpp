// Tile ISA of the simulated machine: dtypes, memories, engines, opcodes and the compact
// instruction record that both the timing and the functional engines read.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

namespace tilelab::sim {

inline constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();

// uint8 holds 0/1 masks and small integers (NKI's bool/uint8 tiles): one byte per element.
enum class DType : uint8_t { fp32, bf16, fp16, fp8_e4m3, int32, uint8 };
inline constexpr int kDTypeCount = static_cast<int>(DType::uint8) + 1;
enum class Memory : uint8_t { hbm, sbuf, psum };
inline constexpr int kMemoryCount = static_cast<int>(Memory::psum) + 1;

// Instruction queues of one NeuronCore. DMA transfers run on the DMA engines but are triggered
// from one of these queues (normally sync, or gpsimd for software descriptor generation).
enum class Engine : uint8_t { tensor, vector, scalar, gpsimd, sync };
inline constexpr int kEngineCount = 5;

enum class Opcode : uint8_t {
  dma_copy,            // HBM<->SBUF or SBUF->SBUF copy with access patterns (may cast)
  dma_gather,          // HBM rows chosen by an int32 index tile on the partition dim (SWDGE)
  dma_transpose,       // 2-D transpose on the DMA engines (NC-v3)
  matmul,              // TensorE: PSUM[M, N] (+)= stationary[K, M]^T @ moving[K, N]
  pe_transpose,        // TensorE: PSUM[F, P] = in[P, F] (identity matmul)
  activation,          // ScalarE: f(x * scale + bias), optional fused free-axis add-reduce
  tensor_tensor,       // VectorE: a op b
  tensor_tensor_scan,  // VectorE: r[j] = (a[j] op0 r[j-1]) op1 b[j] along the free axis
  tensor_scalar,       // VectorE/ScalarE: (x op0 s0) op1 s1 with per-partition or constant scalars
  tensor_reduce,       // VectorE: free-axis reduction to [P, 1]
  bn_stats,            // VectorE: [P, 6] count, mean, variance x count of the even and odd elements
  bn_aggr,             // VectorE: [P, 2] mean and variance from bn_stats groups
  tensor_copy,         // VectorE/ScalarE/GpSimd: copy with cast
  select,              // VectorE: cond != 0 ? x : y
  memset,              // VectorE/GpSimd: fill with a constant
  iota,                // GpSimd: base + p * partition_step + f * free_step, computed in int32
  count,               // not an opcode: the number of opcodes; stays last
};
inline constexpr int kOpcodeCount = static_cast<int>(Opcode::count);

enum class AluOp : uint8_t { bypass, add, subtract, multiply, divide, max, min };
inline constexpr int kAluOpCount = static_cast<int>(AluOp::min) + 1;
enum class ActFunc : uint8_t {
  copy,
  exp,
  log,
  square,
  relu,
  sigmoid,
  tanh,
  reciprocal,
  sqrt,
  rsqrt,
  abs
};
inline constexpr int kActFuncCount = static_cast<int>(ActFunc::abs) + 1;

// A view of an SBUF/PSUM tile: a contiguous partition range and a free access pattern of one or
// two levels, in elements of the tile's dtype. free_count counts all free elements. One level
// (inner_count == 0): element j is at free_offset + j * free_stride. Two levels: element j is at
//   free_offset + (j / inner_count) * outer_stride + (j % inner_count) * free_stride,
// and free_count is a multiple of inner_count. A stride of 0 broadcasts along that level.
struct TileRef {
  uint32_t tile = kNone;
  uint16_t partition_start = 0;
  uint16_t partition_count = 0;
  uint32_t free_offset = 0;
  uint32_t free_count = 0;
  int32_t free_stride = 1;
  uint32_t inner_count = 0;
  int32_t outer_stride = 0;

  bool valid() const { return tile != kNone; }
  bool two_level() const { return inner_count != 0 && inner_count < free_count; }
  // Offset within a partition of free element j.
  uint64_t free_element(uint32_t j) const {
    if (!two_level()) return free_offset + uint64_t(j) * uint64_t(free_stride);
    return free_offset + uint64_t(j / inner_count) * uint64_t(outer_stride) +
           uint64_t(j % inner_count) * uint64_t(free_stride);
  }
  // The largest offset the view touches (strides are non-negative).
  uint64_t last_free_element() const {
    if (free_count == 0) return free_offset;
    if (!two_level()) return free_offset + uint64_t(free_count - 1) * uint64_t(free_stride);
    return free_offset + uint64_t(free_count / inner_count - 1) * uint64_t(outer_stride) +
           uint64_t(inner_count - 1) * uint64_t(free_stride);
  }
  // Elements of each contiguous run (1 when the innermost stride is not 1).
  uint32_t contiguous_run() const {
    if (free_stride != 1) return free_count <= 1 ? free_count : 1;
    if (!two_level() || uint32_t(outer_stride) == inner_count) return free_count;
    return inner_count;
  }
  bool contiguous() const { return contiguous_run() == free_count; }
};

// Operand slots of an Instruction.
enum Slot : int { kDst = 0, kSrc0 = 1, kSrc1 = 2, kAux0 = 3, kAux1 = 4 };
inline constexpr int kSlotCount = 5;
inline constexpr std::array<std::string_view, kSlotCount> kSlotNames = {"dst", "src0", "src1",
                                                                        "aux0", "aux1"};

// Instruction flags.
enum : uint8_t {
  kFlagAccumulate = 1,    // matmul accumulates into PSUM instead of overwriting
  kFlagNegate = 2,        // tensor_reduce negates the result
  kFlagScalar0Tile = 4,   // tensor_scalar / activation scale comes from a tile (slot kSrc1 / kAux0)
  kFlagScalar1Tile = 8,   // second scalar comes from a tile (slot kAux0)
  kFlagReduce = 16,       // activation writes a free-axis sum into kAux1
  kFlagSelectYTile = 32,  // select's "else" operand is a tile (kAux0), not imm0
  kFlagReverse0 = 64,     // tensor_tensor_scan: op0's operands swapped (r[j-1] op0 a[j])
  kFlagReverse1 = 128,    // tensor_tensor_scan: op1's operands swapped (b[j] op1 ...)
};

// One instruction: plain data, no heap storage, so that programs of millions of instructions are
// cheap to build and to time. Slot meaning per opcode:
//   dma_*:         dst, src0 tile sides (invalid on the HBM side); aux0 = gather index tile;
//                  `dma` indexes Program::dmas
//   matmul:        dst = PSUM, src0 = stationary, src1 = moving
//   pe_transpose:  dst = PSUM, src0 = input
//   activation:    dst, src0 = data, src1 = bias [P,1] (optional), aux0 = scale [P,1] (flag),
//                  aux1 = reduce result [P,1] (flag); imm0 = constant scale
//   tensor_tensor: dst, src0, src1; op0
//   tensor_tensor_scan: dst, src0 = data0, src1 = data1; op0, op1; initial in imm0 or aux0 [P,1]
//   tensor_scalar: dst, src0; op0 with imm0 or src1 [P,1]; op1 with imm1 or aux0 [P,1]
//   tensor_reduce: dst [P,1], src0; op0
//   bn_stats:      dst [P,6], src0;  bn_aggr: dst [P,2], src0 [P,3k] (bn_stats groups)
//   tensor_copy:   dst, src0
//   select:        dst, src0 = condition, src1 = x, aux0 = y tile or imm0
//   memset:        dst; imm0
//   iota:          dst; imm0 = base, imm1 = free step, `extra` = partition step
struct Instruction {
  Opcode opcode = Opcode::tensor_copy;
  Engine engine = Engine::vector;
  uint8_t op0 = 0;  // AluOp or ActFunc
  uint8_t op1 = 0;  // AluOp
  uint8_t flags = 0;
  uint32_t dma = kNone;
  int32_t extra = 0;
  float imm0 = 0;
  float imm1 = 0;
  uint32_t source = kNone;  // index into Program::sources: the kernel source line that emitted it
  std::array<TileRef, kSlotCount> operands{};
};

// How an opcode uses one operand slot. A write (or read-write) orders the instruction after every
// earlier access of the region; a read only after earlier writes.
enum class OperandRole : uint8_t { none, read, write, read_write };

constexpr bool reads(OperandRole role) {
  return role == OperandRole::read || role == OperandRole::read_write;
}
constexpr bool writes(OperandRole role) {
  return role == OperandRole::write || role == OperandRole::read_write;
}

// What Instruction::op0 holds for an opcode.
enum class Op0Kind : uint8_t { none, alu, activation };

// Scalar operands an opcode takes (bit set): constants in imm0/imm1, [P, 1] tiles broadcast along
// the free axis, or whole tiles of the data's shape.
enum : uint8_t {
  kScalarImmediate = 1,
  kScalarPerPartition = 2,
  kScalarTile = 4,
};

constexpr uint8_t engine_bit(Engine engine) {
  return static_cast<uint8_t>(1u << static_cast<int>(engine));
}
inline constexpr uint8_t kAllEngines = (1u << kEngineCount) - 1;

// Everything the stages need to know about an opcode apart from its semantics and cost.
struct OpcodeInfo {
  Opcode opcode;
  std::string_view name;
  uint8_t engines;  // engine_bit set of the queues that may issue it (DMA: trigger engines)
  bool dma;         // moves data on the DMA engines; Instruction::dma indexes Program::dmas
  Op0Kind op0;
  std::array<OperandRole, kSlotCount> operands;  // indexed by Slot
  uint8_t scalars;                               // kScalar* bit set
};

// One entry per Opcode, in enum order. Slots: dst, src0, src1, aux0, aux1 (see Instruction).
inline constexpr std::array<OpcodeInfo, kOpcodeCount> kOpcodeTable = [] {
  using O = Opcode;
  using K = Op0Kind;
  constexpr OperandRole n = OperandRole::none, r = OperandRole::read, w = OperandRole::write,
                        rw = OperandRole::read_write;
  constexpr uint8_t kVector = engine_bit(Engine::vector), kScalar = engine_bit(Engine::scalar),
                    kGpsimd = engine_bit(Engine::gpsimd), kTensor = engine_bit(Engine::tensor);
  return std::array<OpcodeInfo, kOpcodeCount>{{
      {O::dma_copy, "dma_copy", kAllEngines, true, K::none, {w, r, n, n, n}, 0},
      {O::dma_gather, "dma_gather", kGpsimd, true, K::none, {w, n, n, r, n}, 0},
      {O::dma_transpose, "dma_transpose", kAllEngines, true, K::none, {w, r, n, n, n}, 0},
      // dst is read too when kFlagAccumulate is set.
      {O::matmul, "matmul", kTensor, false, K::none, {rw, r, r, n, n}, 0},
      {O::pe_transpose, "pe_transpose", kTensor, false, K::none, {w, r, n, n, n}, 0},
      // src1 = bias, aux0 = scale tile, aux1 = fused reduce result.
      {O::activation,
       "activation",
       kScalar,
       false,
       K::activation,
       {w, r, r, r, w},
       kScalarImmediate | kScalarPerPartition},
      {O::tensor_tensor, "tensor_tensor", kVector, false, K::alu, {w, r, r, n, n}, 0},
      // aux0 = initial [P, 1] when kFlagScalar0Tile is set.
      {O::tensor_tensor_scan,
       "tensor_tensor_scan",
       kVector,
       false,
       K::alu,
       {w, r, r, r, n},
       kScalarImmediate | kScalarPerPartition},
      {O::tensor_scalar,
       "tensor_scalar",
       kVector | kScalar | kGpsimd,
       false,
       K::alu,
       {w, r, r, r, n},
       kScalarImmediate | kScalarPerPartition},
      {O::tensor_reduce, "tensor_reduce", kVector, false, K::alu, {w, r, n, n, n}, 0},
      {O::bn_stats, "bn_stats", kVector, false, K::none, {w, r, n, n, n}, 0},
      {O::bn_aggr, "bn_aggr", kVector, false, K::none, {w, r, n, n, n}, 0},
      {O::tensor_copy,
       "tensor_copy",
       kVector | kScalar | kGpsimd,
       false,
       K::none,
       {w, r, n, n, n},
       0},
      {O::select,
       "select",
       kVector,
       false,
       K::none,
       {w, r, r, r, n},
       kScalarImmediate | kScalarTile},
      {O::memset, "memset", kVector | kGpsimd, false, K::none, {w, n, n, n, n}, kScalarImmediate},
      {O::iota, "iota", kGpsimd, false, K::none, {w, n, n, n, n}, kScalarImmediate},
  }};
}();

// A missing, extra or misplaced entry fails here: entry i must describe Opcode(i).
static_assert([] {
  for (int i = 0; i < kOpcodeCount; ++i)
    if (kOpcodeTable[i].opcode != static_cast<Opcode>(i) || kOpcodeTable[i].name.empty() ||
        kOpcodeTable[i].engines == 0 || kOpcodeTable[i].operands[kDst] == OperandRole::none)
      return false;
  return true;
}());

constexpr const OpcodeInfo& opcode_info(Opcode opcode) {
  return kOpcodeTable[static_cast<int>(opcode)];
}
constexpr bool can_issue(Opcode opcode, Engine engine) {
  return (opcode_info(opcode).engines & engine_bit(engine)) != 0;
}

constexpr int dtype_size(DType dtype) {
  switch (dtype) {
    case DType::fp32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::fp16:
      return 2;
    case DType::fp8_e4m3:
      return 1;
    case DType::int32:
      return 4;
    case DType::uint8:
      return 1;
  }
  return 4;
}
constexpr bool is_float(DType dtype) {
  return dtype != DType::int32 && dtype != DType::uint8;
}
constexpr bool is_16bit_float(DType dtype) {
  return dtype == DType::bf16 || dtype == DType::fp16;
}

std::string_view dtype_name(DType dtype);
std::string_view memory_name(Memory memory);
std::string_view engine_name(Engine engine);
std::string_view opcode_name(Opcode opcode);
// "vector, scalar or gpsimd" for an engine_bit set, in Engine order.
std::string engine_set_name(uint8_t engines);
std::string_view alu_op_name(AluOp op);
std::string_view act_func_name(ActFunc func);

}  // namespace tilelab::sim
