// The generated flash attention backward kernels behind detail::generated_flash_attention_backward:
// one per dtype; TensorViews become halide_buffer_t (halide_glue).
#include <algorithm>
#include <cstdint>

#include "attention_problem.hpp"
#include "flash_bwd_bf16.h"
#include "flash_bwd_bf16_fp32_probabilities.h"
#include "flash_bwd_f16.h"
#include "flash_bwd_f32.h"
#include "halide_glue.hpp"
#include "schedules/flash/tiling.hpp"
#include "tilelab/error.hpp"

namespace tilelab::detail {
namespace {

using KernelFn = int (*)(halide_buffer_t*, halide_buffer_t*, halide_buffer_t*, halide_buffer_t*,
                         halide_buffer_t*, halide_buffer_t*, halide_buffer_t*, float, int32_t,
                         int32_t, halide_buffer_t*, halide_buffer_t*, halide_buffer_t*,
                         halide_buffer_t*);

// bf16: P and dS rounded to bf16 for the products that read them, unless fp32_probabilities.
KernelFn pick_kernel(DType dtype, bool fp32_probabilities) {
  switch (dtype) {
    case DType::f32:
      return flash_bwd_f32;
    case DType::f16:
      return flash_bwd_f16;
    case DType::bf16:
      return fp32_probabilities ? flash_bwd_bf16_fp32_probabilities : flash_bwd_bf16;
    case DType::i32:
    case DType::f8e4m3fn:
    case DType::f8e5m2:
      break;
  }
  return nullptr;
}

// Tasks the kernel's key chunks should give at least, over (chunk, kv head, batch): enough for 16
// threads with some balance left for causal masks, whose chunks differ in work.
constexpr std::int64_t kBackwardTasks = 32;
// Each chunk beyond the first adds a partial dq of every row (fp32) to memory; cap that memory.
constexpr std::int64_t kBackwardPartialBytes = std::int64_t{256} << 20;

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

bool generated_flash_attention_backward_covers(const AttentionBackwardProblem& p) {
  const AttentionProblem& f = p.forward;
  for (const TensorView* view : {&f.q, &f.k, &f.v, &f.out, &p.dout, &p.dq, &p.dk, &p.dv}) {
    if (view->stride(3) != 1 || !offsets_fit_int32(*view)) return false;
  }
  if (f.bias && (f.bias->stride(3) != 1 || !offsets_fit_int32(*f.bias))) return false;
  if (!offsets_fit_int32(*f.lse)) return false;
  return f.head_dim <= 256 && fits_int32(f.causal_offset) &&
         pick_kernel(f.dtype, f.fp32_probabilities);
}

bool generated_flash_attention_backward(const AttentionBackwardProblem& p, const TensorView* ds) {
  if (!generated_flash_attention_backward_covers(p)) return false;
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
  const int status = pick_kernel(f.dtype, f.fp32_probabilities)(
      dout.get(), q.get(), k.get(), v.get(), out.get(), lse.get(), bias.get(), f.scale,
      static_cast<int32_t>(f.causal_offset), static_cast<int32_t>(flash_backward_chunk_blocks(f)),
      dq.get(), dk.get(), dv.get(), ds_buffer.get());
  TILELAB_CHECK(status == 0) << "generated flash attention backward kernel failed (status "
                             << status << "): " << halide_error_message_of_thread();
  return true;
}

}  // namespace tilelab::detail
