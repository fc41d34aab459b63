// PagedAttentionSchedule: validation (the NKI kernel's constraints, each with its reason) and JSON.
#include "schedules/paged/schedule.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <variant>

#include "common/json_input.hpp"
#include "tilelab/error.hpp"

namespace tilelab::schedules {
namespace {

constexpr const char* kSchema = "tilelab.paged_attention_schedule";

bool is_power_of_two(std::int64_t x) {
  return x > 0 && (x & (x - 1)) == 0;
}

}  // namespace

const char* transpose_method_name(TransposeMethod method) {
  return method == TransposeMethod::dma ? "dma" : "pe";
}

namespace {

// log2 of a power of two (validate() checks the values; the derived getters are only meaningful
// for valid schedules).
std::int64_t log2_of(std::int64_t power_of_two) {
  return power_of_two > 0 ? std::countr_zero(static_cast<std::uint64_t>(power_of_two)) : 0;
}

}  // namespace

paged::KvGatherTiling<std::int64_t> PagedAttentionTiling::kv_gather_tiling() const {
  using Tiling = paged::KvGatherTiling<std::int64_t>;
  const std::int64_t log2_tile = log2_of(large_tile_size), log2_block = log2_of(block_size);
  return block_size_tiling_factor_override != 0
             ? Tiling::forced(log2_tile, log2_block, log2_of(block_size_tiling_factor_override))
             : Tiling::derived(log2_tile, log2_block);
}

std::int64_t PagedAttentionTiling::derived_block_size_tiling_factor() const {
  return std::int64_t{1} << (paged::KvGatherTiling<std::int64_t>::log2_derived_tiling_factor(
             log2_of(num_blocks_per_large_tile())));
}

std::int64_t PagedAttentionTiling::block_size_tiling_factor() const {
  return kv_gather_tiling().tiling_factor();
}

std::int64_t PagedAttentionTiling::tiled_block_size() const {
  return kv_gather_tiling().tiled_block_size();
}

std::int64_t PagedAttentionTiling::partitions_per_load() const {
  return kv_gather_tiling().partitions_per_load();
}

std::int64_t PagedAttentionTiling::loads_per_large_tile() const {
  return kv_gather_tiling().loads_per_large_tile();
}

std::int64_t PagedAttentionTiling::reduction_tile() const {
  return paged::reduction_tile<std::int64_t>(large_tile_size);
}

void PagedAttentionTiling::validate() const {
  TILELAB_REQUIRE(partition_tile == 128)
      << "partition_tile (B_P_SIZE): expected 128 (the SBUF/PSUM partitions), got "
      << partition_tile;
  TILELAB_REQUIRE(free_tile == 512)
      << "free_tile (B_F_SIZE): expected 512 (one 2 KiB PSUM bank of fp32), got " << free_tile;
  TILELAB_REQUIRE(large_tile_size >= 512 && large_tile_size <= 8192 &&
                  large_tile_size % free_tile == 0)
      << "large_tile_size (LARGE_TILE_SZ): expected a multiple of free_tile (" << free_tile
      << ") in [512, 8192] (P is transposed in free_tile-column pieces), got " << large_tile_size;
  TILELAB_REQUIRE(is_power_of_two(block_size) && block_size <= 256)
      << "block_size: expected a power of two in [1, 256], got " << block_size;
  TILELAB_REQUIRE(large_tile_size % block_size == 0)
      << "large_tile_size (LARGE_TILE_SZ): expected a multiple of block_size (" << block_size
      << ") so that a large tile holds whole cache blocks, got " << large_tile_size;
  TILELAB_REQUIRE(is_power_of_two(num_blocks_per_large_tile()))
      << "large_tile_size / block_size: expected a power of two (blocks per large tile are "
         "spread over the 128 partitions of a vectorized load), got "
      << large_tile_size << " / " << block_size << " = " << num_blocks_per_large_tile();
  if (block_size_tiling_factor_override != 0) {
    const std::int64_t factor = block_size_tiling_factor_override;
    TILELAB_REQUIRE(is_power_of_two(factor) && block_size % factor == 0 &&
                    (factor == 1 || num_blocks_per_large_tile() * factor <= partition_tile))
        << "block_size_tiling_factor_override: expected 0 (derived) or a power of two dividing "
           "block_size ("
        << block_size << ") with blocks per large tile (" << num_blocks_per_large_tile()
        << ") x factor <= " << partition_tile
        << " partitions (one vectorized load spans at most the partitions), got " << factor;
  }
  TILELAB_REQUIRE(block_size % block_size_tiling_factor() == 0)
      << "block_size: expected a multiple of the block size tiling factor "
      << block_size_tiling_factor() << " (= " << partition_tile
      << " partitions / blocks per large tile), got " << block_size;
}

void PagedAttentionTileKnobs::validate() const {
  TILELAB_REQUIRE(kv_buffers >= 1 && kv_buffers <= 4)
      << "kv_buffers: expected 1 to 4 K/V large-tile buffers, got " << kv_buffers;
}

void PagedAttentionSchedule::validate() const {
  PagedAttentionTiling::validate();
  PagedAttentionTileKnobs::validate();
}

void PagedAttentionSchedule::validate(const PagedAttentionShape& shape) const {
  PagedAttentionTileKnobs::validate();
  PagedAttentionTiling::validate(shape);
}

void PagedAttentionTiling::validate(const PagedAttentionShape& shape) const {
  validate();
  TILELAB_REQUIRE(shape.head_dim >= 1 && shape.head_dim <= partition_tile)
      << "head_dim: expected 1 to " << partition_tile
      << " (d is the contraction dim of q·kᵀ, on the partitions), got " << shape.head_dim;
  TILELAB_REQUIRE(shape.num_kv_heads >= 1 && shape.num_heads >= 1 &&
                  shape.num_heads % shape.num_kv_heads == 0)
      << "num_heads: expected a positive multiple of num_kv_heads (" << shape.num_kv_heads
      << "), got " << shape.num_heads;
  TILELAB_REQUIRE(shape.query_len >= partition_tile && shape.query_len % partition_tile == 0)
      << "seq_q: expected a positive multiple of " << partition_tile
      << " (query rows are processed in full partition tiles; pad the batch), got "
      << shape.query_len;
  if (shape.query_len > free_tile) {
    // The new tokens form one tile of query_len columns: transposed in free_tile pieces, its
    // exp-sums reduced in pieces of REDUCTION_TILE = min(2048, query_len / 2).
    // (query_len is a multiple of its reduction tile while that is query_len / 2.)
    const std::int64_t reduction = paged::reduction_tile<std::int64_t>(shape.query_len);
    const std::int64_t piece =
        reduction == shape.query_len / 2 ? free_tile : std::max(free_tile, reduction);
    TILELAB_REQUIRE(shape.query_len % piece == 0)
        << "seq_q: expected a multiple of " << piece << " when seq_q > " << free_tile
        << " (the new tokens' tile is transposed and reduced in pieces of " << piece << "), got "
        << shape.query_len;
  }
  TILELAB_REQUIRE(shape.num_active_blocks >= 1)
      << "block_tables: expected at least one block (the kernel starts its running softmax "
         "statistics from the first prior-context tile), got 0 entries";
  const std::int64_t context_len = shape.num_active_blocks * block_size;
  TILELAB_REQUIRE(context_len % large_tile_size == 0)
      << "block_tables: expected num_active_blocks · block_size to be a multiple of "
         "large_tile_size ("
      << large_tile_size << "; pad the block table), got " << shape.num_active_blocks << " · "
      << block_size << " = " << context_len;
}

const std::vector<PagedAttentionScheduleField>& paged_attention_schedule_fields() {
  using S = PagedAttentionSchedule;
  static const std::vector<PagedAttentionScheduleField> fields = {
      {"partition_tile", "B_P_SIZE: query rows per tile = SBUF/PSUM partitions (128)",
       &S::partition_tile, 1, 1 << 16},
      {"free_tile", "B_F_SIZE: score columns per matmul = one PSUM bank of fp32 (512)",
       &S::free_tile, 1, 1 << 16},
      {"large_tile_size", "LARGE_TILE_SZ: prior-context tokens per large tile", &S::large_tile_size,
       1, 1 << 20},
      {"block_size", "tokens per KV-cache block", &S::block_size, 1, 1 << 16},
      {"mixed_precision", "bf16 tensor-engine operands with fp32 accumulation",
       &S::mixed_precision},
      {"transpose", "how tiles are transposed: pe (tensor engine) or dma (NeuronCore-v3)",
       &S::transpose, 0, 0, true},
      {"kv_buffers", "K/V large-tile buffers in SBUF (2 = double buffering)", &S::kv_buffers, 1, 4,
       true},
      {"block_size_tiling_factor_override",
       "0 derives the block size tiling factor; otherwise forces it",
       &S::block_size_tiling_factor_override, 0, 1 << 16},
  };
  return fields;
}

std::string PagedAttentionSchedule::to_json() const {
  nlohmann::ordered_json json;
  json["schema"] = kSchema;
  json["schema_version"] = kSchemaVersion;
  for (const PagedAttentionScheduleField& field : paged_attention_schedule_fields()) {
    std::visit(
        [&](auto member) {
          if constexpr (std::is_same_v<decltype(member), TransposeMethod PagedAttentionSchedule::*>)
            json[field.name] = transpose_method_name(this->*member);
          else
            json[field.name] = this->*member;
        },
        field.member);
  }
  json["derived"] = {{"num_blocks_per_large_tile", num_blocks_per_large_tile()},
                     {"block_size_tiling_factor", block_size_tiling_factor()},
                     {"tiled_block_size", tiled_block_size()},
                     {"partitions_per_load", partitions_per_load()},
                     {"loads_per_large_tile", loads_per_large_tile()},
                     {"reduction_tile", reduction_tile()}};
  return json.dump(2);
}

PagedAttentionSchedule PagedAttentionSchedule::from_json(const std::string& text) {
  // The bounded parser: malformed JSON, deep nesting, duplicate keys and numbers beyond the
  // double range are Errors here, so every value below has a bounded excerpt.
  const nlohmann::json json = parse_user_json(text, "paged attention schedule");
  TILELAB_REQUIRE(json.is_object()) << "paged attention schedule: expected a JSON object, got "
                                    << json.type_name() << " " << json_excerpt(json);
  const auto given = [&](const char* key) {
    return json.contains(key) ? json_excerpt(json[key]) : std::string("nothing");
  };
  TILELAB_REQUIRE(json.contains("schema") && json["schema"].is_string() &&
                  json["schema"].get<std::string>() == kSchema)
      << "schema: expected \"" << kSchema << "\", got " << given("schema");
  // The integer itself: 1.0 or 1.9 is not version 1.
  TILELAB_REQUIRE(json.contains("schema_version") && json["schema_version"].is_number_integer() &&
                  json["schema_version"].get<std::int64_t>() == kSchemaVersion)
      << "schema_version: expected " << kSchemaVersion << ", got " << given("schema_version");
  // Written by to_json() and ignored on read, but still the object to_json() writes.
  TILELAB_REQUIRE(!json.contains("derived") || json["derived"].is_object())
      << "derived: expected an object (derived values, ignored on read), got " << given("derived");

  const auto& fields = paged_attention_schedule_fields();
  PagedAttentionSchedule schedule;
  for (const auto& [key, value] : json.items()) {
    if (key == "schema" || key == "schema_version" || key == "derived") continue;
    const auto field =
        std::find_if(fields.begin(), fields.end(), [&](const auto& f) { return key == f.name; });
    if (field == fields.end()) {
      std::string known;
      for (const auto& f : fields) known += std::string(known.empty() ? "" : ", ") + f.name;
      throw Error("paged attention schedule: unknown key " + json_excerpt(nlohmann::json(key)) +
                  " (known: " + known + ")");
    }
    std::visit(
        [&](auto member) {
          using Value = std::remove_reference_t<decltype(schedule.*member)>;
          if constexpr (std::is_same_v<Value, TransposeMethod>) {
            TILELAB_REQUIRE(value == "pe" || value == "dma")
                << key << ": expected \"pe\" or \"dma\", got " << json_excerpt(value);
            schedule.*member = value == "dma" ? TransposeMethod::dma : TransposeMethod::pe;
          } else if constexpr (std::is_same_v<Value, bool>) {
            TILELAB_REQUIRE(value.is_boolean())
                << key << ": expected true or false, got " << json_excerpt(value);
            schedule.*member = value.get<bool>();
          } else {
            // nlohmann reads non-negative integers as unsigned: beyond INT64_MAX they are out of
            // range, not wrapped to negative numbers.
            const bool integer = value.is_number_integer() &&
                                 (!value.is_number_unsigned() ||
                                  value.get<std::uint64_t>() <= std::uint64_t{INT64_MAX});
            const bool in_range = integer && value.get<std::int64_t>() >= field->min_value &&
                                  value.get<std::int64_t>() <= field->max_value;
            TILELAB_REQUIRE(in_range)
                << key << ": expected an integer in [" << field->min_value << ", "
                << field->max_value << "], got " << json_excerpt(value);
            schedule.*member = static_cast<Value>(value.get<std::int64_t>());
          }
        },
        field->member);
  }
  schedule.validate();
  return schedule;
}

}  // namespace tilelab::schedules
