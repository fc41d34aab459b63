// The generated flash attention kernels behind detail::generated_flash_attention: TensorViews
// become halide_buffer_t (dims reversed: Halide indexes innermost first), the variant is picked
// by dtype and bias, and Halide's parallel loops run on the OpenMP pool.
#include <omp.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "HalideRuntime.h"
#include "attention_problem.hpp"
#include "flash_fwd_bf16.h"
#include "flash_fwd_bf16_bias.h"
#include "flash_fwd_bf16_decode.h"
#include "flash_fwd_f16.h"
#include "flash_fwd_f16_bias.h"
#include "flash_fwd_f16_decode.h"
#include "flash_fwd_f32.h"
#include "flash_fwd_f32_bias.h"
#include "flash_fwd_f32_decode.h"
#include "tilelab/error.hpp"
#include "tilelab/threading.hpp"

namespace tilelab::detail {
namespace {

// Halide's parallel loops on OpenMP: one thread pool for the whole library. Dynamic scheduling
// because causal tiles differ in cost.
int openmp_do_par_for(void* user_context, halide_task_t task, int min, int size, uint8_t* closure) {
  int result = 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads())
  for (int x = min; x < min + size; ++x) {
    int status;
#pragma omp atomic read
    status = result;
    if (status != 0) continue;
    if (int r = task(user_context, x, closure); r != 0) {
#pragma omp atomic write
      result = r;
    }
  }
  return result;
}

// Halide's scratch memory, cached per thread. Two kinds of allocation go through here: the
// running state of a call (B·Hkv·rows·D·3 floats, 12 MiB for B1 H16 S512 D128), which malloc
// would serve with a fresh mmap whose page faults cost ~15% of the call, and small per-block
// buffers whose extents bounds inference cannot prove constant (so they are not on the stack),
// allocated and freed once per key block by each task. A task allocates and frees on its own
// thread, so a thread-local cache needs no lock.
class ScratchCache {
 public:
  static constexpr std::size_t kAlignment = 128;  // >= halide_malloc_alignment()
  static constexpr std::size_t kBudgetBytes = std::size_t{256} << 20;  // cached per thread

  ScratchCache() = default;
  ScratchCache(const ScratchCache&) = delete;
  ScratchCache& operator=(const ScratchCache&) = delete;
  ~ScratchCache() {
    for (const Block& block : blocks_) std::free(base_of(block.data));
  }

  void* allocate(std::size_t size) {
    // Smallest cached block that fits without wasting more than half of it.
    std::size_t best = blocks_.size();
    for (std::size_t i = 0; i < blocks_.size(); ++i) {
      const std::size_t capacity = blocks_[i].capacity;
      if (capacity >= size && capacity <= 2 * size + kAlignment &&
          (best == blocks_.size() || capacity < blocks_[best].capacity)) {
        best = i;
      }
    }
    if (best != blocks_.size()) {
      const Block block = blocks_[best];
      blocks_[best] = blocks_.back();
      blocks_.pop_back();
      cached_bytes_ -= block.capacity;
      return block.data;
    }
    const std::size_t capacity = (size + kAlignment - 1) / kAlignment * kAlignment;
    auto* base = static_cast<std::size_t*>(std::aligned_alloc(kAlignment, capacity + kAlignment));
    if (!base) return nullptr;
    *base = capacity;  // the header in front of the block holds its capacity
    return reinterpret_cast<char*>(base) + kAlignment;
  }

  // `data` may come from another thread's cache; every block carries its capacity.
  void release(void* data) {
    if (!data) return;
    const std::size_t capacity = *static_cast<std::size_t*>(base_of(data));
    blocks_.push_back({data, capacity});
    cached_bytes_ += capacity;
    while (cached_bytes_ > kBudgetBytes) {  // over budget: drop the largest blocks first
      std::size_t largest = 0;
      for (std::size_t i = 1; i < blocks_.size(); ++i) {
        if (blocks_[i].capacity > blocks_[largest].capacity) largest = i;
      }
      cached_bytes_ -= blocks_[largest].capacity;
      std::free(base_of(blocks_[largest].data));
      blocks_[largest] = blocks_.back();
      blocks_.pop_back();
    }
  }

 private:
  struct Block {
    void* data;
    std::size_t capacity;
  };
  static void* base_of(void* data) { return static_cast<char*>(data) - kAlignment; }

  std::vector<Block> blocks_;
  std::size_t cached_bytes_ = 0;
};

thread_local ScratchCache scratch_cache;
void* scratch_malloc(void*, std::size_t size) {
  return scratch_cache.allocate(size);
}
void scratch_free(void*, void* data) {
  scratch_cache.release(data);
}

// Halide reports runtime errors through this handler; the message is kept per thread and raised
// as a tilelab::Error by the caller.
thread_local std::string halide_error_message;
void record_halide_error(void*, const char* message) {
  halide_error_message = message;
}

void install_halide_hooks() {
  static const bool installed = [] {
    halide_set_custom_do_par_for(openmp_do_par_for);
    halide_set_error_handler(record_halide_error);
    halide_set_custom_malloc(scratch_malloc);
    halide_set_custom_free(scratch_free);
    return true;
  }();
  (void)installed;
}

halide_type_t halide_type_of(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return halide_type_t(halide_type_float, 32);
    case DType::f16:
      return halide_type_t(halide_type_float, 16);
    case DType::bf16:
      return halide_type_t(halide_type_bfloat, 16);
    case DType::i32:
      return halide_type_t(halide_type_int, 32);
  }
  return halide_type_t();
}

// A halide_buffer_t over a TensorView; `extents` (outermost first, as the view) may widen extent-1
// dims whose stride is then 0 (broadcast).
struct HalideView {
  std::array<halide_dimension_t, TensorView::kMaxRank> dims{};
  halide_buffer_t buffer{};

  HalideView(const TensorView& view, const std::int64_t* extents = nullptr) {
    const int rank = view.rank();
    for (int i = 0; i < rank; ++i) {
      const int outer = rank - 1 - i;  // Halide dim i is the view's dim rank-1-i
      const bool broadcast = extents && view.dim(outer) == 1 && extents[outer] != 1;
      dims[i].min = 0;
      dims[i].extent = static_cast<int32_t>(extents ? extents[outer] : view.dim(outer));
      dims[i].stride = broadcast ? 0 : static_cast<int32_t>(view.stride(outer));
    }
    buffer.host = static_cast<uint8_t*>(view.data());
    buffer.type = halide_type_of(view.dtype());
    buffer.dimensions = rank;
  }
  // The buffer points into this object's dims, so it is wired up at use, not at construction.
  halide_buffer_t* get() {
    buffer.dim = dims.data();
    return &buffer;
  }
};

bool fits_int32(std::int64_t value) {
  return value <= std::numeric_limits<int32_t>::max();
}

// Halide addresses elements with int32 offsets; every reachable offset must fit.
bool offsets_fit_int32(const TensorView& view) {
  std::int64_t last = 0;
  for (int i = 0; i < view.rank(); ++i) {
    if (!fits_int32(view.dim(i))) return false;
    last += (view.dim(i) - 1) * view.stride(i);
  }
  return fits_int32(last);
}

using KernelFn = int (*)(halide_buffer_t*, halide_buffer_t*, halide_buffer_t*, halide_buffer_t*,
                         float, int32_t, halide_buffer_t*, halide_buffer_t*);

// Rows per kv head (query rows × GQA group) up to which the decode variant (4-row tiles, head dim
// in the vector lanes) beats the 32-row prefill tile; past 4 rows it re-reads K/V per 4 rows.
constexpr std::int64_t kDecodeMaxRows = 8;

KernelFn pick_kernel(const AttentionProblem& p) {
  const bool has_bias = p.bias.has_value();
  const bool decode = !has_bias && p.q_len * (p.q_heads / p.kv_heads) <= kDecodeMaxRows;
  switch (p.dtype) {
    case DType::f32:
      return has_bias ? flash_fwd_f32_bias : decode ? flash_fwd_f32_decode : flash_fwd_f32;
    case DType::f16:
      return has_bias ? flash_fwd_f16_bias : decode ? flash_fwd_f16_decode : flash_fwd_f16;
    case DType::bf16:
      return has_bias ? flash_fwd_bf16_bias : decode ? flash_fwd_bf16_decode : flash_fwd_bf16;
    case DType::i32:
      break;
  }
  return nullptr;
}

}  // namespace

bool generated_flash_attention_covers(const AttentionProblem& p) {
  // The kernels read the head dim (and the bias key dim) densely.
  for (const TensorView* view : {&p.q, &p.k, &p.v, &p.out}) {
    if (view->stride(3) != 1 || !offsets_fit_int32(*view)) return false;
  }
  if (p.bias && (p.bias->stride(3) != 1 || !offsets_fit_int32(*p.bias))) return false;
  return p.head_dim <= 256 && fits_int32(p.causal_offset) && pick_kernel(p);
}

bool generated_flash_attention(const AttentionProblem& p) {
  if (!generated_flash_attention_covers(p)) return false;
  install_halide_hooks();

  HalideView q(p.q), k(p.k), v(p.v), out(p.out);
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
  HalideView lse(lse_view);

  halide_error_message.clear();
  const int status = pick_kernel(p)(q.get(), k.get(), v.get(), bias.get(), p.scale,
                                    static_cast<int32_t>(p.causal_offset), out.get(), lse.get());
  TILELAB_CHECK(status == 0) << "generated flash attention kernel failed (status " << status
                             << "): " << halide_error_message;
  return true;
}

}  // namespace tilelab::detail
