// The paged-attention kernel in the registry: its CLI parameters, their parsing into a schedule,
// shape and batch, and the functional inputs (block tables, reordered mask).
#include <sstream>

#include <tilelab/error.hpp>

#include "schedules/paged/default_problem.hpp"
#include "sim/kernels/flash_paged_attention.hpp"
#include "sim/kernels/registry.hpp"

namespace tilelab::sim {
namespace {

std::vector<int64_t> parse_list(const std::string& text, const std::string& name) {
  std::vector<int64_t> values;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    int64_t v = -1;
    TILELAB_REQUIRE(parse_integer(item, v) && v >= 0)
        << "parameter '" << name << "': expected non-negative integers separated by commas, got '"
        << text << "'";
    values.push_back(v);
  }
  return values;
}

std::vector<PagedAttentionRequest> requests_from(const KernelParameters& p) {
  std::vector<PagedAttentionRequest> requests;
  std::stringstream in(p.at("prefill"));
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    const auto colon = item.find(':');
    TILELAB_REQUIRE(colon != std::string::npos)
        << "parameter 'prefill': expected QUERY_LEN:CONTEXT_LEN pairs separated by commas, got '"
        << p.at("prefill") << "'";
    const auto q = parse_list(item.substr(0, colon), "prefill");
    const auto c = parse_list(item.substr(colon + 1), "prefill");
    TILELAB_REQUIRE(q.size() == 1 && c.size() == 1 && q[0] >= 1)
        << "parameter 'prefill': bad pair '" << item << "' (QUERY_LEN >= 1 : CONTEXT_LEN)";
    requests.push_back({q[0], c[0]});
  }
  for (int64_t context : parse_list(p.at("decode"), "decode")) requests.push_back({1, context});
  TILELAB_REQUIRE(!requests.empty()) << "parameters 'prefill' and 'decode': no requests given";
  return requests;
}

// The run's schedule, problem and seed, parsed and checked.
struct PagedParameters {
  schedules::PagedAttentionSchedule schedule;
  std::vector<PagedAttentionRequest> requests;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  DType dtype = DType::bf16;
  uint32_t seed = 0;
};

PagedParameters parse_paged(const KernelParameters& p) {
  schedules::PagedAttentionSchedule s;
  s.large_tile_size = parameter_int(p, "large_tile_size", 1, 1 << 20);
  s.block_size = parameter_int(p, "block_size", 1, 1 << 20);
  s.kv_buffers = static_cast<int>(parameter_int(p, "kv_buffers", 0, 64));
  s.mixed_precision = parameter_choice(p, "mixed_precision", {"true", "false"}) == "true";
  s.transpose = parameter_choice(p, "transpose", {"pe", "dma"}) == "dma"
                    ? schedules::TransposeMethod::dma
                    : schedules::TransposeMethod::pe;
  s.validate();
  const int64_t num_heads = parameter_int(p, "num_heads", 1, 4096);
  const int64_t num_kv_heads = parameter_int(p, "num_kv_heads", 1, 4096);
  const int64_t head_dim = parameter_int(p, "head_dim", 1, 1 << 20);
  const DType dtype = parameter_dtype(p, "dtype");
  // The CLI's tiling_factor sets the schedule field (validated with the schedule below).
  const std::string factor = p.at("tiling_factor");
  s.block_size_tiling_factor_override =
      factor == "auto" ? 0 : parameter_int(p, "tiling_factor", 1, s.partition_tile);
  s.validate();
  const int64_t seed = parameter_int(p, "seed", 0, UINT32_MAX);
  return {s,     requests_from(p),           num_heads, num_kv_heads, head_dim,
          dtype, static_cast<uint32_t>(seed)};
}

PagedAttentionRun resolve_paged(const KernelParameters& p) {
  const PagedParameters r = parse_paged(p);
  return paged_attention_run(r.schedule, r.requests, r.num_heads, r.num_kv_heads, r.head_dim,
                             r.dtype, r.seed);
}

}  // namespace

void register_paged_attention(KernelRegistry& registry) {
  const schedules::PagedAttentionSchedule defaults;
  const auto requests = default_paged_attention_requests();
  KernelInfo info;
  info.name = "paged-attention";
  namespace paged = schedules::paged;
  info.description =
      "vLLM NKI flash_paged_attention (per kv head: block-table transform, vectorized K/V "
      "gathers with the block-size tiling trick, PE transposes, running-max softmax, causal "
      "new-token tile). Default batch: prefill requests (query:context) " +
      format_paged_attention_requests(requests, true) +
      " and decode requests (1 token each; context) " +
      format_paged_attention_requests(requests, false) + " = " +
      std::to_string(paged::default_query_rows()) + " query rows, context " +
      std::to_string(paged::default_context_len()) + " tokens in blocks of " +
      std::to_string(defaults.block_size) + " and large tiles of " +
      std::to_string(defaults.large_tile_size) + "; " + std::to_string(paged::kDefaultNumHeads) +
      " q heads, " + std::to_string(paged::kDefaultNumKvHeads) + " kv heads, d " +
      std::to_string(paged::kDefaultHeadDim) + ", bf16 on trn1";
  info.default_machine = "trn1";
  info.parameters = {
      {"num_heads", std::to_string(paged::kDefaultNumHeads), "query heads"},
      {"num_kv_heads", std::to_string(paged::kDefaultNumKvHeads),
       "kv heads (the kernel's grid; num_heads / num_kv_heads = GQA group)"},
      {"head_dim", std::to_string(paged::kDefaultHeadDim), "d (<= 128)"},
      {"dtype", "bf16", "bf16 | fp16 | fp32: query/key/value/kv_cache/output"},
      {"block_size", std::to_string(defaults.block_size), "tokens per KV-cache block"},
      {"large_tile_size", std::to_string(defaults.large_tile_size),
       "LARGE_TILE_SZ: context tokens per gather / softmax merge"},
      {"mixed_precision", defaults.mixed_precision ? "true" : "false",
       "true: bf16 TensorE inputs, fp32 accumulation and statistics"},
      {"transpose", schedules::transpose_method_name(defaults.transpose),
       "pe | dma (dma needs NeuronCore-v3, e.g. --machine trn2)"},
      {"kv_buffers", std::to_string(defaults.kv_buffers), "K/V large-tile buffers (1-4)"},
      {"tiling_factor", "auto",
       "auto (= 128 / blocks per large tile when that is > 1) or a forced power of two; 1 "
       "turns the block-size tiling trick off"},
      {"prefill", format_paged_attention_requests(requests, true),
       "prefill requests QUERY_LEN:CONTEXT_LEN,..."},
      {"decode", format_paged_attention_requests(requests, false),
       "decode requests (1 new token each): CONTEXT_LEN,..."},
      {"seed", "1", "block placement in the cache (shuffled)"},
  };
  info.build = [](const Machine& machine, const KernelParameters& p) {
    const PagedParameters r = parse_paged(p);
    return build_flash_paged_attention(
        machine, paged_attention_config(r.schedule, r.requests, r.num_heads, r.num_kv_heads,
                                        r.head_dim, r.dtype));
  };
  info.writes_reports_by_default = true;
  // The block-size tiling trick made visible: the same batch with the trick turned off.
  info.default_comparisons = {"tiling_factor=1"};
  info.functional_inputs = [](const KernelParameters& p) {
    const PagedAttentionRun r = resolve_paged(p);
    std::map<std::string, std::vector<float>> inputs;
    inputs["block_tables"].assign(r.batch.block_tables.begin(), r.batch.block_tables.end());
    const auto reordered = reorder_context_mask(
        r.batch.mask, r.batch.query_len, r.batch.num_active_blocks * r.config.schedule.block_size,
        kv_tile_layout(r.config), r.config.schedule.large_tile_size);
    inputs["mask"].assign(reordered.begin(), reordered.end());
    return inputs;
  };
  registry.add(std::move(info));
}

}  // namespace tilelab::sim
