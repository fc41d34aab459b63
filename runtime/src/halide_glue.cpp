// The process-wide Halide hooks and TensorView → halide_buffer_t helpers (halide_glue.hpp).
#include "halide_glue.hpp"

#include <omp.h>

#include <cstdlib>
#include <vector>

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

// Halide's scratch memory, cached per thread. Two kinds of allocation go through here: large
// per-call buffers (the backward's accumulators, the bf16 forward's V in key pairs: MiBs), which
// malloc would serve with a fresh mmap whose page faults cost ~15% of a call, and small per-block
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

}  // namespace

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

std::string& halide_error_message_of_thread() {
  return halide_error_message;
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
    case DType::f8e4m3fn:
    case DType::f8e5m2:
      return halide_type_t(halide_type_uint, 8);  // raw bits
  }
  return halide_type_t();
}

}  // namespace tilelab::detail
