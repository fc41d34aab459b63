// validate_paged_attention: every check on paged_attention's arguments, in one place, before any
// implementation touches memory.
#include <cmath>
#include <cstdint>
#include <utility>

#include "cpu_features.hpp"
#include "paged_problem.hpp"
#include "score_options.hpp"
#include "tilelab/detail/argument_checks.hpp"
#include "tilelab/error.hpp"

namespace tilelab::detail {

namespace {

// A per-query-head fp32 option (alibi_slopes, sinks): [Hq], copied.
std::vector<float> read_head_values(const std::optional<TensorView>& view, const char* name,
                                    std::int64_t q_heads) {
  if (!view) return {};
  TILELAB_REQUIRE_TYPE(view->dtype() == DType::f32)
      << name << ": expected dtype float32, got " << dtype_name(view->dtype());
  require_shape(*view, name, "[Hq]", {q_heads});
  require_addressable(*view, name);
  const auto* data = static_cast<const float*>(view->data());
  std::vector<float> values(q_heads);
  for (std::int64_t h = 0; h < q_heads; ++h) values[h] = data[h * view->stride(0)];
  return values;
}

}  // namespace

ResolvedScoreOptions resolve_score_options(const ScoreOptions& options, std::int64_t q_heads) {
  ResolvedScoreOptions resolved;
  TILELAB_REQUIRE(std::isfinite(options.softcap) && options.softcap >= 0.0f)
      << "softcap: expected a finite value >= 0 (0 turns it off), got " << options.softcap;
  resolved.softcap = options.softcap;
  TILELAB_REQUIRE(options.sliding_window.left >= -1 && options.sliding_window.right >= -1)
      << "sliding_window: expected (left, right) each >= 0, or -1 for unbounded, got ("
      << options.sliding_window.left << ", " << options.sliding_window.right << ")";
  resolved.window = options.sliding_window;
  resolved.alibi_slopes = read_head_values(options.alibi_slopes, "alibi_slopes", q_heads);
  resolved.sinks = read_head_values(options.sinks, "sinks", q_heads);
  return resolved;
}

void require_kv_scales(DType kv_dtype, float k_scale, float v_scale) {
  for (const auto& [scale, name] :
       {std::pair<float, const char*>{k_scale, "k_scale"}, {v_scale, "v_scale"}}) {
    TILELAB_REQUIRE(std::isfinite(scale)) << name << ": expected a finite value, got " << scale;
    TILELAB_REQUIRE(is_fp8(kv_dtype) || scale == 1.0f)
        << name << ": expected 1.0 with " << dtype_name(kv_dtype)
        << " K/V (the scales dequantize fp8 K/V only), got " << scale;
  }
}

PagedProblem validate_paged_attention(const TensorView& query, const TensorView& key_cache,
                                      const TensorView& value_cache, const TensorView& block_table,
                                      const TensorView& seq_lens, const TensorView& query_start_loc,
                                      const TensorView& out, const PagedAttentionOptions& options) {
  check_cpu_isa_setting();
  require_rank(query, "query", 3, "[num_tokens, Hq, D]");
  require_rank(key_cache, "key_cache", 4, "[num_blocks, Hkv, block_size, D]");
  require_rank(value_cache, "value_cache", 4, "[num_blocks, Hkv, block_size, D]");
  require_rank(out, "out", 3, "[num_tokens, Hq, D]");

  TILELAB_REQUIRE_TYPE(is_attention_dtype(query.dtype()))
      << "query: expected dtype float32, float16 or bfloat16, got " << dtype_name(query.dtype());
  TILELAB_REQUIRE_TYPE(key_cache.dtype() == query.dtype() || is_fp8(key_cache.dtype()))
      << "key_cache: expected dtype " << dtype_name(query.dtype())
      << " (the dtype of query), float8_e4m3fn or float8_e5m2, got "
      << dtype_name(key_cache.dtype());
  TILELAB_REQUIRE_TYPE(value_cache.dtype() == key_cache.dtype())
      << "value_cache: expected dtype " << dtype_name(key_cache.dtype())
      << " (the dtype of key_cache), got " << dtype_name(value_cache.dtype());
  TILELAB_REQUIRE_TYPE(out.dtype() == query.dtype())
      << "out: expected dtype " << dtype_name(query.dtype()) << " (the dtype of query), got "
      << dtype_name(out.dtype());
  for (const auto& [view, name] : {std::pair<const TensorView*, const char*>{&query, "query"},
                                   {&key_cache, "key_cache"},
                                   {&value_cache, "value_cache"},
                                   {&out, "out"}}) {
    require_addressable(*view, name);
  }

  PagedProblem problem;
  problem.query = query;
  problem.key_cache = key_cache;
  problem.value_cache = value_cache;
  problem.out = out;
  problem.dtype = query.dtype();
  problem.cache_dtype = key_cache.dtype();
  problem.num_tokens = query.dim(0);
  problem.q_heads = query.dim(1);
  problem.head_dim = query.dim(2);
  problem.num_blocks = key_cache.dim(0);
  problem.kv_heads = key_cache.dim(1);
  problem.block_size = key_cache.dim(2);

  TILELAB_REQUIRE(problem.q_heads >= 1) << "query: expected Hq >= 1 heads, got " << shape_of(query);
  TILELAB_REQUIRE(problem.head_dim >= 1 && problem.head_dim <= 512)
      << "query: expected head dim D in [1, 512], got " << shape_of(query);
  TILELAB_REQUIRE(problem.kv_heads >= 1)
      << "key_cache: expected Hkv >= 1 heads, got " << shape_of(key_cache);
  TILELAB_REQUIRE(problem.block_size >= 1)
      << "key_cache: expected block_size >= 1, got " << shape_of(key_cache);
  TILELAB_REQUIRE(key_cache.dim(3) == problem.head_dim)
      << "key_cache: expected head dim " << problem.head_dim << " (from query), got "
      << shape_of(key_cache);
  TILELAB_REQUIRE(problem.q_heads % problem.kv_heads == 0)
      << "key_cache: expected a head count Hkv that divides query's Hq, got Hq " << problem.q_heads
      << " and Hkv " << problem.kv_heads;
  for (int i = 0; i < 4; ++i) {
    TILELAB_REQUIRE(value_cache.dim(i) == key_cache.dim(i))
        << "value_cache: expected shape " << shape_of(key_cache)
        << " (the shape of key_cache), got " << shape_of(value_cache);
  }
  for (int i = 0; i < 3; ++i) {
    TILELAB_REQUIRE(out.dim(i) == query.dim(i)) << "out: expected shape " << shape_of(query)
                                                << " (the shape of query), got " << shape_of(out);
  }

  const std::vector<std::int32_t> starts =
      read_prefix_sums(query_start_loc, "query_start_loc", problem.num_tokens, "num_tokens");
  problem.query_starts.assign(starts.begin(), starts.end());
  problem.num_seqs = static_cast<std::int64_t>(starts.size()) - 1;

  TILELAB_REQUIRE_TYPE(seq_lens.dtype() == DType::i32)
      << "seq_lens: expected dtype int32, got " << dtype_name(seq_lens.dtype());
  require_rank(seq_lens, "seq_lens", 1, "[num_seqs]");
  TILELAB_REQUIRE(seq_lens.dim(0) == problem.num_seqs)
      << "seq_lens: expected " << problem.num_seqs
      << " entries (num_seqs, one less than query_start_loc), got " << seq_lens.dim(0);
  require_addressable(seq_lens, "seq_lens");

  TILELAB_REQUIRE_TYPE(block_table.dtype() == DType::i32)
      << "block_table: expected dtype int32, got " << dtype_name(block_table.dtype());
  require_rank(block_table, "block_table", 2, "[num_seqs, max_blocks_per_seq]");
  TILELAB_REQUIRE(block_table.dim(0) == problem.num_seqs)
      << "block_table: expected shape [num_seqs = " << problem.num_seqs
      << ", max_blocks_per_seq], got " << shape_of(block_table);
  require_addressable(block_table, "block_table");
  problem.max_blocks_per_seq = block_table.dim(1);

  const auto* lens = static_cast<const std::int32_t*>(seq_lens.data());
  const auto* table = static_cast<const std::int32_t*>(block_table.data());
  problem.seq_lens.resize(problem.num_seqs);
  problem.block_table.assign(problem.num_seqs * problem.max_blocks_per_seq, -1);
  for (std::int64_t s = 0; s < problem.num_seqs; ++s) {
    const std::int64_t seq_len = lens[s * seq_lens.stride(0)];
    const std::int64_t q_len = problem.q_len(s);
    TILELAB_REQUIRE(seq_len >= q_len)
        << "seq_lens: expected each sequence's length (context plus new tokens) >= its query "
           "length, got seq_lens["
        << s << "] = " << seq_len << " < " << q_len << " (from query_start_loc)";
    const std::int64_t blocks_used = (seq_len + problem.block_size - 1) / problem.block_size;
    TILELAB_REQUIRE(blocks_used <= problem.max_blocks_per_seq)
        << "seq_lens: expected at most max_blocks_per_seq x block_size = "
        << problem.max_blocks_per_seq << " x " << problem.block_size << " = "
        << problem.max_blocks_per_seq * problem.block_size << " tokens per sequence, got seq_lens["
        << s << "] = " << seq_len;
    problem.seq_lens[s] = seq_len;
    for (std::int64_t b = 0; b < blocks_used; ++b) {
      const std::int32_t entry = table[s * block_table.stride(0) + b * block_table.stride(1)];
      TILELAB_REQUIRE(entry >= 0 && entry < problem.num_blocks)
          << "block_table: expected entries in [0, " << problem.num_blocks
          << ") (key_cache blocks) where sequences use them, got " << entry << " at [" << s << ", "
          << b << "] (seq_lens[" << s << "] = " << seq_len << " uses " << blocks_used << " blocks)";
      problem.block_table[s * problem.max_blocks_per_seq + b] = entry;
    }
  }

  problem.scale = resolve_attention_scale(options.scale, problem.head_dim);
  problem.causal = options.causal;
  problem.score = resolve_score_options(options.score, problem.q_heads);
  require_kv_scales(problem.cache_dtype, options.k_scale, options.v_scale);
  problem.k_scale = options.k_scale;
  problem.v_scale = options.v_scale;
  TILELAB_REQUIRE(options.split_kv >= 0)
      << "split_kv: expected 0 (automatic) or a number of pieces >= 1, got " << options.split_kv;
  problem.split_kv = options.split_kv;
  problem.fp32_probabilities = options.fp32_probabilities;

  // out is written while the inputs are still read, rows concurrently.
  require_no_self_overlap(out, "out");
  require_disjoint(out, "out", query, "query");
  require_disjoint(out, "out", key_cache, "key_cache");
  require_disjoint(out, "out", value_cache, "value_cache");
  return problem;
}

}  // namespace tilelab::detail
