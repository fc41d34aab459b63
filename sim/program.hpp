// Tile programs and the NKI-like builder that creates them: HBM tensors, SBUF/PSUM tiles with
// lifetimes and multi-buffering, and instructions whose operand limits are checked when built.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "isa.hpp"
#include "machine.hpp"
#include "memory.hpp"

namespace tilelab::sim {

// An HBM tensor or an SBUF/PSUM tile. Tiles are [partitions, free_elements]; HBM tensors keep
// their logical shape and are addressed by element offsets.
struct Buffer {
  std::string name;
  Memory memory = Memory::sbuf;
  DType dtype = DType::fp32;
  uint32_t partitions = 1;     // HBM: 1
  uint64_t free_elements = 0;  // per partition; HBM: all elements
  std::vector<int64_t> shape;  // HBM: logical shape; tiles: {partitions, free_elements}
  int64_t address = -1;        // SBUF/PSUM byte address within each partition
  bool released = false;
  // Freed tiles whose memory this tile reuses: its first access waits for their last accesses.
  std::vector<uint32_t> predecessors;

  uint64_t bytes_per_partition() const { return free_elements * dtype_size(dtype); }
};

// Handles returned by the builder.
struct Tensor {
  uint32_t id = kNone;
};
struct Tile {
  uint32_t id = kNone;
};
// N physical buffers of one tile declaration, handed out round-robin (explicit multi-buffering).
struct TilePool {
  uint32_t first = kNone;
  uint32_t count = 0;
  uint32_t next = 0;
};

// An HBM access pattern in elements: partition p, free index (i0, i1, i2) reads element
//   offset + p * partition_stride + i0 * strides[0] + i1 * strides[1] + i2 * strides[2]
// with the innermost dimension last (counts[rank - 1]).
struct HbmPattern {
  uint32_t tensor = kNone;
  int64_t offset = 0;
  int64_t partition_stride = 0;
  uint32_t partitions = 0;
  uint8_t rank = 1;
  std::array<int64_t, 3> counts{1, 1, 1};
  std::array<int64_t, 3> strides{1, 1, 1};

  int64_t free_elements() const;
};

// Side record of a DMA instruction (kept out of Instruction to keep that small).
struct DmaRecord {
  HbmPattern hbm;  // valid when tensor != kNone
  bool hbm_is_source = false;
  bool hbm_is_destination = false;
  bool transpose = false;
  bool indirect = false;
  uint8_t queue = 0;
  uint32_t partition_start = 0;  // on the SBUF side: decides which DMA engines serve it
  uint32_t partitions = 0;
  uint64_t bytes_per_partition = 0;
  uint64_t run_bytes = 0;  // contiguous bytes per descriptor (<= bytes_per_partition)
  uint64_t bytes() const { return bytes_per_partition * partitions; }
};

// A line of a kernel's source (a front end such as tilelab.nki records them): the instructions
// emitted while it ran carry its index. `caller` is the location it was called from, so a chain
// leads through helper functions to the kernel itself (kNone at the outermost).
struct SourceLocation {
  std::string file;
  int line = 0;  // 1-based
  std::string function;
  std::string text;  // the line's source text, may be empty
  uint32_t caller = kNone;

  // "file.py:12": the file's name without its directories, and the line.
  std::string short_label() const {
    return file.substr(file.find_last_of('/') + 1) + ":" + std::to_string(line);
  }
};

// A built program: the machine it was built for, its buffers, instructions and DMA records.
struct Program {
  Machine machine;
  std::string name;
  std::vector<Buffer> buffers;
  std::vector<Instruction> instructions;
  std::vector<DmaRecord> dmas;
  std::vector<SourceLocation> sources;  // Instruction::source indexes it
  int64_t peak_sbuf_bytes_per_partition = 0;
  int64_t peak_psum_bytes_per_partition = 0;

  std::string describe(const TileRef& ref) const;        // "rhs[0][0:128, 0:512] bf16"
  std::string describe(const Instruction& instr) const;  // one line with operands
  // The same appended to `out`, for callers that describe many (the trace: every instruction).
  void append_description(std::string& out, const TileRef& ref) const;
  void append_description(std::string& out, const Instruction& instr) const;
};

// A scalar operand: a constant or a [P, 1] tile (per-partition value).
struct Scalar {
  float value = 0;
  TileRef tile{};
  static Scalar constant(float v) { return Scalar{v, {}}; }
  static Scalar per_partition(TileRef t) { return Scalar{0, t}; }
};

// DMA options: which queue triggers it and, for a partition mask (`partition < active`), how many
// partitions are moved.
struct DmaOptions {
  Engine trigger = Engine::sync;
  int queue = -1;              // -1: the trigger engine's default queue
  int active_partitions = -1;  // -1: all partitions of the access
};

struct ActivationOptions {
  float scale = 1.0f;
  TileRef scale_tile{};     // [P, 1] per-partition scale instead of `scale`
  TileRef bias{};           // [P, 1]
  TileRef reduce_result{};  // [P, 1]: sum over the free axis of the activated values
};

// Limits on the size of a program, independent of the machine: checked by the builder before
// each instruction or buffer is added, so that an oversized request fails with an Error instead
// of exhausting memory. Buffer elements are what a functional run allocates (every HBM tensor
// and tile, one float per element: 2^30 elements are 4 GiB).
struct ProgramLimits {
  static constexpr uint64_t kDefaultMaxInstructions = uint64_t{1} << 22;
  static constexpr uint64_t kDefaultMaxBufferElements = uint64_t{1} << 30;
  uint64_t max_instructions = kDefaultMaxInstructions;
  uint64_t max_buffer_elements = kDefaultMaxBufferElements;
};

// The limits every builder of this process uses (default ProgramLimits{}). Kernels are built
// through KernelInfo::build(machine, parameters), so front ends set the limits once (CLI flags,
// tilelab.sim.set_program_limits) rather than through every kernel's signature. Thread-safe;
// builders read the limits when constructed.
ProgramLimits program_limits();
void set_program_limits(const ProgramLimits& limits);

// Builds a Program. Every method checks its operands against the machine's limits and throws
// tilelab::Error naming the operand, the value and the limit; the program's size is bounded by
// program_limits(). Not thread-safe.
class ProgramBuilder {
 public:
  ProgramBuilder(Machine machine, std::string name);

  const Machine& machine() const { return program_.machine; }

  // --- buffers ---
  Tensor hbm_tensor(const std::string& name, std::vector<int64_t> shape, DType dtype);
  // Allocates a tile; throws "SBUF allocation failed" naming the live tiles when it does not fit.
  Tile sbuf_tile(const std::string& name, int partitions, int64_t free_elements, DType dtype);
  // A PSUM tile must fit one accumulation bank per partition.
  Tile psum_tile(const std::string& name, int partitions, int64_t free_elements, DType dtype);
  // An SBUF or PSUM tile when it fits now, else Tile{kNone} (a front end that multi-buffers
  // tiles falls back to fewer buffers instead of failing). Bad arguments still throw.
  Tile try_tile(const std::string& name, Memory memory, int partitions, int64_t free_elements,
                DType dtype);
  // Ends a tile's lifetime; its memory may be reused (with a dependency on its last use).
  void release(Tile tile);
  TilePool pool(const std::string& name, Memory memory, int partitions, int64_t free_elements,
                DType dtype, int buffers);
  Tile next(TilePool& pool);
  void release(TilePool& pool);

  // --- views ---
  TileRef view(Tile tile) const;
  // Partition range [p0, p0 + partitions) and free elements offset + i * stride, i < count.
  TileRef view(Tile tile, int p0, int partitions, int64_t offset, int64_t count,
               int64_t stride = 1) const;
  // Two levels: free element (o, i) at offset + o * outer_stride + i * inner_stride, o <
  // outer_count, i < inner_count (e.g. columns [c0, c0 + n) of every row of a [P, rows, cols]
  // tile).
  TileRef view(Tile tile, int p0, int partitions, int64_t offset, int64_t outer_count,
               int64_t outer_stride, int64_t inner_count, int64_t inner_stride) const;
  // Rows [row0, row0 + rows) on partitions and columns [col0, col0 + cols) on the free axis of a
  // 2-D tensor (or the last two dims, with the leading index `batch`).
  HbmPattern hbm_rows(Tensor tensor, int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                      int64_t batch = 0) const;
  // Fully general pattern; checked against the tensor bounds.
  HbmPattern hbm_pattern(Tensor tensor, int64_t offset, int64_t partition_stride, int partitions,
                         std::vector<std::pair<int64_t, int64_t>> free_dims) const;

  // --- DMA ---
  void dma_copy(const TileRef& dst, const HbmPattern& src, DmaOptions options = {});  // load
  void dma_copy(const HbmPattern& dst, const TileRef& src, DmaOptions options = {});  // store
  void dma_copy(const TileRef& dst, const TileRef& src, DmaOptions options = {});     // SBUF->SBUF
  // dst[p, f] = tensor[index[p], col0 + f] for a 2-D tensor; index is an int32 [P, 1] SBUF tile.
  // Descriptors are generated on GpSimd (SWDGE), so the trigger is GpSimd.
  void dma_gather(const TileRef& dst, Tensor tensor, const TileRef& index, int64_t col0,
                  DmaOptions options = {});
  // The same on a tensor of rank >= 3 seen as [batches, rows, cols] (its last two dims):
  // dst[p, f] = tensor[batch, index[p], col0 + f], e.g. kv_cache[0 or 1, row, :].
  void dma_gather(const TileRef& dst, Tensor tensor, int64_t batch, const TileRef& index,
                  int64_t col0, DmaOptions options = {});
  // The general form: the tensor seen as rows of `cols` elements from row `row_offset` on,
  // dst[p, f] = row (row_offset + index[p]), column col0 + f, with index[p] < rows.
  void gather_rows(const TileRef& dst, Tensor tensor, int64_t row_offset, int64_t rows,
                   int64_t cols, const TileRef& index, int64_t col0, DmaOptions options = {});
  // dst[f, p] = src[p, f] on the DMA engines (NC-v3 only).
  void dma_transpose(const TileRef& dst, const HbmPattern& src, DmaOptions options = {});
  void dma_transpose(const TileRef& dst, const TileRef& src, DmaOptions options = {});

  // --- TensorE ---
  // dst[M, N] (+)= stationary[K, M]^T @ moving[K, N]; dst is fp32 PSUM within one bank.
  void matmul(const TileRef& dst, const TileRef& stationary, const TileRef& moving,
              bool accumulate);
  // dst[F, P] = src[P, F] through the PE array into PSUM.
  void pe_transpose(const TileRef& dst, const TileRef& src);

  // --- ScalarE / VectorE / GpSimd ---
  void activation(const TileRef& dst, const TileRef& src, ActFunc func,
                  const ActivationOptions& options = {});
  void tensor_tensor(const TileRef& dst, const TileRef& a, const TileRef& b, AluOp op);
  // Per partition, r[j] = (a[j] op0 r[j-1]) op1 b[j] along the free elements, r[-1] = initial
  // (a constant or a [P, 1] tile); reverse0 / reverse1 swap the operands of op0 / op1.
  void tensor_tensor_scan(const TileRef& dst, const TileRef& a, const TileRef& b, AluOp op0,
                          AluOp op1, Scalar initial, bool reverse0 = false, bool reverse1 = false);
  void tensor_scalar(const TileRef& dst, const TileRef& src, AluOp op0, Scalar s0,
                     AluOp op1 = AluOp::bypass, Scalar s1 = {}, Engine engine = Engine::vector);
  void tensor_reduce(const TileRef& dst, const TileRef& src, AluOp op, bool negate = false);
  // dst [P, 6]: count, mean and variance x count of src's even elements, then of its odd ones
  // (at most bn_stats_max_free_elements of src per partition).
  void bn_stats(const TileRef& dst, const TileRef& src);
  // dst [P, 2]: mean and (population) variance of all the elements that the bn_stats groups of
  // src [P, 3k] (count, mean, variance x count) describe.
  void bn_aggr(const TileRef& dst, const TileRef& src);
  void tensor_copy(const TileRef& dst, const TileRef& src, Engine engine = Engine::vector);
  void select(const TileRef& dst, const TileRef& condition, const TileRef& x, Scalar y);
  void memset(const TileRef& dst, float value, Engine engine = Engine::vector);
  // dst[p, f] = base + p * partition_step + f * free_step (p, f relative to the view), computed in
  // int32 and cast to dst's dtype; base is exact up to 2^24.
  void iota(const TileRef& dst, int base, int partition_step, int free_step);

  // --- source attribution ---
  // The id of a source location (the same location, caller included, gets the same id); line
  // must be >= 1 and caller an existing id or kNone.
  uint32_t add_source(const SourceLocation& location);
  // Instructions built from now on carry `source` (an id from add_source, or kNone).
  void set_source(uint32_t source);
  uint32_t current_source() const { return current_source_; }

  size_t instruction_count() const { return program_.instructions.size(); }
  // Hands over the program; the builder must not be used afterwards.
  Program finish();

 private:
  // required = false: returns Tile{kNone} instead of throwing when the memory is full.
  Tile allocate_tile(const std::string& name, Memory memory, int partitions, int64_t free_elements,
                     DType dtype, bool required = true);
  const Buffer& buffer_of(const TileRef& ref, const char* instruction, const char* operand) const {
    if (ref.tile < program_.buffers.size()) [[likely]] {  // kNone is out of range too
      const Buffer& b = program_.buffers[ref.tile];
      if (b.memory != Memory::hbm && !b.released) [[likely]]
        return b;
    }
    operand_is_not_a_tile(ref, instruction, operand);
  }
  [[noreturn, gnu::cold, gnu::noinline]] void operand_is_not_a_tile(const TileRef& ref,
                                                                    const char* instruction,
                                                                    const char* operand) const;
  void check_compute_operand(const TileRef& ref, const char* instruction, const char* operand,
                             Engine engine) const;
  [[noreturn, gnu::cold, gnu::noinline]] void report_bad_compute_operand(const TileRef& ref,
                                                                         const char* instruction,
                                                                         const char* operand,
                                                                         Engine engine) const;
  void check_same_partitions(const TileRef& a, const TileRef& b, const char* instruction,
                             const char* a_name, const char* b_name) const;
  void check_elements(const TileRef& dst, const TileRef& src, const char* instruction) const;
  // The operands of a VectorE instruction that reduces each partition's row of `src` ("data")
  // into the same partition of dst.
  void check_vector_rows(const TileRef& dst, const TileRef& src, const char* instruction) const;
  // The operands of a two-input VectorE instruction: dst like a, a and b alike, not both in PSUM.
  void check_vector_pair(const TileRef& dst, const TileRef& a, const TileRef& b,
                         const char* instruction, const char* a_name, const char* b_name) const;
  void check_scalar(const Scalar& s, const TileRef& data, const char* instruction,
                    const char* operand) const;
  uint32_t add_dma(DmaRecord record, const DmaOptions& options);
  // A DMA instruction of `record`; dst / src are the tile operands (empty on the HBM side).
  void push_dma(Opcode opcode, const DmaRecord& record, const DmaOptions& options,
                const TileRef& dst, const TileRef& src);
  void dma_between_hbm_and_tile(const TileRef& tile, const HbmPattern& hbm, bool hbm_is_source,
                                const DmaOptions& options);
  void require_engine(Opcode opcode, Engine engine) const;
  // Appends an instruction of `opcode` on `engine`, tagged with the current source line, has
  // fill(instruction) fill it in place, and checks it against the opcode table; a failed check
  // discards it. Every check that may throw runs before: fill only assigns fields. (An Instruction
  // assembled on the stack and copied whole stalls on store forwarding, which measured as a large
  // part of building a program.)
  template <typename Fill>
  void append(Opcode opcode, Engine engine, Fill&& fill);
  Instruction& append_blank(Opcode opcode, Engine engine);
  void check_appended();
  // check_appended's failure: discards the instruction and throws, naming what disagrees.
  [[gnu::cold, gnu::noinline]] void report_disagreeing_append();
  // Counts `elements` more buffer elements against the limit before a buffer is added.
  void reserve_buffer_elements(const std::string& name, uint64_t elements);

  Program program_;
  ProgramLimits limits_;
  uint64_t buffer_elements_ = 0;
  PartitionAllocator sbuf_;
  PartitionAllocator psum_;
  bool finished_ = false;
  uint32_t current_source_ = kNone;
  std::map<std::tuple<std::string, int, std::string, uint32_t>, uint32_t> source_ids_;
};

}  // namespace tilelab::sim
