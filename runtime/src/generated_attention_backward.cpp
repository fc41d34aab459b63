// The generated flash attention backward kernels behind detail::generated_flash_attention_backward:
// one per dtype, and one more with the score options; TensorViews become halide_buffer_t
// (halide_glue).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "attention_problem.hpp"
#include "cpu_features.hpp"
#include "finite_values.hpp"
#include "flash_bwd_bf16.h"
#include "flash_bwd_bf16_fp32_probabilities.h"
#include "flash_bwd_bf16_fp32_probabilities_options.h"
#include "flash_bwd_bf16_fp32_products.h"
#include "flash_bwd_bf16_fp32_products_options.h"
#include "flash_bwd_bf16_options.h"
#include "flash_bwd_f16.h"
#include "flash_bwd_f16_options.h"
#include "flash_bwd_f32.h"
#include "flash_bwd_f32_options.h"
#include "halide_glue.hpp"
#include "schedules/flash/backward_tiling.hpp"
#include "tilelab/error.hpp"

namespace tilelab::detail {
namespace {

using KernelFn = int (*)(halide_buffer_t*, halide_buffer_t*, halide_buffer_t*, halide_buffer_t*,
                         halide_buffer_t*, halide_buffer_t*, halide_buffer_t*, float, int32_t,
                         int32_t, halide_buffer_t*, halide_buffer_t*, halide_buffer_t*,
                         halide_buffer_t*);
// The score options variant: (..., chunk_blocks, softcap, alibi_slopes, position_offset,
// window_begin_offset, dq, dk, dv, ds).
using OptionsKernelFn = int (*)(halide_buffer_t*, halide_buffer_t*, halide_buffer_t*,
                                halide_buffer_t*, halide_buffer_t*, halide_buffer_t*,
                                halide_buffer_t*, float, int32_t, int32_t, float, halide_buffer_t*,
                                int32_t, int32_t, halide_buffer_t*, halide_buffer_t*,
                                halide_buffer_t*, halide_buffer_t*);

// The kernels of a dtype, plain and with the score options. bf16 on a CPU whose bf16 dot products
// outrun its FMAs: P and dS rounded to bf16 for the products that read them, or with
// fp32_probabilities kept in fp32 (q·k and dout·v still on bf16 dot products); elsewhere every
// product on fp32 FMAs (rounds_bf16_probabilities).
struct BackwardKernels {
  KernelFn plain;
  OptionsKernelFn with_options;
};
std::optional<BackwardKernels> kernels_of(DType dtype, bool fp32_probabilities) {
  switch (dtype) {
    case DType::f32:
      return BackwardKernels{flash_bwd_f32, flash_bwd_f32_options};
    case DType::f16:
      return BackwardKernels{flash_bwd_f16, flash_bwd_f16_options};
    case DType::bf16:
      if (!bf16_dot_products_pay_off(dtype)) {
        return BackwardKernels{flash_bwd_bf16_fp32_products, flash_bwd_bf16_fp32_products_options};
      }
      if (!rounds_bf16_probabilities(dtype, dtype, fp32_probabilities)) {
        return BackwardKernels{flash_bwd_bf16_fp32_probabilities,
                               flash_bwd_bf16_fp32_probabilities_options};
      }
      return BackwardKernels{flash_bwd_bf16, flash_bwd_bf16_options};
    case DType::i32:
    case DType::f8e4m3fn:
    case DType::f8e5m2:
      break;
  }
  return std::nullopt;
}

// Tasks the kernel's key chunks should give at least, over (chunk, kv head, batch): enough for 16
// threads, or 8 with some balance left for causal masks, whose chunks differ in work. A constant,
// not the thread count, so that the chunks, and dq's summation order, do not depend on it. Every
// chunk beyond a kv head's first costs a partial dq to clear, fill and add: at 32 tasks, B1 H16
// S512 D128 fp32 (two chunks per head) ran 3-4% slower, full and causal (Emerald Rapids, 2
// threads).
constexpr std::int64_t kBackwardTasks = 16;
// Each chunk beyond the first adds a partial dq of every row (fp32) to memory; cap that memory.
constexpr std::int64_t kBackwardPartialBytes = std::int64_t{256} << 20;

// Whether the kernels cover the call's shapes, strides, dtype and options.
bool kernels_cover(const AttentionBackwardProblem& p) {
  const AttentionProblem& f = p.forward;
  for (const TensorView* view : {&f.q, &f.k, &f.v, &f.out, &p.dout, &p.dq, &p.dk, &p.dv}) {
    if (view->stride(3) != 1 || !offsets_fit_int32(*view)) return false;
  }
  if (f.bias && (f.bias->stride(3) != 1 || !offsets_fit_int32(*f.bias))) return false;
  if (!offsets_fit_int32(*f.lse)) return false;
  if (f.head_dim > 256 || !fits_int32(f.causal_offset)) return false;
  if (!kernels_of(f.dtype, f.fp32_probabilities)) return false;
  if (!f.score.changes_scores()) return true;
  const KeyBounds bounds = key_bounds(f);
  return fits_int32(bounds.window_begin) && fits_int32(bounds.causal_offset) &&
         fits_int32(f.position_offset);
}

}  // namespace

std::int64_t flash_backward_chunk_blocks(const AttentionProblem& f) {
  const std::int64_t key_block = schedules::flash::kBackwardTiling.key_block;
  const std::int64_t key_blocks = (f.kv_len + key_block - 1) / key_block;
  const std::int64_t heads = f.batch * f.kv_heads;
  const std::int64_t partial_bytes = heads * f.rows_per_kv_head() * f.head_dim * 4;
  std::int64_t chunks = (kBackwardTasks + heads - 1) / heads;
  chunks = std::min(chunks, kBackwardPartialBytes / std::max<std::int64_t>(partial_bytes, 1));
  chunks = std::clamp<std::int64_t>(chunks, 1, key_blocks);
  return (key_blocks + chunks - 1) / chunks;
}

bool generated_flash_attention_backward_runs(const AttentionBackwardProblem& p) {
  if (!kernels_cover(p)) return false;
  const AttentionProblem& f = p.forward;
  // The kernels multiply a masked pair's rows by P = 0 and dS = 0 inside a partly visible block;
  // with score options, NaN or inf there must reach no gradient (docs/attention_options.md).
  if (!f.score.any()) return true;
  for (const TensorView* view : {&f.q, &f.k, &f.v, &p.dout}) {
    if (!every_value_finite(*view)) return false;
  }
  return true;
}

bool generated_flash_attention_backward(const AttentionBackwardProblem& p, const TensorView* ds) {
  if (!generated_flash_attention_backward_runs(p)) return false;
  const AttentionProblem& f = p.forward;
  // The kernel writes dS as (key, row, kv head, batch), row = (h mod group) · M + i: a dense
  // [B, Hq, M, N] view is exactly that layout.
  if (ds && (!ds->is_contiguous() || !offsets_fit_int32(*ds))) return false;
  install_halide_hooks();

  HalideView dout(p.dout), q(f.q), k(f.k), v(f.v), out(f.out), lse(*f.lse);
  HalideView dq(p.dq), dk(p.dk), dv(p.dv);
  // Without a bias the kernel reads a single 0 through stride-0 dims.
  float zero_bias = 0.0f;
  const TensorView no_bias(&zero_bias, DType::f32, {1, 1, 1, 1});
  const std::int64_t bias_extents[4] = {f.batch, f.q_heads, f.q_len, f.kv_len};
  HalideView bias(f.bias ? *f.bias : no_bias, bias_extents);
  // Without a dS request, a 1-element output: the kernel computes only what is asked for.
  float unused_ds = 0.0f;
  const TensorView no_ds(&unused_ds, DType::f32, {1, 1, 1, 1});
  HalideView ds_buffer(no_ds);
  if (ds) {
    const std::int64_t rows = f.rows_per_kv_head();
    halide_dimension_t* dims = ds_buffer.dims.data();
    dims[0] = {0, static_cast<int32_t>(f.kv_len), 1, 0};
    dims[1] = {0, static_cast<int32_t>(rows), static_cast<int32_t>(f.kv_len), 0};
    dims[2] = {0, static_cast<int32_t>(f.kv_heads), static_cast<int32_t>(rows * f.kv_len), 0};
    dims[3] = {0, static_cast<int32_t>(f.batch),
               static_cast<int32_t>(f.q_heads * f.q_len * f.kv_len), 0};
    ds_buffer.buffer.host = static_cast<uint8_t*>(ds->data());
  }

  halide_error_message_of_thread().clear();
  int status = 0;
  const auto chunk_blocks = static_cast<int32_t>(flash_backward_chunk_blocks(f));
  const BackwardKernels kernels = *kernels_of(f.dtype, f.fp32_probabilities);
  if (f.score.changes_scores()) {
    // Absent slopes as 0: adding 0 · (j - i) changes no score. The sinks are in lse.
    std::vector<float> slopes = f.score.alibi_slopes;
    if (slopes.empty()) slopes.assign(static_cast<std::size_t>(f.q_heads), 0.0f);
    HalideView slope_view(TensorView(slopes.data(), DType::f32, {f.q_heads}));
    const KeyBounds bounds = key_bounds(f);
    status = kernels.with_options(
        dout.get(), q.get(), k.get(), v.get(), out.get(), lse.get(), bias.get(), f.scale,
        static_cast<int32_t>(bounds.causal_offset), chunk_blocks, f.score.softcap, slope_view.get(),
        static_cast<int32_t>(f.position_offset), static_cast<int32_t>(bounds.window_begin),
        dq.get(), dk.get(), dv.get(), ds_buffer.get());
  } else {
    status = kernels.plain(dout.get(), q.get(), k.get(), v.get(), out.get(), lse.get(), bias.get(),
                           f.scale, static_cast<int32_t>(f.causal_offset), chunk_blocks, dq.get(),
                           dk.get(), dv.get(), ds_buffer.get());
  }
  TILELAB_CHECK(status == 0) << "generated flash attention backward kernel failed (status "
                             << status << "): " << halide_error_message_of_thread();
  return true;
}

}  // namespace tilelab::detail
