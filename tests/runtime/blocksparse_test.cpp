// BlockSparseLayout: the local + strided rule, dense round trips, token masks, density, and the
// errors of every malformed layout.
#include <catch2/catch.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tilelab/tilelab.hpp"

namespace {

using tilelab::BlockSparseLayout;

// The rule of BlockSparseLayout::local_strided, written out directly.
bool kept_by_rule(std::int64_t h, std::int64_t qb, std::int64_t kb, std::int64_t local_blocks,
                  std::int64_t vert_stride, std::int64_t step) {
  return qb >= kb && (qb - kb < local_blocks || (kb + h * step + 1) % vert_stride == 0);
}

// Expects an Error whose message starts with "`argument`:" and contains every string of `also`.
template <typename Call>
void expect_error(Call&& call, const std::string& argument, std::vector<std::string> also = {}) {
  std::string message;
  try {
    call();
  } catch (const tilelab::Error& error) {
    message = error.what();
  }
  INFO("message: " << message);
  REQUIRE(!message.empty());
  CHECK(message.rfind(argument + ":", 0) == 0);
  for (const std::string& text : also) CHECK(message.find(text) != std::string::npos);
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
