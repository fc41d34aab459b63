// First-fit partition allocator.
#include "memory.hpp"

#include <algorithm>

#include <tilelab/error.hpp>

namespace tilelab::sim {

PartitionAllocator::PartitionAllocator(int64_t capacity_bytes, int64_t bank_bytes,
                                       int64_t alignment_bytes)
    : capacity_(capacity_bytes),
      bank_bytes_(bank_bytes),
      alignment_(std::max<int64_t>(1, alignment_bytes)) {
  free_blocks_[0] = capacity_bytes;
}

std::optional<int64_t> PartitionAllocator::allocate(int64_t bytes) {
  const int64_t size = (bytes + alignment_ - 1) / alignment_ * alignment_;
  for (auto it = free_blocks_.begin(); it != free_blocks_.end(); ++it) {
    const int64_t block_start = it->first;
    const int64_t block_end = it->first + it->second;
    int64_t start = block_start;
    if (bank_bytes_ > 0 && start / bank_bytes_ != (start + size - 1) / bank_bytes_)
      start = (start / bank_bytes_ + 1) * bank_bytes_;  // move to the next bank boundary
    if (start + size > block_end) continue;
    // Split the block into [block_start, start) and [start + size, block_end).
    free_blocks_.erase(it);
    if (start > block_start) free_blocks_[block_start] = start - block_start;
    if (block_end > start + size) free_blocks_[start + size] = block_end - (start + size);
    used_ += size;
    peak_ = std::max(peak_, used_);
    return start;
  }
  return std::nullopt;
}

void PartitionAllocator::release(int64_t address, int64_t bytes) {
  const int64_t size = (bytes + alignment_ - 1) / alignment_ * alignment_;
  TILELAB_CHECK(address >= 0 && address + size <= capacity_) << "release out of range";
  auto [it, inserted] = free_blocks_.emplace(address, size);
  TILELAB_CHECK(inserted) << "double release at " << address;
  used_ -= size;
  // Coalesce with the next and previous blocks.
  auto next = std::next(it);
  if (next != free_blocks_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_blocks_.erase(next);
  }
  if (it != free_blocks_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_blocks_.erase(it);
    }
  }
}

int64_t PartitionAllocator::largest_free_block() const {
  int64_t largest = 0;
  for (const auto& [address, size] : free_blocks_) largest = std::max(largest, size);
  return largest;
}

}  // namespace tilelab::sim
