// The generated flash attention kernels behind detail::generated_flash_attention: the variant is
// picked by dtype, bias and rows per kv head; TensorViews become halide_buffer_t (halide_glue).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "attention_problem.hpp"
#include "cpu_features.hpp"
#include "flash_fwd_bf16.h"
#include "flash_fwd_bf16_bias.h"
#include "flash_fwd_bf16_bias_fp32_probabilities.h"
#include "flash_fwd_bf16_bias_fp32_probabilities_tall.h"
#include "flash_fwd_bf16_decode.h"
#include "flash_fwd_bf16_fp32_probabilities.h"
#include "flash_fwd_bf16_fp32_probabilities_tall.h"
#include "flash_fwd_bf16_options.h"
#include "flash_fwd_bf16_options_fp32_probabilities.h"
#include "flash_fwd_f16.h"
#include "flash_fwd_f16_bias.h"
#include "flash_fwd_f16_bias_tall.h"
#include "flash_fwd_f16_decode.h"
#include "flash_fwd_f16_options.h"
#include "flash_fwd_f16_tall.h"
#include "flash_fwd_f32.h"
#include "flash_fwd_f32_bias.h"
#include "flash_fwd_f32_decode.h"
#include "flash_fwd_f32_options.h"
#include "halide_glue.hpp"
#include "schedules/flash/tiling.hpp"
#include "scratch_memory.hpp"
#include "tilelab/error.hpp"
#include "tilelab/threading.hpp"

namespace tilelab::detail {
namespace {

using KernelFn = int (*)(halide_buffer_t*, halide_buffer_t*, halide_buffer_t*, halide_buffer_t*,
                         float, int32_t, halide_buffer_t*, halide_buffer_t*);
// The score options variant: (..., causal_offset, softcap, alibi_slopes, sinks, position_offset,
// window_begin_offset, out, lse).
using OptionsKernelFn = int (*)(halide_buffer_t*, halide_buffer_t*, halide_buffer_t*,
                                halide_buffer_t*, float, int32_t, float, halide_buffer_t*,
                                halide_buffer_t*, int32_t, int32_t, halide_buffer_t*,
                                halide_buffer_t*);

using Kernel = NamedKernel<KernelFn>;
using OptionsKernel = NamedKernel<OptionsKernelFn>;

using schedules::flash::kDecodeMaxRows;

bool decode_rows(const AttentionProblem& p) {
  return p.rows_per_kv_head() <= kDecodeMaxRows;
}

// Score options run on their prefill variant; decode-sized calls and fp8 K/V stay on the paged
// kernel. bf16: on bf16 dot products with P rounded, or on fp32 FMAs (rounds_bf16_probabilities).
OptionsKernel pick_options_kernel(const AttentionProblem& p) {
  if (decode_rows(p) || is_fp8(p.kv_dtype) || p.bias) return {};
  switch (p.dtype) {
    case DType::f32:
      return TILELAB_NAMED(flash_fwd_f32_options);
    case DType::f16:
      return TILELAB_NAMED(flash_fwd_f16_options);
    case DType::bf16:
      if (rounds_bf16_probabilities(p.dtype, p.kv_dtype, p.fp32_probabilities)) {
        return TILELAB_NAMED(flash_fwd_bf16_options);
      }
      return TILELAB_NAMED(flash_fwd_bf16_options_fp32_probabilities);
    default:
      return {};
  }
}

// Without a bias, decode for few rows per kv head; else 128-key blocks (kPrefillWideTiling), causal
// or not, bias or not. Kernels that widen 16-bit K and V per tile (fp16, and bf16 on fp32 FMAs)
// also come with 64-row tiles, for calls with rows enough to fill them.
Kernel pick_kernel(const AttentionProblem& p) {
  const bool has_bias = p.bias.has_value();
  const bool decode = !has_bias && decode_rows(p);
  const bool tall = !decode && schedules::flash::prefers_tall_query_tiles(
                                   p.rows_per_kv_head(), p.batch * p.kv_heads, num_threads());
  switch (p.dtype) {
    case DType::f32:
      if (has_bias) return TILELAB_NAMED(flash_fwd_f32_bias);
      if (decode) return TILELAB_NAMED(flash_fwd_f32_decode);
      return TILELAB_NAMED(flash_fwd_f32);
    case DType::f16:
      if (has_bias && tall) return TILELAB_NAMED(flash_fwd_f16_bias_tall);
      if (has_bias) return TILELAB_NAMED(flash_fwd_f16_bias);
      if (decode) return TILELAB_NAMED(flash_fwd_f16_decode);
      if (tall) return TILELAB_NAMED(flash_fwd_f16_tall);
      return TILELAB_NAMED(flash_fwd_f16);
    case DType::bf16:
      if (decode) return TILELAB_NAMED(flash_fwd_bf16_decode);
      if (!rounds_bf16_probabilities(p.dtype, p.kv_dtype, p.fp32_probabilities)) {
        if (has_bias && tall) return TILELAB_NAMED(flash_fwd_bf16_bias_fp32_probabilities_tall);
        if (has_bias) return TILELAB_NAMED(flash_fwd_bf16_bias_fp32_probabilities);
        if (tall) return TILELAB_NAMED(flash_fwd_bf16_fp32_probabilities_tall);
        return TILELAB_NAMED(flash_fwd_bf16_fp32_probabilities);
      }
      if (has_bias) return TILELAB_NAMED(flash_fwd_bf16_bias);
      return TILELAB_NAMED(flash_fwd_bf16);
    case DType::i32:
    case DType::f8e4m3fn:
    case DType::f8e5m2:
      break;
  }
  return {};
}

#undef TILELAB_NAMED

// The kernels index out and lse by row = (h mod group) · M + i within a kv head (the GQA group
// folded into rows, as their tiles are): out (d, row, kv head, batch), and lse the same dims with
// a stride-0 head dim (the two are one Tuple output, whose buffers share dims). A [B, Hq, M, ...]
// view has that layout when a kv head's query heads sit M rows apart, or a row is a query alone
// (no group) or a head alone (M = 1): the row stride then, else nothing.
std::optional<std::int64_t> row_layout_stride(const TensorView& view, std::int64_t group) {
  if (group == 1) return view.stride(2);
  if (view.dim(2) == 1) return view.stride(1);
  if (view.stride(1) == view.dim(2) * view.stride(2)) return view.stride(2);
  return std::nullopt;
}

// `view` ([B, Hq, M, D] out or [B, Hq, M] lse) in the kernels' row layout, [B, Hkv, rows, D]
// (lse: a stride-0 D); `row_stride` from row_layout_stride.
TensorView row_layout_view(const TensorView& view, const AttentionProblem& p,
                           std::int64_t row_stride) {
  const std::int64_t group = p.q_heads / p.kv_heads;
  const std::int64_t head_dim_stride = view.rank() == 4 ? view.stride(3) : 0;
  return TensorView(view.data(), view.dtype(),
                    {p.batch, p.kv_heads, p.rows_per_kv_head(), p.head_dim},
                    {view.stride(0), group * view.stride(1), row_stride, head_dim_stride});
}

// Copies `from` (contiguous) to `to` (the same dims and dtype, any strides), a row of the
// innermost dim at a time, in parallel.
void copy_to_view(const TensorView& from, const TensorView& to) {
  const int rank = to.rank();
  const std::int64_t inner = to.dim(rank - 1), inner_stride = to.stride(rank - 1);
  const std::int64_t rows = to.numel() / std::max<std::int64_t>(inner, 1);
  const auto element = static_cast<std::int64_t>(dtype_size(to.dtype()));
  const auto* source = static_cast<const std::byte*>(from.data());
  auto* target = static_cast<std::byte*>(to.data());
#pragma omp parallel for schedule(static) num_threads(num_threads())
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::byte* row = source + r * inner * element;
    std::byte* destination = target + to.element_offset(r * inner) * element;
    if (inner_stride == 1) {
      std::memcpy(destination, row, static_cast<std::size_t>(inner * element));
      continue;
    }
    for (std::int64_t j = 0; j < inner; ++j) {
      std::memcpy(destination + j * inner_stride * element, row + j * element,
                  static_cast<std::size_t>(element));
    }
  }
}

// A contiguous stand-in for an output whose layout the kernels cannot write (row_layout_stride),
// from the scratch cache, copied to the caller's view afterwards.
class RowLayoutOutput {
 public:
  RowLayoutOutput(const TensorView& view, const AttentionProblem& p) : target_(view) {
    const std::int64_t group = p.q_heads / p.kv_heads;
    if (const std::optional<std::int64_t> stride = row_layout_stride(view, group)) {
      kernel_view_ = row_layout_view(view, p, *stride);
      return;
    }
    storage_.emplace(static_cast<std::size_t>(view.numel()) * dtype_size(view.dtype()));
    const TensorView contiguous =
        view.rank() == 4
            ? TensorView(storage_->data(), view.dtype(),
                         {view.dim(0), view.dim(1), view.dim(2), view.dim(3)})
            : TensorView(storage_->data(), view.dtype(), {view.dim(0), view.dim(1), view.dim(2)});
    kernel_view_ = row_layout_view(contiguous, p, *row_layout_stride(contiguous, group));
    staged_ = contiguous;
  }
  RowLayoutOutput(const RowLayoutOutput&) = delete;
  RowLayoutOutput& operator=(const RowLayoutOutput&) = delete;

  const TensorView& kernel_view() const { return kernel_view_; }
  // Copies the stand-in, if any, to the caller's view.
  void finish() const {
    if (storage_) copy_to_view(staged_, target_);
  }

 private:
  TensorView target_, kernel_view_, staged_;
  std::optional<ScratchBuffer> storage_;
};

}  // namespace

const char* generated_flash_attention_kernel(const AttentionProblem& p) {
  // The kernels read the head dim (and the bias key dim) densely.
  for (const TensorView* view : {&p.q, &p.k, &p.v, &p.out}) {
    if (view->stride(3) != 1 || !offsets_fit_int32(*view)) return nullptr;
  }
  if (p.bias && (p.bias->stride(3) != 1 || !offsets_fit_int32(*p.bias))) return nullptr;
  if (p.head_dim > kMaxFlashHeadDim || !fits_int32(p.causal_offset)) return nullptr;
  if (!p.score.any()) return is_fp8(p.kv_dtype) ? nullptr : pick_kernel(p).name;
  const KeyBounds bounds = key_bounds(p);
  if (!fits_int32(bounds.window_begin) || !fits_int32(bounds.causal_offset) ||
      !fits_int32(p.position_offset)) {
    return nullptr;
  }
  return pick_options_kernel(p).name;
}

bool generated_flash_attention(const AttentionProblem& p) {
  if (!generated_flash_attention_covers(p)) return false;
  install_halide_hooks();

  HalideView q(p.q), k(p.k), v(p.v);
  // Without bias the variant ignores its bias input; it still needs a valid buffer.
  float unused_bias = 0.0f;
  TensorView no_bias(&unused_bias, DType::f32, {1, 1, 1, 1});
  const std::int64_t bias_extents[4] = {p.batch, p.q_heads, p.q_len, p.kv_len};
  HalideView bias = p.bias ? HalideView(*p.bias, bias_extents) : HalideView(no_bias);
  // The kernels always produce the log-sum-exp; without a caller's lse it goes to scratch.
  std::vector<float> lse_scratch;
  TensorView lse_view;
  if (p.lse) {
    lse_view = *p.lse;
  } else {
    lse_scratch.resize(static_cast<std::size_t>(p.batch * p.q_heads * p.q_len));
    lse_view = TensorView(lse_scratch.data(), DType::f32, {p.batch, p.q_heads, p.q_len});
  }
  const RowLayoutOutput out_rows(p.out, p), lse_rows(lse_view, p);
  HalideView out(out_rows.kernel_view()), lse(lse_rows.kernel_view());

  halide_error_message_of_thread().clear();
  int status = 0;
  if (p.score.any()) {
    // Absent options as their neutral values: slopes 0 (adding 0 · (j - i) changes no score) and
    // sinks -inf.
    const auto heads = static_cast<std::size_t>(p.q_heads);
    std::vector<float> slopes = p.score.alibi_slopes, sinks = p.score.sinks;
    if (slopes.empty()) slopes.assign(heads, 0.0f);
    if (sinks.empty()) sinks.assign(heads, -std::numeric_limits<float>::infinity());
    HalideView slope_view(TensorView(slopes.data(), DType::f32, {p.q_heads}));
    HalideView sink_view(TensorView(sinks.data(), DType::f32, {p.q_heads}));
    const KeyBounds bounds = key_bounds(p);
    status = pick_options_kernel(p).run(
        q.get(), k.get(), v.get(), bias.get(), p.scale, static_cast<int32_t>(bounds.causal_offset),
        p.score.softcap, slope_view.get(), sink_view.get(), static_cast<int32_t>(p.position_offset),
        static_cast<int32_t>(bounds.window_begin), out.get(), lse.get());
  } else {
    status = pick_kernel(p).run(q.get(), k.get(), v.get(), bias.get(), p.scale,
                                static_cast<int32_t>(p.causal_offset), out.get(), lse.get());
  }
  TILELAB_CHECK(status == 0) << "generated flash attention kernel failed (status " << status
                             << "): " << halide_error_message_of_thread();
  out_rows.finish();
  lse_rows.finish();
  return true;
}

}  // namespace tilelab::detail
