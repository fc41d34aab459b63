// Prefill sequences of paged_attention on the generated dense flash kernels. A sequence with many
// query tokens is compute-bound: its K/V is reused by every query row, so gathering its blocks
// into contiguous rows (a copy of its cache; an fp8 cache widened to the query's dtype) costs
// little next to the products, and the generated kernels' register-blocked q·kᵀ and P·V (bf16 dot
// products for bf16) run them several times faster than the paged kernel's per-token
// micro-kernels.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention_problem.hpp"
#include "finite_values.hpp"
#include "paged_problem.hpp"
#include "scratch_memory.hpp"
#include "tilelab/error.hpp"
#include "tilelab/threading.hpp"
#include "widen_rows.hpp"

namespace tilelab::detail {

namespace {

// Rows of queries per kv head (query tokens × the GQA group) from which a sequence takes the
// generated kernels. Measured side by side on Zen 4 (8 sequences with 1 k of context, Hq 32,
// Hkv 8, D 128): with bf16 the generated kernels are 1.2× faster at 16 rows (4 tokens) and 2× at
// 32; with fp32 they are 1.2× slower at 16 rows, even at 24 and 1.3× faster at 32.
std::int64_t generated_prefill_min_rows(DType dtype) {
  return dtype == DType::bf16 ? 16 : 32;
}
// The gathered K and V of one call stay within this many bytes: a long sequence is computed a few
// kv heads at a time.
constexpr std::int64_t kGatherBudgetBytes = std::int64_t{64} << 20;

std::int64_t group_of(const PagedProblem& p) {
  return p.q_heads / p.kv_heads;
}

// A view of `view` starting `offset` elements further.
void* element_at(const TensorView& view, std::int64_t offset) {
  return static_cast<char*>(view.data()) +
         offset * static_cast<std::int64_t>(dtype_size(view.dtype()));
}

// The first key a sequence's queries can see, rounded down to its cache block: a sliding window
// leaves the keys before it out of the gather.
std::int64_t first_gathered_key(const PagedProblem& p, std::int64_t seq) {
  const std::int64_t first = p.first_visible_key(p.first_query_position(seq));
  return first / p.block_size * p.block_size;
}

// The dense problem of kv heads [kv_head, kv_head + kv_heads) of sequence `seq`: queries and
// outputs are views of the token rows, K and V the gathered rows of keys [first_key, N) at `keys`
// and `values` ([kv_heads, N - first_key, D] contiguous).
AttentionProblem dense_problem(const PagedProblem& p, std::int64_t seq, std::int64_t kv_head,
                               std::int64_t kv_heads, std::int64_t first_key, void* keys,
                               void* values) {
  const std::int64_t group = group_of(p), M = p.q_len(seq), D = p.head_dim;
  const std::int64_t N = p.seq_lens[seq] - first_key;
  const std::int64_t first_token = p.query_starts[seq];
  const auto token_rows = [&](const TensorView& view) {
    const std::int64_t offset = first_token * view.stride(0) + kv_head * group * view.stride(1);
    return TensorView(element_at(view, offset), view.dtype(), {1, kv_heads * group, M, D},
                      {0, view.stride(1), view.stride(0), view.stride(2)});
  };
  AttentionProblem dense;
  dense.q = token_rows(p.query);
  dense.out = token_rows(p.out);
  // K and V are gathered in the query's dtype (an fp8 cache widened, V scaled by v_scale).
  dense.k = TensorView(keys, p.dtype, {1, kv_heads, N, D});
  dense.v = TensorView(values, p.dtype, {1, kv_heads, N, D});
  dense.dtype = p.dtype;
  dense.kv_dtype = p.dtype;
  dense.batch = 1;
  dense.q_heads = kv_heads * group;
  dense.kv_heads = kv_heads;
  dense.q_len = M;
  dense.kv_len = N;
  dense.head_dim = D;
  dense.scale = p.scale * p.k_scale;  // as the paged kernel's score scale
  dense.causal = p.causal;
  // Bottom-right: the sequence's queries are its last positions (gathered key j is key
  // first_key + j).
  dense.causal_offset = p.causal ? N - M : N;
  dense.position_offset = N - M;
  dense.fp32_probabilities = p.fp32_probabilities;
  // The score options, with the slopes and sinks of the call's query heads.
  dense.score = p.score;
  const auto heads = [&](const std::vector<float>& per_head) {
    if (per_head.empty()) return per_head;
    const auto begin = per_head.begin() + kv_head * group;
    return std::vector<float>(begin, begin + kv_heads * group);
  };
  dense.score.alibi_slopes = heads(p.score.alibi_slopes);
  dense.score.sinks = heads(p.score.sinks);
  return dense;
}

// How many kv heads one call gathers for a sequence of `keys` keys.
std::int64_t kv_heads_per_call(const PagedProblem& p, std::int64_t keys) {
  const std::int64_t head_bytes =
      2 * keys * p.head_dim * static_cast<std::int64_t>(dtype_size(p.dtype));
  return std::clamp<std::int64_t>(kGatherBudgetBytes / std::max<std::int64_t>(head_bytes, 1), 1,
                                  p.kv_heads);
}

// Widens an fp8 row to fp32 and writes `scale` times it in the query's dtype (bf16 rounded to
// nearest even, or fp32).
template <DType cache_dtype>
void widen_scaled_row(const void* src, std::int64_t count, float scale, DType dtype, void* dst) {
  float row[kMaxFlashHeadDim];
  widen_contiguous<cache_dtype>(static_cast<const std::uint8_t*>(src), count, row);
  if (dtype == DType::bf16) {
    scale_to_bf16(row, count, scale, static_cast<std::uint16_t*>(dst));
  } else {
    scale_to_f32(row, count, scale, static_cast<float*>(dst));
  }
}

// Copies `rows` rows of `cache` from `src` (rows cache.stride(2) elements apart) into `dst`
// (contiguous rows of the query's dtype), widening an fp8 cache and multiplying it by `scale`.
void copy_rows(const PagedProblem& p, const TensorView& cache, const char* src, std::int64_t rows,
               float scale, char* dst) {
  const std::int64_t D = p.head_dim;
  const auto element = static_cast<std::int64_t>(dtype_size(cache.dtype()));
  const auto out_element = static_cast<std::int64_t>(dtype_size(p.dtype));
  for (std::int64_t r = 0; r < rows; ++r) {
    const char* row = src + r * cache.stride(2) * element;
    char* row_to = dst + r * D * out_element;
    if (cache.dtype() == p.dtype) {
      std::memcpy(row_to, row, D * element);
    } else if (cache.dtype() == DType::f8e4m3fn) {
      widen_scaled_row<DType::f8e4m3fn>(row, D, scale, p.dtype, row_to);
    } else {
      widen_scaled_row<DType::f8e5m2>(row, D, scale, p.dtype, row_to);
    }
  }
}

// Copies the rows of keys [first_key, N) (first_key a multiple of the block size) of kv heads
// [kv_head, kv_head + kv_heads) of `seq` from `cache` into `dst` ([kv_heads, N - first_key, D]
// contiguous, the query's dtype), a block at a time. An fp8 cache is widened and multiplied by
// `scale` on the way. Returns whether every copied value is finite (checked only when
// `check_finite`, on each block while it is still in cache; else true).
bool gather_rows(const PagedProblem& p, const TensorView& cache, std::int64_t seq,
                 std::int64_t kv_head, std::int64_t kv_heads, std::int64_t first_key, float scale,
                 bool check_finite, void* dst) {
  const std::int64_t D = p.head_dim, bs = p.block_size, first_block = first_key / bs;
  const std::int64_t N = p.seq_lens[seq] - first_key;
  const auto element = static_cast<std::int64_t>(dtype_size(cache.dtype()));
  const auto out_element = static_cast<std::int64_t>(dtype_size(p.dtype));
  const std::int64_t blocks = (N + bs - 1) / bs;  // from first_block
  const bool same_dtype = cache.dtype() == p.dtype;
  const bool whole_rows = same_dtype && cache.stride(2) == D;  // one copy per block
  bool finite = true;
#pragma omp parallel for collapse(2) schedule(static) num_threads(num_threads()) \
    reduction(&& : finite)
  for (std::int64_t h = 0; h < kv_heads; ++h) {
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int64_t rows = std::min(bs, N - b * bs);
      const auto* src = static_cast<const char*>(
          element_at(cache, p.physical_block(seq, first_block + b) * cache.stride(0) +
                                (kv_head + h) * cache.stride(1)));
      char* to = static_cast<char*>(dst) + ((h * N + b * bs) * D) * out_element;
      if (whole_rows) {
        std::memcpy(to, src, rows * D * element);
      } else {
        copy_rows(p, cache, src, rows, scale, to);
      }
      if (check_finite) finite = finite && every_value_finite(to, rows * D, p.dtype);
    }
  }
  return finite;
}

}  // namespace

std::vector<char> sequences_for_generated_prefill(const PagedProblem& p) {
  std::vector<char> chosen(p.num_seqs, 0);
  // The generated kernels produce no lse for a paged problem. They read k and v of q's dtype: an
  // fp8 cache is widened into bf16 or fp32 rows (fp16's range could not hold v_scale · v).
  const bool widens = is_fp8(p.cache_dtype) && (p.dtype == DType::bf16 || p.dtype == DType::f32);
  if ((p.cache_dtype != p.dtype && !widens) || p.lse || p.position_shift != 0) return chosen;
  if (p.key_cache.stride(3) != 1 || p.value_cache.stride(3) != 1) return chosen;
  const std::int64_t group = group_of(p);
  for (std::int64_t s = 0; s < p.num_seqs; ++s) {
    if (p.q_len(s) * group < generated_prefill_min_rows(p.dtype)) continue;
    const std::int64_t first_key = first_gathered_key(p, s);
    const std::int64_t heads = kv_heads_per_call(p, p.seq_lens[s] - first_key);
    chosen[s] = generated_flash_attention_covers(
        dense_problem(p, s, 0, heads, first_key, nullptr, nullptr));
  }
  return chosen;
}

void generated_prefill_attention(const PagedProblem& p, std::vector<char>& sequences) {
  const auto element = static_cast<std::int64_t>(dtype_size(p.dtype));
  const auto gathered_keys = [&](std::int64_t seq) {
    return p.seq_lens[seq] - first_gathered_key(p, seq);
  };
  const auto gathered_bytes = [&](std::int64_t seq) {
    return kv_heads_per_call(p, gathered_keys(seq)) * gathered_keys(seq) * p.head_dim * element;
  };
  std::int64_t bytes = 0;
  for (std::int64_t s = 0; s < p.num_seqs; ++s) {
    if (sequences[s]) bytes = std::max(bytes, gathered_bytes(s));
  }
  if (bytes == 0) return;
  // From the scratch cache: fresh pages would cost more than the gather itself.
  const ScratchBuffer keys(bytes), values(bytes);
  for (std::int64_t s = 0; s < p.num_seqs; ++s) {
    if (!sequences[s]) continue;
    const std::int64_t first_key = first_gathered_key(p, s);
    const std::int64_t heads_per_call = kv_heads_per_call(p, gathered_keys(s));
    for (std::int64_t h = 0; h < p.kv_heads; h += heads_per_call) {
      const std::int64_t heads = std::min(heads_per_call, p.kv_heads - h);
      // k_scale joins the softmax scale (dense_problem); v_scale multiplies the widened V.
      // The generated kernels multiply a key's V row by P = 0 for the rows of its query tile that
      // do not see it, so a NaN or inf there would reach them; the paged kernel accumulates only
      // the keys each row sees. Such a sequence goes back to the paged kernel (which then
      // computes all its heads).
      if (!gather_rows(p, p.value_cache, s, h, heads, first_key, p.v_scale, true, values.data())) {
        sequences[s] = 0;
        break;
      }
      gather_rows(p, p.key_cache, s, h, heads, first_key, 1.0f, false, keys.data());
      TILELAB_CHECK(generated_flash_attention(
          dense_problem(p, s, h, heads, first_key, keys.data(), values.data())))
          << "paged_attention: sequence " << s << " was chosen for a generated kernel that does "
          << "not cover it";
    }
  }
}

}  // namespace tilelab::detail
