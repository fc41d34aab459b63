// ProgramBuilder: operand checks, allocation and instruction records.
#include "program.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <sstream>

#include <tilelab/error.hpp>

#include "dma/dma.hpp"
#include "host_pages.hpp"
#include "text.hpp"

namespace tilelab::sim {
namespace {

// SBUF start-address alignment is not published (sbuf_min_align); 64 B keeps tiles apart on
// cache-line-like boundaries without wasting noticeable space.
constexpr int64_t kSbufAlignment = 64;
constexpr int64_t kPsumAlignment = 4;

// Contiguous run, in elements, of the innermost dimensions of an HBM pattern.
int64_t contiguous_run_elements(const HbmPattern& p) {
  const int r = p.rank;
  if (p.strides[r - 1] != 1) return 1;
  int64_t run = p.counts[r - 1];
  for (int d = r - 2; d >= 0; --d) {
    if (p.strides[d] != run) break;
    run *= p.counts[d];
  }
  return run;
}

int64_t contiguous_run_elements(const TileRef& ref) {
  return ref.contiguous_run();
}

}  // namespace

int64_t HbmPattern::free_elements() const {
  int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= counts[d];
  return n;
}

void Program::append_description(std::string& out, const TileRef& ref) const {
  if (!ref.valid()) {
    out += '-';
    return;
  }
  const Buffer& b = buffers[ref.tile];
  out.append(b.name).append("[");
  append_decimal(out, ref.partition_start);
  out += ':';
  append_decimal(out, ref.partition_start + ref.partition_count);
  out += ", ";
  append_decimal(out, ref.free_offset);
  out += ':';
  append_decimal(out, ref.last_free_element() + (ref.free_count ? 1 : 0));
  if (ref.free_stride != 1) {
    out += ':';
    append_decimal(out, ref.free_stride);
  }
  if (ref.two_level()) {
    out += " as ";
    append_decimal(out, ref.free_count / ref.inner_count);
    out += 'x';
    append_decimal(out, ref.inner_count);
    out += " (outer stride ";
    append_decimal(out, ref.outer_stride);
    out += ')';
  }
  out.append("] ").append(dtype_name(b.dtype)).append(" ").append(memory_name(b.memory));
}

void Program::append_description(std::string& out, const Instruction& instr) const {
  const OpcodeInfo& info = opcode_info(instr.opcode);
  out += info.name;
  if (info.op0 == Op0Kind::alu) out.append(".").append(alu_op_name(static_cast<AluOp>(instr.op0)));
  if (info.op0 == Op0Kind::activation)
    out.append(".").append(act_func_name(static_cast<ActFunc>(instr.op0)));
  for (int s = 0; s < kSlotCount; ++s) {
    if (!instr.operands[s].valid()) continue;
    out.append(" ").append(kSlotNames[s]).append("=");
    append_description(out, instr.operands[s]);
  }
  if (instr.dma != kNone) {
    const DmaRecord& d = dmas[instr.dma];
    if (d.hbm.tensor != kNone) {
      out.append(d.hbm_is_source ? " src=" : " dst=")
          .append(buffers[d.hbm.tensor].name)
          .append("@");
      append_decimal(out, d.hbm.offset);
      out += " hbm";
    }
    out += " bytes=";
    append_decimal(out, d.bytes());
    out += " bytes_per_partition=";
    append_decimal(out, d.bytes_per_partition);
    out += " queue=";
    append_decimal(out, int(d.queue));
  }
}

std::string Program::describe(const TileRef& ref) const {
  std::string out;
  append_description(out, ref);
  return out;
}

std::string Program::describe(const Instruction& instr) const {
  std::string out;
  append_description(out, instr);
  return out;
}

namespace {
std::atomic<uint64_t> max_instructions{ProgramLimits::kDefaultMaxInstructions};
std::atomic<uint64_t> max_buffer_elements{ProgramLimits::kDefaultMaxBufferElements};
}  // namespace

ProgramLimits program_limits() {
  return {max_instructions.load(), max_buffer_elements.load()};
}

void set_program_limits(const ProgramLimits& limits) {
  TILELAB_REQUIRE(limits.max_instructions >= 1)
      << "max_instructions: expected at least 1, got " << limits.max_instructions;
  TILELAB_REQUIRE(limits.max_buffer_elements >= 1)
      << "max_buffer_elements: expected at least 1, got " << limits.max_buffer_elements;
  max_instructions.store(limits.max_instructions);
  max_buffer_elements.store(limits.max_buffer_elements);
}

namespace {
// Growing a vector of ~120-byte instructions from empty costs more than building them: every
// doubling copies it into fresh pages, and first touches of pages are expensive (a cold build of
// the default paged batch spent 20 of its 25 ms there). So a builder reserves address space up
// front: at least kInitialCapacity entries (untouched pages cost nothing; a program keeps the
// reservation, not resident memory), or what the thread's last program needed plus an eighth,
// as consecutive programs on a thread are usually alike (sweep points, benchmark runs). The cap
// keeps one huge program from making every later builder reserve its address space. The
// reservation asks for huge pages: a first build in a fresh process (as the CLI runs one) faults
// in a page per 2 MiB instead of per 4 KiB (the default paged batch on Zen 4 under KVM, fresh
// processes alternating: built in 3.6-4.0 ms instead of 7.7-10.9, most runs).
constexpr size_t kInitialCapacity = size_t{1} << 17;
constexpr size_t kMaxCapacityHint = size_t{1} << 20;
thread_local size_t instruction_capacity_hint = kInitialCapacity;
thread_local size_t dma_capacity_hint = kInitialCapacity / 8;

size_t next_capacity_hint(size_t used, size_t floor) {
  return std::clamp(used + used / 8, floor, kMaxCapacityHint);
}
}  // namespace

void ProgramBuilder::reserve_buffer_elements(const std::string& name, uint64_t elements) {
  TILELAB_REQUIRE(elements <= limits_.max_buffer_elements - buffer_elements_)
      << "program '" << program_.name << "': buffer '" << name << "' (" << elements
      << " elements) brings the program's HBM tensors and tiles to more than "
      << limits_.max_buffer_elements << " elements (max_buffer_elements; " << buffer_elements_
      << " declared before it); use a smaller problem or raise the limit";
  buffer_elements_ += elements;
}

ProgramBuilder::ProgramBuilder(Machine machine, std::string name)
    : limits_(program_limits()),
      sbuf_(machine.sbuf_bytes_per_partition, 0, kSbufAlignment),
      psum_(machine.psum_bytes_per_partition, machine.psum_bank_bytes_per_partition,
            kPsumAlignment) {
  program_.machine = std::move(machine);
  program_.name = std::move(name);
  reserve_on_huge_pages(program_.instructions, instruction_capacity_hint);
  program_.dmas.reserve(dma_capacity_hint);
}

Tensor ProgramBuilder::hbm_tensor(const std::string& name, std::vector<int64_t> shape,
                                  DType dtype) {
  TILELAB_REQUIRE(!shape.empty()) << "hbm_tensor '" << name << "': shape must not be empty";
  int64_t elements = 1;
  for (int64_t d : shape) {
    TILELAB_REQUIRE(d > 0) << "hbm_tensor '" << name << "': dimensions must be positive, got " << d;
    TILELAB_REQUIRE(elements <= INT64_MAX / d)
        << "hbm_tensor '" << name << "': more than 2^63 elements";
    elements *= d;
  }
  reserve_buffer_elements(name, static_cast<uint64_t>(elements));
  Buffer b;
  b.name = name;
  b.memory = Memory::hbm;
  b.dtype = dtype;
  b.partitions = 1;
  b.free_elements = static_cast<uint64_t>(elements);
  b.shape = std::move(shape);
  program_.buffers.push_back(std::move(b));
  return Tensor{static_cast<uint32_t>(program_.buffers.size() - 1)};
}

Tile ProgramBuilder::allocate_tile(const std::string& name, Memory memory, int partitions,
                                   int64_t free_elements, DType dtype, bool required) {
  const Machine& m = program_.machine;
  const char* kind = memory == Memory::sbuf ? "sbuf_tile" : "psum_tile";
  TILELAB_REQUIRE(partitions >= 1 && partitions <= m.partitions)
      << kind << " '" << name << "': partition dim " << partitions << " must be in [1, "
      << m.partitions << "] (pmax)";
  TILELAB_REQUIRE(free_elements >= 1)
      << kind << " '" << name << "': free size must be positive, got " << free_elements;
  TILELAB_REQUIRE(free_elements <= (int64_t{1} << 40))
      << kind << " '" << name << "': free size " << free_elements << " is beyond any memory";
  const int64_t bytes = free_elements * dtype_size(dtype);
  if (memory == Memory::psum) {
    TILELAB_REQUIRE(bytes <= m.psum_bank_bytes_per_partition)
        << "psum_tile '" << name << "': " << bytes
        << " B per partition exceeds one PSUM bank (psum_bank_bytes_per_partition = "
        << m.psum_bank_bytes_per_partition << ", i.e. " << m.psum_bank_bytes_per_partition / 4
        << " fp32)";
  }
  reserve_buffer_elements(name, uint64_t(partitions) * uint64_t(free_elements));
  PartitionAllocator& allocator = memory == Memory::sbuf ? sbuf_ : psum_;
  const auto address = allocator.allocate(bytes);
  if (!address && !required) {
    buffer_elements_ -= uint64_t(partitions) * uint64_t(free_elements);
    return Tile{};
  }
  if (!address) {
    // Name the live tiles, largest first, like the compiler's allocation failure.
    std::vector<const Buffer*> live;
    for (const Buffer& b : program_.buffers)
      if (b.memory == memory && !b.released) live.push_back(&b);
    std::sort(live.begin(), live.end(), [](const Buffer* a, const Buffer* b) {
      return a->bytes_per_partition() > b->bytes_per_partition();
    });
    std::ostringstream out;
    out << (memory == Memory::sbuf ? "SBUF" : "PSUM") << " allocation failed for tile '" << name
        << "' (" << bytes << " B per partition): " << allocator.used() << " of "
        << allocator.capacity() << " B per partition in use, largest free block "
        << allocator.largest_free_block() << " B; live tiles:";
    for (size_t i = 0; i < live.size() && i < 16; ++i)
      out << (i ? ", " : " ") << live[i]->name << " (" << live[i]->bytes_per_partition() << " B)";
    if (live.size() > 16) out << ", ... (" << live.size() - 16 << " more)";
    throw Error(out.str());
  }
  Buffer b;
  b.name = name;
  b.memory = memory;
  b.dtype = dtype;
  b.partitions = static_cast<uint32_t>(partitions);
  b.free_elements = static_cast<uint64_t>(free_elements);
  b.shape = {partitions, free_elements};
  b.address = *address;
  // Released tiles whose bytes overlap this one: the new tile's first access must wait for them.
  for (uint32_t i = 0; i < program_.buffers.size(); ++i) {
    const Buffer& old = program_.buffers[i];
    if (old.memory != memory || !old.released) continue;
    const int64_t old_end = old.address + static_cast<int64_t>(old.bytes_per_partition());
    if (old.address < *address + bytes && *address < old_end) b.predecessors.push_back(i);
  }
  program_.buffers.push_back(std::move(b));
  if (memory == Memory::sbuf)
    program_.peak_sbuf_bytes_per_partition = sbuf_.peak();
  else
    program_.peak_psum_bytes_per_partition = psum_.peak();
  return Tile{static_cast<uint32_t>(program_.buffers.size() - 1)};
}

Tile ProgramBuilder::sbuf_tile(const std::string& name, int partitions, int64_t free_elements,
                               DType dtype) {
  return allocate_tile(name, Memory::sbuf, partitions, free_elements, dtype);
}

Tile ProgramBuilder::psum_tile(const std::string& name, int partitions, int64_t free_elements,
                               DType dtype) {
  return allocate_tile(name, Memory::psum, partitions, free_elements, dtype);
}

Tile ProgramBuilder::try_tile(const std::string& name, Memory memory, int partitions,
                              int64_t free_elements, DType dtype) {
  TILELAB_REQUIRE(memory != Memory::hbm) << "try_tile '" << name << "': tiles live in SBUF or PSUM";
  return allocate_tile(name, memory, partitions, free_elements, dtype, false);
}

void ProgramBuilder::release(Tile tile) {
  TILELAB_REQUIRE(tile.id < program_.buffers.size() &&
                  program_.buffers[tile.id].memory != Memory::hbm)
      << "release: not a tile (id " << tile.id << ")";
  Buffer& b = program_.buffers[tile.id];
  TILELAB_REQUIRE(!b.released) << "release: tile '" << b.name << "' was already released";
  b.released = true;
  (b.memory == Memory::sbuf ? sbuf_ : psum_)
      .release(b.address, static_cast<int64_t>(b.bytes_per_partition()));
}

TilePool ProgramBuilder::pool(const std::string& name, Memory memory, int partitions,
                              int64_t free_elements, DType dtype, int buffers) {
  TILELAB_REQUIRE(buffers >= 1) << "pool '" << name << "': buffers must be >= 1, got " << buffers;
  TILELAB_REQUIRE(memory != Memory::hbm) << "pool '" << name << "': pools live in SBUF or PSUM";
  TilePool p;
  for (int i = 0; i < buffers; ++i) {
    const Tile t = allocate_tile(buffers == 1 ? name : name + "[" + std::to_string(i) + "]", memory,
                                 partitions, free_elements, dtype);
    if (i == 0) p.first = t.id;
  }
  p.count = static_cast<uint32_t>(buffers);
  return p;
}

Tile ProgramBuilder::next(TilePool& pool) {
  TILELAB_REQUIRE(pool.count > 0) << "next: empty or released pool";
  const Tile t{pool.first + pool.next};
  pool.next = (pool.next + 1) % pool.count;
  return t;
}

void ProgramBuilder::release(TilePool& pool) {
  for (uint32_t i = 0; i < pool.count; ++i) release(Tile{pool.first + i});
  pool.count = 0;
}

TileRef ProgramBuilder::view(Tile tile) const {
  TILELAB_REQUIRE(tile.id < program_.buffers.size() &&
                  program_.buffers[tile.id].memory != Memory::hbm)
      << "view: not a tile (id " << tile.id << ")";
  const Buffer& b = program_.buffers[tile.id];
  return view(tile, 0, static_cast<int>(b.partitions), 0, static_cast<int64_t>(b.free_elements));
}

namespace {

[[noreturn, gnu::cold, gnu::noinline]] void bad_view(const Program& program, Tile tile, int p0,
                                                     int partitions, int64_t offset, int64_t count,
                                                     int64_t stride) {
  TILELAB_REQUIRE(tile.id < program.buffers.size() &&
                  program.buffers[tile.id].memory != Memory::hbm)
      << "view: not a tile (id " << tile.id << ")";
  const Buffer& b = program.buffers[tile.id];
  TILELAB_REQUIRE(p0 >= 0 && partitions >= 1 && p0 + partitions <= static_cast<int>(b.partitions))
      << "view of '" << b.name << "': partitions [" << p0 << ", " << p0 + partitions
      << ") outside the tile's [0, " << b.partitions << ")";
  TILELAB_REQUIRE(count >= 1) << "view of '" << b.name << "': free count must be >= 1, got "
                              << count;
  TILELAB_REQUIRE(stride >= 0 && stride <= INT32_MAX)
      << "view of '" << b.name << "': free stride must be in [0, 2^31), got " << stride;
  const int64_t last = offset + (count - 1) * stride;
  TILELAB_REQUIRE(false) << "view of '" << b.name << "': free elements [" << offset << ", "
                         << last + 1 << ") outside the tile's [0, " << b.free_elements << ")";
  std::abort();  // unreachable: the last check always throws
}

}  // namespace

TileRef ProgramBuilder::view(Tile tile, int p0, int partitions, int64_t offset, int64_t count,
                             int64_t stride) const {
  // The checks of bad_view, without building messages on the path every operand takes.
  if (tile.id >= program_.buffers.size() || program_.buffers[tile.id].memory == Memory::hbm ||
      p0 < 0 || partitions < 1 ||
      p0 + partitions > static_cast<int>(program_.buffers[tile.id].partitions) || count < 1 ||
      stride < 0 || stride > INT32_MAX || offset < 0 ||
      offset + (count - 1) * stride >=
          static_cast<int64_t>(program_.buffers[tile.id].free_elements)) [[unlikely]]
    bad_view(program_, tile, p0, partitions, offset, count, stride);
  TileRef r;
  r.tile = tile.id;
  r.partition_start = static_cast<uint16_t>(p0);
  r.partition_count = static_cast<uint16_t>(partitions);
  r.free_offset = static_cast<uint32_t>(offset);
  r.free_count = static_cast<uint32_t>(count);
  r.free_stride = static_cast<int32_t>(stride);
  return r;
}

TileRef ProgramBuilder::view(Tile tile, int p0, int partitions, int64_t offset, int64_t outer_count,
                             int64_t outer_stride, int64_t inner_count,
                             int64_t inner_stride) const {
  TileRef r = view(tile, p0, partitions, offset, inner_count, inner_stride);
  const Buffer& b = program_.buffers[tile.id];
  TILELAB_REQUIRE(outer_count >= 1 && outer_count * inner_count <= UINT32_MAX)
      << "view of '" << b.name << "': outer count must be >= 1 and the element count below 2^32, "
      << "got " << outer_count << " x " << inner_count;
  TILELAB_REQUIRE(outer_stride >= 0 && outer_stride <= INT32_MAX)
      << "view of '" << b.name << "': outer stride must be in [0, 2^31), got " << outer_stride;
  r.free_count = static_cast<uint32_t>(outer_count * inner_count);
  if (outer_count > 1) {
    r.inner_count = static_cast<uint32_t>(inner_count);
    r.outer_stride = static_cast<int32_t>(outer_stride);
  }
  TILELAB_REQUIRE(r.last_free_element() < b.free_elements)
      << "view of '" << b.name << "': reaches free element " << r.last_free_element()
      << ", outside the tile's [0, " << b.free_elements << ")";
  return r;
}

HbmPattern ProgramBuilder::hbm_rows(Tensor tensor, int64_t row0, int64_t rows, int64_t col0,
                                    int64_t cols, int64_t batch) const {
  TILELAB_REQUIRE(tensor.id < program_.buffers.size() &&
                  program_.buffers[tensor.id].memory == Memory::hbm)
      << "hbm_rows: not an HBM tensor (id " << tensor.id << ")";
  const Buffer& b = program_.buffers[tensor.id];
  TILELAB_REQUIRE(b.shape.size() >= 2)
      << "hbm_rows of '" << b.name << "': needs a tensor of rank >= 2, got rank " << b.shape.size();
  const int64_t total_rows = b.shape[b.shape.size() - 2];
  const int64_t total_cols = b.shape.back();
  const int64_t batches = static_cast<int64_t>(b.free_elements) / (total_rows * total_cols);
  TILELAB_REQUIRE(batch >= 0 && batch < batches)
      << "hbm_rows of '" << b.name << "': batch " << batch << " outside [0, " << batches << ")";
  TILELAB_REQUIRE(row0 >= 0 && rows >= 1 && row0 + rows <= total_rows)
      << "hbm_rows of '" << b.name << "': rows [" << row0 << ", " << row0 + rows << ") outside [0, "
      << total_rows << ")";
  TILELAB_REQUIRE(col0 >= 0 && cols >= 1 && col0 + cols <= total_cols)
      << "hbm_rows of '" << b.name << "': columns [" << col0 << ", " << col0 + cols
      << ") outside [0, " << total_cols << ")";
  TILELAB_REQUIRE(rows <= program_.machine.partitions)
      << "hbm_rows of '" << b.name << "': " << rows << " rows exceed the partition limit "
      << program_.machine.partitions << " (pmax)";
  HbmPattern p;
  p.tensor = tensor.id;
  p.offset = batch * total_rows * total_cols + row0 * total_cols + col0;
  p.partition_stride = total_cols;
  p.partitions = static_cast<uint32_t>(rows);
  p.rank = 1;
  p.counts = {cols, 1, 1};
  p.strides = {1, 1, 1};
  return p;
}

HbmPattern ProgramBuilder::hbm_pattern(Tensor tensor, int64_t offset, int64_t partition_stride,
                                       int partitions,
                                       std::vector<std::pair<int64_t, int64_t>> free_dims) const {
  TILELAB_REQUIRE(tensor.id < program_.buffers.size() &&
                  program_.buffers[tensor.id].memory == Memory::hbm)
      << "hbm_pattern: not an HBM tensor (id " << tensor.id << ")";
  const Buffer& b = program_.buffers[tensor.id];
  TILELAB_REQUIRE(!free_dims.empty() && free_dims.size() <= 3)
      << "hbm_pattern of '" << b.name << "': 1 to 3 free dimensions allowed, got "
      << free_dims.size();
  TILELAB_REQUIRE(partitions >= 1 && partitions <= program_.machine.partitions)
      << "hbm_pattern of '" << b.name << "': partitions " << partitions << " must be in [1, "
      << program_.machine.partitions << "]";
  TILELAB_REQUIRE(offset >= 0 && partition_stride >= 0)
      << "hbm_pattern of '" << b.name << "': offset and partition stride must be >= 0";
  HbmPattern p;
  p.tensor = tensor.id;
  p.offset = offset;
  p.partition_stride = partition_stride;
  p.partitions = static_cast<uint32_t>(partitions);
  p.rank = static_cast<uint8_t>(free_dims.size());
  int64_t last = offset + (partitions - 1) * partition_stride;
  for (size_t d = 0; d < free_dims.size(); ++d) {
    const auto [count, stride] = free_dims[d];
    TILELAB_REQUIRE(count >= 1 && stride >= 0)
        << "hbm_pattern of '" << b.name << "': free dim " << d << " needs count >= 1 and stride "
        << ">= 0, got [" << count << ", " << stride << "]";
    p.counts[d] = count;
    p.strides[d] = stride;
    last += (count - 1) * stride;
  }
  TILELAB_REQUIRE(last < static_cast<int64_t>(b.free_elements))
      << "hbm_pattern of '" << b.name << "': reaches element " << last << ", tensor has "
      << b.free_elements << " elements";
  return p;
}

namespace {

// Partition start rule of the engines' access (the compiler's allocator enforces it).
bool allowed_partition_start(int partitions, int start) {
  return partitions > 64   ? start == 0
         : partitions > 32 ? (start == 0 || start == 64)
                           : start % 32 == 0;
}

}  // namespace

// The error paths of the per-operand checks, out of line: building an error message inlined into
// the checks would make every instruction pay for its stack frame.
void ProgramBuilder::operand_is_not_a_tile(const TileRef& ref, const char* instruction,
                                           const char* operand) const {
  const Program& p = program_;
  const bool tile =
      ref.valid() && ref.tile < p.buffers.size() && p.buffers[ref.tile].memory != Memory::hbm;
  TILELAB_REQUIRE(tile) << instruction << ": operand '" << operand << "' is not a tile view";
  TILELAB_REQUIRE(false) << instruction << ": operand '" << operand << "' uses tile '"
                         << p.buffers[ref.tile].name << "' after it was released";
  std::abort();  // unreachable: the second check always throws
}

void ProgramBuilder::check_compute_operand(const TileRef& ref, const char* instruction,
                                           const char* operand, Engine engine) const {
  // The checks of report_bad_compute_operand, without building messages on the path every
  // operand takes.
  const Buffer& b = buffer_of(ref, instruction, operand);
  const Machine& m = program_.machine;
  const int n = ref.partition_count;
  const int p0 = ref.partition_start;
  const int64_t limit =
      b.memory == Memory::psum ? m.engine_max_free_elements_psum : m.engine_max_free_elements_sbuf;
  if ((engine != Engine::gpsimd || b.memory == Memory::sbuf) && allowed_partition_start(n, p0) &&
      ref.free_count <= limit) [[likely]]
    return;
  report_bad_compute_operand(ref, instruction, operand, engine);
}

void ProgramBuilder::report_bad_compute_operand(const TileRef& ref, const char* instruction,
                                                const char* operand, Engine engine) const {
  const Buffer& b = buffer_of(ref, instruction, operand);
  const Machine& m = program_.machine;
  if (engine == Engine::gpsimd) {
    TILELAB_REQUIRE(b.memory == Memory::sbuf)
        << instruction << ": operand '" << operand << "' (" << program_.describe(ref)
        << ") is in PSUM; GpSimd cannot access PSUM";
  }
  const int n = ref.partition_count;
  const int p0 = ref.partition_start;
  TILELAB_REQUIRE(allowed_partition_start(n, p0))
      << instruction << ": operand '" << operand << "' starts at partition " << p0 << " with " << n
      << " partitions; allowed starts: 0 (65-128 partitions), 0 or 64 (33-64), "
      << "0/32/64/96 (1-32)";
  const int64_t limit =
      b.memory == Memory::psum ? m.engine_max_free_elements_psum : m.engine_max_free_elements_sbuf;
  TILELAB_REQUIRE(ref.free_count <= limit)
      << instruction << ": operand '" << operand << "' has " << ref.free_count
      << " free elements; the limit in " << memory_name(b.memory) << " is " << limit
      << (b.memory == Memory::psum ? " (engine_max_free_elements_psum)"
                                   : " (engine_max_free_elements_sbuf)");
  TILELAB_CHECK(false) << "report_bad_compute_operand: " << instruction << " operand '" << operand
                       << "' passes every check";
  std::abort();  // unreachable: the check above always throws
}

void ProgramBuilder::check_same_partitions(const TileRef& a, const TileRef& b,
                                           const char* instruction, const char* a_name,
                                           const char* b_name) const {
  TILELAB_REQUIRE(a.partition_count == b.partition_count)
      << instruction << ": '" << a_name << "' has " << a.partition_count << " partitions but '"
      << b_name << "' has " << b.partition_count << "; they must match";
}

void ProgramBuilder::check_elements(const TileRef& dst, const TileRef& src,
                                    const char* instruction) const {
  check_same_partitions(dst, src, instruction, "dst", "src");
  TILELAB_REQUIRE(dst.free_count == src.free_count)
      << instruction << ": dst has " << dst.free_count << " free elements but src has "
      << src.free_count;
}

void ProgramBuilder::check_scalar(const Scalar& s, const TileRef& data, const char* instruction,
                                  const char* operand) const {
  if (!s.tile.valid()) return;
  buffer_of(s.tile, instruction, operand);
  TILELAB_REQUIRE(s.tile.free_count == 1)
      << instruction << ": per-partition scalar '" << operand << "' must be [P, 1], got "
      << s.tile.free_count << " free elements";
  check_same_partitions(data, s.tile, instruction, "data", operand);
}

void ProgramBuilder::require_engine(Opcode opcode, Engine engine) const {
  TILELAB_REQUIRE(can_issue(opcode, engine))
      << opcode_name(opcode) << ": engine " << engine_name(engine) << " not allowed; "
      << engine_set_name(opcode_info(opcode).engines);
}

Instruction& ProgramBuilder::append_blank(Opcode opcode, Engine engine) {
  TILELAB_REQUIRE(program_.instructions.size() < limits_.max_instructions)
      << "program '" << program_.name << "': more than " << limits_.max_instructions
      << " instructions (max_instructions); use a smaller problem or raise the limit";
  // A copy of a blank instruction: value-initializing one in place compiles to `rep stos`, whose
  // start-up costs more than the copy.
  static const Instruction kBlank{};
  Instruction& instr = program_.instructions.emplace_back(kBlank);
  instr.opcode = opcode;
  instr.engine = engine;
  instr.source = current_source_;
  return instr;
}

// Every instruction agrees with its opcode's table entry; the stages rely on it. Checked without
// the messages' code on the path every instruction takes (the default paged batch built about 3%
// faster).
void ProgramBuilder::check_appended() {
  const Instruction& instr = program_.instructions.back();
  const OpcodeInfo& info = opcode_info(instr.opcode);
  bool agrees = can_issue(instr.opcode, instr.engine) && info.dma == (instr.dma != kNone);
  for (int s = 0; s < kSlotCount; ++s)
    agrees &= !instr.operands[s].valid() || info.operands[s] != OperandRole::none;
  if (!agrees) [[unlikely]]
    report_disagreeing_append();
}

void ProgramBuilder::report_disagreeing_append() {
  // A failed check discards the instruction, so that the program stays as it was.
  struct DiscardUnlessChecked {
    std::vector<Instruction>& instructions;
    bool checked = false;
    ~DiscardUnlessChecked() {
      if (!checked) instructions.pop_back();
    }
  } guard{program_.instructions};
  const Instruction& instr = program_.instructions.back();
  const OpcodeInfo& info = opcode_info(instr.opcode);
  TILELAB_CHECK(can_issue(instr.opcode, instr.engine))
      << info.name << " issued on " << engine_name(instr.engine);
  TILELAB_CHECK(info.dma == (instr.dma != kNone)) << info.name << ": DMA record mismatch";
  for (int s = 0; s < kSlotCount; ++s)
    TILELAB_CHECK(!instr.operands[s].valid() || info.operands[s] != OperandRole::none)
        << info.name << ": operand slot " << kSlotNames[s] << " is not used by this opcode";
  guard.checked = true;
}

template <typename Fill>
void ProgramBuilder::append(Opcode opcode, Engine engine, Fill&& fill) {
  fill(append_blank(opcode, engine));
  check_appended();
}

uint32_t ProgramBuilder::add_source(const SourceLocation& location) {
  TILELAB_REQUIRE(location.line >= 1)
      << "add_source: line must be >= 1, got " << location.line << " (" << location.file << ")";
  TILELAB_REQUIRE(location.caller == kNone || location.caller < program_.sources.size())
      << "add_source: caller " << location.caller << " is not a source id (have "
      << program_.sources.size() << ")";
  const auto key =
      std::make_tuple(location.file, location.line, location.function, location.caller);
  const auto [it, inserted] =
      source_ids_.try_emplace(key, static_cast<uint32_t>(program_.sources.size()));
  if (inserted) program_.sources.push_back(location);
  return it->second;
}

void ProgramBuilder::set_source(uint32_t source) {
  TILELAB_REQUIRE(source == kNone || source < program_.sources.size())
      << "set_source: " << source << " is not a source id (have " << program_.sources.size() << ")";
  current_source_ = source;
}

uint32_t ProgramBuilder::add_dma(DmaRecord record, const DmaOptions& options) {
  const Machine& m = program_.machine;
  const int queue = options.queue >= 0 ? options.queue : default_dma_queue(options.trigger);
  TILELAB_REQUIRE(queue < m.dma_queues_per_engine)
      << "dma: queue " << queue << " outside [0, " << m.dma_queues_per_engine
      << ") (dma_queues_per_engine)";
  record.queue = static_cast<uint8_t>(queue);
  program_.dmas.push_back(record);
  return static_cast<uint32_t>(program_.dmas.size() - 1);
}

namespace {
// Applies a partition mask (`partition < active`) to both sides of a transfer.
int masked_partitions(const DmaOptions& options, int partitions, const char* instruction) {
  if (options.active_partitions < 0) return partitions;
  TILELAB_REQUIRE(options.active_partitions >= 1 && options.active_partitions <= partitions)
      << instruction << ": partition mask keeps " << options.active_partitions
      << " partitions; allowed [1, " << partitions << "]";
  return options.active_partitions;
}
}  // namespace

void ProgramBuilder::dma_copy(const TileRef& dst, const HbmPattern& src, DmaOptions options) {
  dma_between_hbm_and_tile(dst, src, /*hbm_is_source=*/true, options);
}

void ProgramBuilder::dma_copy(const HbmPattern& dst, const TileRef& src, DmaOptions options) {
  dma_between_hbm_and_tile(src, dst, /*hbm_is_source=*/false, options);
}

namespace {

// A transfer of `partitions` rows of `free_count` elements of `dtype` from partition
// `partition_start`, contiguous in runs of `run_elements`.
DmaRecord copy_record(uint32_t partition_start, int partitions, int64_t free_count,
                      int64_t run_elements, DType dtype) {
  DmaRecord r;
  r.partition_start = partition_start;
  r.partitions = static_cast<uint32_t>(partitions);
  r.bytes_per_partition = static_cast<uint64_t>(free_count) * dtype_size(dtype);
  r.run_bytes = static_cast<uint64_t>(run_elements) * dtype_size(dtype);
  return r;
}

}  // namespace

void ProgramBuilder::push_dma(Opcode opcode, const DmaRecord& record, const DmaOptions& options,
                              const TileRef& dst, const TileRef& src) {
  const uint32_t dma = add_dma(record, options);
  append(opcode, options.trigger, [&](Instruction& instr) {
    instr.dma = dma;
    instr.operands[kDst] = dst;
    instr.operands[kSrc0] = src;
  });
}

// A load (HBM -> SBUF tile) or a store (SBUF tile -> HBM): one checked path for both directions.
void ProgramBuilder::dma_between_hbm_and_tile(const TileRef& tile_in, const HbmPattern& hbm_in,
                                              bool hbm_is_source, const DmaOptions& options) {
  const char* tile_side = hbm_is_source ? "dst" : "src";
  const char* hbm_side = hbm_is_source ? "src" : "dst";
  const Buffer& tile_buffer = buffer_of(tile_in, "dma_copy", tile_side);
  TILELAB_REQUIRE(tile_buffer.memory == Memory::sbuf)
      << "dma_copy: " << tile_side << " '" << tile_buffer.name << "' is in PSUM; "
      << (hbm_is_source ? "DMA writes SBUF tiles" : "copy it to SBUF before storing");
  TILELAB_REQUIRE(hbm_in.tensor < program_.buffers.size())
      << "dma_copy: " << hbm_side << " is not an HBM access pattern";
  TILELAB_REQUIRE(hbm_in.partitions == tile_in.partition_count)
      << "dma_copy: " << hbm_side << " covers " << hbm_in.partitions << " partitions but "
      << tile_side << " '" << tile_buffer.name << "' has " << tile_in.partition_count;
  TILELAB_REQUIRE(hbm_in.free_elements() == tile_in.free_count)
      << "dma_copy: " << hbm_side << " has " << hbm_in.free_elements()
      << " elements per partition but " << tile_side << " '" << tile_buffer.name << "' has "
      << tile_in.free_count;
  const int partitions = masked_partitions(options, tile_in.partition_count, "dma_copy");
  TileRef tile = tile_in;
  tile.partition_count = static_cast<uint16_t>(partitions);
  HbmPattern hbm = hbm_in;
  hbm.partitions = static_cast<uint32_t>(partitions);
  const Buffer& tensor = program_.buffers[hbm.tensor];
  DmaRecord r = copy_record(tile.partition_start, partitions, tile.free_count,
                            std::min(contiguous_run_elements(hbm), contiguous_run_elements(tile)),
                            tensor.dtype);
  r.hbm = hbm;
  r.hbm_is_source = hbm_is_source;
  r.hbm_is_destination = !hbm_is_source;
  push_dma(Opcode::dma_copy, r, options, hbm_is_source ? tile : TileRef{},
           hbm_is_source ? TileRef{} : tile);
}

void ProgramBuilder::dma_copy(const TileRef& dst_in, const TileRef& src_in, DmaOptions options) {
  const Buffer& dst_buffer = buffer_of(dst_in, "dma_copy", "dst");
  const Buffer& src_buffer = buffer_of(src_in, "dma_copy", "src");
  TILELAB_REQUIRE(dst_buffer.memory == Memory::sbuf && src_buffer.memory == Memory::sbuf)
      << "dma_copy: tile-to-tile DMA moves SBUF to SBUF; got " << memory_name(src_buffer.memory)
      << " -> " << memory_name(dst_buffer.memory);
  check_elements(dst_in, src_in, "dma_copy");
  const int partitions = masked_partitions(options, dst_in.partition_count, "dma_copy");
  TileRef dst = dst_in;
  TileRef src = src_in;
  dst.partition_count = src.partition_count = static_cast<uint16_t>(partitions);
  const DmaRecord r = copy_record(
      dst.partition_start, partitions, src.free_count,
      std::min(contiguous_run_elements(dst), contiguous_run_elements(src)), src_buffer.dtype);
  push_dma(Opcode::dma_copy, r, options, dst, src);
}

void ProgramBuilder::dma_gather(const TileRef& dst, Tensor tensor, const TileRef& index,
                                int64_t col0, DmaOptions options) {
  TILELAB_REQUIRE(tensor.id < program_.buffers.size() &&
                  program_.buffers[tensor.id].memory == Memory::hbm)
      << "dma_gather: source is not an HBM tensor";
  const Buffer& t = program_.buffers[tensor.id];
  const int64_t rows = t.shape.front();
  gather_rows(dst, tensor, 0, rows, static_cast<int64_t>(t.free_elements) / rows, index, col0,
              options);
}

void ProgramBuilder::dma_gather(const TileRef& dst, Tensor tensor, int64_t batch,
                                const TileRef& index, int64_t col0, DmaOptions options) {
  TILELAB_REQUIRE(tensor.id < program_.buffers.size() &&
                  program_.buffers[tensor.id].memory == Memory::hbm)
      << "dma_gather: source is not an HBM tensor";
  const Buffer& t = program_.buffers[tensor.id];
  TILELAB_REQUIRE(t.shape.size() >= 3)
      << "dma_gather of '" << t.name << "' by batch: needs a tensor of rank >= 3, got rank "
      << t.shape.size();
  const int64_t rows = t.shape[t.shape.size() - 2];
  const int64_t cols = t.shape.back();
  const int64_t batches = static_cast<int64_t>(t.free_elements) / (rows * cols);
  TILELAB_REQUIRE(batch >= 0 && batch < batches)
      << "dma_gather of '" << t.name << "': batch " << batch << " outside [0, " << batches << ")";
  gather_rows(dst, tensor, batch * rows, rows, cols, index, col0, options);
}

void ProgramBuilder::gather_rows(const TileRef& dst, Tensor tensor, int64_t row_offset,
                                 int64_t rows, int64_t cols, const TileRef& index, int64_t col0,
                                 DmaOptions options) {
  TILELAB_REQUIRE(tensor.id < program_.buffers.size() &&
                  program_.buffers[tensor.id].memory == Memory::hbm)
      << "dma_gather: source is not an HBM tensor";
  TILELAB_REQUIRE(rows >= 1 && cols >= 1 && row_offset >= 0 &&
                  (row_offset + rows) * cols <=
                      static_cast<int64_t>(program_.buffers[tensor.id].free_elements))
      << "dma_gather of '" << program_.buffers[tensor.id].name << "': rows [" << row_offset << ", "
      << row_offset + rows << ") of " << cols << " elements outside the tensor's "
      << program_.buffers[tensor.id].free_elements << " elements";
  const Buffer& dst_buffer = buffer_of(dst, "dma_gather", "dst");
  TILELAB_REQUIRE(dst_buffer.memory == Memory::sbuf)
      << "dma_gather: dst '" << dst_buffer.name << "' must be in SBUF";
  const Buffer& index_buffer = buffer_of(index, "dma_gather", "index");
  TILELAB_REQUIRE(index_buffer.memory == Memory::sbuf && index_buffer.dtype == DType::int32)
      << "dma_gather: index tile '" << index_buffer.name << "' must be an int32 SBUF tile, got "
      << dtype_name(index_buffer.dtype) << " in " << memory_name(index_buffer.memory);
  TILELAB_REQUIRE(index.free_count == 1)
      << "dma_gather: index must be [P, 1], got " << index.free_count << " free elements";
  check_same_partitions(dst, index, "dma_gather", "dst", "index");
  const Buffer& t = program_.buffers[tensor.id];
  TILELAB_REQUIRE(col0 >= 0 && col0 + dst.free_count <= cols)
      << "dma_gather: columns [" << col0 << ", " << col0 + dst.free_count << ") outside the "
      << cols << " elements of a row of '" << t.name << "'";
  if (options.trigger == Engine::sync) options.trigger = Engine::gpsimd;  // SWDGE only
  TILELAB_REQUIRE(can_issue(Opcode::dma_gather, options.trigger))
      << "dma_gather: indirect DMA needs software descriptor generation on gpsimd, got trigger "
      << engine_name(options.trigger);
  const int partitions = masked_partitions(options, dst.partition_count, "dma_gather");
  DmaRecord r;
  r.hbm.tensor = tensor.id;
  r.hbm.offset = row_offset * cols + col0;
  r.hbm.partition_stride = cols;
  r.hbm.partitions = static_cast<uint32_t>(rows);  // any row may be read
  r.hbm.counts = {static_cast<int64_t>(dst.free_count), 1, 1};
  r.hbm_is_source = true;
  r.indirect = true;
  r.partition_start = dst.partition_start;
  r.partitions = static_cast<uint32_t>(partitions);
  r.bytes_per_partition = static_cast<uint64_t>(dst.free_count) * dtype_size(t.dtype);
  r.run_bytes = static_cast<uint64_t>(contiguous_run_elements(dst)) * dtype_size(t.dtype);
  const uint32_t dma = add_dma(r, options);
  append(Opcode::dma_gather, options.trigger, [&](Instruction& instr) {
    instr.dma = dma;
    instr.operands[kDst] = dst;
    instr.operands[kDst].partition_count = static_cast<uint16_t>(partitions);
    instr.operands[kAux0] = index;
    instr.operands[kAux0].partition_count = static_cast<uint16_t>(partitions);
  });
}

namespace {
void require_dma_transpose(const Machine& m) {
  TILELAB_REQUIRE(m.dma_transpose_supported)
      << "dma_transpose: not supported on machine '" << m.name << "' (NeuronCore-v" << m.nc_version
      << "): key 'dma_transpose_supported' is false; use load + pe_transpose";
}
}  // namespace

void ProgramBuilder::dma_transpose(const TileRef& dst, const HbmPattern& src, DmaOptions options) {
  require_dma_transpose(program_.machine);
  const Buffer& dst_buffer = buffer_of(dst, "dma_transpose", "dst");
  TILELAB_REQUIRE(dst_buffer.memory == Memory::sbuf)
      << "dma_transpose: dst '" << dst_buffer.name << "' must be in SBUF";
  TILELAB_REQUIRE(src.tensor < program_.buffers.size() && src.rank == 1)
      << "dma_transpose: src must be a 2-D HBM access pattern [P, F]";
  const Buffer& tensor = program_.buffers[src.tensor];
  TILELAB_REQUIRE(dtype_size(tensor.dtype) == 2 || dtype_size(tensor.dtype) == 4)
      << "dma_transpose: dtype " << dtype_name(tensor.dtype) << " not allowed; 2- or 4-byte only";
  TILELAB_REQUIRE(dst.partition_count == src.counts[0] && dst.free_count == src.partitions)
      << "dma_transpose: src [" << src.partitions << ", " << src.counts[0] << "] needs dst ["
      << src.counts[0] << ", " << src.partitions << "], got [" << dst.partition_count << ", "
      << dst.free_count << "]";
  // A transpose writes whole destination rows: its runs are the rows.
  DmaRecord r = copy_record(dst.partition_start, dst.partition_count, dst.free_count,
                            dst.free_count, tensor.dtype);
  r.hbm = src;
  r.hbm_is_source = true;
  r.transpose = true;
  push_dma(Opcode::dma_transpose, r, options, dst, TileRef{});
}

void ProgramBuilder::dma_transpose(const TileRef& dst, const TileRef& src, DmaOptions options) {
  require_dma_transpose(program_.machine);
  const Buffer& dst_buffer = buffer_of(dst, "dma_transpose", "dst");
  const Buffer& src_buffer = buffer_of(src, "dma_transpose", "src");
  TILELAB_REQUIRE(dst_buffer.memory == Memory::sbuf && src_buffer.memory == Memory::sbuf)
      << "dma_transpose: tile-to-tile transposes move SBUF to SBUF";
  TILELAB_REQUIRE(dtype_size(src_buffer.dtype) == 2 || dtype_size(src_buffer.dtype) == 4)
      << "dma_transpose: dtype " << dtype_name(src_buffer.dtype)
      << " not allowed; 2- or 4-byte only";
  TILELAB_REQUIRE(dst.partition_count == src.free_count && dst.free_count == src.partition_count)
      << "dma_transpose: src [" << src.partition_count << ", " << src.free_count << "] needs dst ["
      << src.free_count << ", " << src.partition_count << "], got [" << dst.partition_count << ", "
      << dst.free_count << "]";
  DmaRecord r = copy_record(dst.partition_start, dst.partition_count, dst.free_count,
                            dst.free_count, src_buffer.dtype);
  r.transpose = true;
  push_dma(Opcode::dma_transpose, r, options, dst, src);
}

void ProgramBuilder::matmul(const TileRef& dst, const TileRef& stationary, const TileRef& moving,
                            bool accumulate) {
  const Machine& m = program_.machine;
  const Buffer& d = buffer_of(dst, "matmul", "dst");
  const Buffer& s = buffer_of(stationary, "matmul", "stationary");
  const Buffer& mv = buffer_of(moving, "matmul", "moving");
  TILELAB_REQUIRE(s.memory == Memory::sbuf && mv.memory == Memory::sbuf)
      << "matmul: TensorE reads only SBUF; stationary is in " << memory_name(s.memory)
      << ", moving in " << memory_name(mv.memory);
  TILELAB_REQUIRE(d.memory == Memory::psum && d.dtype == DType::fp32)
      << "matmul: dst '" << d.name << "' must be an fp32 PSUM tile, got " << dtype_name(d.dtype)
      << " in " << memory_name(d.memory);
  TILELAB_REQUIRE(is_float(s.dtype) && is_float(mv.dtype))
      << "matmul: integer operands (" << dtype_name(s.dtype) << ", " << dtype_name(mv.dtype)
      << ") are not supported by TensorE";
  TILELAB_REQUIRE(stationary.partition_count == moving.partition_count)
      << "matmul: contraction (partition) sizes differ: stationary " << stationary.partition_count
      << ", moving " << moving.partition_count;
  TILELAB_REQUIRE(stationary.partition_count <= m.matmul_max_contraction)
      << "matmul: contraction size " << stationary.partition_count
      << " exceeds pmax (matmul_max_contraction) = " << m.matmul_max_contraction;
  TILELAB_REQUIRE(stationary.free_count <= static_cast<uint32_t>(m.matmul_max_stationary_free))
      << "matmul: stationary free size " << stationary.free_count
      << " exceeds gemm_stationary_fmax (matmul_max_stationary_free) = "
      << m.matmul_max_stationary_free;
  TILELAB_REQUIRE(moving.free_count <= static_cast<uint32_t>(m.matmul_max_moving_free))
      << "matmul: moving free size " << moving.free_count
      << " exceeds gemm_moving_fmax (matmul_max_moving_free) = " << m.matmul_max_moving_free;
  TILELAB_REQUIRE(dst.partition_count == stationary.free_count &&
                  dst.free_count == moving.free_count)
      << "matmul: dst must be [" << stationary.free_count << ", " << moving.free_count
      << "] (stationary free x moving free), got [" << dst.partition_count << ", " << dst.free_count
      << "]";
  TILELAB_REQUIRE(dst.contiguous()) << "matmul: dst must be contiguous in PSUM";
  check_compute_operand(dst, "matmul", "dst", Engine::tensor);
  const int64_t first_byte = d.address + int64_t(dst.free_offset) * 4;
  const int64_t last_byte = first_byte + int64_t(dst.free_count) * 4 - 1;
  TILELAB_REQUIRE(first_byte / m.psum_bank_bytes_per_partition ==
                  last_byte / m.psum_bank_bytes_per_partition)
      << "matmul: dst '" << d.name << "' crosses a PSUM bank boundary; a matmul output must fit "
      << "one bank (" << m.psum_bank_bytes_per_partition << " B per partition)";
  append(Opcode::matmul, Engine::tensor, [&](Instruction& instr) {
    instr.flags = accumulate ? kFlagAccumulate : 0;
    instr.operands[kDst] = dst;
    instr.operands[kSrc0] = stationary;
    instr.operands[kSrc1] = moving;
  });
}

void ProgramBuilder::pe_transpose(const TileRef& dst, const TileRef& src) {
  const Machine& m = program_.machine;
  const Buffer& d = buffer_of(dst, "pe_transpose", "dst");
  const Buffer& s = buffer_of(src, "pe_transpose", "src");
  TILELAB_REQUIRE(s.memory == Memory::sbuf)
      << "pe_transpose: src '" << s.name << "' must be in SBUF (TensorE reads only SBUF)";
  TILELAB_REQUIRE(d.memory == Memory::psum)
      << "pe_transpose: dst '" << d.name << "' must be in PSUM";
  const bool sixteen_bit_out =
      m.pe_transpose_16bit_output_supported && dtype_size(s.dtype) == 2 && d.dtype == s.dtype;
  TILELAB_REQUIRE(d.dtype == DType::fp32 || sixteen_bit_out)
      << "pe_transpose: dst dtype " << dtype_name(d.dtype) << " not allowed on machine '" << m.name
      << "'; fp32"
      << (m.pe_transpose_16bit_output_supported
              ? " or the 16-bit input dtype"
              : " (key 'pe_transpose_16bit_output_supported' is false)");
  TILELAB_REQUIRE(src.free_count <= static_cast<uint32_t>(m.matmul_max_stationary_free))
      << "pe_transpose: input free size " << src.free_count
      << " exceeds matmul_max_stationary_free = " << m.matmul_max_stationary_free;
  TILELAB_REQUIRE(dst.partition_count == src.free_count && dst.free_count == src.partition_count)
      << "pe_transpose: src [" << src.partition_count << ", " << src.free_count << "] needs dst ["
      << src.free_count << ", " << src.partition_count << "], got [" << dst.partition_count << ", "
      << dst.free_count << "]";
  check_compute_operand(dst, "pe_transpose", "dst", Engine::tensor);
  append(Opcode::pe_transpose, Engine::tensor, [&](Instruction& instr) {
    instr.operands[kDst] = dst;
    instr.operands[kSrc0] = src;
  });
}

void ProgramBuilder::activation(const TileRef& dst, const TileRef& src, ActFunc func,
                                const ActivationOptions& options) {
  check_compute_operand(dst, "activation", "dst", Engine::scalar);
  check_compute_operand(src, "activation", "data", Engine::scalar);
  check_elements(dst, src, "activation");
  if (options.bias.valid()) {
    const Buffer& b = buffer_of(options.bias, "activation", "bias");
    TILELAB_REQUIRE(is_float(b.dtype) && b.dtype != DType::fp8_e4m3)
        << "activation: bias dtype " << dtype_name(b.dtype) << " not allowed; fp32/fp16/bf16";
    check_scalar(Scalar::per_partition(options.bias), src, "activation", "bias");
  }
  if (options.scale_tile.valid())
    check_scalar(Scalar::per_partition(options.scale_tile), src, "activation", "scale");
  if (options.reduce_result.valid())
    check_scalar(Scalar::per_partition(options.reduce_result), src, "activation", "reduce_result");
  append(Opcode::activation, Engine::scalar, [&](Instruction& instr) {
    instr.op0 = static_cast<uint8_t>(func);
    instr.imm0 = options.scale;
    instr.operands[kDst] = dst;
    instr.operands[kSrc0] = src;
    if (options.bias.valid()) instr.operands[kSrc1] = options.bias;
    if (options.scale_tile.valid()) {
      instr.operands[kAux0] = options.scale_tile;
      instr.flags |= kFlagScalar0Tile;
    }
    if (options.reduce_result.valid()) {
      instr.operands[kAux1] = options.reduce_result;
      instr.flags |= kFlagReduce;
    }
  });
}

void ProgramBuilder::check_vector_pair(const TileRef& dst, const TileRef& a, const TileRef& b,
                                       const char* instruction, const char* a_name,
                                       const char* b_name) const {
  check_compute_operand(dst, instruction, "dst", Engine::vector);
  check_compute_operand(a, instruction, a_name, Engine::vector);
  check_compute_operand(b, instruction, b_name, Engine::vector);
  check_elements(dst, a, instruction);
  check_same_partitions(a, b, instruction, a_name, b_name);
  TILELAB_REQUIRE(a.free_count == b.free_count)
      << instruction << ": " << a_name << " has " << a.free_count << " free elements, " << b_name
      << " has " << b.free_count;
  TILELAB_REQUIRE(!(program_.buffers[a.tile].memory == Memory::psum &&
                    program_.buffers[b.tile].memory == Memory::psum))
      << instruction << ": both inputs are in PSUM; at most one input may be in PSUM";
}

void ProgramBuilder::tensor_tensor(const TileRef& dst, const TileRef& a, const TileRef& b,
                                   AluOp op) {
  TILELAB_REQUIRE(op != AluOp::bypass) << "tensor_tensor: op must not be bypass";
  check_vector_pair(dst, a, b, "tensor_tensor", "in0", "in1");
  append(Opcode::tensor_tensor, Engine::vector, [&](Instruction& instr) {
    instr.op0 = static_cast<uint8_t>(op);
    instr.operands[kDst] = dst;
    instr.operands[kSrc0] = a;
    instr.operands[kSrc1] = b;
  });
}

void ProgramBuilder::tensor_tensor_scan(const TileRef& dst, const TileRef& a, const TileRef& b,
                                        AluOp op0, AluOp op1, Scalar initial, bool reverse0,
                                        bool reverse1) {
  TILELAB_REQUIRE(op0 != AluOp::bypass && op1 != AluOp::bypass)
      << "tensor_tensor_scan: op0 and op1 must be arithmetic operators, not bypass";
  check_vector_pair(dst, a, b, "tensor_tensor_scan", "data0", "data1");
  check_scalar(initial, a, "tensor_tensor_scan", "initial");
  append(Opcode::tensor_tensor_scan, Engine::vector, [&](Instruction& instr) {
    instr.op0 = static_cast<uint8_t>(op0);
    instr.op1 = static_cast<uint8_t>(op1);
    instr.imm0 = initial.value;
    instr.flags =
        static_cast<uint8_t>((reverse0 ? kFlagReverse0 : 0) | (reverse1 ? kFlagReverse1 : 0));
    instr.operands[kDst] = dst;
    instr.operands[kSrc0] = a;
    instr.operands[kSrc1] = b;
    if (initial.tile.valid()) {
      instr.operands[kAux0] = initial.tile;
      instr.flags |= kFlagScalar0Tile;
    }
  });
}

void ProgramBuilder::tensor_scalar(const TileRef& dst, const TileRef& src, AluOp op0, Scalar s0,
                                   AluOp op1, Scalar s1, Engine engine) {
  require_engine(Opcode::tensor_scalar, engine);
  TILELAB_REQUIRE(op0 != AluOp::bypass) << "tensor_scalar: op0 must not be bypass";
  check_compute_operand(dst, "tensor_scalar", "dst", engine);
  check_compute_operand(src, "tensor_scalar", "data", engine);
  check_elements(dst, src, "tensor_scalar");
  check_scalar(s0, src, "tensor_scalar", "operand0");
  check_scalar(s1, src, "tensor_scalar", "operand1");
  append(Opcode::tensor_scalar, engine, [&](Instruction& instr) {
    instr.op0 = static_cast<uint8_t>(op0);
    instr.op1 = static_cast<uint8_t>(op1);
    instr.imm0 = s0.value;
    instr.imm1 = s1.value;
    instr.operands[kDst] = dst;
    instr.operands[kSrc0] = src;
    if (s0.tile.valid()) {
      instr.operands[kSrc1] = s0.tile;
      instr.flags |= kFlagScalar0Tile;
    }
    if (s1.tile.valid()) {
      instr.operands[kAux0] = s1.tile;
      instr.flags |= kFlagScalar1Tile;
    }
  });
}

void ProgramBuilder::check_vector_rows(const TileRef& dst, const TileRef& src,
                                       const char* instruction) const {
  check_compute_operand(dst, instruction, "dst", Engine::vector);
  check_compute_operand(src, instruction, "data", Engine::vector);
  check_same_partitions(dst, src, instruction, "dst", "data");
}

void ProgramBuilder::tensor_reduce(const TileRef& dst, const TileRef& src, AluOp op, bool negate) {
  TILELAB_REQUIRE(op == AluOp::add || op == AluOp::max || op == AluOp::min || op == AluOp::multiply)
      << "tensor_reduce: op " << alu_op_name(op) << " not allowed; add, multiply, max or min";
  check_vector_rows(dst, src, "tensor_reduce");
  TILELAB_REQUIRE(dst.free_count == 1)
      << "tensor_reduce: dst must be [P, 1] (reduction over the free axis), got " << dst.free_count
      << " free elements";
  append(Opcode::tensor_reduce, Engine::vector, [&](Instruction& instr) {
    instr.op0 = static_cast<uint8_t>(op);
    instr.flags = negate ? kFlagNegate : 0;
    instr.operands[kDst] = dst;
    instr.operands[kSrc0] = src;
  });
}

void ProgramBuilder::bn_stats(const TileRef& dst, const TileRef& src) {
  check_vector_rows(dst, src, "bn_stats");
  TILELAB_REQUIRE(dst.free_count == 6)
      << "bn_stats: dst must be [P, 6] (count, mean, variance x count of the even and the odd "
      << "elements), got " << dst.free_count << " free elements";
  const int64_t limit = program_.machine.bn_stats_max_free_elements;
  TILELAB_REQUIRE(src.free_count <= limit)
      << "bn_stats: data has " << src.free_count << " elements per partition; at most " << limit
      << " (bn_stats_max_free_elements); split the row and combine the groups with bn_aggr";
  append(Opcode::bn_stats, Engine::vector, [&](Instruction& instr) {
    instr.operands[kDst] = dst;
    instr.operands[kSrc0] = src;
  });
}

void ProgramBuilder::bn_aggr(const TileRef& dst, const TileRef& src) {
  check_vector_rows(dst, src, "bn_aggr");
  TILELAB_REQUIRE(src.free_count % 3 == 0)
      << "bn_aggr: data must hold (count, mean, variance x count) groups, a multiple of 3 "
      << "elements per partition; got " << src.free_count;
  TILELAB_REQUIRE(dst.free_count == 2)
      << "bn_aggr: dst must be [P, 2] (mean, variance), got " << dst.free_count << " free elements";
  append(Opcode::bn_aggr, Engine::vector, [&](Instruction& instr) {
    instr.operands[kDst] = dst;
    instr.operands[kSrc0] = src;
  });
}

void ProgramBuilder::tensor_copy(const TileRef& dst, const TileRef& src, Engine engine) {
  require_engine(Opcode::tensor_copy, engine);
  check_compute_operand(dst, "tensor_copy", "dst", engine);
  check_compute_operand(src, "tensor_copy", "src", engine);
  check_elements(dst, src, "tensor_copy");
  append(Opcode::tensor_copy, engine, [&](Instruction& instr) {
    instr.operands[kDst] = dst;
    instr.operands[kSrc0] = src;
  });
}

void ProgramBuilder::select(const TileRef& dst, const TileRef& condition, const TileRef& x,
                            Scalar y) {
  check_compute_operand(dst, "select", "dst", Engine::vector);
  check_compute_operand(condition, "select", "condition", Engine::vector);
  check_compute_operand(x, "select", "x", Engine::vector);
  check_elements(dst, x, "select");
  check_same_partitions(condition, x, "select", "condition", "x");
  TILELAB_REQUIRE(condition.free_count == x.free_count)
      << "select: condition has " << condition.free_count << " free elements, x has "
      << x.free_count;
  if (y.tile.valid()) {
    check_compute_operand(y.tile, "select", "y", Engine::vector);
    check_elements(dst, y.tile, "select");
  }
  append(Opcode::select, Engine::vector, [&](Instruction& instr) {
    instr.imm0 = y.value;
    instr.operands[kDst] = dst;
    instr.operands[kSrc0] = condition;
    instr.operands[kSrc1] = x;
    if (y.tile.valid()) {
      instr.operands[kAux0] = y.tile;
      instr.flags |= kFlagSelectYTile;
    }
  });
}

void ProgramBuilder::memset(const TileRef& dst, float value, Engine engine) {
  require_engine(Opcode::memset, engine);
  check_compute_operand(dst, "memset", "dst", engine);
  append(Opcode::memset, engine, [&](Instruction& instr) {
    instr.imm0 = value;
    instr.operands[kDst] = dst;
  });
}

void ProgramBuilder::iota(const TileRef& dst, int base, int partition_step, int free_step) {
  check_compute_operand(dst, "iota", "dst", Engine::gpsimd);
  append(Opcode::iota, Engine::gpsimd, [&](Instruction& instr) {
    instr.imm0 = static_cast<float>(base);
    instr.imm1 = static_cast<float>(free_step);
    instr.extra = partition_step;
    instr.operands[kDst] = dst;
  });
}

Program ProgramBuilder::finish() {
  TILELAB_REQUIRE(!finished_) << "finish: the program was already handed over";
  finished_ = true;
  program_.peak_sbuf_bytes_per_partition = sbuf_.peak();
  program_.peak_psum_bytes_per_partition = psum_.peak();
  instruction_capacity_hint = next_capacity_hint(program_.instructions.size(), kInitialCapacity);
  dma_capacity_hint = next_capacity_hint(program_.dmas.size(), kInitialCapacity / 8);
  return std::move(program_);
}

}  // namespace tilelab::sim
