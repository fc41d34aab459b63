// The generated block-sparse attention kernels behind detail::generated_blocksparse_attention.
// Here the runtime splits the query rows into tasks (schedules/flash/blocksparse_tasks.hpp: rows of
// one sequence inside one layout row block, for one group of folded query heads, with the task's
// key blocks), batches them by variant (decode: few rows; prefill) and by live key tiles, runs
// each batch as one kernel call, and scatters each task's rows to out.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "blocksparse_bf16_decode.h"
#include "blocksparse_bf16_prefill.h"
#include "blocksparse_bf16_prefill_fp32_probabilities.h"
#include "blocksparse_bf16_prefill_fp32_probabilities_tall.h"
#include "blocksparse_f16_decode.h"
#include "blocksparse_f16_prefill.h"
#include "blocksparse_f16_prefill_tall.h"
#include "blocksparse_f32_decode.h"
#include "blocksparse_f32_prefill.h"
#include "blocksparse_f32_prefill_tall.h"
#include "blocksparse_problem.hpp"
#include "cpu_features.hpp"
#include "halide_glue.hpp"
#include "schedules/flash/blocksparse_tasks.hpp"
#include "scratch_memory.hpp"
#include "tilelab/error.hpp"
#include "tilelab/threading.hpp"

namespace tilelab::detail {
namespace {

using KernelFn = int (*)(halide_buffer_t*, halide_buffer_t*, halide_buffer_t*, halide_buffer_t*,
                         halide_buffer_t*, int32_t, int32_t, int32_t, bool, float,
                         halide_buffer_t*);

using schedules::flash::BlockSparseTaskField;
using schedules::flash::FlashAttentionTiling;
using schedules::flash::kBlockSparseDecodeTiling;
using schedules::flash::kBlockSparsePrefillTallTiling;
using schedules::flash::kBlockSparsePrefillTiling;
using schedules::flash::kBlockSparseTaskFields;
using schedules::flash::kDecodeMaxRows;

using Kernel = NamedKernel<KernelFn>;

// The kernel of a task kind. Prefill on fp32 FMAs comes with 64-row tasks too (tall), which a
// task's rows amortize: fp16 and bf16 widen K and V to fp32 per (task, key tile), and every task
// reads its key tiles from wherever the layout's blocks lie (fp32 too, unlike the dense forward,
// whose tall tiles gave fp32 nothing). Not bf16 on bf16 dot products, which this was not measured
// on: `tall` then picks the 32-row kernel.
Kernel pick_kernel(DType dtype, bool decode, bool fp32_probabilities, bool tall) {
  switch (dtype) {
    case DType::f32:
      if (decode) return TILELAB_NAMED(blocksparse_f32_decode);
      if (tall) return TILELAB_NAMED(blocksparse_f32_prefill_tall);
      return TILELAB_NAMED(blocksparse_f32_prefill);
    case DType::f16:
      if (decode) return TILELAB_NAMED(blocksparse_f16_decode);
      if (tall) return TILELAB_NAMED(blocksparse_f16_prefill_tall);
      return TILELAB_NAMED(blocksparse_f16_prefill);
    case DType::bf16:
      if (decode) return TILELAB_NAMED(blocksparse_bf16_decode);
      if (rounds_bf16_probabilities(dtype, dtype, fp32_probabilities)) {
        return TILELAB_NAMED(blocksparse_bf16_prefill);
      }
      if (tall) return TILELAB_NAMED(blocksparse_bf16_prefill_fp32_probabilities_tall);
      return TILELAB_NAMED(blocksparse_bf16_prefill_fp32_probabilities);
    case DType::i32:
    case DType::f8e4m3fn:
    case DType::f8e5m2:
      break;
  }
  return {};
}

// Whether the prefill kernel comes with 64-row tasks too.
bool prefill_has_tall_tasks(DType dtype, bool fp32_probabilities) {
  return pick_kernel(dtype, false, fp32_probabilities, true).run !=
         pick_kernel(dtype, false, fp32_probabilities, false).run;
}

// Whether the query heads of every GQA group use the same blocks (the same layout head, or layout
// heads with equal CSR rows), so that a task can serve the whole group.
bool groups_share_blocks(const BlockSparseProblem& p) {
  const BlockSparseLayout& layout = *p.layout;
  const std::int64_t group = p.q_heads / p.kv_heads, rows = layout.num_row_blocks();
  for (std::int64_t h = 0; h < p.q_heads; ++h) {
    const std::int64_t head = p.layout_head(h), first = p.layout_head(h - h % group);
    if (head == first) continue;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::span<const std::int32_t> a = layout.columns(head, r), b = layout.columns(first, r);
      if (!std::equal(a.begin(), a.end(), b.begin(), b.end())) return false;
    }
  }
  return true;
}

// How one variant runs: its tiling and the query heads folded into a task's rows.
struct VariantPlan {
  FlashAttentionTiling tiling;
  std::int64_t folded_heads = 1;
  std::int64_t rows_per_task() const { return tiling.query_tile / folded_heads; }
  bool tall() const { return tiling.query_tile == kBlockSparsePrefillTallTiling.query_tile; }
};

// A variant on `tiling` folds a GQA group of `group` heads into a task's rows when the heads share
// their blocks and the group fits the tile, so that one pass over a K/V tile serves the group.
// (Over the union of heads' different blocks, prefill would compute blocks some rows do not need,
// and a row's masked keys would still meet its p·v as 0 · v, NaN where v is not finite.)
VariantPlan plan_variant(FlashAttentionTiling tiling, std::int64_t group, bool shared) {
  VariantPlan plan{tiling, 1};
  if (shared && group <= plan.tiling.query_tile) plan.folded_heads = group;
  return plan;
}

// Calls visit(is_decode, plan, seq, position, end) for each run of query rows [position, end) of
// sequence seq that makes one task per group of folded heads: rows of one layout row block, at
// most plan.rows_per_task() of them.
template <typename Visit>
void for_each_task_rows(const BlockSparseProblem& p, const VariantPlan& prefill,
                        const VariantPlan& decode, Visit&& visit) {
  const std::int64_t block_size = p.layout->block_size();
  for (std::int64_t seq = 0; seq < p.num_seqs; ++seq) {
    const bool is_decode = p.q_len(seq) * decode.folded_heads <= kDecodeMaxRows;
    const VariantPlan& plan = is_decode ? decode : prefill;
    const std::int64_t k_len = p.k_len(seq);
    for (std::int64_t position = k_len - p.q_len(seq); position < k_len;) {
      const std::int64_t end = std::min(
          {k_len, (position / block_size + 1) * block_size, position + plan.rows_per_task()});
      visit(is_decode, plan, seq, position, end);
      position = end;
    }
  }
}

// Prefill folds GQA groups as plan_variant says. Kernels with tall tasks run 64-row tasks instead
// of 32-row ones when the dense kernels' model says so (schedules/flash/tiling.hpp,
// widening_tiles_cost): rows split at layout row blocks, so blocks of fewer than 64 rows leave tall
// tasks mostly padding.
VariantPlan plan_prefill(const BlockSparseProblem& p, bool shared, const VariantPlan& decode) {
  const std::int64_t group = p.q_heads / p.kv_heads;
  const VariantPlan regular = plan_variant(kBlockSparsePrefillTiling, group, shared);
  if (!prefill_has_tall_tasks(p.dtype, p.fp32_probabilities)) return regular;
  const VariantPlan tall = plan_variant(kBlockSparsePrefillTallTiling, group, shared);
  const auto cost = [&](const VariantPlan& plan) {
    std::int64_t tasks = 0;
    for_each_task_rows(p, plan, decode, [&](bool is_decode, const VariantPlan& run, auto...) {
      if (!is_decode) tasks += p.q_heads / run.folded_heads;
    });
    return schedules::flash::widening_tiles_cost(tasks, plan.tiling.query_tile, num_threads());
  };
  return cost(tall) < cost(regular) ? tall : regular;
}

// The key tiles (of `tile` keys) of the kernel's block loop for rows whose last visible key is
// `key_limit`: the tiles of every listed block up to the first tile past key_limit (columns are
// sorted, so that is a prefix of the list).
std::int32_t live_key_tiles(std::span<const std::int32_t> columns, std::int64_t block_size,
                            std::int64_t tile, std::int64_t key_limit) {
  const std::int64_t tiles_per_block = (block_size + tile - 1) / tile;
  std::int64_t live = 0;
  for (const std::int32_t column : columns) {
    const std::int64_t first_key = column * block_size;
    if (first_key > key_limit) break;
    live += std::min(tiles_per_block, (key_limit - first_key) / tile + 1);
  }
  return static_cast<std::int32_t>(live);
}

using Task = std::array<std::int32_t, kBlockSparseTaskFields>;

// The tasks one kernel call runs: one variant, one number of live key tiles.
struct TaskBatch {
  bool decode = false;
  std::int32_t live_tiles = 0;
  std::vector<std::int32_t> tasks;    // [num_tasks, kBlockSparseTaskFields]
  std::vector<std::int32_t> columns;  // the tasks' key blocks, each task's run sorted
  std::int64_t size() const {
    return static_cast<std::int64_t>(tasks.size()) / kBlockSparseTaskFields;
  }
};

// Splits each sequence's query rows at layout row-block boundaries and into tasks of
// rows_per_task() rows of the sequence's variant, for each group of folded query heads; batches
// them by (variant, live key tiles).
std::vector<TaskBatch> build_task_batches(const BlockSparseProblem& p, const VariantPlan& prefill,
                                          const VariantPlan& decode) {
  const BlockSparseLayout& layout = *p.layout;
  const std::int64_t block_size = layout.block_size();
  std::map<std::pair<bool, std::int32_t>, TaskBatch> batches;
  for_each_task_rows(
      p, prefill, decode,
      [&](bool is_decode, const VariantPlan& plan, std::int64_t seq, std::int64_t position,
          std::int64_t end) {
        const std::int64_t k_len = p.k_len(seq), first_position = k_len - p.q_len(seq);
        const std::int64_t row_block = position / block_size;
        const std::int64_t key_limit = layout.causal() ? end - 1 : k_len - 1;
        for (std::int64_t group = 0; group < p.q_heads / plan.folded_heads; ++group) {
          Task task{};
          auto set = [&](BlockSparseTaskField field, std::int64_t value) {
            task[static_cast<std::size_t>(field)] = static_cast<std::int32_t>(value);
          };
          set(BlockSparseTaskField::query_token, p.q_starts[seq] + (position - first_position));
          set(BlockSparseTaskField::rows, end - position);
          set(BlockSparseTaskField::query_position, position);
          set(BlockSparseTaskField::key_token, p.k_starts[seq]);
          set(BlockSparseTaskField::key_count, k_len);
          set(BlockSparseTaskField::head_group, group);
          // Folded heads share their blocks (groups_share_blocks).
          const std::span<const std::int32_t> columns =
              layout.columns(p.layout_head(group * plan.folded_heads), row_block);
          const std::int32_t live =
              live_key_tiles(columns, block_size, plan.tiling.key_block, key_limit);
          TaskBatch& batch = batches[{is_decode, live}];
          batch.decode = is_decode;
          batch.live_tiles = live;
          set(BlockSparseTaskField::column_begin, static_cast<std::int64_t>(batch.columns.size()));
          batch.tasks.insert(batch.tasks.end(), task.begin(), task.end());
          batch.columns.insert(batch.columns.end(), columns.begin(), columns.end());
        }
      });
  std::vector<TaskBatch> list;
  for (auto& [key, batch] : batches) list.push_back(std::move(batch));
  return list;
}

// Copies each task's rows from the kernel's task-indexed output [tasks, query_tile, D] to out.
// On one thread: in parallel, a process's first few fp32 calls after bf16 ones ran up to 1.4x
// slower (S 2048, Emerald Rapids; not explained), for a 3% gain once settled.
void scatter_rows(const BlockSparseProblem& p, const TaskBatch& batch, const VariantPlan& plan,
                  const std::byte* task_out) {
  const auto element = static_cast<std::int64_t>(dtype_size(p.dtype));
  const std::int64_t row_bytes = p.head_dim * element;
  const std::int64_t tile_rows = plan.tiling.query_tile;
  auto* out = static_cast<std::byte*>(p.out.data());
  for (std::int64_t t = 0; t < batch.size(); ++t) {
    const std::int32_t* task = &batch.tasks[static_cast<std::size_t>(t * kBlockSparseTaskFields)];
    auto get = [&](BlockSparseTaskField field) { return task[static_cast<std::size_t>(field)]; };
    const std::int64_t rows = get(BlockSparseTaskField::rows);
    for (std::int64_t row = 0; row < rows * plan.folded_heads; ++row) {
      const std::int64_t token = get(BlockSparseTaskField::query_token) + row % rows;
      const std::int64_t head =
          get(BlockSparseTaskField::head_group) * plan.folded_heads + row / rows;
      std::memcpy(out + (token * p.out.stride(0) + head * p.out.stride(1)) * element,
                  task_out + (t * tile_rows + row) * row_bytes,
                  static_cast<std::size_t>(row_bytes));
    }
  }
}

// A copy of `kv` [total_k, Hkv, D] with each kv head's tokens contiguous ([Hkv, total_k, D] in
// memory, viewed with the original dims): the kernel reads a key tile as consecutive rows, which
// the packed layout spreads Hkv·D elements apart. One pass over K or V, in parallel; worth it when
// queries reuse each key (prefill), not for decode-only batches. `storage` holds
// kv.numel() elements.
TensorView head_major_copy(const TensorView& kv, std::byte* storage) {
  const std::int64_t tokens = kv.dim(0), heads = kv.dim(1), dims = kv.dim(2);
  const auto element = static_cast<std::int64_t>(dtype_size(kv.dtype()));
  const auto* source = static_cast<const std::byte*>(kv.data());
#pragma omp parallel for collapse(2) schedule(static) num_threads(num_threads())
  for (std::int64_t h = 0; h < heads; ++h) {
    for (std::int64_t t = 0; t < tokens; ++t) {
      std::memcpy(storage + ((h * tokens + t) * dims) * element,
                  source + (t * kv.stride(0) + h * kv.stride(1)) * element,
                  static_cast<std::size_t>(dims * element));
    }
  }
  return TensorView(storage, kv.dtype(), {tokens, heads, dims}, {dims, tokens * dims, 1});
}

// The kernel calls of one problem: the variants' plans and the task batches, one call each.
struct KernelCalls {
  VariantPlan prefill, decode;
  std::vector<TaskBatch> batches;

  const VariantPlan& plan_of(const TaskBatch& batch) const {
    return batch.decode ? decode : prefill;
  }
  Kernel kernel_of(const BlockSparseProblem& p, const TaskBatch& batch) const {
    return pick_kernel(p.dtype, batch.decode, p.fp32_probabilities, plan_of(batch).tall());
  }
};

// The calls that compute the problem, or nothing when it is outside what the generated kernels
// cover (checked before anything is written).
std::optional<KernelCalls> plan_kernel_calls(const BlockSparseProblem& p) {
  // The kernels read the head dim densely and address elements with int32 offsets.
  for (const TensorView* view : {&p.q, &p.k, &p.v, &p.out}) {
    if (view->stride(2) != 1 || !offsets_fit_int32(*view)) return std::nullopt;
  }
  const BlockSparseLayout& layout = *p.layout;
  if (p.head_dim > 256 || !pick_kernel(p.dtype, false, false, false).run ||
      !fits_int32(layout.num_row_blocks() * layout.block_size())) {
    return std::nullopt;
  }
  KernelCalls calls;
  const bool shared = groups_share_blocks(p);
  calls.decode = plan_variant(kBlockSparseDecodeTiling, p.q_heads / p.kv_heads, shared);
  calls.prefill = plan_prefill(p, shared, calls.decode);
  calls.batches = build_task_batches(p, calls.prefill, calls.decode);
  // The kernels index each batch's column list with int32.
  for (const TaskBatch& batch : calls.batches) {
    if (!fits_int32(static_cast<std::int64_t>(batch.columns.size()))) return std::nullopt;
  }
  return calls;
}

}  // namespace

std::optional<std::vector<std::string>> generated_blocksparse_kernels(const BlockSparseProblem& p) {
  const std::optional<KernelCalls> calls = plan_kernel_calls(p);
  if (!calls) return std::nullopt;
  std::vector<std::string> names;
  for (const TaskBatch& batch : calls->batches) names.emplace_back(calls->kernel_of(p, batch).name);
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

bool generated_blocksparse_attention(const BlockSparseProblem& p) {
  const std::optional<KernelCalls> calls = plan_kernel_calls(p);
  if (!calls) return false;
  if (calls->batches.empty()) return true;
  install_halide_hooks();
  const BlockSparseLayout& layout = *p.layout;

  // Prefill reuses every key for many query rows: read K and V from head-major copies. The
  // copies and the kernels' outputs are scratch, uninitialized and kept for the next call (fresh
  // zeroed vectors cost 5-14% of a call at S 2048 and 8192 on Emerald Rapids, mostly in page
  // faults).
  std::optional<ScratchBuffer> k_storage, v_storage;
  TensorView k_view = p.k, v_view = p.v;
  auto head_major = [&](const TensorView& kv, std::optional<ScratchBuffer>& storage) {
    if (p.kv_heads == 1 || kv.stride(0) == p.head_dim) return kv;  // tokens already contiguous
    storage.emplace(static_cast<std::size_t>(kv.numel()) * dtype_size(kv.dtype()));
    return head_major_copy(kv, static_cast<std::byte*>(storage->data()));
  };
  if (p.max_q_len > kDecodeMaxRows) {
    k_view = head_major(p.k, k_storage);
    v_view = head_major(p.v, v_storage);
  }

  for (const TaskBatch& batch : calls->batches) {
    const VariantPlan& plan = calls->plan_of(batch);
    const std::int64_t tile_rows = plan.tiling.query_tile;
    const ScratchBuffer task_out(static_cast<std::size_t>(batch.size() * tile_rows * p.head_dim) *
                                 dtype_size(p.dtype));
    TensorView tasks(const_cast<std::int32_t*>(batch.tasks.data()), DType::i32,
                     {batch.size(), kBlockSparseTaskFields});
    TensorView task_out_view(task_out.data(), p.dtype, {batch.size(), tile_rows, p.head_dim});
    // Tasks that keep no block leave the list empty: the kernel still needs one (unread) entry.
    std::vector<std::int32_t> columns = batch.columns;
    if (columns.empty()) columns.assign(1, 0);
    TensorView columns_view(columns.data(), DType::i32,
                            {static_cast<std::int64_t>(columns.size())});
    HalideView q(p.q), k(k_view), v(v_view), tasks_h(tasks), columns_h(columns_view),
        out(task_out_view);
    halide_error_message_of_thread().clear();
    const int status = calls->kernel_of(p, batch).run(
        q.get(), k.get(), v.get(), tasks_h.get(), columns_h.get(),
        static_cast<int32_t>(layout.block_size()), batch.live_tiles,
        static_cast<int32_t>(plan.folded_heads), layout.causal(), p.scale, out.get());
    TILELAB_CHECK(status == 0) << "generated block-sparse attention kernel failed (status "
                               << status << "): " << halide_error_message_of_thread();
    scatter_rows(p, batch, plan, static_cast<const std::byte*>(task_out.data()));
  }
  return true;
}

}  // namespace tilelab::detail
