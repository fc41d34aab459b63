// The library's thread count: one OpenMP pool shared by the reference kernels and Halide's loops.
// The count is held here, process-wide, and passed to every parallel region: omp_set_num_threads
// would only set it for the calling thread.
#include "tilelab/threading.hpp"

#include <omp.h>

#include <atomic>

#include "tilelab/error.hpp"

namespace tilelab {
namespace {
// 0: not set, use OpenMP's default (OMP_NUM_THREADS or the core count).
std::atomic<int> configured_threads{0};
}  // namespace

int max_num_threads() {
  return kMaxThreadsPerProcessor * omp_get_num_procs();
}

void set_num_threads(int n) {
  // Far more threads than processors only slows the kernels down, and beyond some thousands the
  // OpenMP runtime cannot create them: it aborts the process inside the next parallel region.
  TILELAB_REQUIRE(n >= 1 && n <= max_num_threads())
      << "n: expected a thread count in [1, " << max_num_threads() << "] (at most "
      << kMaxThreadsPerProcessor << " per processor, " << omp_get_num_procs()
      << " processors), got " << n;
  configured_threads.store(n, std::memory_order_relaxed);
}

int num_threads() {
  const int n = configured_threads.load(std::memory_order_relaxed);
  return n > 0 ? n : omp_get_max_threads();
}

}  // namespace tilelab
