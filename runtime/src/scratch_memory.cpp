// The per-thread scratch cache behind scratch_allocate (scratch_memory.hpp). Besides large per-call
// buffers it serves small per-block buffers of the generated kernels, allocated and freed once per
// key block by each task; a task allocates and frees on its own thread, so a thread-local cache
// needs no lock.
#include "scratch_memory.hpp"

#include <cstdlib>
#include <new>
#include <vector>

namespace tilelab::detail {
namespace {

class ScratchCache {
 public:
  static constexpr std::size_t kAlignment = 128;  // >= halide_malloc_alignment(), and cache lines
  static constexpr std::size_t kBudgetBytes = std::size_t{256} << 20;  // cached per thread

  ScratchCache() = default;
  ScratchCache(const ScratchCache&) = delete;
  ScratchCache& operator=(const ScratchCache&) = delete;
  ~ScratchCache() {
    for (const Block& block : blocks_) std::free(base_of(block.data));
  }

  void* allocate(std::size_t size) {
    // The most recently released block that fits without wasting more than half of it: tasks
    // allocate and free their per-block buffers in a fixed order, so it is found at once.
    std::size_t best = blocks_.size();
    for (std::size_t i = blocks_.size(); i-- > 0;) {
      const std::size_t capacity = blocks_[i].capacity;
      if (capacity >= size && capacity <= 2 * size + kAlignment) {
        best = i;
        break;
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

}  // namespace

void* scratch_allocate(std::size_t size) {
  return scratch_cache.allocate(size);
}

void scratch_release(void* data) {
  scratch_cache.release(data);
}

ScratchBuffer::ScratchBuffer(std::size_t size) : data_(scratch_allocate(size)) {
  if (!data_) throw std::bad_alloc();
}

}  // namespace tilelab::detail
