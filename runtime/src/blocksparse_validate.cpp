// validate_blocksparse_attention: every check on blocksparse_attention's arguments, in one place,
// before any implementation touches memory.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "blocksparse_problem.hpp"
#include "cpu_features.hpp"
#include "tilelab/detail/argument_checks.hpp"
#include "tilelab/error.hpp"

namespace tilelab::detail {

BlockSparseProblem validate_blocksparse_attention(
    const TensorView& q, const TensorView& k, const TensorView& v, const BlockSparseLayout& layout,
    const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, const TensorView& out,
    const BlockSparseAttentionOptions& options) {
  check_cpu_isa_setting();
  require_rank(q, "q", 3, "[total_q, Hq, D]");
  require_rank(k, "k", 3, "[total_k, Hkv, D]");
  require_rank(v, "v", 3, "[total_k, Hkv, D]");
  require_rank(out, "out", 3, "[total_q, Hq, D]");

  require_attention_operands(q, k, v, out);

  BlockSparseProblem problem;
  problem.q = q;
  problem.k = k;
  problem.v = v;
  problem.out = out;
  problem.layout = &layout;
  problem.dtype = q.dtype();
  problem.total_q = q.dim(0);
  problem.q_heads = q.dim(1);
  problem.head_dim = q.dim(2);
  problem.total_k = k.dim(0);
  problem.kv_heads = k.dim(1);

  TILELAB_REQUIRE(problem.total_q >= 1)
      << "q: expected total_q >= 1 query rows, got " << shape_of(q);
  TILELAB_REQUIRE(problem.q_heads >= 1) << "q: expected Hq >= 1 heads, got " << shape_of(q);
  TILELAB_REQUIRE(problem.head_dim >= 1 && problem.head_dim <= 256)
      << "q: expected head dim D in [1, 256], got " << shape_of(q);
  TILELAB_REQUIRE(problem.total_k >= 1) << "k: expected total_k >= 1 keys, got " << shape_of(k);
  TILELAB_REQUIRE(problem.kv_heads >= 1) << "k: expected Hkv >= 1 heads, got " << shape_of(k);
  TILELAB_REQUIRE(k.dim(2) == problem.head_dim)
      << "k: expected head dim " << problem.head_dim << " (from q), got " << shape_of(k);
  TILELAB_REQUIRE(problem.q_heads % problem.kv_heads == 0)
      << "k: expected a head count that divides q's (q heads must be a multiple of k heads), got "
      << "q heads " << problem.q_heads << " and k heads " << problem.kv_heads;
  for (int i = 0; i < 3; ++i) {
    TILELAB_REQUIRE(v.dim(i) == k.dim(i))
        << "v: expected shape " << shape_of(k) << " (the shape of k), got " << shape_of(v);
    TILELAB_REQUIRE(out.dim(i) == q.dim(i))
        << "out: expected shape " << shape_of(q) << " (the shape of q), got " << shape_of(out);
  }

  TILELAB_REQUIRE(layout.n_heads() == 1 || layout.n_heads() == problem.q_heads ||
                  layout.n_heads() == problem.kv_heads)
      << "layout: expected 1 head, Hq = " << problem.q_heads << " heads (one per query head) or "
      << "Hkv = " << problem.kv_heads << " heads (one per kv head), got " << layout.n_heads();

  problem.q_starts = read_prefix_sums(cu_seqlens_q, "cu_seqlens_q", problem.total_q, "total_q");
  problem.k_starts = read_prefix_sums(cu_seqlens_k, "cu_seqlens_k", problem.total_k, "total_k");
  TILELAB_REQUIRE(problem.k_starts.size() == problem.q_starts.size())
      << "cu_seqlens_k: expected " << problem.q_starts.size()
      << " entries (num_seqs + 1, the length of cu_seqlens_q), got " << problem.k_starts.size();
  problem.cu_seqlens_q = cu_seqlens_q;
  problem.cu_seqlens_k = cu_seqlens_k;
  problem.num_seqs = static_cast<std::int64_t>(problem.q_starts.size()) - 1;
  for (std::int64_t s = 0; s < problem.num_seqs; ++s) {
    const std::int64_t q_len = problem.q_len(s), k_len = problem.k_len(s);
    TILELAB_REQUIRE(q_len <= k_len)
        << "cu_seqlens_q: expected q_len <= k_len in every sequence (queries are the last q_len "
           "positions), got q_len "
        << q_len << " > k_len " << k_len << " in sequence " << s;
    TILELAB_REQUIRE(k_len <= layout.max_seqlen())
        << "layout: expected num_row_blocks x block_size = " << layout.num_row_blocks() << " x "
        << layout.block_size() << " = " << layout.max_seqlen()
        << " tokens to cover every sequence, got k_len " << k_len << " in sequence " << s;
    problem.max_q_len = std::max(problem.max_q_len, q_len);
    problem.max_k_len = std::max(problem.max_k_len, k_len);
  }

  problem.scale = resolve_attention_scale(options.scale, problem.head_dim);
  problem.fp32_probabilities = options.fp32_probabilities;

  // out is written while the inputs are still read, rows concurrently.
  require_no_self_overlap(out, "out");
  require_disjoint(out, "out", q, "q");
  require_disjoint(out, "out", k, "k");
  require_disjoint(out, "out", v, "v");
  require_disjoint(out, "out", cu_seqlens_q, "cu_seqlens_q");
  require_disjoint(out, "out", cu_seqlens_k, "cu_seqlens_k");
  return problem;
}

}  // namespace tilelab::detail
