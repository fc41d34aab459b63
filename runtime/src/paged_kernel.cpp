// The paged kernel: attention that reads K/V in place through the block table.
//
// Work items are (sequence, kv heads, up to kMaxFoldedRows query rows, key piece). The rows of an
// item are every query head of the kv head's GQA group for a run of query tokens, so each K/V
// element an item reads serves the whole group (decode reads the cache once per kv head). Keys
// are visited in chunks of kKeyChunk positions: the chunk's K and V rows are gathered through the
// block table and widened to fp32 once, then each row scores the keys it sees (causality and the
// sliding window give every row one contiguous interval) and folds them into its online softmax.
// Decode items (one query token) on CPUs with AVX2 or AVX-512 skip the scratch: their micro-kernels
// read the chunk's K and V rows in place and widen them in registers (paged_stream.hpp). Over a
// token-major cache such an item spans several kv heads (decode_layout), so that a key's rows of
// all those heads are read from memory together.
// An item whose keys are split into pieces (split-KV) writes each piece's partial state; a second
// pass merges the pieces in piece order, so the result does not depend on which thread ran what.
// Block-sparse decode whose heads keep different blocks says which heads see which listed blocks
// (PagedProblem::head_sees_block): an item folds each run of blocks into the rows of the heads
// that see it, and skips the blocks that no head of a group sees.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "cpu_features.hpp"
#include "dtype_convert.hpp"
#include "paged_problem.hpp"
#include "paged_stream.hpp"
#include "reference_softmax.hpp"
#include "tilelab/error.hpp"
#include "tilelab/threading.hpp"
#include "widen_rows.hpp"

namespace tilelab::detail {

namespace {

constexpr std::int64_t kKeyChunk = 64;
// Streamed (decode) items visit keys in longer chunks: each pass over a chunk's K rows, then its V
// rows, restarts the hardware prefetcher on the other tensor. Measured side by side on Zen 4 (dense
// decode B8 Hq32 Hkv8 N4096 D128, bf16): 256 keys 1.32x faster than 64 and 1.08x faster than 128;
// 512 gained 4% more. A multiple of kKeyChunk, so split pieces stay whole.
constexpr std::int64_t kStreamedKeyChunk = 4 * kKeyChunk;
constexpr std::int64_t kScoreStride = kStreamedKeyChunk;  // floats between rows of the scores
static_assert(kScoreStride % 8 == 0);  // stream_scores writes up to round_up(keys, 8) columns
// Streamed items prefetch kStreamedPrefetchKeys rows ahead into L1, and while scoring, the K and V
// rows kStreamedL2Ahead times further into L2 (paged_stream.hpp): the
// hardware prefetcher restarts at every scattered block, and a block's rows at a scattered address
// arrive in about the time of one block's products. Measured side by side on Zen 4: L1 alone made
// decode of 64 sequences (Hkv 8, D 128, 16-key blocks) bf16 1.17x and fp8 1.33x faster; the V and
// L2 prefetches another 1.15-1.28x (bf16) and 1.1-1.23x (fp8), and made dense decode rows (B8
// Hq32 Hkv8 N4096 D128), which L1 alone had slowed by 3-5%, 1.08x (fp32) and 1.10-1.17x (bf16)
// faster; L1 distances of 8 and 32 and L2 factors of 2 to 6 measured within noise of these.
constexpr std::int64_t kStreamedPrefetchKeys = 16;
// The far stream runs while scoring only, so during p·v the memory would wait. Where reading the
// cache bounds decode, both passes also stream their own rows kStreamedRunAhead keys ahead into
// L2: fp32 caches, and bf16 ones on the AVX-512 kernels. Where widening the elements bounds it
// (fp8 and fp16 caches, bf16 on AVX2), the extra prefetches cost more than they save. Measured
// side by side on Zen 4: dense decode (B8 Hq32 Hkv8 N4096 D128) fp32 1.11-1.21x faster (AVX2
// kernels 1.20-1.23x), bf16 1.01-1.11x; bf16 paged decode (16-key blocks) of one 32 k sequence
// 1.06-1.13x, of 64 sequences 1.00-1.01x (with the cache in L2, 0.91-0.94x: the prefetches' own
// cost); against fp8 paged decode 0.95-0.96x, fp16 dense decode 0.98-0.99x and bf16 on AVX2
// 0.93-0.96x.
constexpr std::int64_t kStreamedRunAhead = 128;
std::int64_t streamed_run_ahead(DType cache_dtype) {
  const bool reads_bound =
      cache_dtype == DType::f32 || (cache_dtype == DType::bf16 && cpu_runs_avx512());
  return reads_bound ? kStreamedRunAhead : 0;
}
// Streamed chunks also list the rows of the keys after them that the prefetches reach, so that the
// memory stays busy across chunk boundaries.
constexpr std::int64_t kStreamedFarAhead = kStreamedL2Ahead * kStreamedPrefetchKeys;
constexpr std::int64_t kStreamedMaxLookahead = std::max(kStreamedFarAhead, kStreamedRunAhead);
constexpr std::int64_t kPrefetchKeys = kKeyChunk;  // one chunk ahead
// Rows (query tokens × the group's heads) per item: bounded scratch, and enough rows per K/V chunk
// that prefill reuses each gathered chunk many times.
constexpr std::int64_t kMaxFoldedRows = 64;
// Over a token-major cache (a key's rows of all kv heads side by side: block-sparse K and V,
// [B, N, H, D] dense views), a decode item spans up to kMaxDecodeRows rows (kv heads × group)
// whose chunks hold up to kDecodeChunkBytes of K and V: while one chunk is scored head by head,
// the next chunk's rows of all the item's heads are prefetched into L2 in address order, so the
// memory reads them as one run, where one-head items each read a row out of every Hkv (and the
// rows between them again, later or on the other thread). Measured side by side on Zen 4 (B8
// Hq32 Hkv8 N4096 D128): block-sparse decode of a layout kept by every head (34% of the keys)
// 1.31x (bf16) and 1.12x (fp32) faster, dense decode over [B, N, H, D] 1.06x and 1.23x. Where a
// kv head's rows of a block are contiguous (vLLM's layout, [B, H, N, D]) one-head items were as
// fast or faster (64-sequence paged decode 0.94-1.0x, dense decode 0.85-0.92x with multi-head
// items). Two chunks fit a 1 MiB L2.
constexpr std::int64_t kMaxDecodeRows = 64;
constexpr std::int64_t kDecodeChunkBytes = std::int64_t{256} << 10;
// Automatic split-KV: pieces of at least this many keys, and split only while the batch has fewer
// than kItemsPerThread items per thread.
constexpr std::int64_t kMinAutoPieceKeys = 512;
constexpr std::int64_t kItemsPerThread = 4;

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

// fp32 rows in the kernel's scratch are padded with zeros to a multiple of 32 (kLanes for the
// AVX2 micro-kernels below, whole AVX-512 vectors and the 32-element groups of streamed bf16
// accumulators for the streaming ones), so every micro-kernel runs whole vectors.
constexpr std::int64_t kLanes = 8;
constexpr std::int64_t kRowPadding = 32;
std::int64_t padded_dim(std::int64_t head_dim) {
  return (head_dim + kRowPadding - 1) / kRowPadding * kRowPadding;
}

// The two products of attention, on fp32 scratch, compiled for AVX2 + FMA and for the x86-64
// baseline (the loader picks one by the CPU); GCC vector types keep the accumulators in registers.
using Float8 = float __attribute__((vector_size(32)));

// The helpers are always inlined into the micro-kernels: no Float8 crosses a call, so the ABI note
// GCC gives for 32-byte vectors in the baseline clones does not apply.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

[[gnu::always_inline]] inline Float8 load8(const float* p) {
  Float8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
[[gnu::always_inline]] inline void store8(float* p, Float8 v) {
  std::memcpy(p, &v, sizeof v);
}
[[gnu::always_inline]] inline float sum8(Float8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// scores[r * score_stride + j] = q[r] · k[j] for r < rows, j < count (rows `dim` floats apart).
void dot_rows_with_keys(const float* q, std::int64_t rows, const float* k, std::int64_t count,
                        std::int64_t dim, float* scores, std::int64_t score_stride) {
  run_compiled_for_cpu([&]() TILELAB_ALWAYS_INLINE {
    std::int64_t r = 0;
    for (; r + 4 <= rows; r += 4) {  // four rows by two keys: 6 loads feed 8 FMAs
      const float* q0 = q + r * dim;
      std::int64_t j = 0;
      for (; j + 2 <= count; j += 2) {
        const float* key = k + j * dim;
        Float8 a0{}, a1{}, a2{}, a3{}, b0{}, b1{}, b2{}, b3{};
        for (std::int64_t d = 0; d < dim; d += kLanes) {
          const Float8 k0 = load8(key + d), k1 = load8(key + dim + d);
          const Float8 q0d = load8(q0 + d), q1d = load8(q0 + dim + d);
          const Float8 q2d = load8(q0 + 2 * dim + d), q3d = load8(q0 + 3 * dim + d);
          a0 += q0d * k0;
          b0 += q0d * k1;
          a1 += q1d * k0;
          b1 += q1d * k1;
          a2 += q2d * k0;
          b2 += q2d * k1;
          a3 += q3d * k0;
          b3 += q3d * k1;
        }
        float* out = scores + r * score_stride + j;
        out[0] = sum8(a0);
        out[1] = sum8(b0);
        out[score_stride] = sum8(a1);
        out[score_stride + 1] = sum8(b1);
        out[2 * score_stride] = sum8(a2);
        out[2 * score_stride + 1] = sum8(b2);
        out[3 * score_stride] = sum8(a3);
        out[3 * score_stride + 1] = sum8(b3);
      }
      for (; j < count; ++j) {
        const float* key = k + j * dim;
        Float8 a0{}, a1{}, a2{}, a3{};
        for (std::int64_t d = 0; d < dim; d += kLanes) {
          const Float8 kv = load8(key + d);
          a0 += load8(q0 + d) * kv;
          a1 += load8(q0 + dim + d) * kv;
          a2 += load8(q0 + 2 * dim + d) * kv;
          a3 += load8(q0 + 3 * dim + d) * kv;
        }
        scores[r * score_stride + j] = sum8(a0);
        scores[(r + 1) * score_stride + j] = sum8(a1);
        scores[(r + 2) * score_stride + j] = sum8(a2);
        scores[(r + 3) * score_stride + j] = sum8(a3);
      }
    }
    for (; r < rows; ++r) {
      for (std::int64_t j = 0; j < count; ++j) {
        Float8 a{};
        for (std::int64_t d = 0; d < dim; d += kLanes)
          a += load8(q + r * dim + d) * load8(k + j * dim + d);
        scores[r * score_stride + j] = sum8(a);
      }
    }
  });
}

// acc[r] = acc[r] · correction[r] + Σ_j p[r * p_stride + j] · v[j] for r < rows, j < count.
void accumulate_values(const float* p, std::int64_t p_stride, std::int64_t rows, const float* v,
                       std::int64_t count, std::int64_t dim, const float* correction, float* acc) {
  run_compiled_for_cpu([&]() TILELAB_ALWAYS_INLINE {
    std::int64_t r = 0;
    for (; r + 4 <= rows; r += 4) {
      const float* p0 = p + r * p_stride;
      std::int64_t d = 0;
      for (; d + 2 * kLanes <= dim; d += 2 * kLanes) {  // four rows by two vectors in registers
        float* out = acc + r * dim + d;
        Float8 a0 = load8(out) * correction[r], b0 = load8(out + kLanes) * correction[r];
        Float8 a1 = load8(out + dim) * correction[r + 1];
        Float8 b1 = load8(out + dim + kLanes) * correction[r + 1];
        Float8 a2 = load8(out + 2 * dim) * correction[r + 2];
        Float8 b2 = load8(out + 2 * dim + kLanes) * correction[r + 2];
        Float8 a3 = load8(out + 3 * dim) * correction[r + 3];
        Float8 b3 = load8(out + 3 * dim + kLanes) * correction[r + 3];
        for (std::int64_t j = 0; j < count; ++j) {
          const Float8 v0 = load8(v + j * dim + d), v1 = load8(v + j * dim + d + kLanes);
          const float p_0 = p0[j], p_1 = p0[p_stride + j];
          const float p_2 = p0[2 * p_stride + j], p_3 = p0[3 * p_stride + j];
          a0 += p_0 * v0;
          b0 += p_0 * v1;
          a1 += p_1 * v0;
          b1 += p_1 * v1;
          a2 += p_2 * v0;
          b2 += p_2 * v1;
          a3 += p_3 * v0;
          b3 += p_3 * v1;
        }
        store8(out, a0);
        store8(out + kLanes, b0);
        store8(out + dim, a1);
        store8(out + dim + kLanes, b1);
        store8(out + 2 * dim, a2);
        store8(out + 2 * dim + kLanes, b2);
        store8(out + 3 * dim, a3);
        store8(out + 3 * dim + kLanes, b3);
      }
      for (; d < dim; d += kLanes) {  // four rows' accumulators stay in registers
        float* out = acc + r * dim + d;
        Float8 a0 = load8(out) * correction[r];
        Float8 a1 = load8(out + dim) * correction[r + 1];
        Float8 a2 = load8(out + 2 * dim) * correction[r + 2];
        Float8 a3 = load8(out + 3 * dim) * correction[r + 3];
        for (std::int64_t j = 0; j < count; ++j) {
          const Float8 vv = load8(v + j * dim + d);
          a0 += p0[j] * vv;
          a1 += p0[p_stride + j] * vv;
          a2 += p0[2 * p_stride + j] * vv;
          a3 += p0[3 * p_stride + j] * vv;
        }
        store8(out, a0);
        store8(out + dim, a1);
        store8(out + 2 * dim, a2);
        store8(out + 3 * dim, a3);
      }
    }
    for (; r < rows; ++r) {
      for (std::int64_t d = 0; d < dim; d += kLanes) {
        float* out = acc + r * dim + d;
        Float8 a = load8(out) * correction[r];
        for (std::int64_t j = 0; j < count; ++j) a += p[r * p_stride + j] * load8(v + j * dim + d);
        store8(out, a);
      }
    }
  });
}
#pragma GCC diagnostic pop

struct WorkItem {
  std::int64_t seq, kv_head, kv_head_count;  // kv heads [kv_head, kv_head + kv_head_count)
  std::int64_t token_begin, tokens;  // query tokens of the sequence (0 = its first query token)
  std::int64_t key_begin, key_end;   // the union of the rows' visible keys
  std::int64_t pieces;               // split-KV pieces of [key_begin, key_end)
  std::int64_t partial_offset;       // first piece's slot in the partial-state buffer
};

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// Query rows of an item: its tokens × its heads' groups. Row r is query head
// kv_head · group + r % (kv_head_count · group) of token token_begin + r / (kv_head_count · group).
std::int64_t item_rows(const WorkItem& item, std::int64_t group) {
  return item.tokens * item.kv_head_count * group;
}

// True when items of one query token read K and V rows in place (paged_stream.hpp).
bool streams_cache_rows(const PagedProblem& problem) {
  return cpu_streams_cache_rows() && problem.head_dim <= kMaxStreamedHeadDim &&
         problem.key_cache.stride(3) == 1 && problem.value_cache.stride(3) == 1;
}

// How decode items (one query token, streamed) span kv heads, and the keys of their chunks.
struct DecodeLayout {
  std::int64_t kv_heads = 1;
  std::int64_t chunk_keys = kStreamedKeyChunk;
};

DecodeLayout decode_layout(const PagedProblem& problem) {
  const bool token_major = problem.key_cache.stride(1) < problem.key_cache.stride(2) &&
                           problem.value_cache.stride(1) < problem.value_cache.stride(2);
  if (!streams_cache_rows(problem) || !token_major) return {};
  const std::int64_t group = problem.q_heads / problem.kv_heads;
  const auto row_bytes =
      problem.head_dim * static_cast<std::int64_t>(dtype_size(problem.cache_dtype));
  const std::int64_t heads =
      std::min({problem.kv_heads, std::max<std::int64_t>(1, kMaxDecodeRows / group),
                std::max<std::int64_t>(1, kDecodeChunkBytes / (2 * kKeyChunk * row_bytes))});
  if (heads == 1) return {};
  const std::int64_t chunk_keys =
      kDecodeChunkBytes / (2 * heads * row_bytes) / kKeyChunk * kKeyChunk;
  return {heads, std::clamp(chunk_keys, kKeyChunk, kStreamedKeyChunk)};
}

// The keys of piece `piece` of `pieces`: whole chunks, as even as possible.
std::pair<std::int64_t, std::int64_t> piece_keys(const WorkItem& item, std::int64_t piece) {
  const std::int64_t chunks = ceil_div(item.key_end - item.key_begin, kKeyChunk);
  const std::int64_t first = item.key_begin + piece * chunks / item.pieces * kKeyChunk;
  const std::int64_t last = item.key_begin + (piece + 1) * chunks / item.pieces * kKeyChunk;
  return {first, std::min(last, item.key_end)};
}

// The work items of every sequence, and the partial-state slots their split pieces need.
struct WorkPlan {
  std::vector<WorkItem> items;
  std::int64_t partial_slots = 0;
  std::int64_t pieces() const {
    std::int64_t count = 0;
    for (const WorkItem& item : items) count += item.pieces;
    return count;
  }
};

WorkPlan plan_work(const PagedProblem& problem, std::int64_t folded_rows,
                   std::int64_t decode_kv_heads) {
  const std::int64_t group = problem.q_heads / problem.kv_heads;
  const std::int64_t tokens_per_item = std::max<std::int64_t>(1, folded_rows / group);
  std::vector<WorkItem> items;
  for (std::int64_t s = 0; s < problem.num_seqs; ++s) {
    if (!problem.computed_elsewhere.empty() && problem.computed_elsewhere[s]) continue;
    const std::int64_t q_len = problem.q_len(s), first = problem.first_query_position(s);
    for (std::int64_t t = 0; t < q_len; t += tokens_per_item) {
      const std::int64_t tokens = std::min(tokens_per_item, q_len - t);
      // Visible intervals move right with the position: the union runs from the first row's
      // start to the last row's end.
      const std::int64_t key_begin = problem.first_visible_key(first + t);
      const std::int64_t key_end =
          std::max(key_begin, problem.visible_key_end(s, first + t + tokens - 1));
      const std::int64_t heads = tokens == 1 ? decode_kv_heads : 1;
      for (std::int64_t h = 0; h < problem.kv_heads; h += heads) {
        const std::int64_t count = std::min(heads, problem.kv_heads - h);
        items.push_back({s, h, count, t, tokens, key_begin, key_end, 1, 0});
      }
    }
  }

  const std::int64_t threads = num_threads();
  const auto item_count = static_cast<std::int64_t>(items.size());
  std::int64_t partial_slots = 0;
  for (WorkItem& item : items) {
    const std::int64_t chunks = ceil_div(item.key_end - item.key_begin, kKeyChunk);
    std::int64_t pieces = 1;
    if (problem.split_kv >= 1) {
      pieces = problem.split_kv;
    } else if (threads > 1 && item_count < kItemsPerThread * threads) {
      const std::int64_t wanted = ceil_div(kItemsPerThread * threads, item_count);
      pieces = std::min(wanted, (item.key_end - item.key_begin) / kMinAutoPieceKeys);
    }
    item.pieces = std::clamp<std::int64_t>(pieces, 1, std::max<std::int64_t>(chunks, 1));
    if (item.pieces > 1) {
      item.partial_offset = partial_slots;
      partial_slots += item.pieces;
    }
  }
  return {std::move(items), partial_slots};
}

// A [tokens, H, D] tensor (query, out) addressed by element strides; token t of sequence s is
// at s * seq_stride + t * token_stride (PagedProblem::query_seq_stride).
template <typename Storage>
struct TokenRows {
  Storage* data;
  std::int64_t seq_stride, token_stride, head_stride, dim_stride;
  TokenRows(const TensorView& view, std::int64_t sequence_stride)
      : data(static_cast<Storage*>(view.data())),
        seq_stride(sequence_stride),
        token_stride(view.stride(0)),
        head_stride(view.stride(1)),
        dim_stride(view.stride(2)) {}
  Storage* row(std::int64_t seq, std::int64_t token, std::int64_t head) const {
    return data + seq * seq_stride + token * token_stride + head * head_stride;
  }
};

// The running online-softmax state of an item's rows, or a piece's partial state.
struct RowStates {
  std::int64_t rows = 0, row_floats = 0;
  std::vector<float> max, sum, acc;  // acc [rows][row_floats] (the padded head dim)
  std::vector<char> saw_key;         // a visible key reached the row (even if its score is -inf)

  RowStates(std::int64_t rows_capacity, std::int64_t dim)
      : row_floats(dim),
        max(rows_capacity),
        sum(rows_capacity),
        acc(rows_capacity * dim),
        saw_key(rows_capacity) {}
  void reset(std::int64_t row_count) {
    rows = row_count;
    std::fill_n(max.begin(), rows, kNegativeInfinity);
    std::fill_n(sum.begin(), rows, 0.0f);
    std::fill_n(acc.begin(), rows * row_floats, 0.0f);
    std::fill_n(saw_key.begin(), rows, 0);
  }
};

template <DType query_dtype, DType cache_dtype>
class PagedKernel {
  using QueryTraits = ElementTraits<query_dtype>;
  using QueryStorage = typename QueryTraits::Storage;
  using CacheTraits = ElementTraits<cache_dtype>;
  using CacheStorage = typename CacheTraits::Storage;

 public:
  // row_capacity: the most rows an item has.
  PagedKernel(const PagedProblem& problem, std::int64_t row_capacity, DecodeLayout decode)
      : p_(problem),
        group_(problem.q_heads / problem.kv_heads),
        head_dim_(problem.head_dim),
        score_scale_(problem.scale * problem.k_scale),
        query_(problem.query, problem.query_seq_stride),
        out_(problem.out, problem.out_seq_stride),
        dim_(padded_dim(problem.head_dim)),
        row_bytes_(problem.key_cache.stride(3) == 1
                       ? problem.head_dim * static_cast<std::int64_t>(sizeof(CacheStorage))
                       : 0),
        streams_(streams_cache_rows(problem)),
        decode_(decode),
        rounds_probabilities_(
            rounds_bf16_probabilities(query_dtype, cache_dtype, problem.fp32_probabilities)),
        streamed_products_(streamed_products(query_dtype, cache_dtype, problem.fp32_probabilities)),
        q_rows_((row_capacity + kStreamedRowTile - 1) * dim_, 0.0f),
        keys_(kKeyChunk * dim_, 0.0f),
        values_(kKeyChunk * dim_, 0.0f),
        scores_((group_ + kStreamedRowTile - 1) / kStreamedRowTile * kStreamedRowTile *
                kScoreStride),
        corrections_(group_),
        run_ahead_(streamed_run_ahead(cache_dtype)),
        lookahead_(std::max(kStreamedFarAhead, run_ahead_)),
        key_rows_(kStreamedKeyChunk + kStreamedMaxLookahead),
        value_rows_(kStreamedKeyChunk + kStreamedMaxLookahead),
        far_key_rows_(decode.kv_heads > 1 ? decode.kv_heads * decode.chunk_keys : 0),
        far_value_rows_(far_key_rows_.size()),
        head_sees_rows_(decode.kv_heads),
        state_(row_capacity, dim_),
        merged_(row_capacity, dim_),
        acc_order_(streamed_acc_order(problem.head_dim)),
        ordered_row_(acc_order_.empty() ? 0 : problem.head_dim) {}

  // Computes piece `piece` of `item` into state(). The rows of one query token (its group's
  // heads) see the same keys, so they are scored and accumulated together.
  void run_piece(const WorkItem& item, std::int64_t piece) {
    load_queries(item);
    state_.reset(item_rows(item, group_));
    const auto [first_key, end_key] = piece_keys(item, piece);
    if (item.kv_head_count > 1) return run_heads_piece(item, first_key, end_key);
    for_each_seen_run(item, item.kv_head, first_key, end_key,
                      [&](std::int64_t begin, std::int64_t end, const std::uint8_t* rows_see) {
                        run_keys(item, begin, end, rows_see);
                      });
  }

  RowStates& state() { return state_; }
  RowStates& merged() { return merged_; }

  // Writes the rows of `states` (the item's whole keys) to out: sinks join the denominator, then
  // 1 / sum and v_scale.
  void finish_rows(const WorkItem& item, RowStates& states) {
    const std::int64_t rows = item_rows(item, group_), head_rows = item.kv_head_count * group_;
    const bool streamed = streams(item);  // accumulators in streamed_acc_index order
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t head = item.kv_head * group_ + r % head_rows;
      float* acc = &states.acc[r * dim_];
      float row_max = states.max[r];
      float row_sum = states.sum[r];
      bool counted = states.saw_key[r] != 0;
      if (!p_.score.sinks.empty()) {
        // The sink is one more logit, with a zero value vector. A sink of -inf adds nothing.
        const float sink = p_.score.sinks[head];
        const float new_max = nan_propagating_max(row_max, sink);
        if (new_max != kNegativeInfinity) {
          const float correction = Sleef_expf_u10(row_max - new_max);  // 0 for a keyless row
          row_sum = row_sum * correction + Sleef_expf_u10(sink - new_max);
          for (std::int64_t i = 0; i < dim_; ++i) acc[i] *= correction;
          row_max = new_max;
          counted = true;
        }
      }
      const float factor = inverse_row_sum(counted, row_sum) * p_.v_scale;
      const std::int64_t token = p_.query_starts[item.seq] + item.token_begin + r / head_rows;
      const float* row = acc;
      if (streamed && !acc_order_.empty()) {
        for (std::int64_t d = 0; d < head_dim_; ++d) ordered_row_[d] = acc[acc_order_[d]];
        row = ordered_row_.data();
      }
      store_row(row, factor, out_.row(item.seq, token, head));
      if (p_.lse) {
        // As flash_attention's lse: -inf for a row no key reached, NaN for a sum of zero (only
        // -inf scores) or NaN.
        static_cast<float*>(p_.lse->data())[item.seq * p_.lse_seq_stride +
                                            token * p_.lse->stride(0) + head * p_.lse->stride(1)] =
            !counted          ? kNegativeInfinity
            : row_sum == 0.0f ? std::numeric_limits<float>::quiet_NaN()
                              : row_max + std::log(row_sum);
      }
    }
  }

 private:
  // Decode items (one query token: a GQA group of rows) read K and V in place; items with more
  // rows widen each chunk once into fp32 scratch and reuse it across their rows.
  bool streams(const WorkItem& item) const { return streams_ && item.tokens == 1; }

  // Where streamed accumulators keep head-dim element d (streamed_acc_index), computed once;
  // empty when that is d itself, or when no item streams.
  std::vector<std::int32_t> streamed_acc_order(std::int64_t head_dim) const {
    std::vector<std::int32_t> order(head_dim);
    bool identity = true;
    for (std::int64_t d = 0; d < head_dim; ++d) {
      order[d] = static_cast<std::int32_t>(
          streamed_acc_index(cache_dtype, streamed_products_, d, head_dim));
      identity = identity && order[d] == d;
    }
    if (!streams_ || identity) order.clear();
    return order;
  }

  // dst[d] = row[d] · factor in the query dtype, d < head_dim: vectorized where the output row is
  // contiguous bf16 or fp32 (the same rounding as from_float).
  void store_row(const float* row, float factor, QueryStorage* dst) const {
    if (out_.dim_stride == 1) {
      if constexpr (query_dtype == DType::bf16) return scale_to_bf16(row, head_dim_, factor, dst);
      if constexpr (query_dtype == DType::f32) return scale_to_f32(row, head_dim_, factor, dst);
    }
    for (std::int64_t d = 0; d < head_dim_; ++d) {
      dst[d * out_.dim_stride] = QueryTraits::from_float(row[d] * factor);
    }
  }

  // Calls f(begin, end, rows_see) for the runs of keys in [first_key, end_key) whose blocks the
  // same heads of kv head `kv_head`'s group see, skipping those that none sees; rows_see: the
  // group's head_sees_block entries, or null (one run) when every head sees every block.
  template <typename F>
  void for_each_seen_run(const WorkItem& item, std::int64_t kv_head, std::int64_t first_key,
                         std::int64_t end_key, F&& f) const {
    if (p_.head_sees_block.empty()) {
      if (first_key < end_key) f(first_key, end_key, nullptr);
      return;
    }
    const std::int64_t group_head = kv_head * group_;
    for (std::int64_t block = first_key / p_.block_size; block * p_.block_size < end_key;) {
      const std::uint8_t* sees = p_.heads_seeing_block(item.seq, block, group_head);
      std::int64_t run_end = block + 1;
      while (
          run_end * p_.block_size < end_key &&
          std::equal(sees, sees + group_, p_.heads_seeing_block(item.seq, run_end, group_head))) {
        ++run_end;
      }
      if (group_sees_block(item.seq, block, kv_head)) {
        f(std::max(first_key, block * p_.block_size), std::min(end_key, run_end * p_.block_size),
          sees);
      }
      block = run_end;
    }
  }

  // True when some head of kv head `kv_head`'s group sees logical block `block` of `seq`.
  bool group_sees_block(std::int64_t seq, std::int64_t block, std::int64_t kv_head) const {
    if (p_.head_sees_block.empty()) return true;
    const std::uint8_t* sees = p_.heads_seeing_block(seq, block, kv_head * group_);
    return std::any_of(sees, sees + group_, [](std::uint8_t seen) { return seen != 0; });
  }

  // Keys [first_key, end_key) of a one-kv-head item, chunk by chunk. `rows_see` (group_ entries,
  // or null for all): which of each token's group rows see these keys.
  void run_keys(const WorkItem& item, std::int64_t first_key, std::int64_t end_key,
                const std::uint8_t* rows_see) {
    const std::int64_t first_position = p_.first_query_position(item.seq) + item.token_begin;
    const std::int64_t chunk_keys = streams(item) ? kStreamedKeyChunk : kKeyChunk;
    for (std::int64_t chunk = first_key; chunk < end_key; chunk += chunk_keys) {
      const std::int64_t chunk_end = std::min(chunk + chunk_keys, end_key);
      if (streams(item)) {
        collected_end_ = std::min(chunk_end + lookahead_, end_key);
        collect_rows(item, item.kv_head, chunk, collected_end_);
      } else {
        gather_chunk(item, chunk, chunk_end, end_key);
      }
      for (std::int64_t t = 0; t < item.tokens; ++t) {
        const std::int64_t position = first_position + t;
        const std::int64_t begin = std::max(chunk, p_.first_visible_key(position));
        const std::int64_t end = std::min(chunk_end, p_.visible_key_end(item.seq, position));
        if (begin >= end) continue;
        score_and_merge(item, item.kv_head, t * group_, position, chunk, begin, end, nullptr,
                        rows_see);
      }
    }
  }

  // The next chunk's K and V rows that one head's step of a multi-head item prefetches.
  struct FarRows {
    const void* const* keys;
    const void* const* values;
    std::int64_t count;
  };

  // One head's run of keys within a chunk of a multi-head item (for_each_seen_run).
  struct HeadRun {
    std::int64_t head;  // of the item's kv heads
    std::int64_t begin, end;
    const std::uint8_t* rows_see;
  };

  // A decode item over several kv heads (decode_layout): each chunk is scored head by head, and
  // each head's runs of keys prefetch their share (by keys) of the next chunk's rows of all the
  // item's heads, in address order, into L2.
  void run_heads_piece(const WorkItem& item, std::int64_t first_key, std::int64_t end_key) {
    const std::int64_t position = p_.first_query_position(item.seq) + item.token_begin;
    const std::int64_t begin = std::max(first_key, p_.first_visible_key(position));
    const std::int64_t end = std::min(end_key, p_.visible_key_end(item.seq, position));
    for (std::int64_t chunk = begin; chunk < end; chunk += decode_.chunk_keys) {
      const std::int64_t chunk_end = std::min(chunk + decode_.chunk_keys, end);
      const std::int64_t far_count =
          collect_in_address_order(item, chunk_end, std::min(chunk_end + decode_.chunk_keys, end));
      head_runs_.clear();
      std::int64_t seen_keys = 0;
      for (std::int64_t h = 0; h < item.kv_head_count; ++h) {
        for_each_seen_run(
            item, item.kv_head + h, chunk, chunk_end,
            [&](std::int64_t run_begin, std::int64_t run_end, const std::uint8_t* see) {
              head_runs_.push_back({h, run_begin, run_end, see});
              seen_keys += run_end - run_begin;
            });
      }
      std::int64_t collected_head = -1, keys_done = 0;
      for (const HeadRun& run : head_runs_) {
        if (run.head != collected_head) {
          collect_rows(item, item.kv_head + run.head, chunk, chunk_end);
          collected_head = run.head;
        }
        const std::int64_t far_begin = keys_done * far_count / seen_keys;
        keys_done += run.end - run.begin;
        const std::int64_t far_end = keys_done * far_count / seen_keys;
        const FarRows far{&far_key_rows_[far_begin], &far_value_rows_[far_begin],
                          far_end - far_begin};
        score_and_merge(item, item.kv_head + run.head, run.head * group_, position, chunk,
                        run.begin, run.end, &far, run.rows_see);
      }
    }
  }

  // Lists the K and V rows of keys [key, end) of the item's heads in address order (the cache is
  // token-major, decode_layout: key by key, its heads side by side), walking the first head's rows
  // through the block table; with head_sees_block, only rows of blocks some head of the row's
  // kv head's group sees. Returns how many.
  std::int64_t collect_in_address_order(const WorkItem& item, std::int64_t key, std::int64_t end) {
    const std::int64_t key_head_stride = p_.key_cache.stride(1);
    const std::int64_t value_head_stride = p_.value_cache.stride(1);
    std::int64_t count = 0, block = -1;
    for (CacheRows rows = cache_rows(item, item.kv_head, key, end); rows.key < rows.end;
         advance(item, rows)) {
      if (rows.key / p_.block_size != block) {
        block = rows.key / p_.block_size;
        for (std::int64_t h = 0; h < item.kv_head_count; ++h) {
          head_sees_rows_[h] = group_sees_block(item.seq, block, item.kv_head + h);
        }
      }
      for (std::int64_t h = 0; h < item.kv_head_count; ++h) {
        if (head_sees_rows_[h] == 0) continue;
        far_key_rows_[count] = rows.key_row + h * key_head_stride;
        far_value_rows_[count] = rows.value_row + h * value_head_stride;
        ++count;
      }
    }
    return count;
  }

  // Lists the K and V row addresses of keys [key, end) of kv head `kv_head` of the item, a cache
  // block at a time: one block-table lookup per block, then a plain loop over its rows (walking
  // key by key, testing for the block's end at every key, took about 6% of fp8 decode with the
  // cache in L2; on Zen 4 64-sequence decode measured 1.04-1.05x faster with fp8 caches and
  // 1.015x with bf16).
  void collect_rows(const WorkItem& item, std::int64_t kv_head, std::int64_t key,
                    std::int64_t end) {
    const std::int64_t key_stride = p_.key_cache.stride(2);
    const std::int64_t value_stride = p_.value_cache.stride(2);
    const void** key_rows = key_rows_.data();
    const void** value_rows = value_rows_.data();
    while (key < end) {
      const CacheRows rows = cache_rows(item, kv_head, key, end);
      const std::int64_t run = std::min(rows.block_end, end) - key;
      for (std::int64_t i = 0; i < run; ++i) {
        key_rows[i] = rows.key_row + i * key_stride;
        value_rows[i] = rows.value_row + i * value_stride;
      }
      key_rows += run;
      value_rows += run;
      key += run;
    }
  }

  void load_queries(const WorkItem& item) {
    const std::int64_t rows = item_rows(item, group_), head_rows = item.kv_head_count * group_;
    for (std::int64_t r = 0; r < rows; ++r) {
      const QueryStorage* src =
          query_.row(item.seq, p_.query_starts[item.seq] + item.token_begin + r / head_rows,
                     item.kv_head * group_ + r % head_rows);
      float* dst = &q_rows_[r * dim_];
      for (std::int64_t d = 0; d < head_dim_; ++d) {
        dst[d] = QueryTraits::to_float(src[d * query_.dim_stride]);
      }
    }
  }

  // K and V of key positions [chunk, chunk_end) of the item's kv head, widened to fp32 rows; the
  // next chunk's rows (up to `prefetch_end`) are prefetched meanwhile: the cache is read from
  // memory in runs of one block, too short for the hardware prefetcher to run ahead. Rows are
  // walked a block at a time (one block-table lookup per block, not a division per row).
  void gather_chunk(const WorkItem& item, std::int64_t chunk, std::int64_t chunk_end,
                    std::int64_t prefetch_end) {
    CacheRows rows = cache_rows(item, item.kv_head, chunk, chunk_end);
    CacheRows ahead =
        cache_rows(item, item.kv_head, std::min(chunk + kPrefetchKeys, prefetch_end), prefetch_end);
    LineStream<_MM_HINT_T0> key_lines, value_lines;
    for (std::int64_t row = 0; rows.key < rows.end; ++row) {
      if (ahead.key < ahead.end && row_bytes_ != 0) {
        key_lines.prefetch(ahead.key_row, row_bytes_);
        value_lines.prefetch(ahead.value_row, row_bytes_);
        advance(item, ahead);
      }
      widen_row(rows.key_row, p_.key_cache.stride(3), &keys_[row * dim_]);
      widen_row(rows.value_row, p_.value_cache.stride(3), &values_[row * dim_]);
      advance(item, rows);
    }
  }

  // A walk over the K and V rows of keys [key, end) of one kv head of an item, through the block
  // table.
  struct CacheRows {
    std::int64_t kv_head, key, end;
    std::int64_t block_end;  // the first key of the next block
    const CacheStorage* key_row;
    const CacheStorage* value_row;
  };

  CacheRows cache_rows(const WorkItem& item, std::int64_t kv_head, std::int64_t key,
                       std::int64_t end) const {
    CacheRows rows{kv_head, key, end, 0, nullptr, nullptr};
    if (key < end) locate(item, rows);
    return rows;
  }

  void locate(const WorkItem& item, CacheRows& rows) const {
    const std::int64_t logical_block = rows.key / p_.block_size;
    const std::int64_t offset = rows.key - logical_block * p_.block_size;
    const std::int64_t block = p_.physical_block(item.seq, logical_block);
    rows.block_end = rows.key - offset + p_.block_size;
    rows.key_row = cache_row(p_.key_cache, rows.kv_head, block, offset);
    rows.value_row = cache_row(p_.value_cache, rows.kv_head, block, offset);
  }

  void advance(const WorkItem& item, CacheRows& rows) const {
    if (++rows.key >= rows.end) return;
    if (rows.key == rows.block_end) {
      locate(item, rows);
    } else {
      rows.key_row += p_.key_cache.stride(2);
      rows.value_row += p_.value_cache.stride(2);
    }
  }

  const CacheStorage* cache_row(const TensorView& cache, std::int64_t kv_head, std::int64_t block,
                                std::int64_t offset) const {
    return static_cast<const CacheStorage*>(cache.data()) + block * cache.stride(0) +
           kv_head * cache.stride(1) + offset * cache.stride(2);
  }

  void widen_row(const CacheStorage* src, std::int64_t stride, float* dst) const {
    if (stride == 1) {
      widen_contiguous<cache_dtype>(src, head_dim_, dst);
    } else {
      for (std::int64_t d = 0; d < head_dim_; ++d) dst[d] = CacheTraits::to_float(src[d * stride]);
    }
  }

  // Scores of the group rows [row0, row0 + group) of kv head `kv_head` (one query token at
  // `position`) against keys [begin, end) of the gathered or collected chunk starting at `chunk`,
  // folded into the rows' states: of the rows that see these keys (`rows_see`, group entries, or
  // null for all); the others are left as they were. Streamed scoring prefetches `far` into L2,
  // or without it the collected rows further on.
  void score_and_merge(const WorkItem& item, std::int64_t kv_head, std::int64_t row0,
                       std::int64_t position, std::int64_t chunk, std::int64_t begin,
                       std::int64_t end, const FarRows* far,
                       const std::uint8_t* rows_see = nullptr) {
    const std::int64_t count = end - begin;
    const bool streamed = streams(item);
    const bool bf16_dots = streamed_products_ == StreamedProducts::bf16_dots;
    if (streamed) {
      const void* const* key_rows = &key_rows_[begin - chunk];
      const StreamedRows keys =
          far != nullptr
              ? StreamedRows{key_rows, count, 0, far->keys, far->values, far->count}
              : stream_far_ahead(key_rows, &value_rows_[begin - chunk], count, collected_end_ - end,
                                 kStreamedPrefetchKeys, run_ahead_);
      stream_scores(query_dtype, cache_dtype, &q_rows_[row0 * dim_], group_, dim_, keys, head_dim_,
                    score_scale_, scores_.data(), kScoreStride, kStreamedPrefetchKeys);
    } else {
      dot_rows_with_keys(&q_rows_[row0 * dim_], group_, &keys_[(begin - chunk) * dim_], count, dim_,
                         scores_.data(), kScoreStride);
    }
    for (std::int64_t g = 0; g < group_; ++g) {
      const std::int64_t r = row0 + g;
      const std::int64_t head = kv_head * group_ + g;
      float* s = &scores_[g * kScoreStride];
      if (rows_see != nullptr && rows_see[g] == 0) {
        corrections_[g] = kNegativeInfinity;  // left out of p·v, as a row of -inf scores
        continue;
      }
      state_.saw_key[r] = 1;
      if (!streamed) {  // the streaming kernels scale as they store
        for (std::int64_t j = 0; j < count; ++j) s[j] *= score_scale_;
      }
      if (p_.score.softcap > 0.0f) softcap_in_place(s, count, p_.score.softcap);
      if (!p_.score.alibi_slopes.empty()) {
        const float slope = p_.score.alibi_slopes[head];
        for (std::int64_t j = 0; j < count; ++j) {
          s[j] += slope * static_cast<float>(begin + j - position);
        }
      }
      const float block_max = block_max_of(s, count);
      if (block_max == kNegativeInfinity) {
        // Every score -inf: nothing contributes (exp(-inf - -inf) would be NaN). Its row must not
        // join the group's p·v either (0 · a non-finite value is NaN).
        corrections_[g] = kNegativeInfinity;
        continue;
      }
      corrections_[g] = softmax_block_update(s, count, block_max, state_.max[r], state_.sum[r],
                                             SoftmaxExp::polynomial_on_avx512);
      // bf16 dot products round P themselves; the fp32 products read it rounded.
      if (rounds_probabilities_ && !(streamed && bf16_dots)) {
        for (std::int64_t j = 0; j < count; ++j) s[j] = round_to_dtype(s[j], DType::bf16);
      }
    }
    float* acc = &state_.acc[row0 * dim_];
    // The V rows, and the collected ones after them (a multi-head item's next chunk is its far
    // stream's).
    const StreamedRows values =
        far != nullptr ? StreamedRows{.rows = &value_rows_[begin - chunk], .count = count}
                       : StreamedRows{.rows = &value_rows_[begin - chunk],
                                      .count = count,
                                      .lookahead = collected_end_ - end,
                                      .run_ahead = run_ahead_};
    // Rows whose block had only -inf scores are left out (their correction says so).
    const auto accumulate = [&](std::int64_t first_row, std::int64_t rows) {
      if (streamed) {
        stream_values(cache_dtype, streamed_products_, &scores_[first_row * kScoreStride],
                      kScoreStride, rows, values, head_dim_, &corrections_[first_row],
                      acc + first_row * dim_, dim_, kStreamedPrefetchKeys);
      } else {
        accumulate_values(&scores_[first_row * kScoreStride], kScoreStride, rows,
                          &values_[(begin - chunk) * dim_], count, dim_, &corrections_[first_row],
                          acc + first_row * dim_);
      }
    };
    // Runs of the rows that count (usually the whole group), each one pass over V.
    for (std::int64_t g = 0; g < group_;) {
      if (corrections_[g] == kNegativeInfinity) {
        ++g;
        continue;
      }
      std::int64_t run_end = g + 1;
      while (run_end < group_ && corrections_[run_end] != kNegativeInfinity) ++run_end;
      accumulate(g, run_end - g);
      g = run_end;
    }
  }

  const PagedProblem& p_;
  const std::int64_t group_, head_dim_;
  const float score_scale_;
  const TokenRows<const QueryStorage> query_;
  const TokenRows<QueryStorage> out_;
  const std::int64_t dim_;  // head_dim_ padded to whole vectors
  // Bytes a cache row spans (contiguous rows only; prefetching strided rows is not worth it).
  const std::int64_t row_bytes_;
  const bool streams_;
  const DecodeLayout decode_;
  // P is rounded to bf16 before P·V (rounds_bf16_probabilities).
  const bool rounds_probabilities_;
  const StreamedProducts streamed_products_;
  std::vector<float> q_rows_, keys_, values_;  // q_rows_ has kStreamedRowTile - 1 spare rows
  std::vector<float> scores_;       // [group rounded up to kStreamedRowTile][kScoreStride]
  std::vector<float> corrections_;  // [group]
  // Streamed items: the run-ahead stream's distance (0: none), and how many keys past a chunk
  // its K and V row addresses (of one kv head) also list.
  const std::int64_t run_ahead_, lookahead_;
  std::vector<const void*> key_rows_, value_rows_;
  // Multi-head decode items: the next chunk's K and V rows in address order.
  std::vector<const void*> far_key_rows_, far_value_rows_;
  std::vector<HeadRun> head_runs_;    // a chunk's runs (run_heads_piece)
  std::vector<char> head_sees_rows_;  // per kv head of an item (collect_in_address_order)
  std::int64_t collected_end_ = 0;    // the key after the last collected row
  RowStates state_, merged_;
  std::vector<std::int32_t> acc_order_;  // streamed_acc_order
  std::vector<float> ordered_row_;       // one row in head-dim order, where acc_order_ permutes
};

// Partial states of split items: per piece slot, rows × (max, sum, saw_key, acc[row_floats]),
// whole padded accumulator rows (a streamed item's are in streamed_acc_index order).
struct PartialStates {
  std::int64_t rows_per_slot, row_floats;
  std::vector<float> values;
  std::int64_t slot_floats() const { return rows_per_slot * (3 + row_floats); }
  float* slot(std::int64_t index) { return &values[index * slot_floats()]; }
};

template <DType query_dtype, DType cache_dtype>
void run_paged_kernel(const PagedProblem& problem) {
  const std::int64_t group = problem.q_heads / problem.kv_heads;
  const std::int64_t folded_rows = std::max(kMaxFoldedRows / group * group, group);
  // Multi-head decode items, unless one-head items would keep more threads busy. An item's heads
  // set its chunks' bounds, and so the summation order: with a forced split, whose result must
  // not depend on the thread count, the choice follows the processors instead.
  const std::int64_t threads =
      problem.split_kv >= 1 ? max_num_threads() / kMaxThreadsPerProcessor : num_threads();
  DecodeLayout decode = decode_layout(problem);
  WorkPlan plan = plan_work(problem, folded_rows, decode.kv_heads);
  if (decode.kv_heads > 1 && threads > 1 && plan.pieces() < kItemsPerThread * threads) {
    decode = {};
    plan = plan_work(problem, folded_rows, 1);
  }
  const std::int64_t row_capacity = std::max(folded_rows, decode.kv_heads * group);
  const std::vector<WorkItem>& items = plan.items;
  const auto item_count = static_cast<std::int64_t>(items.size());

  // Pieces: (item, piece) pairs, unsplit items as one piece each.
  std::vector<std::pair<std::int64_t, std::int64_t>> pieces;
  for (std::int64_t i = 0; i < item_count; ++i) {
    for (std::int64_t p = 0; p < items[i].pieces; ++p) pieces.emplace_back(i, p);
  }
  PartialStates partial{row_capacity, padded_dim(problem.head_dim), {}};
  partial.values.resize(plan.partial_slots * partial.slot_floats());
  const auto piece_count = static_cast<std::int64_t>(pieces.size());

#pragma omp parallel num_threads(num_threads())
  {
    PagedKernel<query_dtype, cache_dtype> kernel(problem, row_capacity, decode);
#pragma omp for schedule(dynamic)
    for (std::int64_t n = 0; n < piece_count; ++n) {
      const WorkItem& item = items[pieces[n].first];
      const std::int64_t piece = pieces[n].second;
      kernel.run_piece(item, piece);
      RowStates& state = kernel.state();
      if (item.pieces == 1) {
        kernel.finish_rows(item, state);
        continue;
      }
      float* slot = partial.slot(item.partial_offset + piece);
      for (std::int64_t r = 0; r < state.rows; ++r) {
        float* row = slot + r * (3 + partial.row_floats);
        row[0] = state.max[r];
        row[1] = state.sum[r];
        row[2] = state.saw_key[r] ? 1.0f : 0.0f;
        std::copy_n(&state.acc[r * state.row_floats], partial.row_floats, row + 3);
      }
    }

    // Split items: merge the pieces in piece order.
#pragma omp for schedule(dynamic)
    for (std::int64_t i = 0; i < item_count; ++i) {
      const WorkItem& item = items[i];
      if (item.pieces == 1) continue;
      RowStates& merged = kernel.merged();
      merged.reset(item_rows(item, group));
      for (std::int64_t piece = 0; piece < item.pieces; ++piece) {
        const float* slot = partial.slot(item.partial_offset + piece);
        for (std::int64_t r = 0; r < merged.rows; ++r) {
          const float* row = slot + r * (3 + partial.row_floats);
          merged.saw_key[r] |= row[2] != 0.0f ? 1 : 0;
          merge_partial_into_row(row[0], row[1], row + 3, partial.row_floats, merged.max[r],
                                 merged.sum[r], &merged.acc[r * merged.row_floats]);
        }
      }
      kernel.finish_rows(item, merged);
    }
  }
}

template <DType query_dtype>
void dispatch_cache_dtype(const PagedProblem& problem) {
  switch (problem.cache_dtype) {
    case DType::f8e4m3fn:
      return run_paged_kernel<query_dtype, DType::f8e4m3fn>(problem);
    case DType::f8e5m2:
      return run_paged_kernel<query_dtype, DType::f8e5m2>(problem);
    default:
      TILELAB_CHECK(problem.cache_dtype == query_dtype)
          << "paged kernel: cache dtype " << dtype_name(problem.cache_dtype)
          << " passed validation";
      return run_paged_kernel<query_dtype, query_dtype>(problem);
  }
}

}  // namespace

void paged_kernel_attention(const PagedProblem& problem) {
  switch (problem.dtype) {
    case DType::f32:
      return dispatch_cache_dtype<DType::f32>(problem);
    case DType::f16:
      return dispatch_cache_dtype<DType::f16>(problem);
    case DType::bf16:
      return dispatch_cache_dtype<DType::bf16>(problem);
    case DType::i32:
    case DType::f8e4m3fn:
    case DType::f8e5m2:
      break;
  }
  TILELAB_CHECK(false) << "paged kernel: query dtype " << dtype_name(problem.dtype)
                       << " passed validation";
}

}  // namespace tilelab::detail
