// The library's thread count: one OpenMP pool shared by the reference kernels and Halide's loops.
#include "tilelab/threading.hpp"

#include <omp.h>

#include "tilelab/error.hpp"

namespace tilelab {

void set_num_threads(int n) {
  TILELAB_REQUIRE(n >= 1) << "n: expected a thread count >= 1, got " << n;
  omp_set_num_threads(n);
}

int num_threads() {
  return omp_get_max_threads();
}

}  // namespace tilelab
