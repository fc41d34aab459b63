// advise_huge_pages is advice only: whatever range it is given, memory keeps its contents.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

#include "sim/host_pages.hpp"

using tilelab::sim::advise_huge_pages;

TEST_CASE("advise_huge_pages changes no contents, for any range", "[sim][host_pages]") {
  // Over 6 MiB: at least two whole 2 MiB pages inside, with ragged ends.
  std::vector<std::uint32_t> data((6u << 20) / 4 + 1234);
  std::iota(data.begin(), data.end(), 7u);
  const std::size_t bytes = data.size() * sizeof(std::uint32_t);
  advise_huge_pages(data.data(), bytes);
  advise_huge_pages(reinterpret_cast<const char*>(data.data()) + 3, bytes - 17);  // unaligned
  advise_huge_pages(data.data(), 100);  // no whole huge page inside
  advise_huge_pages(data.data(), 0);
  advise_huge_pages(nullptr, 0);
  advise_huge_pages(nullptr, 4u << 20);
  for (std::size_t i = 0; i < data.size(); ++i) REQUIRE(data[i] == std::uint32_t(i + 7));
  // Still ordinary memory: written and read back after the advice.
  for (std::size_t i = 0; i < data.size(); i += 4099) data[i] = ~std::uint32_t(i);
  for (std::size_t i = 0; i < data.size(); i += 4099) REQUIRE(data[i] == ~std::uint32_t(i));
}
