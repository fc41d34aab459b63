// The flash kernels' tiling descriptions: variant names, and the choice between 32- and 64-row
// query tiles that the runtime makes per call.
#include <catch2/catch.hpp>

#include <string>

#include "schedules/flash/tiling.hpp"
#include "tilelab/error.hpp"

namespace flash = tilelab::schedules::flash;

TEST_CASE("tiling_of_variant names every generated tiling") {
  CHECK(flash::tiling_of_variant("prefill").query_tile == flash::kPrefillTiling.query_tile);
  CHECK(flash::tiling_of_variant("prefill_wide").key_block == flash::kPrefillWideTiling.key_block);
  CHECK(flash::tiling_of_variant("prefill_wide").split_state);
  const flash::FlashAttentionTiling wide_tall = flash::tiling_of_variant("prefill_wide_tall");
  CHECK(wide_tall.query_tile == 64);
  CHECK(wide_tall.key_block == flash::kPrefillWideTiling.key_block);
  CHECK(flash::tiling_of_variant("decode").decode);
}

TEST_CASE("tiling_of_variant rejects an unknown name, naming it and the allowed ones") {
  try {
    (void)flash::tiling_of_variant("prefill_tall");
    FAIL("accepted an unknown variant");
  } catch (const tilelab::Error& error) {
    const std::string message = error.what();
    CHECK(message.find("variant") != std::string::npos);
    CHECK(message.find("\"prefill_tall\"") != std::string::npos);
    CHECK(message.find("\"prefill_wide_tall\"") != std::string::npos);
  }
}

TEST_CASE("prefers_tall_query_tiles: tall tiles only when they pay for their padding") {
  // 32 rows or fewer fill one short tile: a tall one would be half padding.
  CHECK_FALSE(flash::prefers_tall_query_tiles(8, 64, 2));
  CHECK_FALSE(flash::prefers_tall_query_tiles(32, 64, 2));
  // 33-64 rows: one tall tile instead of two short ones.
  CHECK(flash::prefers_tall_query_tiles(48, 64, 2));
  CHECK(flash::prefers_tall_query_tiles(64, 8, 2));
  // 65-96 rows: two tall tiles (128 rows) cost more than three short ones (96 rows).
  CHECK_FALSE(flash::prefers_tall_query_tiles(80, 16, 2));
  // Long prefill: half the tiles, each block widened half as often.
  CHECK(flash::prefers_tall_query_tiles(512, 16, 2));
  CHECK(flash::prefers_tall_query_tiles(2080, 8, 2));
  // Too few tasks for the threads: two short tiles run side by side, one tall tile alone.
  CHECK_FALSE(flash::prefers_tall_query_tiles(64, 1, 2));
  CHECK(flash::prefers_tall_query_tiles(64, 1, 1));
}
