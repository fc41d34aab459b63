// Flash paged attention kernel: functional runs against an fp64 reference over block sizes,
// large tiles, GQA groups, head dims and precisions; the tiling trick in the timing; the HTML
// report; errors for bad schedules.
#include <cmath>
#include <random>

#include "sim/functional.hpp"
#include "sim/kernels/flash_paged_attention.hpp"
#include "sim/kernels/registry.hpp"
#include "sim/report.hpp"
#include "sim/report_html.hpp"
#include "test_util.hpp"

namespace tilelab::sim {
namespace {

using namespace test;

struct Case {
  int64_t block_size = 32;
  int64_t large_tile_size = 2048;
  int64_t heads = 4, kv_heads = 1, head_dim = 64;
  bool mixed_precision = true;
  DType dtype = DType::bf16;
  int64_t tiling_factor = 0;
  schedules::TransposeMethod transpose = schedules::TransposeMethod::pe;
  std::vector<PagedAttentionRequest> requests = {{40, 70}, {1, 300}, {1, 33}, {25, 0}, {1, 1}};
};

PagedAttentionRun prepare(const Case& c) {
  schedules::PagedAttentionSchedule s;
  s.block_size = c.block_size;
  s.large_tile_size = c.large_tile_size;
  s.mixed_precision = c.mixed_precision;
  s.transpose = c.transpose;
  s.block_size_tiling_factor_override = c.tiling_factor;
  return paged_attention_run(s, c.requests, c.heads, c.kv_heads, c.head_dim, c.dtype, 7);
}

// Runs the kernel on random data and returns the largest |kernel - reference| over the rows of
// real requests (padding rows attend nothing and are not compared).
double max_error(const Machine& machine, const Case& c) {
  const PagedAttentionRun p = prepare(c);
  const auto& shape = p.config.shape;
  const int64_t H = shape.num_heads, KH = shape.num_kv_heads, d = shape.head_dim;
  const int64_t seq_q = p.batch.query_len, bs = c.block_size;
  const int64_t context = p.batch.num_active_blocks * bs, columns = context + seq_q;
  const Program program = build_flash_paged_attention(machine, p.config);

  std::mt19937 rng(42);
  const auto query = random_values(size_t(H * d * seq_q), c.dtype, rng);
  const auto key = random_values(size_t(KH * d * seq_q), c.dtype, rng);
  const auto value = random_values(size_t(KH * seq_q * d), c.dtype, rng);
  const auto cache =
      random_values(size_t(2 * p.batch.num_cache_blocks * KH * bs * d), c.dtype, rng);
  FunctionalExecutor exec(program);
  exec.set_tensor("query", query);
  exec.set_tensor("key", key);
  exec.set_tensor("value", value);
  exec.set_tensor("kv_cache", cache);  // (2, blocks, kv heads, block_size, d), row-major
  exec.set_tensor("block_tables",
                  std::vector<float>(p.batch.block_tables.begin(), p.batch.block_tables.end()));
  const auto reordered = reorder_context_mask(p.batch.mask, seq_q, context,
                                              kv_tile_layout(p.config), c.large_tile_size);
  exec.set_tensor("mask", std::vector<float>(reordered.begin(), reordered.end()));
  exec.run();
  const std::vector<float> out = exec.tensor("output");

  // fp64 reference: K/V gathered through the block table, masked columns excluded, GQA by
  // repetition of the kv head.
  const double scale = 1.0 / std::sqrt(double(d));
  auto cache_at = [&](int64_t kv, int64_t token, int64_t head, int64_t i) {
    const int64_t block = p.batch.block_tables[size_t(token / bs)];
    return double(cache[size_t(
        (((kv * p.batch.num_cache_blocks + block) * KH + head) * bs + token % bs) * d + i)]);
  };
  double worst = 0;
  std::vector<double> scores(static_cast<size_t>(columns)), acc(static_cast<size_t>(d));
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h / (H / KH);
    for (int64_t r = 0; r < seq_q; ++r) {
      if (p.batch.request_of_row[size_t(r)] < 0) continue;
      double best = -1e300;
      for (int64_t col = 0; col < columns; ++col) {
        if (!p.batch.mask[size_t(r * columns + col)]) continue;
        double dot = 0;
        for (int64_t i = 0; i < d; ++i) {
          const double k = col < context ? cache_at(0, col, g, i)
                                         : key[size_t((g * d + i) * seq_q + col - context)];
          dot += double(query[size_t((h * d + i) * seq_q + r)]) * k;
        }
        scores[size_t(col)] = dot * scale;
        best = std::max(best, scores[size_t(col)]);
      }
      double sum = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t col = 0; col < columns; ++col) {
        if (!p.batch.mask[size_t(r * columns + col)]) continue;
        const double w = std::exp(scores[size_t(col)] - best);
        sum += w;
        for (int64_t i = 0; i < d; ++i)
          acc[size_t(i)] +=
              w * (col < context ? cache_at(1, col, g, i)
                                 : value[size_t((g * seq_q + col - context) * d + i)]);
      }
      for (int64_t i = 0; i < d; ++i) {
        const double got = out[size_t((h * seq_q + r) * d + i)];
        const double error = std::fabs(got - acc[size_t(i)] / sum);
        if (std::isnan(error)) return error;  // std::max would drop it
        worst = std::max(worst, error);
      }
    }
  }
  return worst;
}

// bf16 inputs to TensorE and P in bf16 (2^-8 relative each): measured max errors 2.3e-3 to
// 3.5e-3 on these cases; fp32 all through: about 1.8e-7.
constexpr double kBf16Tolerance = 1e-2;
constexpr double kFp32Tolerance = 2e-6;

}  // namespace

// Every option of the kernel against the fp64 reference: block sizes and tiling factors (auto and
// forced), GQA, fp32 and mixed precision (also from fp32 inputs cast on chip), more than 512 new
// tokens (causal score tiles skipped), and DMA transposes on trn2.
TEST_CASE("flash paged attention: matches the fp64 reference for every option",
          "[sim][paged_attention]") {
  using Dt = DType;
  using schedules::TransposeMethod;
  struct Option {
    const char* name;
    bool on_trn2;
    Case c;
    double tolerance;
  };
  const std::vector<PagedAttentionRequest> long_prefill = {{600, 100}, {1, 200}, {400, 0}, {1, 17}};
  const std::vector<Option> options = {
      {"block size 32, large tile 2048, tiling factor 2 (bf16)",
       false,
       {.head_dim = 128},
       kBf16Tolerance},
      {"block size 1, large tile 512, 4 gathers per tile (fp32)",
       false,
       {.block_size = 1,
        .large_tile_size = 512,
        .heads = 2,
        .kv_heads = 2,
        .head_dim = 32,
        .mixed_precision = false,
        .dtype = Dt::fp32},
       kFp32Tolerance},
      {"block size 8, large tile 1024, GQA 4 (fp32)",
       false,
       {.block_size = 8,
        .large_tile_size = 1024,
        .heads = 8,
        .kv_heads = 2,
        .head_dim = 64,
        .mixed_precision = false,
        .dtype = Dt::fp32},
       kFp32Tolerance},
      {"block size 128, large tile 512, tiling factor 32 (bf16)",
       false,
       {.block_size = 128, .large_tile_size = 512, .heads = 1, .head_dim = 64},
       kBf16Tolerance},
      // 16 blocks: gathers span 16 partitions, then 64 (half the auto factor).
      {"tiling factor forced to 1 keeps the numerics",
       false,
       {.block_size = 32,
        .large_tile_size = 512,
        .heads = 2,
        .head_dim = 32,
        .mixed_precision = false,
        .dtype = Dt::fp32,
        .tiling_factor = 1},
       kFp32Tolerance},
      {"tiling factor forced to 4 keeps the numerics",
       false,
       {.block_size = 32,
        .large_tile_size = 512,
        .heads = 2,
        .head_dim = 32,
        .mixed_precision = false,
        .dtype = Dt::fp32,
        .tiling_factor = 4},
       kFp32Tolerance},
      // Kernel dtype bf16: K, V and q are copied to bf16 on chip.
      {"fp32 inputs with mixed precision cast on chip",
       false,
       {.block_size = 16,
        .large_tile_size = 1024,
        .heads = 4,
        .kv_heads = 1,
        .head_dim = 64,
        .dtype = Dt::fp32},
       kBf16Tolerance},
      // 1002 rows -> seq_q 1024.
      {"more than 512 new tokens skip causal score tiles",
       false,
       {.block_size = 16,
        .large_tile_size = 512,
        .heads = 1,
        .head_dim = 32,
        .mixed_precision = false,
        .dtype = Dt::fp32,
        .requests = long_prefill},
       kFp32Tolerance},
      {"DMA transposes on trn2 (bf16)",
       true,
       {.large_tile_size = 512,
        .heads = 2,
        .kv_heads = 2,
        .head_dim = 64,
        .transpose = TransposeMethod::dma},
       kBf16Tolerance},
  };
  for (const Option& option : options) {
    DYNAMIC_SECTION(option.name) {
      CHECK(max_error(option.on_trn2 ? trn2() : trn1(), option.c) < option.tolerance);
    }
  }
}

TEST_CASE("flash paged attention: the tiling trick raises DMA utilization",
          "[sim][paged_attention]") {
  const KernelInfo& kernel = kernel_registry().find("paged-attention");
  auto report_of = [&](const KernelParameters& given) {
    const Program program = kernel.build(trn1(), resolve_parameters(kernel, given));
    return make_report(program, simulate_timing(program));
  };
  const Report tiled = report_of({});
  const Report untiled = report_of({{"tiling_factor", "1"}});
  auto gather = [](const Report& r) {
    for (const auto& k : r.dma_by_kind)
      if (k.kind == "dma_gather") return k;
    FAIL("no dma_gather transfers");
    return DmaKindSummary{};
  };
  CHECK(gather(tiled).engines_used == 16);
  CHECK(gather(untiled).engines_used == 8);
  CHECK(gather(untiled).utilization_percent < 0.75 * gather(tiled).utilization_percent);
  CHECK(untiled.dma_utilization_percent < tiled.dma_utilization_percent);
  CHECK(tiled.total_time_ns < untiled.total_time_ns);
}

TEST_CASE("flash paged attention: the HTML report draws every chart with data",
          "[sim][paged_attention][report]") {
  const KernelInfo& kernel = kernel_registry().find("paged-attention");
  const KernelParameters parameters = resolve_parameters(
      kernel, {{"num_heads", "4"}, {"num_kv_heads", "2"}, {"large_tile_size", "512"}});
  const Program program = kernel.build(trn1(), parameters);
  TimingOptions options;
  options.record_dma_pieces = true;
  const TimingResult timing = simulate_timing(program, options);
  const Report report = make_report(program, timing);
  HtmlOptions html_options;
  html_options.comparisons.push_back({"again", report});
  const std::string html = report_html(program, timing, report, html_options);
  for (const char* id : {"id='summary'", "id='comparison'", "id='timeline'", "id='bandwidth'",
                         "id='histogram'", "id='sbuf'", "id='psum'", "id='blame'"})
    CHECK(html.find(id) != std::string::npos);
  CHECK(html.find("<script") == std::string::npos);
  CHECK(html.find("http://") == std::string::npos);
  CHECK(html.find("nan") == std::string::npos);
  // Timeline: opaque cells on engine and DMA rows; charts: polygons; histogram: bars.
  size_t busy_cells = 0;
  for (size_t at = html.find("fill-opacity='"); at != std::string::npos;
       at = html.find("fill-opacity='", at + 1))
    busy_cells += html.compare(at + 19, 3, "'/>") == 0;  // timeline cells, not chart areas
  CHECK(busy_cells > 50);
  CHECK(html.find("<polygon class='series' points='") != std::string::npos);
  CHECK(html.find("<rect class='bar'") != std::string::npos);
  CHECK(html.find("dma 15") != std::string::npos);  // one row per DMA engine
  CHECK(html.size() < 5u * 1024 * 1024);
}

TEST_CASE("flash paged attention: bad schedule parameters are clear errors",
          "[sim][paged_attention]") {
  Case c;
  auto build = [](const Machine& machine, const Case& bad) {
    return [&machine, bad] { build_flash_paged_attention(machine, prepare(bad).config); };
  };
  Case odd_factor = c;
  odd_factor.tiling_factor = 3;
  CHECK_THAT(error_of(build(trn1(), odd_factor)),
             Catch::Contains("block_size_tiling_factor_override: expected 0 (derived) or a power "
                             "of two") &&
                 Catch::Contains("got 3"));
  Case wide_factor = c;
  wide_factor.tiling_factor = 4;  // 64 blocks x 4 > 128 partitions
  CHECK_THAT(error_of(build(trn1(), wide_factor)), Catch::Contains("<= 128 partitions"));
  Case dma = c;
  dma.transpose = schedules::TransposeMethod::dma;
  CHECK_THAT(error_of(build(trn1(), dma)), Catch::Contains("transpose: 'dma' needs"));
  Case wide_head = c;
  wide_head.head_dim = 256;
  CHECK_THAT(error_of(build(trn1(), wide_head)), Catch::Contains("head_dim"));
  Case uneven_group = c;
  uneven_group.heads = 6;
  uneven_group.kv_heads = 4;
  CHECK_THAT(error_of(build(trn1(), uneven_group)), Catch::Contains("num_heads"));
  const KernelInfo& kernel = kernel_registry().find("paged-attention");
  CHECK_THAT(
      error_of([&] { kernel.build(trn1(), resolve_parameters(kernel, {{"block_size", "3"}})); }),
      Catch::Contains("block_size: expected a power of two"));
  CHECK_THAT(
      error_of([&] { kernel.build(trn1(), resolve_parameters(kernel, {{"prefill", "12-40"}})); }),
      Catch::Contains("parameter 'prefill'"));
}

}  // namespace tilelab::sim
