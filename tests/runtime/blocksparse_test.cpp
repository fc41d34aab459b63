// BlockSparseLayout: the local + strided rule, dense round trips, token masks, density, and the
// errors of every malformed layout.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "expect_error.hpp"
#include "host_tensor.hpp"
#include "tilelab/tilelab.hpp"

namespace {

using tilelab::BlockSparseLayout;
using tilelab_test::expect_error;

// The rule of BlockSparseLayout::local_strided, written out directly.
bool kept_by_rule(std::int64_t h, std::int64_t qb, std::int64_t kb, std::int64_t local_blocks,
                  std::int64_t vert_stride, std::int64_t step) {
  return qb >= kb && (qb - kb < local_blocks || (kb + h * step + 1) % vert_stride == 0);
}

}  // namespace

TEST_CASE("BlockSparseLayout::local_strided keeps exactly the blocks of its rule",
          "[runtime][blocksparse]") {
  struct Case {
    std::int64_t heads, seqlen, block, local, vert;
    bool homo;
    std::optional<std::int64_t> sliding;
  };
  const Case cases[] = {{4, 300, 16, 4, 3, false, std::nullopt},
                        {4, 300, 16, 4, 3, true, {}},
                        {3, 257, 32, 2, 4, false, 3},
                        {40, 1000, 64, 3, 8, false, {}},
                        {2, 64, 64, 1, 1, false, {}},
                        {5, 200, 8, 0, 5, false, 2}};
  for (const Case& c : cases) {
    const BlockSparseLayout layout = BlockSparseLayout::local_strided(
        c.heads, c.seqlen, c.block, c.local, c.vert, c.homo, c.sliding);
    const std::int64_t rows = (c.seqlen + c.block - 1) / c.block;
    REQUIRE(layout.n_heads() == c.heads);
    REQUIRE(layout.num_row_blocks() == rows);
    REQUIRE(layout.block_size() == c.block);
    REQUIRE(layout.causal());
    const std::int64_t step =
        c.homo ? 0 : c.sliding.value_or(std::max<std::int64_t>(1, c.vert / c.heads));
    const std::vector<std::uint8_t> dense = layout.to_dense();
    std::int64_t kept = 0;
    for (std::int64_t h = 0; h < c.heads; ++h) {
      for (std::int64_t qb = 0; qb < rows; ++qb) {
        for (std::int64_t kb = 0; kb < rows; ++kb) {
          const bool expected = kept_by_rule(h, qb, kb, c.local, c.vert, step);
          INFO("head " << h << " qb " << qb << " kb " << kb);
          REQUIRE(static_cast<bool>(dense[(h * rows + qb) * rows + kb]) == expected);
          kept += expected;
        }
      }
    }
    CHECK(layout.density() == Approx(static_cast<double>(kept) /
                                     (static_cast<double>(c.heads) * rows * (rows + 1) / 2)));
  }
}

TEST_CASE("BlockSparseLayout: CSR arrays, padding and from_dense/to_dense round trip",
          "[runtime][blocksparse]") {
  // Head 0 keeps (0,0), (1,0), (1,1), (2,2); head 1 keeps (2,0) only.
  const std::vector<std::uint8_t> mask = {1, 0, 0, 1, 1, 0, 0, 0, 1,   // head 0
                                          0, 0, 0, 0, 0, 0, 1, 0, 0};  // head 1
  const BlockSparseLayout layout = BlockSparseLayout::from_dense(mask, 2, 3, 4);
  CHECK(layout.nnz_max() == 4);
  CHECK(layout.crow() == std::vector<std::int32_t>{0, 1, 3, 4, 0, 0, 0, 1});
  CHECK(layout.col() == std::vector<std::int32_t>{0, 0, 1, 2, 0, -1, -1, -1});
  CHECK(layout.to_dense() == mask);
  CHECK(layout.nnz(0) == 4);
  CHECK(layout.nnz(1) == 1);
  CHECK(layout.density() == Approx(5.0 / 12.0));
  // The CSR constructor gives the same layout; padding is stored as -1 whatever it held.
  const BlockSparseLayout same(2, 4, layout.crow(), {0, 0, 1, 2, 0, 7, 7, 7});
  CHECK(same.col() == layout.col());
  CHECK(same.to_dense() == mask);

  const BlockSparseLayout non_causal =
      BlockSparseLayout::from_dense({0, 1, 1, 0}, 1, 2, 8, /*causal=*/false);
  CHECK(!non_causal.causal());
  CHECK(non_causal.density() == Approx(0.5));
  CHECK(non_causal.to_dense() == std::vector<std::uint8_t>{0, 1, 1, 0});
}

TEST_CASE("BlockSparseLayout::token_mask: kept blocks, causal inside diagonal blocks",
          "[runtime][blocksparse]") {
  const std::vector<std::uint8_t> mask = {1, 0, 0, 1, 1, 0, 1, 0, 1};
  const std::int64_t block = 4;
  for (const bool causal : {true, false}) {
    const BlockSparseLayout layout = BlockSparseLayout::from_dense(mask, 1, 3, block, causal);
    for (const std::int64_t seqlen : {12, 10, 1, 0}) {
      const std::vector<std::uint8_t> tokens = layout.token_mask(0, seqlen);
      REQUIRE(static_cast<std::int64_t>(tokens.size()) == seqlen * seqlen);
      for (std::int64_t i = 0; i < seqlen; ++i) {
        for (std::int64_t j = 0; j < seqlen; ++j) {
          const bool expected = mask[(i / block) * 3 + j / block] && (!causal || j <= i);
          INFO("causal " << causal << " seqlen " << seqlen << " i " << i << " j " << j);
          REQUIRE(static_cast<bool>(tokens[i * seqlen + j]) == expected);
        }
      }
    }
    expect_error([&] { layout.token_mask(0, 13); }, "seqlen", {"[0, 12]", "13"});
    expect_error([&] { layout.token_mask(1, 4); }, "head", {"[0, 1)", "1"});
  }
}

TEST_CASE("BlockSparseLayout errors name the array, the head and the row",
          "[runtime][blocksparse][errors]") {
  using Ints = std::vector<std::int32_t>;
  // Two heads, two rows; a valid layout is crow {0,1,3, 0,1,2}, col {0,0,1, 0,1,-1}.
  expect_error([] { BlockSparseLayout(2, 4, Ints{0, 1, 3, 0, 1}, Ints{0, 0, 1, 0, 1, 0}); }, "crow",
               {"5 entries"});
  expect_error([] { BlockSparseLayout(2, 4, Ints{0, 1, 3, 0, 1, 2}, Ints{0, 0, 1, 0, 1}); }, "col",
               {"5 entries"});
  expect_error([] { BlockSparseLayout(2, 4, Ints{0, 1, 3, 1, 1, 2}, Ints{0, 0, 1, 0, 1, 0}); },
               "crow", {"head 1"});
  expect_error([] { BlockSparseLayout(2, 4, Ints{0, 2, 1, 0, 1, 2}, Ints{0, 0, 1, 0, 1, 0}); },
               "crow", {"non-decreasing", "head 0, row 1"});
  expect_error([] { BlockSparseLayout(2, 4, Ints{0, 1, 4, 0, 1, 2}, Ints{0, 0, 1, 0, 1, 0}); },
               "col", {"at least 4", "head 0"});
  expect_error([] { BlockSparseLayout(2, 4, Ints{0, 1, 3, 0, 1, 2}, Ints{0, 0, 1, 0, 2, 0}); },
               "col", {"[0, 2)", "got 2", "head 1, row 1"});
  expect_error([] { BlockSparseLayout(2, 4, Ints{0, 1, 3, 0, 1, 2}, Ints{0, 0, -1, 0, 1, 0}); },
               "col", {"got -1", "head 0, row 1"});
  expect_error([] { BlockSparseLayout(2, 4, Ints{0, 1, 3, 0, 1, 2}, Ints{0, 1, 0, 0, 1, 0}); },
               "col", {"sorted", "head 0, row 1"});
  expect_error([] { BlockSparseLayout(2, 4, Ints{0, 1, 3, 0, 1, 2}, Ints{0, 1, 1, 0, 1, 0}); },
               "col", {"unique", "head 0, row 1"});
  expect_error([] { BlockSparseLayout(2, 4, Ints{0, 1, 3, 0, 1, 2}, Ints{1, 0, 1, 0, 1, 0}); },
               "col", {"above the diagonal", "column 1", "head 0, row 0"});
  // The same block is fine in a non-causal layout.
  CHECK_NOTHROW(BlockSparseLayout(2, 4, Ints{0, 1, 3, 0, 1, 2}, Ints{1, 0, 1, 0, 1, 0}, false));
  expect_error([] { BlockSparseLayout(0, 4, Ints{0, 1}, Ints{0}); }, "n_heads");
  expect_error([] { BlockSparseLayout(1, 0, Ints{0, 1}, Ints{0}); }, "block_size");

  expect_error([] { BlockSparseLayout::from_dense({1, 1, 1, 1}, 1, 2, 4); }, "block_mask",
               {"above the diagonal", "head 0, row 0"});
  expect_error([] { BlockSparseLayout::from_dense({1, 1, 1}, 1, 2, 4); }, "block_mask", {"got 3"});

  expect_error([] { BlockSparseLayout::local_strided(0, 64, 16, 1, 1); }, "n_heads");
  expect_error([] { BlockSparseLayout::local_strided(1, 0, 16, 1, 1); }, "max_seqlen");
  expect_error([] { BlockSparseLayout::local_strided(1, 64, 0, 1, 1); }, "block_size");
  expect_error([] { BlockSparseLayout::local_strided(1, 64, 16, -1, 1); }, "local_blocks");
  expect_error([] { BlockSparseLayout::local_strided(1, 64, 16, 1, 0); }, "vert_stride");
  expect_error([] { BlockSparseLayout::local_strided(1, 64, 16, 1, 2, false, -1); },
               "head_sliding_step");
}

namespace {

using tilelab::DType;
using tilelab::ErrorKind;
using tilelab::TensorView;
using tilelab_test::HostTensor;
using tilelab_test::Random;

// A valid blocksparse_attention call (two sequences: q_len 10 of k_len 40, decode of k_len 20;
// Hq 4, Hkv 2, D 16, fp32) that each test breaks in one way.
struct ValidCall {
  HostTensor q{DType::f32, {11, 4, 16}};
  HostTensor k{DType::f32, {60, 2, 16}};
  HostTensor v{DType::f32, {60, 2, 16}};
  HostTensor out{DType::f32, {11, 4, 16}};
  HostTensor cu_q{DType::i32, {3}};
  HostTensor cu_k{DType::i32, {3}};
  BlockSparseLayout layout = BlockSparseLayout::local_strided(4, 64, 16, 2, 2);
  TensorView q_view = q.view(), k_view = k.view(), v_view = v.view(), out_view = out.view();
  TensorView cu_q_view = cu_q.view(), cu_k_view = cu_k.view();
  tilelab::BlockSparseAttentionOptions options;

  ValidCall() {
    Random random(11);
    q.fill_uniform(random, 1.0);
    k.fill_uniform(random, 1.0);
    v.fill_uniform(random, 1.0);
    set_cu(cu_q, {0, 10, 11});
    set_cu(cu_k, {0, 40, 60});
  }
  static void set_cu(HostTensor& tensor, std::vector<float> values) {
    for (std::size_t i = 0; i < values.size(); ++i)
      tensor.set(static_cast<std::int64_t>(i), values[i]);
  }
  void run() {
    tilelab::blocksparse_attention(q_view, k_view, v_view, layout, cu_q_view, cu_k_view, out_view,
                                   options);
  }
};

// Calls `call` under every implementation; expects an Error of `kind` whose message starts with
// "`argument`:" and contains `also`, and out untouched.
void expect_call_error(ValidCall& call, ErrorKind kind, const std::string& argument,
                       const std::string& also) {
  call.out.fill_bytes(0x5a);
  const auto out_before = call.out.bytes();
  for (const auto implementation :
       {tilelab::Implementation::automatic, tilelab::Implementation::reference,
        tilelab::Implementation::generated}) {
    call.options.implementation = implementation;
    std::string message;
    bool thrown = false;
    try {
      call.run();
    } catch (const tilelab::Error& error) {
      thrown = true;
      message = error.what();
      CHECK(error.kind() == kind);
    }
    INFO("expected an error naming '" << argument << "' with '" << also << "', got: " << message);
    REQUIRE(thrown);
    CHECK(message.rfind(argument + ":", 0) == 0);
    CHECK(message.find(also) != std::string::npos);
  }
  CHECK(call.out.bytes() == out_before);
}

}  // namespace

TEST_CASE("blocksparse_attention errors: the valid call succeeds", "[runtime][blocksparse]") {
  ValidCall call;
  call.options.implementation = tilelab::Implementation::reference;
  CHECK_NOTHROW(call.run());
}

TEST_CASE("blocksparse_attention_kernels names the kernels a call runs and validates like it",
          "[runtime][blocksparse]") {
  ValidCall call;
  const auto kernels = [&] {
    return tilelab::blocksparse_attention_kernels(call.q_view, call.k_view, call.v_view,
                                                  call.layout, call.cu_q_view, call.cu_k_view,
                                                  call.out_view, call.options);
  };
  const std::vector<std::string> generated = {"blocksparse_f32_decode", "blocksparse_f32_prefill"};
#ifdef TILELAB_HAVE_KERNELS
  // 10 queries of a GQA group of 2 make prefill tasks; the single query, a decode task.
  CHECK(kernels() == generated);
  call.options.implementation = tilelab::Implementation::generated;
  CHECK(kernels() == generated);
#else
  CHECK(kernels().empty());
  call.options.implementation = tilelab::Implementation::generated;
  CHECK_THROWS_WITH(kernels(), Catch::Matchers::StartsWith(
                                   "implementation: 'generated' does not cover this call"));
#endif
  call.options.implementation = tilelab::Implementation::reference;
  CHECK(kernels().empty());
  call.options.implementation = tilelab::Implementation::automatic;
  ValidCall::set_cu(call.cu_q, {1, 10, 11});
  CHECK_THROWS_WITH(kernels(), Catch::Matchers::StartsWith("cu_seqlens_q: expected 0 at index 0"));
}

TEST_CASE("blocksparse_attention errors: cu_seqlens", "[runtime][blocksparse][errors]") {
  const std::tuple<std::vector<float>, std::vector<float>, std::string, std::string> cases[] = {
      {{1, 10, 11}, {0, 40, 60}, "cu_seqlens_q", "expected 0 at index 0, got 1"},
      {{0, 12, 11}, {0, 40, 60}, "cu_seqlens_q", "non-decreasing prefix sums, got 12 then 11"},
      {{0, 10, 12}, {0, 40, 60}, "cu_seqlens_q", "total_q = 11, got 12 at index 2"},
      {{0, 10, 11}, {0, 40, 59}, "cu_seqlens_k", "total_k = 60, got 59 at index 2"},
      {{0, 10, 11}, {0, 5, 60}, "cu_seqlens_q", "got q_len 10 > k_len 5 in sequence 0"},
  };
  for (const auto& [q_values, k_values, argument, also] : cases) {
    ValidCall call;
    ValidCall::set_cu(call.cu_q, q_values);
    ValidCall::set_cu(call.cu_k, k_values);
    expect_call_error(call, ErrorKind::invalid_value, argument, also);
  }
  {
    ValidCall call;
    HostTensor longer(DType::i32, {4});
    ValidCall::set_cu(longer, {0, 20, 40, 60});
    call.cu_k_view = longer.view();
    expect_call_error(call, ErrorKind::invalid_value, "cu_seqlens_k", "expected 3 entries");
  }
  {
    ValidCall call;
    HostTensor floats(DType::f32, {3});
    call.cu_q_view = floats.view();
    expect_call_error(call, ErrorKind::invalid_type, "cu_seqlens_q", "expected dtype int32");
  }
}

TEST_CASE("blocksparse_attention errors: tensors, layout, scale",
          "[runtime][blocksparse][errors]") {
  {
    ValidCall call;
    call.layout = BlockSparseLayout::local_strided(3, 64, 16, 2, 2);
    expect_call_error(call, ErrorKind::invalid_value, "layout", "got 3");
  }
  {
    ValidCall call;
    call.layout = BlockSparseLayout::local_strided(4, 32, 16, 2, 2);
    expect_call_error(call, ErrorKind::invalid_value, "layout", "got k_len 40 in sequence 0");
  }
  {
    ValidCall call;
    call.options.scale = std::numeric_limits<float>::infinity();
    expect_call_error(call, ErrorKind::invalid_value, "scale", "finite");
  }
  {
    ValidCall call;
    HostTensor k16(DType::f16, {60, 2, 16});
    call.k_view = k16.view();
    expect_call_error(call, ErrorKind::invalid_type, "k", "the dtype of q");
  }
  {
    ValidCall call;
    HostTensor wide(DType::f32, {11, 4, 257});
    call.q_view = wide.view();
    expect_call_error(call, ErrorKind::invalid_value, "q", "[1, 256]");
  }
  {
    ValidCall call;
    HostTensor three_heads(DType::f32, {60, 3, 16});
    call.k_view = three_heads.view();
    call.v_view = three_heads.view();
    expect_call_error(call, ErrorKind::invalid_value, "k", "divides q's");
  }
  {
    ValidCall call;
    call.out_view = call.q_view;
    expect_call_error(call, ErrorKind::invalid_value, "out", "disjoint from q");
  }
}

TEST_CASE("blocksparse_attention: a dense causal layout gives flash_attention's result",
          "[runtime][blocksparse]") {
  // One sequence of 50 keys and its last 30 queries, [len, H, D] viewed as [1, H, len, D].
  const std::int64_t heads = 2, kv_len = 50, q_len = 30, dim = 8;
  HostTensor q(DType::f32, {q_len, heads, dim}), k(DType::f32, {kv_len, heads, dim});
  HostTensor v(DType::f32, {kv_len, heads, dim}), out(DType::f32, {q_len, heads, dim});
  HostTensor dense_out(DType::f32, {1, heads, q_len, dim});
  Random random(5);
  q.fill_uniform(random, 2.0);
  k.fill_uniform(random, 2.0);
  v.fill_uniform(random, 1.0);
  HostTensor cu_q(DType::i32, {2}), cu_k(DType::i32, {2});
  cu_q.set(1, q_len);
  cu_k.set(1, kv_len);
  std::vector<std::uint8_t> lower(4 * 4, 0);
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c <= r; ++c) lower[r * 4 + c] = 1;
  }
  const BlockSparseLayout layout = BlockSparseLayout::from_dense(lower, 1, 4, 16);
  tilelab::blocksparse_attention(q.view(), k.view(), v.view(), layout, cu_q.view(), cu_k.view(),
                                 out.view());
  const auto as_batch = [](const HostTensor& t, std::int64_t len) {
    return TensorView(t.view().data(), DType::f32, {1, heads, len, dim},
                      {len * heads * dim, dim, heads * dim, 1});
  };
  tilelab::FlashAttentionOptions options;
  options.causal = true;
  options.causal_alignment = tilelab::CausalAlignment::bottom_right;
  tilelab::flash_attention(as_batch(q, q_len), as_batch(k, kv_len), as_batch(v, kv_len),
                           dense_out.view(), options);
  for (std::int64_t i = 0; i < q_len; ++i) {
    for (std::int64_t h = 0; h < heads; ++h) {
      for (std::int64_t d = 0; d < dim; ++d) {
        const float expected = dense_out.get((h * q_len + i) * dim + d);
        REQUIRE(out.get((i * heads + h) * dim + d) == Approx(expected).margin(1e-6));
      }
    }
  }
}

TEST_CASE(
    "blocksparse_attention: a sparse layout gives flash_attention's result with its token "
    "mask as a -inf bias",
    "[runtime][blocksparse]") {
  // One sequence of 90 keys and its last 70 queries; 16-token blocks, one local block, stride 3:
  // most blocks are absent.
  const std::int64_t heads = 2, kv_len = 90, q_len = 70, dim = 8;
  const BlockSparseLayout layout = BlockSparseLayout::local_strided(heads, 96, 16, 1, 3);
  HostTensor q(DType::f32, {q_len, heads, dim}), k(DType::f32, {kv_len, heads, dim});
  HostTensor v(DType::f32, {kv_len, heads, dim}), out(DType::f32, {q_len, heads, dim});
  HostTensor dense_out(DType::f32, {1, heads, q_len, dim});
  HostTensor bias(DType::f32, {1, heads, q_len, kv_len});
  Random random(9);
  q.fill_uniform(random, 2.0);
  k.fill_uniform(random, 2.0);
  v.fill_uniform(random, 1.0);
  for (std::int64_t h = 0; h < heads; ++h) {
    const std::vector<std::uint8_t> tokens = layout.token_mask(h, kv_len);
    for (std::int64_t i = 0; i < q_len; ++i) {
      for (std::int64_t j = 0; j < kv_len; ++j) {
        const bool visible = tokens[(kv_len - q_len + i) * kv_len + j];
        bias.set((h * q_len + i) * kv_len + j,
                 visible ? 0.0f : -std::numeric_limits<float>::infinity());
      }
    }
  }
  HostTensor cu_q(DType::i32, {2}), cu_k(DType::i32, {2});
  cu_q.set(1, q_len);
  cu_k.set(1, kv_len);
  tilelab::blocksparse_attention(q.view(), k.view(), v.view(), layout, cu_q.view(), cu_k.view(),
                                 out.view());
  const auto as_batch = [](const HostTensor& t, std::int64_t len) {
    return TensorView(t.view().data(), DType::f32, {1, heads, len, dim},
                      {len * heads * dim, dim, heads * dim, 1});
  };
  tilelab::FlashAttentionOptions options;
  options.bias = bias.view();
  tilelab::flash_attention(as_batch(q, q_len), as_batch(k, kv_len), as_batch(v, kv_len),
                           dense_out.view(), options);
  for (std::int64_t i = 0; i < q_len; ++i) {
    for (std::int64_t h = 0; h < heads; ++h) {
      for (std::int64_t d = 0; d < dim; ++d) {
        const float expected = dense_out.get((h * q_len + i) * dim + d);
        REQUIRE(out.get((i * heads + h) * dim + d) == Approx(expected).margin(1e-6));
      }
    }
  }
}

TEST_CASE(
    "blocksparse_attention: decode whose heads keep different blocks matches the reference, "
    "with K and V token-major and head-major",
    "[runtime][blocksparse]") {
  // Hq 32, Hkv 16, D 128: decode items span several kv heads of a token-major cache, and the
  // blocks a head keeps differ from its group's other heads'. Five sequences decoding one query.
  const std::int64_t q_heads = 32, kv_heads = 16, dim = 128, block = 16, blocks = 13;
  const std::vector<std::int64_t> k_lens = {blocks * block, 1, block, block + 1, 131};
  const auto seqs = static_cast<std::int64_t>(k_lens.size());
  std::int64_t total_k = 0;
  for (const std::int64_t len : k_lens) total_k += len;
  Random random(23);
  std::vector<std::uint8_t> mask(q_heads * blocks * blocks, 0);
  for (std::int64_t h = 0; h < q_heads; ++h) {
    for (std::int64_t r = 0; r < blocks; ++r) {
      for (std::int64_t c = 0; c <= r; ++c) {
        // Head 0 keeps nothing in the last row block; head 1 everything.
        const bool keep = h == 1 || (h != 0 && random.below(5) < 2);
        mask[(h * blocks + r) * blocks + c] = keep && !(h == 0 && r == blocks - 1);
      }
    }
  }
  const BlockSparseLayout layout = BlockSparseLayout::from_dense(mask, q_heads, blocks, block);
  HostTensor q(DType::f32, {seqs, q_heads, dim});
  HostTensor cu_q(DType::i32, {seqs + 1}), cu_k(DType::i32, {seqs + 1});
  for (std::int64_t s = 0, start = 0; s < seqs; ++s) {
    start += k_lens[static_cast<std::size_t>(s)];
    cu_q.set(s + 1, static_cast<float>(s + 1));
    cu_k.set(s + 1, static_cast<float>(start));
  }
  q.fill_uniform(random, 1.0);
  for (const bool head_major : {false, true}) {
    // Head-major: each kv head's tokens contiguous (one-head items).
    const tilelab_test::Layout kv_layout{head_major ? std::vector<int>{1, 0, 2}
                                                    : std::vector<int>{}};
    HostTensor k(DType::f32, {total_k, kv_heads, dim}, kv_layout);
    HostTensor v(DType::f32, {total_k, kv_heads, dim}, kv_layout);
    k.fill_uniform(random, 1.0);
    v.fill_uniform(random, 1.0);
    HostTensor out(DType::f32, {seqs, q_heads, dim}), expected(DType::f32, {seqs, q_heads, dim});
    tilelab::BlockSparseAttentionOptions options;
    tilelab::blocksparse_attention(q.view(), k.view(), v.view(), layout, cu_q.view(), cu_k.view(),
                                   out.view(), options);
    options.implementation = tilelab::Implementation::reference;
    tilelab::blocksparse_attention(q.view(), k.view(), v.view(), layout, cu_q.view(), cu_k.view(),
                                   expected.view(), options);
    INFO("head-major K and V: " << head_major);
    for (std::int64_t i = 0; i < out.numel(); ++i) {
      REQUIRE(out.get(i) == Approx(expected.get(i)).margin(1e-5));
    }
    // Head 0 of the longest sequence keeps no block of its query's row: 0.
    for (std::int64_t d = 0; d < dim; ++d) REQUIRE(out.get(d) == 0.0f);
  }
}
