// Flash paged attention, mixed precision: the generated `tile` schedule and the simulator kernel
// round at the same points (bf16 q·scale, K, V, P; fp32 PSUM and statistics; bf16 output), so on
// the same inputs they agree far more tightly than either agrees with an fp64 reference.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "sim/functional.hpp"
#include "sim/kernels/flash_paged_attention.hpp"
#include "sim/machine.hpp"
#include "tilelab/nki.hpp"

namespace {

using tilelab::DType;
using tilelab::TensorView;
namespace sim = tilelab::sim;

struct CrossCase {
  std::int64_t block_size, large_tile_size, heads, kv_heads;
};

struct Errors {
  double sim_vs_tile = 0, tile_vs_fp64 = 0, sim_vs_fp64 = 0;
};

std::vector<float> random_bf16(std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = sim::round_to_dtype(dist(rng), sim::DType::bf16);
  return v;
}

// One batch (prefill requests with and without context, decode requests) through the simulator
// (functional, bf16 tensors) and tilelab::nki (schedule tile, the same values as float32, which
// the runtime converts to bf16 exactly); errors over the rows of real requests.
Errors run_case(const CrossCase& c) {
  const std::int64_t d = 64;
  const std::vector<sim::PagedAttentionRequest> requests = {{40, 70}, {1, 300}, {1, 33},
                                                            {25, 0},  {1, 1},   {30, 129}};
  sim::FlashPagedAttentionConfig config;
  auto& s = config.schedule;
  s.block_size = c.block_size;
  s.large_tile_size = c.large_tile_size;
  s.mixed_precision = true;
  const sim::PagedAttentionBatch batch =
      sim::make_paged_attention_batch(requests, c.block_size, c.large_tile_size, 128, 11);
  const std::int64_t seq_q = batch.query_len, KH = c.kv_heads, H = c.heads;
  config.shape = {H, KH, d, seq_q, batch.num_active_blocks};
  config.num_cache_blocks = batch.num_cache_blocks;
  config.dtype = sim::DType::bf16;
  const std::int64_t context = batch.num_active_blocks * c.block_size;
  const std::int64_t columns = context + seq_q;

  std::mt19937 rng(static_cast<unsigned>(c.block_size * 131 + c.large_tile_size + H));
  auto query = random_bf16(static_cast<std::size_t>(H * d * seq_q), rng);
  auto key = random_bf16(static_cast<std::size_t>(KH * d * seq_q), rng);
  auto value = random_bf16(static_cast<std::size_t>(KH * seq_q * d), rng);
  auto cache = random_bf16(
      static_cast<std::size_t>(2 * batch.num_cache_blocks * KH * c.block_size * d), rng);

  // Simulator.
  const sim::Machine machine = sim::load_machine("trn1");
  const sim::Program program = sim::build_flash_paged_attention(machine, config);
  sim::FunctionalExecutor exec(program);
  exec.set_tensor("query", query);
  exec.set_tensor("key", key);
  exec.set_tensor("value", value);
  exec.set_tensor("kv_cache", cache);
  exec.set_tensor("block_tables",
                  std::vector<float>(batch.block_tables.begin(), batch.block_tables.end()));
  const auto sim_mask = sim::reorder_context_mask(batch.mask, seq_q, context,
                                                  sim::kv_tile_layout(config), c.large_tile_size);
  exec.set_tensor("mask", std::vector<float>(sim_mask.begin(), sim_mask.end()));
  exec.run();
  const std::vector<float> sim_out = exec.tensor("output");

  // Generated tile schedule; its mask reordered by the runtime's own helper.
  std::vector<std::int32_t> mask(batch.mask.begin(), batch.mask.end()), tile_mask(mask.size());
  std::vector<std::int32_t> table(batch.block_tables.begin(), batch.block_tables.end());
  std::vector<float> tile_out(static_cast<std::size_t>(H * seq_q * d));
  tilelab::nki::reorder_context_mask(TensorView(mask.data(), DType::i32, {seq_q, columns}),
                                     c.large_tile_size, c.block_size,
                                     TensorView(tile_mask.data(), DType::i32, {seq_q, columns}));
  tilelab::nki::FlashPagedAttentionOptions options;
  options.large_tile_size = c.large_tile_size;
  options.schedule = tilelab::nki::PagedSchedule::tile;
  options.mixed_precision = true;
  tilelab::nki::flash_paged_attention(
      TensorView(query.data(), DType::f32, {1, H, d, seq_q}),
      TensorView(key.data(), DType::f32, {1, KH, d, seq_q}),
      TensorView(value.data(), DType::f32, {1, KH, seq_q, d}),
      TensorView(cache.data(), DType::f32, {2, batch.num_cache_blocks, KH, c.block_size, d}),
      TensorView(table.data(), DType::i32, {batch.num_active_blocks}),
      TensorView(tile_mask.data(), DType::i32, {seq_q, columns}),
      TensorView(tile_out.data(), DType::f32, {1, H, seq_q, d}), options);

  // fp64 reference over the visible columns (masked ones weigh exp(-9984 - m) = 0 in fp32 too).
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  auto cache_at = [&](std::int64_t kv, std::int64_t token, std::int64_t head, std::int64_t i) {
    const std::int64_t block = batch.block_tables[static_cast<std::size_t>(token / c.block_size)];
    return static_cast<double>(cache[static_cast<std::size_t>(
        (((kv * batch.num_cache_blocks + block) * KH + head) * c.block_size +
         token % c.block_size) *
            d +
        i)]);
  };
  Errors e;
  std::vector<double> scores(static_cast<std::size_t>(columns)), acc(static_cast<std::size_t>(d));
  for (std::int64_t h = 0; h < H; ++h) {
    const std::int64_t g = h / (H / KH);
    for (std::int64_t r = 0; r < seq_q; ++r) {
      if (batch.request_of_row[static_cast<std::size_t>(r)] < 0) continue;
      double best = -1e300;
      for (std::int64_t col = 0; col < columns; ++col) {
        if (!batch.mask[static_cast<std::size_t>(r * columns + col)]) continue;
        double dot = 0;
        for (std::int64_t i = 0; i < d; ++i) {
          const double k = col < context
                               ? cache_at(0, col, g, i)
                               : key[static_cast<std::size_t>((g * d + i) * seq_q + col - context)];
          dot += static_cast<double>(query[static_cast<std::size_t>((h * d + i) * seq_q + r)]) * k;
        }
        scores[static_cast<std::size_t>(col)] = dot * scale;
        best = std::max(best, dot * scale);
      }
      double sum = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (std::int64_t col = 0; col < columns; ++col) {
        if (!batch.mask[static_cast<std::size_t>(r * columns + col)]) continue;
        const double w = std::exp(scores[static_cast<std::size_t>(col)] - best);
        sum += w;
        for (std::int64_t i = 0; i < d; ++i) {
          const double v =
              col < context ? cache_at(1, col, g, i)
                            : value[static_cast<std::size_t>((g * seq_q + col - context) * d + i)];
          acc[static_cast<std::size_t>(i)] += w * v;
        }
      }
      for (std::int64_t i = 0; i < d; ++i) {
        const auto at = static_cast<std::size_t>((h * seq_q + r) * d + i);
        const double expected = acc[static_cast<std::size_t>(i)] / sum;
        e.sim_vs_tile = std::max(e.sim_vs_tile, std::abs(double(sim_out[at]) - tile_out[at]));
        e.tile_vs_fp64 = std::max(e.tile_vs_fp64, std::abs(tile_out[at] - expected));
        e.sim_vs_fp64 = std::max(e.sim_vs_fp64, std::abs(sim_out[at] - expected));
      }
    }
  }
  return e;
}

TEST_CASE("paged attention: simulator and tile schedule round alike (mixed precision)",
          "[cross][paged]") {
  const CrossCase c = GENERATE(CrossCase{8, 512, 2, 2}, CrossCase{32, 512, 4, 1},
                               CrossCase{8, 1024, 4, 1}, CrossCase{32, 1024, 2, 2});
  const Errors e = run_case(c);
  INFO("block_size " << c.block_size << ", LARGE_TILE_SZ " << c.large_tile_size << ", heads "
                     << c.heads << "/" << c.kv_heads << ": max|sim - tile| " << e.sim_vs_tile
                     << ", max|tile - fp64| " << e.tile_vs_fp64 << ", max|sim - fp64| "
                     << e.sim_vs_fp64);
  WARN("block_size " << c.block_size << " LTS " << c.large_tile_size << " group "
                     << c.heads / c.kv_heads << ": sim-tile " << e.sim_vs_tile << " tile-fp64 "
                     << e.tile_vs_fp64 << " sim-fp64 " << e.sim_vs_fp64);
  CHECK(e.tile_vs_fp64 < 2e-2);
  CHECK(e.sim_vs_fp64 < 2e-2);
  CHECK(e.sim_vs_tile <= 0.25 * e.tile_vs_fp64);
}

}  // namespace
