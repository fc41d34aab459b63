// Scratch memory cached per thread, for buffers of MiBs that calls need again and again (the
// generated kernels' per-call buffers, the K/V rows paged_attention gathers for its prefill
// route): malloc serves each with a fresh mmap, whose page faults cost ~15% of a kernel call.
#pragma once

#include <cstddef>

namespace tilelab::detail {

// 128-byte aligned; nullptr when out of memory. A block may be released on another thread than
// the one that allocated it.
void* scratch_allocate(std::size_t size);
void scratch_release(void* data);

// A scratch block of `size` bytes for one scope (uninitialized).
class ScratchBuffer {
 public:
  explicit ScratchBuffer(std::size_t size);
  ~ScratchBuffer() { scratch_release(data_); }
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  void* data() const { return data_; }

 private:
  void* data_;
};

}  // namespace tilelab::detail
