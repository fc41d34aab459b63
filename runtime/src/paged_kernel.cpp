// The paged kernel: attention that reads K/V in place through the block table.
//
// Work items are (sequence, kv head, up to kMaxFoldedRows query rows, key piece). The rows of an
// item are every query head of the kv head's GQA group for a run of query tokens, so each K/V
// element an item reads serves the whole group (decode reads the cache once per kv head). Keys
// are visited in chunks of kKeyChunk positions: the chunk's K and V rows are gathered through the
// block table and widened to fp32 once, then each row scores the keys it sees (causality and the
// sliding window give every row one contiguous interval) and folds them into its online softmax.
// An item whose keys are split into pieces (split-KV) writes each piece's partial state; a second
// pass merges the pieces in piece order, so the result does not depend on which thread ran what.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "dtype_convert.hpp"
#include "paged_problem.hpp"
#include "reference_softmax.hpp"
#include "tilelab/error.hpp"
#include "tilelab/threading.hpp"

namespace tilelab::detail {

namespace {

constexpr std::int64_t kKeyChunk = 64;
// Rows (query tokens × the group's heads) per item: bounded scratch, and enough rows per K/V chunk
// that prefill reuses each gathered chunk many times.
constexpr std::int64_t kMaxFoldedRows = 64;
// Automatic split-KV: pieces of at least this many keys, and split only while the batch has fewer
// than kItemsPerThread items per thread.
constexpr std::int64_t kMinAutoPieceKeys = 512;
constexpr std::int64_t kItemsPerThread = 4;

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

struct WorkItem {
  std::int64_t seq, kv_head;
  std::int64_t token_begin, tokens;  // query tokens of the sequence (0 = its first query token)
  std::int64_t key_begin, key_end;   // the union of the rows' visible keys
  std::int64_t pieces;               // split-KV pieces of [key_begin, key_end)
  std::int64_t partial_offset;       // first piece's slot in the partial-state buffer
};

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// The keys of piece `piece` of `pieces`: whole chunks, as even as possible.
std::pair<std::int64_t, std::int64_t> piece_keys(const WorkItem& item, std::int64_t piece) {
  const std::int64_t chunks = ceil_div(item.key_end - item.key_begin, kKeyChunk);
  const std::int64_t first = item.key_begin + piece * chunks / item.pieces * kKeyChunk;
  const std::int64_t last = item.key_begin + (piece + 1) * chunks / item.pieces * kKeyChunk;
  return {first, std::min(last, item.key_end)};
}

std::vector<WorkItem> make_work_items(const PagedProblem& problem,
                                      const std::vector<bool>& sequences,
                                      std::int64_t folded_rows) {
  const std::int64_t group = problem.q_heads / problem.kv_heads;
  const std::int64_t tokens_per_item = std::max<std::int64_t>(1, folded_rows / group);
  std::vector<WorkItem> items;
  for (std::int64_t s = 0; s < problem.num_seqs; ++s) {
    if (!sequences[s]) continue;
    const std::int64_t q_len = problem.q_len(s), first = problem.first_query_position(s);
    for (std::int64_t t = 0; t < q_len; t += tokens_per_item) {
      const std::int64_t tokens = std::min(tokens_per_item, q_len - t);
      // Visible intervals move right with the position: the union runs from the first row's
      // start to the last row's end.
      const std::int64_t key_begin = problem.first_visible_key(first + t);
      const std::int64_t key_end =
          std::max(key_begin, problem.visible_key_end(s, first + t + tokens - 1));
      for (std::int64_t h = 0; h < problem.kv_heads; ++h) {
        items.push_back({s, h, t, tokens, key_begin, key_end, 1, 0});
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
  return items;
}

// A packed [rows, H, D] tensor (query, out) addressed by element strides.
template <typename Storage>
struct TokenRows {
  Storage* data;
  std::int64_t token_stride, head_stride, dim_stride;
  explicit TokenRows(const TensorView& view)
      : data(static_cast<Storage*>(view.data())),
        token_stride(view.stride(0)),
        head_stride(view.stride(1)),
        dim_stride(view.stride(2)) {}
  Storage* row(std::int64_t token, std::int64_t head) const {
    return data + token * token_stride + head * head_stride;
  }
};

// The running online-softmax state of an item's rows, or a piece's partial state.
struct RowStates {
  std::int64_t rows = 0, head_dim = 0;
  std::vector<float> max, sum, acc;  // acc [rows][head_dim]
  std::vector<char> saw_key;         // a visible key reached the row (even if its score is -inf)

  RowStates(std::int64_t rows_capacity, std::int64_t dim)
      : head_dim(dim),
        max(rows_capacity),
        sum(rows_capacity),
        acc(rows_capacity * dim),
        saw_key(rows_capacity) {}
  void reset(std::int64_t row_count) {
    rows = row_count;
    std::fill_n(max.begin(), rows, kNegativeInfinity);
    std::fill_n(sum.begin(), rows, 0.0f);
    std::fill_n(acc.begin(), rows * head_dim, 0.0f);
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
  PagedKernel(const PagedProblem& problem, std::int64_t folded_rows)
      : p_(problem),
        group_(problem.q_heads / problem.kv_heads),
        head_dim_(problem.head_dim),
        score_scale_(problem.scale * problem.k_scale),
        query_(problem.query),
        out_(problem.out),
        q_rows_(folded_rows * problem.head_dim),
        keys_(kKeyChunk * problem.head_dim),
        values_(kKeyChunk * problem.head_dim),
        scores_(kKeyChunk),
        state_(folded_rows, problem.head_dim),
        merged_(folded_rows, problem.head_dim) {}

  // Computes piece `piece` of `item` into state().
  void run_piece(const WorkItem& item, std::int64_t piece) {
    const std::int64_t rows = item.tokens * group_;
    load_queries(item);
    state_.reset(rows);
    const auto [first_key, end_key] = piece_keys(item, piece);
    const std::int64_t first_position = p_.first_query_position(item.seq) + item.token_begin;
    for (std::int64_t chunk = first_key; chunk < end_key; chunk += kKeyChunk) {
      const std::int64_t chunk_end = std::min(chunk + kKeyChunk, end_key);
      gather_chunk(item, chunk, chunk_end);
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t position = first_position + r / group_;
        const std::int64_t head = item.kv_head * group_ + r % group_;
        const std::int64_t begin = std::max(chunk, p_.first_visible_key(position));
        const std::int64_t end = std::min(chunk_end, p_.visible_key_end(item.seq, position));
        if (begin >= end) continue;
        state_.saw_key[r] = 1;
        score_and_merge(r, head, position, chunk, begin, end);
      }
    }
  }

  RowStates& state() { return state_; }
  RowStates& merged() { return merged_; }

  // Writes the rows of `states` (the item's whole keys) to out: sinks join the denominator, then
  // 1 / sum and v_scale.
  void finish_rows(const WorkItem& item, RowStates& states) {
    const std::int64_t rows = item.tokens * group_;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t head = item.kv_head * group_ + r % group_;
      float* acc = &states.acc[r * head_dim_];
      const float row_max = states.max[r];
      float row_sum = states.sum[r];
      bool counted = states.saw_key[r] != 0;
      if (!p_.sinks.empty()) {
        // The sink is one more logit, with a zero value vector. A sink of -inf adds nothing.
        const float sink = p_.sinks[head];
        const float new_max = nan_propagating_max(row_max, sink);
        if (new_max != kNegativeInfinity) {
          const float correction = Sleef_expf_u10(row_max - new_max);  // 0 for a keyless row
          row_sum = row_sum * correction + Sleef_expf_u10(sink - new_max);
          for (std::int64_t d = 0; d < head_dim_; ++d) acc[d] *= correction;
          counted = true;
        }
      }
      const float factor = inverse_row_sum(counted, row_sum) * p_.v_scale;
      QueryStorage* dst = out_.row(p_.query_starts[item.seq] + item.token_begin + r / group_, head);
      for (std::int64_t d = 0; d < head_dim_; ++d) {
        dst[d * out_.dim_stride] = QueryTraits::from_float(acc[d] * factor);
      }
    }
  }

 private:
  void load_queries(const WorkItem& item) {
    const std::int64_t rows = item.tokens * group_;
    for (std::int64_t r = 0; r < rows; ++r) {
      const QueryStorage* src =
          query_.row(p_.query_starts[item.seq] + item.token_begin + r / group_,
                     item.kv_head * group_ + r % group_);
      float* dst = &q_rows_[r * head_dim_];
      for (std::int64_t d = 0; d < head_dim_; ++d) {
        dst[d] = QueryTraits::to_float(src[d * query_.dim_stride]);
      }
    }
  }

  // K and V of key positions [chunk, chunk_end) of the item's kv head, widened to fp32 rows.
  void gather_chunk(const WorkItem& item, std::int64_t chunk, std::int64_t chunk_end) {
    const TensorView& kc = p_.key_cache;
    const TensorView& vc = p_.value_cache;
    const auto* k_base = static_cast<const CacheStorage*>(kc.data());
    const auto* v_base = static_cast<const CacheStorage*>(vc.data());
    for (std::int64_t key = chunk; key < chunk_end; ++key) {
      const std::int64_t block = p_.physical_block(item.seq, key / p_.block_size);
      const std::int64_t offset = key % p_.block_size;
      const CacheStorage* k_row =
          k_base + block * kc.stride(0) + item.kv_head * kc.stride(1) + offset * kc.stride(2);
      const CacheStorage* v_row =
          v_base + block * vc.stride(0) + item.kv_head * vc.stride(1) + offset * vc.stride(2);
      float* k_dst = &keys_[(key - chunk) * head_dim_];
      float* v_dst = &values_[(key - chunk) * head_dim_];
      widen_row(k_row, kc.stride(3), k_dst);
      widen_row(v_row, vc.stride(3), v_dst);
    }
  }

  void widen_row(const CacheStorage* src, std::int64_t stride, float* dst) const {
    if (stride == 1) {
      for (std::int64_t d = 0; d < head_dim_; ++d) dst[d] = CacheTraits::to_float(src[d]);
    } else {
      for (std::int64_t d = 0; d < head_dim_; ++d) dst[d] = CacheTraits::to_float(src[d * stride]);
    }
  }

  // Scores of row r against keys [begin, end) of the gathered chunk starting at `chunk`, folded
  // into the row's state.
  void score_and_merge(std::int64_t r, std::int64_t head, std::int64_t position, std::int64_t chunk,
                       std::int64_t begin, std::int64_t end) {
    const std::int64_t count = end - begin;
    float* s = scores_.data();
    const float* q = &q_rows_[r * head_dim_];
    for (std::int64_t j = 0; j < count; ++j) {
      const float* k = &keys_[(begin - chunk + j) * head_dim_];
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (std::int64_t d = 0; d < head_dim_; ++d) dot += q[d] * k[d];
      s[j] = dot * score_scale_;
    }
    if (p_.softcap > 0.0f) softcap_in_place(s, count, p_.softcap);
    if (!p_.alibi_slopes.empty()) {
      const float slope = p_.alibi_slopes[head];
      for (std::int64_t j = 0; j < count; ++j) {
        s[j] += slope * static_cast<float>(begin + j - position);
      }
    }
    float chunk_max = kNegativeInfinity;
    for (std::int64_t j = 0; j < count; ++j) chunk_max = nan_propagating_max(chunk_max, s[j]);
    // Every score -inf: nothing contributes, and exp(-inf - -inf) would be NaN.
    if (chunk_max == kNegativeInfinity) return;
    merge_block_into_row(s, count, chunk_max, &values_[(begin - chunk) * head_dim_], head_dim_,
                         state_.max[r], state_.sum[r], &state_.acc[r * head_dim_]);
  }

  const PagedProblem& p_;
  const std::int64_t group_, head_dim_;
  const float score_scale_;
  const TokenRows<const QueryStorage> query_;
  const TokenRows<QueryStorage> out_;
  std::vector<float> q_rows_, keys_, values_, scores_;
  RowStates state_, merged_;
};

// Partial states of split items: per piece slot, rows × (max, sum, saw_key, acc[head_dim]).
struct PartialStates {
  std::int64_t rows_per_slot, head_dim;
  std::vector<float> values;
  std::int64_t slot_floats() const { return rows_per_slot * (3 + head_dim); }
  float* slot(std::int64_t index) { return &values[index * slot_floats()]; }
};

template <DType query_dtype, DType cache_dtype>
void run_paged_kernel(const PagedProblem& problem, const std::vector<bool>& sequences) {
  const std::int64_t group = problem.q_heads / problem.kv_heads;
  const std::int64_t folded_rows = std::max(kMaxFoldedRows / group * group, group);
  const std::vector<WorkItem> items = make_work_items(problem, sequences, folded_rows);
  const auto item_count = static_cast<std::int64_t>(items.size());

  // Pieces: (item, piece) pairs, unsplit items as one piece each.
  std::vector<std::pair<std::int64_t, std::int64_t>> pieces;
  std::int64_t partial_slots = 0;
  for (std::int64_t i = 0; i < item_count; ++i) {
    for (std::int64_t p = 0; p < items[i].pieces; ++p) pieces.emplace_back(i, p);
    if (items[i].pieces > 1) partial_slots += items[i].pieces;
  }
  PartialStates partial{folded_rows, problem.head_dim, {}};
  partial.values.resize(partial_slots * partial.slot_floats());
  const auto piece_count = static_cast<std::int64_t>(pieces.size());

#pragma omp parallel num_threads(num_threads())
  {
    PagedKernel<query_dtype, cache_dtype> kernel(problem, folded_rows);
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
        float* row = slot + r * (3 + problem.head_dim);
        row[0] = state.max[r];
        row[1] = state.sum[r];
        row[2] = state.saw_key[r] ? 1.0f : 0.0f;
        std::copy_n(&state.acc[r * problem.head_dim], problem.head_dim, row + 3);
      }
    }

    // Split items: merge the pieces in piece order.
#pragma omp for schedule(dynamic)
    for (std::int64_t i = 0; i < item_count; ++i) {
      const WorkItem& item = items[i];
      if (item.pieces == 1) continue;
      RowStates& merged = kernel.merged();
      merged.reset(item.tokens * group);
      for (std::int64_t piece = 0; piece < item.pieces; ++piece) {
        const float* slot = partial.slot(item.partial_offset + piece);
        for (std::int64_t r = 0; r < merged.rows; ++r) {
          const float* row = slot + r * (3 + problem.head_dim);
          merged.saw_key[r] |= row[2] != 0.0f ? 1 : 0;
          merge_partial_into_row(row[0], row[1], row + 3, problem.head_dim, merged.max[r],
                                 merged.sum[r], &merged.acc[r * problem.head_dim]);
        }
      }
      kernel.finish_rows(item, merged);
    }
  }
}

template <DType query_dtype>
void dispatch_cache_dtype(const PagedProblem& problem, const std::vector<bool>& sequences) {
  switch (problem.cache_dtype) {
    case DType::f8e4m3fn:
      return run_paged_kernel<query_dtype, DType::f8e4m3fn>(problem, sequences);
    case DType::f8e5m2:
      return run_paged_kernel<query_dtype, DType::f8e5m2>(problem, sequences);
    default:
      TILELAB_CHECK(problem.cache_dtype == query_dtype)
          << "paged kernel: cache dtype " << dtype_name(problem.cache_dtype)
          << " passed validation";
      return run_paged_kernel<query_dtype, query_dtype>(problem, sequences);
  }
}

}  // namespace

void paged_kernel_attention(const PagedProblem& problem, const std::vector<bool>& sequences) {
  switch (problem.dtype) {
    case DType::f32:
      return dispatch_cache_dtype<DType::f32>(problem, sequences);
    case DType::f16:
      return dispatch_cache_dtype<DType::f16>(problem, sequences);
    case DType::bf16:
      return dispatch_cache_dtype<DType::bf16>(problem, sequences);
    case DType::i32:
    case DType::f8e4m3fn:
    case DType::f8e5m2:
      break;
  }
  TILELAB_CHECK(false) << "paged kernel: query dtype " << dtype_name(problem.dtype)
                       << " passed validation";
}

}  // namespace tilelab::detail
