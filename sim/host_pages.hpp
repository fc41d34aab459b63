// Advice on the host memory behind the simulator's large per-instruction arrays.
#pragma once

#include <cstddef>
#include <vector>

namespace tilelab::sim {

// Asks the kernel to back [data, data + bytes) with transparent huge pages where it can (Linux,
// THP in "madvise" or "always" mode): only the 2 MiB pages wholly inside the range, so that no
// neighbouring allocation is affected. Advice only: it changes no contents, and failing (no THP,
// another OS) leaves the range as it was.
void advise_huge_pages(const void* data, std::size_t bytes);

// `vector.reserve(count)`, with the reserved storage advised as above.
template <typename T>
void reserve_on_huge_pages(std::vector<T>& vector, std::size_t count) {
  vector.reserve(count);
  advise_huge_pages(vector.data(), vector.capacity() * sizeof(T));
}

}  // namespace tilelab::sim
