// Digests of built programs, their per-instruction timing and their reports, pinned bit for bit:
// the builder, dependency tracker, DMA model and report are optimised for speed, and these show
// that no optimisation changed a single instruction, time, wait or reported number.
// The pinned values were computed before those optimisations; after an intended model change,
// print the new ones with TILELAB_PRINT_DIGESTS=1 and review the golden reports' diff as well.
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>

#include "sim/analysis.hpp"
#include "sim/kernels/registry.hpp"
#include "sim/report.hpp"
#include "test_util.hpp"

using namespace tilelab::sim;
using namespace tilelab::sim::test;

namespace {

// FNV-1a over the bytes of each value; doubles by their bit patterns (exact, not approximate).
class Digest {
 public:
  template <typename T>
  void add(const T& value) {
    static_assert(std::is_arithmetic_v<T> || std::is_enum_v<T>);
    if constexpr (std::is_floating_point_v<T>) {
      add(std::bit_cast<uint64_t>(static_cast<double>(value)));
    } else {
      const auto v = static_cast<uint64_t>(value);
      for (int i = 0; i < 8; ++i) byte(uint8_t(v >> (8 * i)));
    }
  }
  void add(const std::string& text) {
    add(text.size());
    for (char c : text) byte(static_cast<uint8_t>(c));
  }
  void add(const TileRef& r) {
    add(r.tile);
    add(r.partition_start);
    add(r.partition_count);
    add(r.free_offset);
    add(r.free_count);
    add(r.free_stride);
  }
  uint64_t value() const { return hash_; }

 private:
  void byte(uint8_t b) {
    hash_ ^= b;
    hash_ *= 0x100000001b3ull;
  }
  uint64_t hash_ = 0xcbf29ce484222325ull;
};

uint64_t program_digest(const Program& p) {
  Digest d;
  d.add(p.name);
  d.add(p.peak_sbuf_bytes_per_partition);
  d.add(p.peak_psum_bytes_per_partition);
  for (const Buffer& b : p.buffers) {
    d.add(b.name);
    d.add(b.memory);
    d.add(b.dtype);
    d.add(b.partitions);
    d.add(b.free_elements);
    for (int64_t s : b.shape) d.add(s);
    d.add(b.address);
    d.add(b.released);
    for (uint32_t pred : b.predecessors) d.add(pred);
  }
  for (const Instruction& i : p.instructions) {
    d.add(i.opcode);
    d.add(i.engine);
    d.add(i.op0);
    d.add(i.op1);
    d.add(i.flags);
    d.add(i.dma);
    d.add(i.extra);
    d.add(i.imm0);
    d.add(i.imm1);
    for (const TileRef& r : i.operands) d.add(r);
  }
  for (const DmaRecord& r : p.dmas) {
    d.add(r.hbm.tensor);
    d.add(r.hbm.offset);
    d.add(r.hbm.partition_stride);
    d.add(r.hbm.partitions);
    d.add(r.hbm.rank);
    for (int k = 0; k < 3; ++k) {
      d.add(r.hbm.counts[k]);
      d.add(r.hbm.strides[k]);
    }
    d.add(r.hbm_is_source);
    d.add(r.hbm_is_destination);
    d.add(r.transpose);
    d.add(r.indirect);
    d.add(r.queue);
    d.add(r.partition_start);
    d.add(r.partitions);
    d.add(r.bytes_per_partition);
    d.add(r.run_bytes);
  }
  return d.value();
}

uint64_t timing_digest(const TimingResult& t) {
  Digest d;
  for (const InstructionTiming& i : t.instructions) {
    d.add(i.start_ns);
    d.add(i.issue_end_ns);
    d.add(i.end_ns);
    d.add(i.transfer_start_ns);
    d.add(i.wait_on);
    d.add(i.transfer_wait_on);
    d.add(i.engine_previous);
    d.add(i.wait_reason);
    d.add(i.transfer_reason);
  }
  for (const DmaPieceTiming& p : t.dma_pieces) {
    d.add(p.instruction);
    d.add(p.engine);
    d.add(p.queue);
    d.add(p.bytes);
    d.add(p.start_ns);
    d.add(p.end_ns);
  }
  d.add(t.total_ns);
  for (double v : t.engine_active_ns) d.add(v);
  for (uint64_t v : t.engine_instructions) d.add(v);
  for (double v : t.dma_engine_busy_ns) d.add(v);
  for (uint64_t v : t.dma_engine_bytes) d.add(v);
  for (uint64_t v : t.dma_engine_pieces) d.add(v);
  d.add(t.hbm_read_bytes);
  d.add(t.hbm_write_bytes);
  d.add(t.region_merges);
  d.add(t.region_records_merged);
  return d.value();
}

// The full JSON report (every section, the critical path's segments and the idle-time blame) and
// the flat metrics a sweep returns.
uint64_t report_digest(const Program& p, const TimingResult& t, const KernelParameters& params,
                       const std::string& kernel) {
  ReportOptions options;
  options.kernel = kernel;
  options.parameters = params;
  const Report report = make_report(p, t, options);
  Digest d;
  d.add(report_json(report).dump());
  for (const Metric& m : flat_metrics(report)) {
    d.add(m.name);
    d.add(m.value);
  }
  return d.value();
}

struct DigestCase {
  const char* kernel;
  const char* machine;
  KernelParameters parameters;
  uint64_t program, timing, report;
};

void check(const DigestCase& c, const Program& program, const KernelParameters& parameters,
           const std::string& kernel_name) {
  TimingOptions with_pieces;
  with_pieces.record_dma_pieces = true;
  const TimingResult timing = simulate_timing(program, with_pieces);
  const uint64_t program_hash = program_digest(program);
  const uint64_t timing_hash = timing_digest(timing);
  const uint64_t report_hash = report_digest(program, timing, parameters, kernel_name);
  if (std::getenv("TILELAB_PRINT_DIGESTS")) {
    std::string given;
    for (const auto& [k, v] : c.parameters) given += " " + k + "=" + v;
    std::printf("%s on %s%s: 0x%016llxull, 0x%016llxull, 0x%016llxull\n", c.kernel, c.machine,
                given.c_str(), static_cast<unsigned long long>(program_hash),
                static_cast<unsigned long long>(timing_hash),
                static_cast<unsigned long long>(report_hash));
  }
  INFO(c.kernel << " on " << c.machine);
  CHECK(program_hash == c.program);
  CHECK(timing_hash == c.timing);
  CHECK(report_hash == c.report);
  // Timing without DMA pieces is the same run minus the piece list.
  const TimingResult plain = simulate_timing(program);
  CHECK(plain.dma_pieces.empty());
  CHECK(plain.total_ns == timing.total_ns);
  CHECK(plain.region_merges == timing.region_merges);
}

void check(const DigestCase& c) {
  const KernelInfo& kernel = kernel_registry().find(c.kernel);
  const KernelParameters parameters = resolve_parameters(kernel, c.parameters);
  check(c, kernel.build(load_machine(c.machine), parameters), parameters, kernel.name);
}

// What the kernels rarely do: overlapping and strided views, partial partition ranges, broadcast
// reads, region merges past the tracker's limit, released tiles whose memory is reused, every
// engine, GpSimd/VectorE port sharing and masked and SBUF-to-SBUF DMA.
Program irregular_program(const Machine& m) {
  ProgramBuilder b(m, "irregular");
  const Tensor x = b.hbm_tensor("x", {256, 1024}, DType::bf16);
  const Tensor y = b.hbm_tensor("y", {4, 128, 64}, DType::fp32);
  const Tile a = b.sbuf_tile("a", 128, 1024, DType::bf16);
  const Tile s = b.sbuf_tile("s", 128, 8, DType::fp32);
  TilePool ring = b.pool("ring", Memory::sbuf, 128, 64, DType::fp32, 3);
  const Tile acc = b.psum_tile("acc", 128, 512, DType::fp32);
  b.dma_copy(b.view(a), b.hbm_rows(x, 0, 128, 0, 1024));
  b.dma_copy(b.view(a, 0, 128, 0, 512, 2), b.hbm_pattern(x, 128 * 1024, 1024, 128, {{512, 2}}));
  for (int i = 0; i < 600; ++i) {
    const int p0 = (i % 4) * 32;
    b.tensor_scalar(b.view(s, p0, 32, i % 8, 1), b.view(a, p0, 32, (i * 7) % 1000, 1), AluOp::add,
                    Scalar::constant(float(i)), AluOp::bypass, {},
                    i % 3 == 0 ? Engine::gpsimd : Engine::vector);
  }
  for (int i = 0; i < 40; ++i) {
    const Tile r = b.next(ring);
    b.dma_copy(b.view(r), b.hbm_rows(y, 0, 128, 0, 64, i % 4), DmaOptions{Engine::sync, i % 4, 96});
    b.tensor_scalar(b.view(r), b.view(r), AluOp::multiply,
                    Scalar::per_partition(b.view(s, 0, 128, i % 8, 1)), AluOp::max,
                    Scalar::constant(0.5f), i % 2 ? Engine::scalar : Engine::gpsimd);
    b.matmul(b.view(acc, 0, 128, 0, 64), b.view(a, 0, 128, 0, 128), b.view(r), i % 5 != 0);
    b.tensor_copy(b.view(r, 0, 64, 0, 64), b.view(acc, 0, 64, 0, 64), Engine::vector);
    b.dma_copy(b.hbm_rows(y, 0, 128, 0, 64, (i + 1) % 4), b.view(r));
    if (i % 10 == 9) {
      const Tile t = b.sbuf_tile("temp", 128, 256, DType::fp32);
      b.memset(b.view(t, 0, 128, 0, 256, 1), 1.0f, Engine::gpsimd);
      b.dma_copy(b.view(t, 0, 128, 0, 64), b.view(r));
      b.tensor_tensor(b.view(t, 0, 128, 64, 64), b.view(t, 0, 128, 0, 64),
                      b.view(acc, 0, 128, 0, 64), AluOp::add);
      b.tensor_reduce(b.view(s, 0, 128, 7, 1), b.view(t, 0, 128, 0, 128, 2), AluOp::max);
      b.activation(b.view(t, 0, 128, 128, 64), b.view(r), ActFunc::exp);
      b.release(t);
    }
  }
  b.iota(b.view(s, 0, 128, 0, 8), 0, 8, 1);
  return b.finish();
}

TEST_CASE("simulation digests: an irregular hand-built program on trn1 and trn2") {
  for (const auto& [machine, program_hash, timing_hash, report_hash] :
       {std::tuple{"trn1", 0xbe568d55e22580caull, 0x89a74ff3bc3a32d3ull, 0xace14fad4eb0bd9eull},
        std::tuple{"trn2", 0xbe568d55e22580caull, 0xe29c4ce8be746878ull, 0x6871809f89056918ull}}) {
    const Program p = irregular_program(load_machine(machine));
    CHECK(simulate_timing(p).region_merges > 0);  // the tracker's merge path is covered
    check({"irregular", machine, {}, program_hash, timing_hash, report_hash}, p, {}, "irregular");
  }
}

}  // namespace

TEST_CASE("simulation digests: the default paged attention batch on trn1 and trn2") {
  check({"paged-attention",
         "trn1",
         {},
         0x7e1174ff8caa0f6dull,
         0x29ae47edb219a765ull,
         0x0e76d90d0cd2f276ull});
  check({"paged-attention",
         "trn2",
         {},
         0x7e1174ff8caa0f6dull,
         0x7e7438bbc277540bull,
         0x022fff99d778ba23ull});
}

TEST_CASE("simulation digests: paged attention schedules (small blocks, fp32, one buffer, dma)") {
  check({"paged-attention",
         "trn1",
         {{"block_size", "8"}, {"large_tile_size", "512"}},
         0xb7811260e8dfeb8full,
         0x0e158248d8e5f5edull,
         0xf2a23177471a49f9ull});
  check({"paged-attention",
         "trn1",
         {{"dtype", "fp32"}, {"mixed_precision", "false"}, {"kv_buffers", "1"}},
         0xd665bc25d24bbb49ull,
         0x78fa0adea0b97339ull,
         0xfb7d1ebbdc2b616full});
  check({"paged-attention",
         "trn2",
         {{"transpose", "dma"}, {"block_size", "128"}, {"large_tile_size", "4096"}, {"seed", "7"}},
         0xa7c1ca5b94439258ull,
         0xa5b2063258180c0cull,
         0x39476d87a9118787ull});
  check({"paged-attention",
         "trn1",
         {{"dtype", "fp16"}, {"tiling_factor", "1"}},
         0xa7d526f8c8242793ull,
         0x2383bc0f4e6b0cb2ull,
         0xfb505ea476ec8d48ull});
}

TEST_CASE("simulation digests: the matmul tutorial variants and flash prefill") {
  const auto matmul = [](const char* variant) {
    return KernelParameters{{"variant", variant}, {"M", "2048"}, {"K", "2048"}, {"N", "2048"}};
  };
  check({"matmul", "trn1", matmul("tiled"), 0x9593bc43b1386369ull, 0x19f08e4120199b9aull,
         0x84591884b82fd098ull});
  check({"matmul", "trn1", matmul("hoist_load"), 0x820e9c1d2b5622eaull, 0x05a3a9271942412dull,
         0x37e9ddf8c289050bull});
  check({"matmul", "trn1", matmul("block_free"), 0x9e0b5f4caeed9ca2ull, 0xe4d37a9cfa2cabf4ull,
         0x3369f66c8912616full});
  check({"matmul", "trn1", matmul("fully_optimized"), 0x0b47d74da01831fbull, 0x1c4b99615db997dbull,
         0x542151eb77efdc87ull});
  check({"matmul",
         "trn2",
         {{"variant", "tiled"}, {"M", "512"}, {"evict_engine", "scalar"}},
         0xbe0acda17b1d39f9ull,
         0xb6a5795144f952eeull,
         0xc9595ac290dc9af2ull});
  check({"flash-prefill",
         "trn1",
         {},
         0xaa41fe66e2a005bbull,
         0x6557f020a45bbf80ull,
         0x00178a5d14bb77aeull});
  check({"flash-prefill",
         "trn2",
         {{"seq_len", "300"}, {"causal", "false"}, {"dtype", "fp32"}},
         0x5f21470eab9b1792ull,
         0xc9805d51f6cd82b0ull,
         0x254c5f9e9c5060f7ull});
}

TEST_CASE("simulation digests: a report without idle-time blame has the same flat metrics") {
  const KernelInfo& kernel = kernel_registry().find("paged-attention");
  const KernelParameters parameters = resolve_parameters(kernel, {{"large_tile_size", "1024"}});
  const Program program = kernel.build(trn1(), parameters);
  const TimingResult timing = simulate_timing(program);
  ReportOptions without;
  without.max_critical_path_segments = 0;
  without.idle_blame = false;
  const Report lean = make_report(program, timing, without);
  for (const EngineSummary& e : lean.engines) {
    CHECK(e.idle_blame.empty());
    CHECK(e.top_waits.empty());
  }
  const std::vector<Metric> full = flat_metrics(make_report(program, timing));
  const std::vector<Metric> flat = flat_metrics(lean);
  REQUIRE(full.size() == flat.size());
  for (size_t i = 0; i < full.size(); ++i) {
    INFO(full[i].name);
    CHECK(flat[i].name == full[i].name);
    CHECK(std::bit_cast<uint64_t>(flat[i].value) == std::bit_cast<uint64_t>(full[i].value));
  }
}
