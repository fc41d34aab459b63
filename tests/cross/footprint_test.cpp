// The tile schedule's generator-time SBUF/PSUM footprint (written by schedules/tile/footprint.cpp
// next to the kernel) against the simulator kernel's allocation for the same schedule and shape
// (the default paged-attention batch: LARGE_TILE_SZ 2048, block_size 32, d 128, seq_q 512,
// mixed precision), buffer by corresponding buffer.
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "sim/kernels/registry.hpp"
#include "sim/machine.hpp"

namespace {

namespace sim = tilelab::sim;

// What of the tile schedule's footprint exceeds `machine`'s SBUF/PSUM per partition (empty: it
// fits), naming the memory, the footprint and the capacity.
std::string tile_footprint_excess(const nlohmann::json& footprint, const sim::Machine& machine) {
  std::ostringstream excess;
  const long long sbuf = footprint["peak_sbuf_bytes_per_partition"].get<long long>();
  const long long psum = footprint["peak_psum_bytes_per_partition"].get<long long>();
  if (sbuf > machine.sbuf_bytes_per_partition)
    excess << "SBUF footprint " << sbuf << " bytes per partition exceeds the machine's "
           << machine.sbuf_bytes_per_partition << "; ";
  if (psum > machine.psum_bytes_per_partition)
    excess << "PSUM footprint " << psum << " bytes per partition exceeds the machine's "
           << machine.psum_bytes_per_partition;
  return excess.str();
}

TEST_CASE(
    "paged attention: the footprint check fails on a machine too small for the tile "
    "schedule",
    "[cross][footprint]") {
  std::ifstream file(TILELAB_TILE_FOOTPRINT_JSON);
  REQUIRE(file.good());
  const nlohmann::json footprint = nlohmann::json::parse(file);
  sim::Machine small = sim::load_machine("trn1");
  small.sbuf_bytes_per_partition = 16384;
  small.psum_bytes_per_partition = 16384;
  const std::string excess = tile_footprint_excess(footprint, small);
  CHECK_THAT(excess, Catch::Matchers::Contains("SBUF footprint") &&
                         Catch::Matchers::Contains("exceeds the machine's 16384"));
}

TEST_CASE("paged attention: tile schedule footprint matches the simulator's buffers",
          "[cross][footprint]") {
  std::ifstream file(TILELAB_TILE_FOOTPRINT_JSON);
  REQUIRE(file.good());
  const nlohmann::json footprint = nlohmann::json::parse(file);
  REQUIRE(footprint["configuration"]["large_tile_size"] == 2048);

  const sim::Machine machine = sim::load_machine("trn1");
  const sim::KernelInfo& kernel = sim::kernel_registry().find("paged-attention");
  const sim::Program program = kernel.build(machine, sim::resolve_parameters(kernel, {}));

  // Largest elements per partition per Halide stage (the context and new-token tiles share a
  // name) and per simulator pool (its buffers are the pool's round-robin copies).
  std::map<std::string, long long> halide;
  for (const auto& b : footprint["buffers"]) {
    const std::string name = b["name"].get<std::string>();
    const std::string base = name.substr(0, name.find_first_of("$."));
    halide[base] = std::max(halide[base], b["elements_per_partition"].get<long long>());
  }
  auto simulator = [&](const std::string& pool) {
    long long elements = 0;
    for (const sim::Buffer& b : program.buffers) {
      if (b.name.rfind(pool, 0) == 0) {
        elements = std::max(elements, static_cast<long long>(b.free_elements));
      }
    }
    return elements;
  };
  // Halide stage -> simulator pool: the buffers both allocate per (query tile, large tile).
  const std::pair<const char*, const char*> corresponding[] = {
      {"key_loaded", "k_gathered"}, {"value_loaded", "cur_v_tile"},
      {"key_t", "cur_k_tile"},      {"masked", "qk_res_buf"},
      {"prob", "p_local"},          {"prob_t", "p_local_transposed"},
      {"score", "qk_psum"},         {"block_pv", "pv_psum"}};
  std::ostringstream table;
  for (const auto& [stage, pool] : corresponding) {
    table << stage << " " << halide[stage] << " / " << pool << " " << simulator(pool) << "\n";
  }
  table << "peak SBUF bytes per partition: tile schedule "
        << footprint["peak_sbuf_bytes_per_partition"] << ", simulator "
        << program.peak_sbuf_bytes_per_partition << "; PSUM: tile schedule "
        << footprint["peak_psum_bytes_per_partition"] << ", simulator "
        << program.peak_psum_bytes_per_partition;
  INFO(table.str());
  WARN(table.str());
  for (const auto& [stage, pool] : corresponding) {
    CHECK(halide[stage] == simulator(pool));
  }
  // Both fit the machine (the check the build used to make at generator time, now against the
  // simulator's own machine description); the simulator holds more (double-buffered pools, the
  // o/l/m state of every query tile of a kv head, the block tables) than one task of the tile
  // schedule.
  CHECK(tile_footprint_excess(footprint, machine).empty());
  CHECK(footprint["peak_sbuf_bytes_per_partition"].get<long long>() <=
        program.peak_sbuf_bytes_per_partition);
}

}  // namespace
