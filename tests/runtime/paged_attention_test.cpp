// paged_attention through the C++ API: the result equals flash_attention's reference on the K/V a
// block table names (every query token of a varlen batch), options against a direct fp64
// evaluation, split-KV, the fp8 codecs over all 256 codes, reshape_and_cache_flash, and errors
// naming the argument with nothing written.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "dtype_convert.hpp"
#include "expect_error.hpp"
#include "host_tensor.hpp"
#include "tilelab/tilelab.hpp"

namespace {

using tilelab::DType;
using tilelab_test::expect_error;
using tilelab_test::HostTensor;
using tilelab_test::Random;

constexpr std::int64_t kHeads = 4, kKvHeads = 2, kDim = 24, kBlock = 5;

// A batch of (q_len, seq_len) requests whose blocks are handed out back to front.
struct Batch {
  std::vector<std::int64_t> q_lens, seq_lens;
  std::int64_t tokens = 0, blocks = 0, max_blocks = 0;
  HostTensor query, key_cache, value_cache, block_table, lens, starts;

  Batch(std::vector<std::int64_t> q, std::vector<std::int64_t> s, DType dtype, DType cache_dtype)
      : q_lens(q),
        seq_lens(s),
        tokens(sum(q)),
        blocks(total_blocks(s)),
        max_blocks(max_blocks_of(s)),
        query(dtype, {tokens, kHeads, kDim}),
        key_cache(cache_dtype, {blocks, kKvHeads, kBlock, kDim}),
        value_cache(cache_dtype, {blocks, kKvHeads, kBlock, kDim}),
        block_table(DType::i32, {static_cast<std::int64_t>(s.size()), max_blocks}),
        lens(DType::i32, {static_cast<std::int64_t>(s.size())}),
        starts(DType::i32, {static_cast<std::int64_t>(s.size()) + 1}) {
    Random random(7);
    query.fill_uniform(random, 1.0);
    key_cache.fill_uniform(random, 1.0);
    value_cache.fill_uniform(random, 1.0);
    auto* table = static_cast<std::int32_t*>(block_table.view().data());
    auto* len = static_cast<std::int32_t*>(lens.view().data());
    auto* start = static_cast<std::int32_t*>(starts.view().data());
    std::int64_t next = blocks - 1, token = 0;
    start[0] = 0;
    for (std::size_t n = 0; n < s.size(); ++n) {
      for (std::int64_t b = 0; b < max_blocks; ++b) {
        table[n * max_blocks + b] = b < (s[n] + kBlock - 1) / kBlock ? next-- : -1;
      }
      len[n] = static_cast<std::int32_t>(s[n]);
      token += q[n];
      start[n + 1] = static_cast<std::int32_t>(token);
    }
  }

  static std::int64_t sum(const std::vector<std::int64_t>& values) {
    std::int64_t total = 0;
    for (std::int64_t v : values) total += v;
    return total;
  }
  static std::int64_t total_blocks(const std::vector<std::int64_t>& s) {
    std::int64_t total = 0;
    for (std::int64_t v : s) total += (v + kBlock - 1) / kBlock;
    return total;
  }
  static std::int64_t max_blocks_of(const std::vector<std::int64_t>& s) {
    std::int64_t most = 1;
    for (std::int64_t v : s) most = std::max(most, (v + kBlock - 1) / kBlock);
    return most;
  }

  // Element d of key (or value) position j of sequence n, kv head h, as stored.
  double cache_at(const HostTensor& cache, std::int64_t n, std::int64_t h, std::int64_t j,
                  std::int64_t d) const {
    const auto* table = static_cast<const std::int32_t*>(block_table.view().data());
    const std::int64_t block = table[n * max_blocks + j / kBlock];
    return cache.get(((block * kKvHeads + h) * kBlock + j % kBlock) * kDim + d);
  }
};

struct Options {
  bool causal = true;
  std::int64_t left = -1, right = -1;
  double softcap = 0, k_scale = 1, v_scale = 1;
  std::vector<float> slopes, sinks;
};

// The documented formulas in fp64, query token by token.
std::vector<double> fp64_paged(const Batch& batch, const Options& o) {
  std::vector<double> out(batch.tokens * kHeads * kDim, 0.0);
  const double scale = static_cast<double>(1.0f / std::sqrt(static_cast<float>(kDim)));
  std::int64_t token = 0;
  for (std::size_t n = 0; n < batch.q_lens.size(); ++n) {
    const std::int64_t seq_len = batch.seq_lens[n], q_len = batch.q_lens[n];
    for (std::int64_t t = 0; t < q_len; ++t, ++token) {
      const std::int64_t i = seq_len - q_len + t;
      for (std::int64_t h = 0; h < kHeads; ++h) {
        const std::int64_t kv = h / (kHeads / kKvHeads);
        std::vector<double> scores;
        std::vector<std::int64_t> keys;
        double row_max = o.sinks.empty() ? -INFINITY : o.sinks[h];
        for (std::int64_t j = 0; j < seq_len; ++j) {
          if ((o.causal && j > i) || (o.left >= 0 && j < i - o.left) ||
              (o.right >= 0 && j > i + o.right)) {
            continue;
          }
          double dot = 0;
          for (std::int64_t d = 0; d < kDim; ++d) {
            dot += batch.query.get((token * kHeads + h) * kDim + d) *
                   batch.cache_at(batch.key_cache, n, kv, j, d) * o.k_scale;
          }
          double s = scale * dot;
          if (o.softcap > 0) s = o.softcap * std::tanh(s / o.softcap);
          if (!o.slopes.empty()) s += o.slopes[h] * static_cast<double>(j - i);
          scores.push_back(s);
          keys.push_back(j);
          row_max = std::max(row_max, s);
        }
        if (scores.empty() && o.sinks.empty()) continue;
        double denominator = o.sinks.empty() ? 0.0 : std::exp(o.sinks[h] - row_max);
        for (double& s : scores) {
          s = std::exp(s - row_max);
          denominator += s;
        }
        for (std::int64_t d = 0; d < kDim; ++d) {
          double acc = 0;
          for (std::size_t k = 0; k < keys.size(); ++k) {
            acc += scores[k] * batch.cache_at(batch.value_cache, n, kv, keys[k], d) * o.v_scale;
          }
          out[(token * kHeads + h) * kDim + d] = acc / denominator;
        }
      }
    }
  }
  return out;
}

double max_error(const HostTensor& out, const std::vector<double>& expected) {
  double worst = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    worst = std::max(worst, std::abs(out.get(static_cast<std::int64_t>(i)) - expected[i]));
  }
  return worst;
}

void run(const Batch& batch, const HostTensor& out, const tilelab::PagedAttentionOptions& options) {
  tilelab::paged_attention(batch.query.view(), batch.key_cache.view(), batch.value_cache.view(),
                           batch.block_table.view(), batch.lens.view(), batch.starts.view(),
                           out.view(), options);
}

}  // namespace

TEST_CASE("paged_attention matches the fp64 formulas, with and without options",
          "[runtime][paged]") {
  const Batch batch({1, 7, 3, 0, 1}, {1, 23, 9, 4, 31}, DType::f32, DType::f32);
  HostTensor out(DType::f32, {batch.tokens, kHeads, kDim});
  Options o;
  std::vector<float> slopes = {0.5f, 0.25f, 0.125f, 0.0625f},
                     sinks = {0.3f, -1.0f, 2.0f, -INFINITY};
  struct Case {
    const char* name;
    Options options;
  };
  const Case cases[] = {
      {"plain", {}},
      {"softcap", {.softcap = 1.5}},
      {"alibi", {.slopes = slopes}},
      {"window", {.left = 4}},
      {"non-causal window", {.causal = false, .left = 2, .right = 3}},
      {"sinks", {.sinks = sinks}},
      {"everything", {.left = 6, .softcap = 2.0, .slopes = slopes, .sinks = sinks}},
  };
  for (const Case& c : cases) {
    {
      for (const std::int64_t split : {0, 1, 3}) {
        INFO(c.name << ", split_kv " << split);
        tilelab::PagedAttentionOptions options;
        options.causal = c.options.causal;
        options.score.sliding_window = {c.options.left, c.options.right};
        options.score.softcap = static_cast<float>(c.options.softcap);
        if (!c.options.slopes.empty()) {
          options.score.alibi_slopes = tilelab::TensorView(
              const_cast<float*>(c.options.slopes.data()), DType::f32, {kHeads});
        }
        if (!c.options.sinks.empty()) {
          options.score.sinks =
              tilelab::TensorView(const_cast<float*>(c.options.sinks.data()), DType::f32, {kHeads});
        }
        options.split_kv = split;
        run(batch, out, options);
        CHECK(max_error(out, fp64_paged(batch, c.options)) < 2e-6);
      }
    }
  }
}

TEST_CASE("paged_attention reads fp8 caches with their scales", "[runtime][paged]") {
  for (const DType fp8 : {DType::f8e4m3fn, DType::f8e5m2}) {
    const Batch batch({2, 1}, {12, 30}, DType::bf16, fp8);
    HostTensor out(DType::bf16, {batch.tokens, kHeads, kDim});
    tilelab::PagedAttentionOptions options;
    options.k_scale = 0.75f;
    options.v_scale = 1.5f;
    run(batch, out, options);
    Options o;
    o.k_scale = 0.75;
    o.v_scale = 1.5;
    // bf16 output: half an ulp of |out| <= 1.5.
    CHECK(max_error(out, fp64_paged(batch, o)) < 1.5 * 0x1p-8 + 1e-5);
  }
}

TEST_CASE("fp8 codecs: every code widens to its value and narrows back", "[runtime][paged]") {
  for (int code = 0; code < 256; ++code) {
    const auto bits = static_cast<std::uint8_t>(code);
    const int sign = code & 0x80 ? -1 : 1;
    {  // e4m3fn: bias 7, no inf, S.1111.111 NaN
      const int exponent = (code >> 3) & 0xf, mantissa = code & 7;
      const float value = tilelab::detail::f8e4m3fn_bits_to_float(bits);
      if ((code & 0x7f) == 0x7f) {
        CHECK(std::isnan(value));
      } else {
        const double expected =
            sign * (exponent == 0 ? std::ldexp(mantissa / 8.0, -6)
                                  : std::ldexp(1.0 + mantissa / 8.0, exponent - 7));
        CHECK(value == expected);
        CHECK(std::signbit(value) == (sign < 0));
        CHECK(tilelab::detail::float_to_f8e4m3fn_bits(value) == bits);
      }
    }
    {  // e5m2: bias 15, inf and NaN with exponent 31
      const int exponent = (code >> 2) & 0x1f, mantissa = code & 3;
      const float value = tilelab::detail::f8e5m2_bits_to_float(bits);
      if (exponent == 31) {
        CHECK((mantissa == 0 ? std::isinf(value) : std::isnan(value)));
        if (mantissa == 0) CHECK(tilelab::detail::float_to_f8e5m2_bits(value) == bits);
      } else {
        const double expected =
            sign * (exponent == 0 ? std::ldexp(mantissa / 4.0, -14)
                                  : std::ldexp(1.0 + mantissa / 4.0, exponent - 15));
        CHECK(value == expected);
        CHECK(tilelab::detail::float_to_f8e5m2_bits(value) == bits);
      }
    }
  }
  // Ties round to even; finite overflow saturates.
  CHECK(tilelab::detail::float_to_f8e4m3fn_bits(1.0625f) == 0x38);  // halfway 1 and 1.125
  CHECK(tilelab::detail::float_to_f8e4m3fn_bits(1.1875f) == 0x3a);  // halfway 1.125 and 1.25
  CHECK(tilelab::detail::float_to_f8e4m3fn_bits(1e6f) == 0x7e);
  CHECK(tilelab::detail::float_to_f8e5m2_bits(-1e6f) == 0xfb);
}

TEST_CASE("reshape_and_cache_flash writes slots, skips negative ones, and validates",
          "[runtime][paged]") {
  HostTensor key(DType::f32, {3, kKvHeads, kDim}), value(DType::f32, {3, kKvHeads, kDim});
  Random random(3);
  key.fill_uniform(random, 2.0);
  value.fill_uniform(random, 2.0);
  HostTensor key_cache(DType::f8e4m3fn, {4, kKvHeads, kBlock, kDim});
  HostTensor value_cache(DType::f8e4m3fn, {4, kKvHeads, kBlock, kDim});
  HostTensor slots(DType::i32, {3});
  auto* slot = static_cast<std::int32_t*>(slots.view().data());
  slot[0] = 7;
  slot[1] = -1;
  slot[2] = 19;
  tilelab::reshape_and_cache_flash(key.view(), value.view(), key_cache.view(), value_cache.view(),
                                   slots.view(), 0.5f, 2.0f);
  for (std::int64_t h = 0; h < kKvHeads; ++h) {
    for (std::int64_t d = 0; d < kDim; ++d) {
      const auto cached = [&](const HostTensor& cache, std::int64_t s) {
        return cache.get((((s / kBlock) * kKvHeads + h) * kBlock + s % kBlock) * kDim + d);
      };
      const auto stored = [](float x) {
        return tilelab::detail::f8e4m3fn_bits_to_float(tilelab::detail::float_to_f8e4m3fn_bits(x));
      };
      CHECK(cached(key_cache, 7) == stored(key.get((0 * kKvHeads + h) * kDim + d) / 0.5f));
      CHECK(cached(value_cache, 19) == stored(value.get((2 * kKvHeads + h) * kDim + d) / 2.0f));
      CHECK(cached(key_cache, 0) == 0.0f);
    }
  }
  const std::vector<unsigned char> before = key_cache.bytes();
  slot[1] = 20;  // 4 blocks x 5 = 20 slots
  expect_error(
      [&] {
        tilelab::reshape_and_cache_flash(key.view(), value.view(), key_cache.view(),
                                         value_cache.view(), slots.view(), 0.5f, 2.0f);
      },
      "slot_mapping", {"got 20 at index 1"});
  CHECK(key_cache.bytes() == before);
  expect_error(
      [&] {
        tilelab::reshape_and_cache_flash(key.view(), value.view(), key_cache.view(),
                                         key_cache.view(), slots.view());
      },
      "key_cache", {"disjoint from value_cache"});
}

TEST_CASE("paged_attention errors name the argument and write nothing", "[runtime][paged]") {
  Batch batch({2, 1}, {12, 30}, DType::f32, DType::f32);
  HostTensor out(DType::f32, {batch.tokens, kHeads, kDim});
  out.fill_bytes(0x5a);
  const std::vector<unsigned char> before = out.bytes();
  auto* table = static_cast<std::int32_t*>(batch.block_table.view().data());
  const std::int32_t saved = table[1];
  table[1] = static_cast<std::int32_t>(batch.blocks);  // sequence 1, logical block 0... of row 0
  expect_error([&] { run(batch, out, {}); }, "block_table",
               {"got " + std::to_string(batch.blocks)});
  table[1] = saved;
  tilelab::PagedAttentionOptions options;
  options.score.sliding_window = {-3, 0};
  expect_error([&] { run(batch, out, options); }, "sliding_window", {"(-3, 0)"});
  options = {};
  options.k_scale = 0.5f;
  expect_error([&] { run(batch, out, options); }, "k_scale", {"float32 K/V"});
  auto* lens = static_cast<std::int32_t*>(batch.lens.view().data());
  lens[0] = 1;  // shorter than its 2 query tokens
  expect_error([&] { run(batch, out, {}); }, "seq_lens", {"seq_lens[0] = 1 < 2"});
  CHECK(out.bytes() == before);
}

#ifdef TILELAB_HAVE_KERNELS
TEST_CASE("flash_attention with score options: the generated kernels agree with the paged kernel",
          "[runtime][paged]") {
  // 3 query heads per kv head, 45 queries, 150 keys: prefill-sized, three 64-key blocks, so a
  // window's left edge skips whole blocks.
  const float slopes[6] = {0.5f, 0.25f, 0.125f, 0.0625f, 0.03125f, 0.015625f};
  const float sinks[6] = {0.5f, -1.0f, 3.0f, -std::numeric_limits<float>::infinity(), 0.0f, 1.5f};
  for (const DType dtype : {DType::f32, DType::bf16}) {
    HostTensor q(dtype, {1, 6, 45, 40}), k(dtype, {1, 2, 150, 40}), v(dtype, {1, 2, 150, 40});
    Random random(12);
    q.fill_uniform(random, 1.0);
    k.fill_uniform(random, 1.0);
    v.fill_uniform(random, 1.0);
    for (const bool causal : {true, false}) {
      tilelab::FlashAttentionOptions options;
      options.causal = causal;
      options.causal_alignment = tilelab::CausalAlignment::bottom_right;
      options.score.softcap = 4.0f;
      options.score.alibi_slopes = tilelab::TensorView(const_cast<float*>(slopes), DType::f32, {6});
      options.score.sinks = tilelab::TensorView(const_cast<float*>(sinks), DType::f32, {6});
      options.score.sliding_window = {70, causal ? -1 : 5};
      HostTensor generated(dtype, {1, 6, 45, 40}), paged(dtype, {1, 6, 45, 40});
      HostTensor generated_lse(DType::f32, {1, 6, 45}), paged_lse(DType::f32, {1, 6, 45});
      CHECK(std::string(tilelab::flash_attention_implementation(
                q.view(), k.view(), v.view(), generated.view(), options)) == "generated");
      options.lse = generated_lse.view();
      options.implementation = tilelab::Implementation::generated;
      tilelab::flash_attention(q.view(), k.view(), v.view(), generated.view(), options);
      options.lse = paged_lse.view();
      options.implementation = tilelab::Implementation::reference;  // the paged kernel
      tilelab::flash_attention(q.view(), k.view(), v.view(), paged.view(), options);
      // Both fp32 accumulation; bf16 rounds P (generated) and the output to bf16.
      const double tolerance = dtype == DType::f32 ? 2e-5 : 2e-2;
      for (std::int64_t i = 0; i < generated.numel(); ++i) {
        REQUIRE(std::abs(generated.get(i) - paged.get(i)) <= tolerance);
      }
      for (std::int64_t i = 0; i < generated_lse.numel(); ++i) {
        REQUIRE(std::abs(generated_lse.get(i) - paged_lse.get(i)) <= 1e-4);
      }
    }
  }
}
#endif

TEST_CASE("flash_attention with score options: lse, and the backward with the sinks' gradient",
          "[runtime][paged]") {
  HostTensor q(DType::f32, {1, 2, 5, 8}), k(DType::f32, {1, 1, 7, 8}), v(DType::f32, {1, 1, 7, 8});
  Random random(11);
  q.fill_uniform(random, 1.0);
  k.fill_uniform(random, 1.0);
  v.fill_uniform(random, 1.0);
  HostTensor out(DType::f32, {1, 2, 5, 8}), lse(DType::f32, {1, 2, 5});
  tilelab::FlashAttentionOptions options;
  options.causal = true;
  options.causal_alignment = tilelab::CausalAlignment::bottom_right;
  options.score.softcap = 1.0f;
  options.lse = lse.view();
  tilelab::flash_attention(q.view(), k.view(), v.view(), out.view(), options);
  // Every row sees a key: lse is finite and at most log(7 keys) + max score (<= softcap).
  for (std::int64_t i = 0; i < 10; ++i) {
    CHECK(std::isfinite(lse.get(i)));
    CHECK(lse.get(i) <= std::log(7.0f) + 1.0f);
  }
  // 10 rows per kv head: the generated prefill kernel with score options (when built); at most
  // 8, the paged kernel.
#ifdef TILELAB_HAVE_KERNELS
  const std::string prefill_implementation = "generated";
#else
  const std::string prefill_implementation = "paged";
#endif
  CHECK(std::string(tilelab::flash_attention_implementation(
            q.view(), k.view(), v.view(), out.view(), options)) == prefill_implementation);
  options.lse.reset();
  const tilelab::TensorView four_queries(q.view().data(), DType::f32, {1, 2, 4, 8}, {80, 40, 8, 1});
  HostTensor out4(DType::f32, {1, 2, 4, 8});
  CHECK(std::string(tilelab::flash_attention_implementation(four_queries, k.view(), v.view(),
                                                            out4.view(), options)) == "paged");
  // The backward takes the options; dsinks needs sinks, and both implementations agree.
  HostTensor dout(DType::f32, {1, 2, 5, 8});
  dout.fill_uniform(random, 1.0);
  HostTensor sinks(DType::f32, {2}), dsinks(DType::f32, {2});
  sinks.set(0, 0.5f);
  sinks.set(1, -1.0f);
  HostTensor dsinks_reference(DType::f32, {2});
  std::vector<HostTensor> grads, grads_reference;
  for (int n = 0; n < 3; ++n) {
    grads.emplace_back(DType::f32, n == 0 ? std::vector<std::int64_t>{1, 2, 5, 8}
                                          : std::vector<std::int64_t>{1, 1, 7, 8});
    grads_reference.emplace_back(DType::f32, n == 0 ? std::vector<std::int64_t>{1, 2, 5, 8}
                                                    : std::vector<std::int64_t>{1, 1, 7, 8});
  }
  expect_error(
      [&] {
        tilelab::flash_attention_backward(dout.view(), q.view(), k.view(), v.view(), out.view(),
                                          lse.view(), grads[0].view(), grads[1].view(),
                                          grads[2].view(), options, std::nullopt, dsinks.view());
      },
      "dsinks", {"without sinks"});
  options.score.sinks = sinks.view();
  options.lse = lse.view();
  tilelab::flash_attention(q.view(), k.view(), v.view(), out.view(), options);
  options.lse.reset();
  tilelab::flash_attention_backward(dout.view(), q.view(), k.view(), v.view(), out.view(),
                                    lse.view(), grads[0].view(), grads[1].view(), grads[2].view(),
                                    options, std::nullopt, dsinks.view());
  options.implementation = tilelab::Implementation::reference;
  tilelab::flash_attention_backward(dout.view(), q.view(), k.view(), v.view(), out.view(),
                                    lse.view(), grads_reference[0].view(),
                                    grads_reference[1].view(), grads_reference[2].view(), options,
                                    std::nullopt, dsinks_reference.view());
  for (int n = 0; n < 3; ++n) {
    for (std::int64_t e = 0; e < grads[n].numel(); ++e) {
      CHECK(grads[n].get(e) == Approx(grads_reference[n].get(e)).margin(1e-5));
    }
  }
  for (std::int64_t h = 0; h < 2; ++h) {
    CHECK(std::isfinite(dsinks.get(h)));
    CHECK(dsinks.get(h) == dsinks_reference.get(h));  // one implementation for both
  }
}
