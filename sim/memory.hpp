// SBUF/PSUM allocation: a first-fit allocator over the per-partition address space, with peak
// occupancy tracking. Tiles occupy the same byte range in every partition, as the compiler does.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

namespace tilelab::sim {

class PartitionAllocator {
 public:
  // `capacity_bytes` per partition; when `bank_bytes` > 0 no allocation may cross a bank boundary
  // (PSUM: a tile lives in one accumulation bank).
  PartitionAllocator(int64_t capacity_bytes, int64_t bank_bytes, int64_t alignment_bytes);

  // Returns the byte address of a free range of `bytes`, or nothing when none fits.
  std::optional<int64_t> allocate(int64_t bytes);
  // Returns a range obtained from allocate().
  void release(int64_t address, int64_t bytes);

  int64_t capacity() const { return capacity_; }
  int64_t used() const { return used_; }
  int64_t peak() const { return peak_; }
  int64_t largest_free_block() const;

 private:
  int64_t capacity_;
  int64_t bank_bytes_;
  int64_t alignment_;
  int64_t used_ = 0;
  int64_t peak_ = 0;
  std::map<int64_t, int64_t> free_blocks_;  // address -> size, coalesced
};

}  // namespace tilelab::sim
