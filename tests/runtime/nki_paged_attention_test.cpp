// tilelab::nki against an fp64 reference (gather through the block table, -9984 for masked
// scores, softmax, GQA by repetition) over block sizes, large tiles, GQA, both schedules and both
// precisions with continuous-batching masks; the helpers; bad inputs; PagedAttentionSchedule.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "host_tensor.hpp"
#include "schedules/paged/schedule.hpp"
#include "tilelab/error.hpp"
#include "tilelab/nki.hpp"

namespace {

using tilelab::DType;
using tilelab::TensorView;
using tilelab::schedules::PagedAttentionSchedule;
using tilelab_test::HostTensor;
using tilelab_test::Random;

constexpr std::int64_t kPartitions = 128;

struct Request {
  std::int64_t query_len, context_len;
};

// One continuous batch: each request's context in its own cache blocks (shuffled over the
// cache), block table padded to whole large tiles, query rows padded to 128.
struct Batch {
  std::int64_t n_heads, n_kv_heads, head_dim, block_size, large_tile, seq_q, num_blocks, num_active;
  HostTensor query, key, value, kv_cache, out;
  std::vector<std::int32_t> block_tables;
  std::vector<std::int32_t> mask;            // natural order
  std::vector<std::int32_t> reordered_mask;  // as the kernel takes it

  Batch(Random& random, const std::vector<Request>& requests, std::int64_t heads,
        std::int64_t kv_heads, std::int64_t dim, std::int64_t block, std::int64_t tile, DType dtype)
      : n_heads(heads),
        n_kv_heads(kv_heads),
        head_dim(dim),
        block_size(block),
        large_tile(tile),
        seq_q(padded_queries(requests)),
        num_blocks(0),
        num_active(0),
        query(dtype, {1, heads, dim, seq_q}),
        key(dtype, {1, kv_heads, dim, seq_q}),
        value(dtype, {1, kv_heads, seq_q, dim}),
        kv_cache(dtype, {1}),
        out(dtype, {1, heads, seq_q, dim}) {
    std::vector<std::int64_t> blocks_of;
    for (const Request& r : requests) {
      blocks_of.push_back((r.context_len + block - 1) / block);
      num_active += blocks_of.back();
    }
    const std::int64_t per_tile = tile / block;
    num_active = std::max(per_tile, (num_active + per_tile - 1) / per_tile * per_tile);
    num_blocks = num_active + 3;
    kv_cache = HostTensor(dtype, {2, num_blocks, kv_heads, block, dim});
    std::vector<std::int32_t> all(static_cast<std::size_t>(num_blocks));
    std::iota(all.begin(), all.end(), 0);
    for (std::size_t i = all.size() - 1; i > 0; --i) std::swap(all[i], all[random.below(i + 1)]);
    block_tables.assign(all.begin(), all.begin() + num_active);

    const std::int64_t context_len = num_active * block, width = context_len + seq_q;
    mask.assign(static_cast<std::size_t>(seq_q * width), 0);
    std::int64_t row = 0, first_block = 0;
    for (std::size_t r = 0; r < requests.size(); ++r) {
      for (std::int64_t i = 0; i < requests[r].query_len; ++i) {
        for (std::int64_t j = 0; j < requests[r].context_len; ++j) {
          mask[(row + i) * width + first_block * block + j] = 1;
        }
        for (std::int64_t j = 0; j <= i; ++j) mask[(row + i) * width + context_len + row + j] = 1;
      }
      row += requests[r].query_len;
      first_block += blocks_of[r];
    }
    reordered_mask.resize(mask.size());
    tilelab::nki::reorder_context_mask(mask_view(mask), tile, block, mask_view(reordered_mask));
    query.fill_uniform(random, 2.0);
    key.fill_uniform(random, 2.0);
    value.fill_uniform(random, 1.0);
    kv_cache.fill_uniform(random, 1.5);
  }

  static std::int64_t padded_queries(const std::vector<Request>& requests) {
    std::int64_t total = 0;
    for (const Request& r : requests) total += r.query_len;
    total = std::max(kPartitions, (total + kPartitions - 1) / kPartitions * kPartitions);
    return total > 512 ? (total + 511) / 512 * 512 : total;
  }
  TensorView mask_view(std::vector<std::int32_t>& m) const {
    return TensorView(m.data(), DType::i32, {seq_q, static_cast<std::int64_t>(m.size()) / seq_q});
  }
  TensorView table_view() { return TensorView(block_tables.data(), DType::i32, {num_active}); }

  void run(const tilelab::nki::FlashPagedAttentionOptions& options) {
    tilelab::nki::flash_paged_attention(query.view(), key.view(), value.view(), kv_cache.view(),
                                        table_view(), mask_view(reordered_mask), out.view(),
                                        options);
  }

  // fp64 reference from the natural-order mask; with mixed precision q·scale is rounded as the
  // kernel rounds it and K, V are bf16-rounded.
  std::vector<double> reference(bool mixed_precision) const {
    auto kernel = [&](double x) {
      return mixed_precision ? tilelab::detail::round_to_dtype(static_cast<float>(x), DType::bf16)
                             : x;
    };
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
    const std::int64_t context_len = num_active * block_size, width = context_len + seq_q;
    const std::int64_t group = n_heads / n_kv_heads, skip = std::min<std::int64_t>(seq_q, 512);
    std::vector<double> result(static_cast<std::size_t>(n_heads * seq_q * head_dim));
    std::vector<double> k(static_cast<std::size_t>(width * head_dim)), v(k.size()), p(width);
    for (std::int64_t hk = 0; hk < n_kv_heads; ++hk) {
      for (std::int64_t j = 0; j < width; ++j) {
        for (std::int64_t d = 0; d < head_dim; ++d) {
          double kj, vj;
          if (j < context_len) {
            const std::int64_t b = block_tables[j / block_size], t = j % block_size;
            const std::int64_t base = ((b * n_kv_heads + hk) * block_size + t) * head_dim + d;
            const std::int64_t values = num_blocks * n_kv_heads * block_size * head_dim;
            kj = kv_cache.get(base);
            vj = kv_cache.get(values + base);
          } else {
            const std::int64_t n = j - context_len;
            kj = key.get((hk * head_dim + d) * seq_q + n);
            vj = value.get((hk * seq_q + n) * head_dim + d);
          }
          k[j * head_dim + d] = kernel(kj);
          v[j * head_dim + d] = kernel(vj);
        }
      }
      for (std::int64_t g = 0; g < group; ++g) {
        const std::int64_t h = hk * group + g;
        for (std::int64_t i = 0; i < seq_q; ++i) {
          const std::int64_t limit = (i / kPartitions * kPartitions / skip + 1) * skip;
          double max_score = -1e300;
          for (std::int64_t j = 0; j < width; ++j) {
            double s = tilelab::nki::kMaskedScore;
            const bool skipped = j >= context_len && j - context_len >= limit;
            if (mask[i * width + j] && !skipped) {
              s = 0;
              for (std::int64_t d = 0; d < head_dim; ++d) {
                const double q = query.get((h * head_dim + d) * seq_q + i);
                const double q_scaled =
                    mixed_precision
                        ? kernel(static_cast<float>(kernel(q)) * static_cast<float>(scale))
                        : q * scale;
                s += q_scaled * k[j * head_dim + d];
              }
            }
            p[j] = s;
            max_score = std::max(max_score, s);
          }
          double sum = 0;
          for (std::int64_t j = 0; j < width; ++j) sum += (p[j] = std::exp(p[j] - max_score));
          for (std::int64_t d = 0; d < head_dim; ++d) {
            double o = 0;
            for (std::int64_t j = 0; j < width; ++j) o += p[j] * v[j * head_dim + d];
            result[(h * seq_q + i) * head_dim + d] = o / sum;
          }
        }
      }
    }
    return result;
  }
};

double max_error(const HostTensor& out, const std::vector<double>& expected) {
  double error = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    error = std::max(error, std::abs(out.get(static_cast<std::int64_t>(i)) - expected[i]));
  }
  return error;
}

const std::vector<Request> kMixedBatch = {{40, 300}, {1, 700}, {1, 33}, {50, 0}};

// "" when the elements of `out` (contiguous) hold exactly `bytes`, else how many elements differ
// and the first of them.
std::string differing_elements(const HostTensor& out, const std::vector<unsigned char>& bytes) {
  const std::vector<unsigned char> got = out.bytes();
  const std::size_t element = tilelab::dtype_size(out.view().dtype());
  std::size_t count = 0, first = 0;
  for (std::size_t e = 0; e < static_cast<std::size_t>(out.numel()); ++e) {
    if (std::equal(got.begin() + e * element, got.begin() + (e + 1) * element,
                   bytes.begin() + e * element)) {
      continue;
    }
    if (count++ == 0) first = e;
  }
  if (count == 0) return "";
  return std::to_string(count) + " elements differ, the first at " + std::to_string(first);
}

void clear_row(std::vector<std::int32_t>& mask, std::int64_t row, std::int64_t width) {
  std::fill(mask.begin() + row * width, mask.begin() + (row + 1) * width, 0);
}

}  // namespace

TEST_CASE("nki: flash_paged_attention matches the fp64 reference", "[nki][paged]") {
  struct Grid {
    std::int64_t block_size, large_tile, n_heads, n_kv_heads, head_dim;
  };
  const std::vector<Grid> grid = {{1, 512, 4, 2, 32},    {8, 512, 1, 1, 8},
                                  {32, 1024, 16, 2, 64}, {256, 2048, 8, 8, 128},
                                  {16, 4096, 6, 3, 16},  {64, 8192, 2, 1, 24}};
  Random random(11);
  for (const Grid& g : grid) {
    for (const auto schedule :
         {tilelab::nki::PagedSchedule::cpu, tilelab::nki::PagedSchedule::tile}) {
      for (const DType dtype : {DType::f32, DType::bf16}) {
        for (const bool mixed : {true, false}) {
          // Two large tiles of context at least, so that the merge across tiles runs.
          std::vector<Request> requests = kMixedBatch;
          requests.push_back({3, g.large_tile});
          Batch batch(random, requests, g.n_heads, g.n_kv_heads, g.head_dim, g.block_size,
                      g.large_tile, dtype);
          tilelab::nki::FlashPagedAttentionOptions options;
          options.mixed_precision = mixed;
          options.large_tile_size = g.large_tile;
          options.schedule = schedule;
          batch.run(options);
          // fp32: accumulation; mixed: P and the output rounded to bf16 (|v| <= 1); bf16 output.
          const double keys = static_cast<double>(batch.num_active * g.block_size + batch.seq_q);
          const double accumulation = 16 * 0x1p-24 * std::sqrt(keys);
          const double tolerance = accumulation + (mixed                  ? 3 * 0x1p-8
                                                   : dtype == DType::bf16 ? 0x1p-8
                                                                          : 0.0);
          INFO("block_size " << g.block_size << " large tile " << g.large_tile << " heads "
                             << g.n_heads << "/" << g.n_kv_heads << " d " << g.head_dim
                             << " schedule "
                             << (schedule == tilelab::nki::PagedSchedule::cpu ? "cpu" : "tile")
                             << " dtype " << tilelab::dtype_name(dtype) << " mixed " << mixed);
          CHECK(max_error(batch.out, batch.reference(mixed)) <= tolerance);
        }
      }
    }
  }
}

TEST_CASE("nki: the cpu schedule leaves out all-zero mask tiles without changing an output bit",
          "[nki][paged][skip]") {
  // The same batch with skip_masked_tiles on and off must agree byte for byte: all-zero
  // (query block, large tile) pairs, partially masked tiles, padding rows (fully masked), rows
  // whose only keys lie in one large tile or only among the new tokens, rows whose first key
  // comes after several all-zero tiles, and scales that make the skipping rule refuse.
  Random random(23);
  const std::vector<Request> requests = {{40, 1100}, {1, 700},  {1, 33},  {50, 0},
                                         {20, 600},  {1, 1500}, {9, 2047}};
  struct Case {
    const char* what;
    void (*edit)(std::vector<std::int32_t>& mask, std::int64_t seq_q, std::int64_t width,
                 std::int64_t context_len);
    float scale;  // 0: the default
  };
  const std::vector<Case> cases = {
      {"continuous batching", [](auto&, auto, auto, auto) {}, 0.0f},
      {"one context key only, late",
       [](std::vector<std::int32_t>& m, std::int64_t, std::int64_t width, std::int64_t context) {
         clear_row(m, 5, width);
         m[5 * width + context - 3] = 1;
       },
       0.0f},
      {"new tokens only, first rows of every block",
       [](std::vector<std::int32_t>& m, std::int64_t seq_q, std::int64_t width,
          std::int64_t context) {
         for (std::int64_t row = 0; row < seq_q; row += 32) {
           std::fill(m.begin() + row * width, m.begin() + row * width + context, 0);
           m[row * width + context + row] = 1;
         }
       },
       0.0f},
      {"random keys in a few tiles",
       [](std::vector<std::int32_t>& m, std::int64_t seq_q, std::int64_t width,
          std::int64_t context) {
         for (std::int64_t row = 0; row < seq_q; ++row) {
           if (row % 7 == 3) clear_row(m, row, width);
           for (std::int64_t col = (row * 131) % context; col < context; col += 517 + row % 5) {
             m[row * width + col] = 1;
           }
         }
       },
       0.0f},
      {"a block without context keys",
       [](std::vector<std::int32_t>& m, std::int64_t, std::int64_t width, std::int64_t context) {
         for (std::int64_t row = 32; row < 64; ++row) {
           std::fill(m.begin() + row * width, m.begin() + row * width + context, 0);
           m[row * width + context + row] = 1;
         }
       },
       0.0f},
      {"scores too large to skip", [](auto&, auto, auto, auto) {}, 3000.0f},
  };
  for (const Case& c : cases) {
    for (const DType dtype : {DType::f32, DType::bf16}) {
      for (const bool mixed : {true, false}) {
        Batch batch(random, requests, 6, 2, 48, 16, 512, dtype);
        const std::int64_t context = batch.num_active * batch.block_size;
        c.edit(batch.mask, batch.seq_q, context + batch.seq_q, context);
        tilelab::nki::reorder_context_mask(batch.mask_view(batch.mask), batch.large_tile,
                                           batch.block_size, batch.mask_view(batch.reordered_mask));
        tilelab::nki::FlashPagedAttentionOptions options;
        options.mixed_precision = mixed;
        options.large_tile_size = batch.large_tile;
        if (c.scale != 0.0f) options.softmax_scale = c.scale;
        options.skip_masked_tiles = false;
        batch.run(options);
        const auto every_tile = batch.out.bytes();
        batch.out.fill_bytes(0x5a);
        options.skip_masked_tiles = true;
        batch.run(options);
        INFO(c.what << ", dtype " << tilelab::dtype_name(dtype) << ", mixed " << mixed);
        CHECK(differing_elements(batch.out, every_tile) == "");
        if (c.scale == 0.0f) {
          const double keys = static_cast<double>(context + batch.seq_q);
          const double tolerance = 16 * 0x1p-24 * std::sqrt(keys) + (mixed ? 3 * 0x1p-8
                                                                     : dtype == DType::bf16 ? 0x1p-8
                                                                                            : 0.0);
          CHECK(max_error(batch.out, batch.reference(mixed)) <= tolerance);
        }
      }
    }
  }
}

TEST_CASE("nki: all-zero mask tiles are computed when a row's only key scores near -9984",
          "[nki][paged][skip]") {
  // Row 5 sees one context key, in the last large tile, scoring about -9980 for head 0: the
  // full computation's rescale at that key is exp(-9984 + 9980), far from 0, so the all-zero
  // tiles before it (-9984 everywhere) still weigh in; leaving them out would change the row.
  Random random(29);
  Batch batch(random, {{40, 1100}, {1, 700}, {50, 0}, {9, 2047}}, 2, 1, 16, 16, 512, DType::f32);
  const std::int64_t context = batch.num_active * batch.block_size;
  const std::int64_t width = context + batch.seq_q, row = 5, token = context - 3;
  clear_row(batch.mask, row, width);
  batch.mask[row * width + token] = 1;
  tilelab::nki::reorder_context_mask(batch.mask_view(batch.mask), batch.large_tile,
                                     batch.block_size, batch.mask_view(batch.reordered_mask));
  const std::int64_t cache_block = batch.block_tables[token / batch.block_size];
  double dot = 0;
  for (std::int64_t d = 0; d < batch.head_dim; ++d) {
    const std::int64_t k_at =
        (cache_block * batch.block_size + token % batch.block_size) * batch.head_dim + d;
    dot += batch.query.get(d * batch.seq_q + row) * batch.kv_cache.get(k_at);
  }
  REQUIRE(std::abs(dot) > 0.1);
  tilelab::nki::FlashPagedAttentionOptions options;
  options.mixed_precision = false;
  options.large_tile_size = batch.large_tile;
  options.softmax_scale = static_cast<float>(-9980.0 / dot);
  options.skip_masked_tiles = false;
  batch.run(options);
  const auto every_tile = batch.out.bytes();
  batch.out.fill_bytes(0x5a);
  options.skip_masked_tiles = true;
  batch.run(options);
  CHECK(differing_elements(batch.out, every_tile) == "");
}

TEST_CASE("nki: invalid arguments raise an Error naming them, and nothing is written",
          "[nki][paged][errors]") {
  Random random(5);
  auto expect_error = [&](auto&& change, const std::string& needle,
                          tilelab::ErrorKind kind = tilelab::ErrorKind::invalid_value) {
    Batch batch(random, {{5, 20}}, 4, 2, 16, 16, 512, DType::f32);
    tilelab::nki::FlashPagedAttentionOptions options;
    options.large_tile_size = 512;
    TensorView query = batch.query.view(), key = batch.key.view(), value = batch.value.view();
    TensorView cache = batch.kv_cache.view(), table = batch.table_view();
    TensorView mask = batch.mask_view(batch.reordered_mask), out = batch.out.view();
    change(query, key, value, cache, table, mask, out, options);
    batch.out.fill_bytes(0x5a);
    const auto before = batch.out.bytes();
    try {
      tilelab::nki::flash_paged_attention(query, key, value, cache, table, mask, out, options);
      FAIL("expected an error mentioning " << needle);
    } catch (const tilelab::Error& error) {
      INFO(error.what());
      CHECK(std::string(error.what()).find(needle) != std::string::npos);
      CHECK(error.kind() == kind);
    }
    CHECK(batch.out.bytes() == before);
  };
  using TV = TensorView;
  using Options = tilelab::nki::FlashPagedAttentionOptions;
  expect_error([](TV&, TV&, TV&, TV&, TV&, TV&, TV&, Options& o) { o.large_tile_size = 1000; },
               "large_tile_size");
  expect_error([](TV&, TV&, TV&, TV&, TV&, TV&, TV&, Options& o) { o.large_tile_size = 1024; },
               "multiple of large_tile_size");
  expect_error([](TV&, TV&, TV&, TV&, TV&, TV&, TV&, Options& o) { o.softmax_scale = INFINITY; },
               "softmax_scale");
  expect_error([](TV& q, TV&, TV&, TV&, TV&, TV&, TV&,
                  Options&) { q = TV(q.data(), DType::f32, {1, 4, 16, 64}); },
               "key");
  expect_error(
      [](TV&, TV&, TV&, TV&, TV& table, TV&, TV&, Options&) {
        static std::int32_t bad[32] = {};
        bad[3] = 1000;
        table = TV(bad, DType::i32, {table.dim(0)});
      },
      "block_tables: expected entries");
  expect_error([](TV&, TV&, TV&, TV&, TV&, TV& mask, TV&,
                  Options&) { mask = TV(mask.data(), DType::f32, {mask.dim(0), mask.dim(1)}); },
               "mask", tilelab::ErrorKind::invalid_type);
  expect_error(
      [](TV&, TV&, TV&, TV& cache, TV&, TV&, TV&, Options&) {
        cache = TV(cache.data(), DType::bf16, {2, cache.dim(1), 2, 16, 16});
      },
      "kv_cache", tilelab::ErrorKind::invalid_type);
  expect_error([](TV& q, TV&, TV&, TV&, TV&, TV&, TV& out, Options&) { out = q; }, "out");
  // Offsets beyond int32 name the tensor that has them (the strides are never dereferenced:
  // validation rejects the view first).
  expect_error(
      [](TV&, TV&, TV&, TV&, TV&, TV& mask, TV&, Options&) {
        mask = TV(mask.data(), DType::i32, {mask.dim(0), mask.dim(1)}, {std::int64_t{1} << 31, 1});
      },
      "mask: expected element offsets below 2^31");
  // 32 blocks of 16 per large tile of 512: the kernels derive a factor of 4; forcing 2 (which
  // the simulator could run) is refused, naming the field and the accepted values.
  expect_error([](TV&, TV&, TV&, TV&, TV&, TV&, TV&,
                  Options& o) { o.block_size_tiling_factor_override = 2; },
               "block_size_tiling_factor_override: the generated kernels derive");
  expect_error([](TV&, TV&, TV&, TV&, TV&, TV&, TV&,
                  Options& o) { o.block_size_tiling_factor_override = 3; },
               "block_size_tiling_factor_override: expected 0 (derived) or a power of two");
}

TEST_CASE("nki: reorder_context_mask and reshape_and_cache against plain loops", "[nki]") {
  Random random(3);
  for (const auto& [tile, block] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {512, 1}, {512, 8}, {2048, 256}, {4096, 16}}) {
    const std::int64_t seq_q = 3, width = 2 * tile + seq_q;
    std::vector<std::int32_t> mask(static_cast<std::size_t>(seq_q * width)), out(mask.size());
    for (auto& m : mask) m = static_cast<std::int32_t>(random.below(2));
    tilelab::nki::reorder_context_mask(TensorView(mask.data(), DType::i32, {seq_q, width}), tile,
                                       block, TensorView(out.data(), DType::i32, {seq_q, width}));
    const std::int64_t tiled = tile / std::max<std::int64_t>(128, tile / block);
    for (std::int64_t i = 0; i < seq_q; ++i) {
      for (std::int64_t col = 0; col < width; ++col) {
        std::int64_t source = col;
        if (col < 2 * tile) {
          const std::int64_t load = col / (128 * tiled), tb = col / 128 % tiled, p = col % 128;
          source = load * 128 * tiled + p * tiled + tb;
        }
        REQUIRE(out[i * width + col] == mask[i * width + source]);
      }
    }
  }

  const std::int64_t blocks = 3, heads = 2, block = 4, dim = 5, tokens = 4;
  HostTensor cache(DType::bf16, {2, blocks, heads, block, dim});
  HostTensor key(DType::bf16, {tokens, heads, dim}), value(DType::bf16, {tokens, heads, dim});
  cache.fill_uniform(random, 1.0);
  key.fill_uniform(random, 1.0);
  value.fill_uniform(random, 1.0);
  HostTensor expected = cache;
  std::vector<std::int32_t> slots = {11, -1, 0, 5};
  for (std::int64_t t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    for (std::int64_t e = 0; e < heads * dim; ++e) {
      const std::int64_t hk = e / dim, d = e % dim, b = slots[t] / block, o = slots[t] % block;
      const std::int64_t at = ((b * heads + hk) * block + o) * dim + d;
      expected.set(at, key.get(t * heads * dim + e));
      expected.set(blocks * heads * block * dim + at, value.get(t * heads * dim + e));
    }
  }
  tilelab::nki::reshape_and_cache(key.view(), value.view(), cache.view(),
                                  TensorView(slots.data(), DType::i32, {tokens}));
  CHECK(cache.bytes() == expected.bytes());
  slots[0] = static_cast<std::int32_t>(blocks * block);
  CHECK_THROWS_WITH(tilelab::nki::reshape_and_cache(key.view(), value.view(), cache.view(),
                                                    TensorView(slots.data(), DType::i32, {tokens})),
                    Catch::Contains("slot_mapping"));
}

TEST_CASE("nki: KvGatherTiling lays every token of a large tile out exactly once",
          "[nki][schedule]") {
  // Checked against the layout's definition, independently of its closed forms: load ld,
  // partition p, piece token tb hold token (ld · blocks_per_load + p / factor) · block_size +
  // (p mod factor) · tiled + tb, for the derived and every valid forced factor.
  using Tiling = tilelab::schedules::paged::KvGatherTiling<std::int64_t>;
  for (std::int64_t log2_tile = 9; log2_tile <= 13; ++log2_tile) {
    for (std::int64_t log2_block = 0; log2_block <= 8; ++log2_block) {
      const std::int64_t tile = std::int64_t{1} << log2_tile, block = std::int64_t{1} << log2_block;
      const std::int64_t blocks = tile / block;
      std::vector<Tiling> tilings = {Tiling::derived(log2_tile, log2_block)};
      for (std::int64_t log2_factor = 0; log2_factor <= log2_block; ++log2_factor)
        if (log2_factor == 0 || (blocks << log2_factor) <= 128)
          tilings.push_back(Tiling::forced(log2_tile, log2_block, log2_factor));
      for (const Tiling& t : tilings) {
        INFO("LARGE_TILE_SZ " << tile << ", block_size " << block << ", log2 factor "
                              << t.log2_tiling_factor);
        const std::int64_t factor = std::int64_t{1} << t.log2_tiling_factor;
        const std::int64_t tiled = block / factor;
        const std::int64_t partitions = std::min<std::int64_t>(128, blocks * factor);
        CHECK((std::int64_t{1} << t.log2_tiled_block_size()) == tiled);
        CHECK((std::int64_t{1} << t.log2_partitions_per_load) == partitions);
        const std::int64_t loads = std::int64_t{1} << t.log2_loads_per_large_tile();
        CHECK(loads * partitions * tiled == tile);
        std::vector<int> seen(static_cast<std::size_t>(tile), 0);
        bool layout_matches = true;
        for (std::int64_t c = 0; c < tile; ++c) {
          const std::int64_t ld = t.load_of_column(c), p = t.partition_of_column(c);
          const std::int64_t tb = t.piece_token_of_column(c);
          const std::int64_t expected =
              (ld * (partitions / factor) + p / factor) * block + (p % factor) * tiled + tb;
          layout_matches &= t.token_of_column(c) == expected && expected >= 0 && expected < tile;
          if (expected >= 0 && expected < tile) ++seen[static_cast<std::size_t>(expected)];
        }
        CHECK(layout_matches);
        CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
      }
    }
  }
  CHECK(tilelab::schedules::paged::reduction_tile<std::int64_t>(512) == 256);
  CHECK(tilelab::schedules::paged::reduction_tile<std::int64_t>(8192) == 2048);
}

TEST_CASE("nki: the schedule's field table drives its JSON, every field round-trips",
          "[nki][schedule]") {
  const auto& fields = tilelab::schedules::paged_attention_schedule_fields();
  // Every field away from its default, read through the table.
  const PagedAttentionSchedule changed = PagedAttentionSchedule::from_json(
      R"({"schema": "tilelab.paged_attention_schedule", "schema_version": 1,
          "large_tile_size": 4096, "block_size": 64, "mixed_precision": false,
          "transpose": "dma", "kv_buffers": 3, "block_size_tiling_factor_override": 1})");
  CHECK(changed.transpose == tilelab::schedules::TransposeMethod::dma);
  CHECK((changed.kv_buffers == 3 && !changed.mixed_precision && changed.block_size == 64));
  const std::string json = changed.to_json();
  for (const auto& field : fields) {
    INFO(field.name);
    std::string key(1, '"');
    key.append(field.name).append("\":");
    CHECK(json.find(key) != std::string::npos);
    CHECK(std::string(field.help).size() > 10);
  }
  CHECK(PagedAttentionSchedule::from_json(json) == changed);
  // The tile-machine knobs are exactly the fields of PagedAttentionTileKnobs.
  std::vector<std::string> knobs;
  for (const auto& field : fields)
    if (field.tile_machine_only) knobs.push_back(field.name);
  CHECK(knobs == std::vector<std::string>{"transpose", "kv_buffers"});
  const std::string header =
      R"({"schema": "tilelab.paged_attention_schedule", "schema_version": 1, )";
  CHECK_THROWS_WITH(PagedAttentionSchedule::from_json(header + R"("kv_buffers": 9})"),
                    Catch::Contains("kv_buffers: expected an integer in [1, 4], got 9"));
  CHECK_THROWS_WITH(PagedAttentionSchedule::from_json(header + R"("mixed_precision": 1})"),
                    Catch::Contains("mixed_precision: expected true or false"));
}

TEST_CASE("nki: PagedAttentionSchedule derives the tiling and rejects what the kernel cannot run",
          "[nki][schedule]") {
  PagedAttentionSchedule s;
  s.large_tile_size = 2048;
  s.block_size = 32;  // 64 blocks per large tile: each block split in 2 to fill 128 partitions
  s.validate();
  CHECK(s.num_blocks_per_large_tile() == 64);
  CHECK(s.block_size_tiling_factor() == 2);
  CHECK(s.tiled_block_size() == 16);
  CHECK(s.loads_per_large_tile() == 1);
  s.block_size = 1;  // 2048 blocks: 16 loads of 128 partitions, no tiling
  CHECK(s.block_size_tiling_factor() == 1);
  CHECK(s.loads_per_large_tile() == 16);
  CHECK(s.reduction_tile() == 1024);

  // The forced factor (the simulator's tiling_factor): fewer partitions per load, not more.
  s.block_size = 32;
  s.block_size_tiling_factor_override = 1;
  s.validate();
  CHECK(s.block_size_tiling_factor() == 1);
  CHECK(s.derived_block_size_tiling_factor() == 2);
  CHECK(s.partitions_per_load() == 64);
  CHECK(s.loads_per_large_tile() == 1);
  CHECK(s.tiled_block_size() == 32);
  CHECK(PagedAttentionSchedule::from_json(s.to_json()) == s);
  for (const std::int64_t bad : {3, 4, 64, -2}) {
    PagedAttentionSchedule forced = s;
    forced.block_size_tiling_factor_override = bad;  // 4: 64 blocks x 4 > 128 partitions
    CHECK_THROWS_WITH(forced.validate(),
                      Catch::Contains("block_size_tiling_factor_override: expected 0 (derived)"));
  }
  s.block_size_tiling_factor_override = 0;

  PagedAttentionSchedule base;
  // One change each from a valid schedule, and the field its error must name.
  using Change = void (*)(PagedAttentionSchedule&);
  const std::vector<std::pair<Change, const char*>> invalid = {
      {[](PagedAttentionSchedule& b) { b.large_tile_size = 1536, b.block_size = 512; },
       "block_size"},
      {[](PagedAttentionSchedule& b) { b.large_tile_size = 1536, b.block_size = 4; },
       "power of two"},
      {[](PagedAttentionSchedule& b) { b.large_tile_size = 256; }, "large_tile_size"},
      {[](PagedAttentionSchedule& b) { b.partition_tile = 64; }, "partition_tile"},
      {[](PagedAttentionSchedule& b) { b.kv_buffers = 0; }, "kv_buffers"},
  };
  for (const auto& [change, needle] : invalid) {
    PagedAttentionSchedule bad = base;
    change(bad);
    CHECK_THROWS_WITH(bad.validate(), Catch::Contains(needle));
  }

  tilelab::schedules::PagedAttentionShape shape;
  shape.head_dim = 160;
  shape.num_active_blocks = 64;
  CHECK_THROWS_WITH(base.validate(shape), Catch::Contains("head_dim"));
  shape.head_dim = 128;
  shape.query_len = 640;
  CHECK_THROWS_WITH(base.validate(shape), Catch::Contains("multiple of 512"));
  shape.query_len = 512;
  shape.num_active_blocks = 65;
  CHECK_THROWS_WITH(base.validate(shape), Catch::Contains("pad the block table"));
  shape.num_active_blocks = 64;
  base.validate(shape);

  PagedAttentionSchedule custom;
  custom.large_tile_size = 4096;
  custom.block_size = 128;
  custom.mixed_precision = false;
  custom.transpose = tilelab::schedules::TransposeMethod::dma;
  custom.kv_buffers = 3;
  CHECK(PagedAttentionSchedule::from_json(custom.to_json()) == custom);
  CHECK(custom.to_json().find("\"block_size_tiling_factor\": 4") != std::string::npos);
  CHECK(custom.to_json().find("\"block_size_tiling_factor_override\": 0") != std::string::npos);
  const std::string header =
      R"({"schema": "tilelab.paged_attention_schedule", "schema_version": 1, )";
  CHECK_THROWS_WITH(PagedAttentionSchedule::from_json(header + R"("large_tile": 512})"),
                    Catch::Contains("unknown key \"large_tile\""));
  CHECK_THROWS_WITH(PagedAttentionSchedule::from_json(header + R"("block_size": "32"})"),
                    Catch::Contains("block_size: expected an integer"));
  CHECK_THROWS_WITH(PagedAttentionSchedule::from_json(header + R"("transpose": "tensor"})"),
                    Catch::Contains("transpose"));
  CHECK_THROWS_WITH(PagedAttentionSchedule::from_json(header + R"("block_size": 3})"),
                    Catch::Contains("block_size"));
  CHECK_THROWS_WITH(PagedAttentionSchedule::from_json(R"({"schema_version": 1})"),
                    Catch::Contains("schema"));
}
