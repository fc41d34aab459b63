// The reference block-sparse attention: OpenMP over (sequence, query head, chunk of a query
// block's rows), online softmax over the key blocks the layout keeps for that query block (absent
// blocks are never read), SLEEF exp, fp32 accumulation, any strides and any supported dtype.
#include <sleef.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "blocksparse_problem.hpp"
#include "dtype_convert.hpp"
#include "reference_softmax.hpp"
#include "tilelab/error.hpp"
#include "tilelab/threading.hpp"

namespace tilelab::detail {

namespace {

// Query rows per task and keys per online-softmax step: bounded scratch whatever the block size
// (64 keys × D ≤ 256 fp32 = 64 KiB each for K and V, which stay in L2 while the rows use them).
constexpr std::int64_t kRowChunk = 64;
constexpr std::int64_t kKeyChunk = 64;

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

// A packed [total, H, D] tensor addressed by element strides.
template <typename Storage>
struct Strided3 {
  Storage* data;
  std::int64_t stride[3];

  explicit Strided3(const TensorView& view) : data(static_cast<Storage*>(view.data())) {
    for (int i = 0; i < 3; ++i) stride[i] = view.stride(i);
  }
  Storage* row(std::int64_t token, std::int64_t head) const {
    return data + token * stride[0] + head * stride[1];
  }
};

// Rows [row_begin, row_begin + rows) (positions in the sequence) of one query block of one
// sequence and query head.
struct Task {
  std::int64_t seq, head, row_block, row_begin, rows;
};

std::vector<Task> make_tasks(const BlockSparseProblem& problem) {
  const std::int64_t block_size = problem.layout->block_size();
  std::vector<Task> tasks;
  for (std::int64_t s = 0; s < problem.num_seqs; ++s) {
    const std::int64_t k_len = problem.k_len(s), first = k_len - problem.q_len(s);
    for (std::int64_t h = 0; h < problem.q_heads; ++h) {
      for (std::int64_t row = first; row < k_len;) {
        const std::int64_t row_block = row / block_size;
        const std::int64_t end = std::min({row + kRowChunk, (row_block + 1) * block_size, k_len});
        tasks.push_back({s, h, row_block, row, end - row});
        row = end;
      }
    }
  }
  return tasks;
}

template <DType dtype>
void run_reference(const BlockSparseProblem& problem) {
  using Traits = ElementTraits<dtype>;
  using Storage = typename Traits::Storage;

  const BlockSparseLayout& layout = *problem.layout;
  const std::int64_t head_dim = problem.head_dim, block_size = layout.block_size();
  const std::int64_t heads_per_kv_head = problem.q_heads / problem.kv_heads;
  const bool causal = layout.causal();
  const float scale = problem.scale;
  const Strided3<const Storage> q(problem.q), k(problem.k), v(problem.v);
  const Strided3<Storage> out(problem.out);
  const std::vector<Task> tasks = make_tasks(problem);
  const std::int64_t task_count = static_cast<std::int64_t>(tasks.size());

#pragma omp parallel num_threads(num_threads())
  {
    // Per-thread fp32 scratch; keys transposed ([d][j]) so the score loop runs over contiguous j.
    std::vector<float> q_rows(kRowChunk * head_dim);
    std::vector<float> keys_transposed(head_dim * kKeyChunk);
    std::vector<float> values(kKeyChunk * head_dim);
    std::vector<float> scores(kKeyChunk);
    std::vector<float> acc(kRowChunk * head_dim);
    float row_max[kRowChunk];
    float row_sum[kRowChunk];
    bool row_sees_a_key[kRowChunk];

#pragma omp for schedule(dynamic)
    for (std::int64_t t = 0; t < task_count; ++t) {
      const Task& task = tasks[t];
      const std::int64_t k_len = problem.k_len(task.seq);
      // Query position i is token q_start + i - first of q.
      const std::int64_t q_token0 = problem.q_starts[task.seq] - (k_len - problem.q_len(task.seq));
      const std::int64_t k_token0 = problem.k_starts[task.seq];
      const std::int64_t kv_head = task.head / heads_per_kv_head;
      const std::int64_t rows = task.rows;

      for (std::int64_t r = 0; r < rows; ++r) {
        const Storage* src = q.row(q_token0 + task.row_begin + r, task.head);
        for (std::int64_t d = 0; d < head_dim; ++d) {
          q_rows[r * head_dim + d] = Traits::to_float(src[d * q.stride[2]]);
        }
        row_max[r] = kNegativeInfinity;
        row_sum[r] = 0.0f;
        row_sees_a_key[r] = false;
      }
      std::fill(acc.begin(), acc.end(), 0.0f);

      const std::int64_t last_row = task.row_begin + rows - 1;
      for (const std::int32_t column :
           layout.columns(problem.layout_head(task.head), task.row_block)) {
        // Keys of the block that exist in this sequence and, when causal, that the last row sees.
        const std::int64_t block_end =
            std::min((column + 1) * block_size, causal ? std::min(k_len, last_row + 1) : k_len);
        for (std::int64_t key_begin = column * block_size; key_begin < block_end;
             key_begin += kKeyChunk) {
          const std::int64_t keys = std::min(kKeyChunk, block_end - key_begin);
          for (std::int64_t j = 0; j < keys; ++j) {
            const Storage* k_row = k.row(k_token0 + key_begin + j, kv_head);
            const Storage* v_row = v.row(k_token0 + key_begin + j, kv_head);
            for (std::int64_t d = 0; d < head_dim; ++d) {
              keys_transposed[d * kKeyChunk + j] = Traits::to_float(k_row[d * k.stride[2]]);
              values[j * head_dim + d] = Traits::to_float(v_row[d * v.stride[2]]);
            }
          }

          for (std::int64_t r = 0; r < rows; ++r) {
            const std::int64_t i = task.row_begin + r;
            const std::int64_t visible = causal ? std::min(keys, i + 1 - key_begin) : keys;
            if (visible <= 0) continue;
            row_sees_a_key[r] = true;

            float* const s = scores.data();
            std::fill(s, s + visible, 0.0f);
            const float* q_row = &q_rows[r * head_dim];
            for (std::int64_t d = 0; d < head_dim; ++d) {
              const float q_d = q_row[d];
              const float* k_d = &keys_transposed[d * kKeyChunk];
              for (std::int64_t j = 0; j < visible; ++j) s[j] += q_d * k_d[j];
            }
            float chunk_max = kNegativeInfinity;
            for (std::int64_t j = 0; j < visible; ++j) {
              s[j] *= scale;
              chunk_max = nan_propagating_max(chunk_max, s[j]);
            }
            // Every score -inf (q·k overflowed): nothing contributes, and exp(-inf - -inf) would
            // be NaN.
            if (chunk_max == kNegativeInfinity) continue;

            merge_block_into_row(s, visible, chunk_max, values.data(), head_dim, row_max[r],
                                 row_sum[r], &acc[r * head_dim]);
          }
        }
      }

      for (std::int64_t r = 0; r < rows; ++r) {
        // As the dense reference: no visible key gives 0; visible keys whose scores are all -inf
        // give NaN (0 / 0); a NaN sum gives NaN.
        const float inverse_sum = inverse_row_sum(row_sees_a_key[r], row_sum[r]);
        Storage* dst = out.row(q_token0 + task.row_begin + r, task.head);
        const float* acc_row = &acc[r * head_dim];
        for (std::int64_t d = 0; d < head_dim; ++d) {
          dst[d * out.stride[2]] = Traits::from_float(acc_row[d] * inverse_sum);
        }
      }
    }
  }
}

}  // namespace

void reference_blocksparse_attention(const BlockSparseProblem& problem) {
  switch (problem.dtype) {
    case DType::f32:
      return run_reference<DType::f32>(problem);
    case DType::f16:
      return run_reference<DType::f16>(problem);
    case DType::bf16:
      return run_reference<DType::bf16>(problem);
    case DType::i32:
    case DType::f8e4m3fn:
    case DType::f8e5m2:
      break;
  }
  TILELAB_CHECK(false) << "reference_blocksparse_attention: dtype " << dtype_name(problem.dtype)
                       << " passed validation";
}

}  // namespace tilelab::detail
