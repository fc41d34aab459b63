// One thread count for the whole library: Halide's parallel loops and the reference kernels both
// run on the OpenMP pool.
#pragma once

namespace tilelab {

// Sets the number of threads tilelab uses (>= 1); Error otherwise. Default: OpenMP's default.
void set_num_threads(int n);
int num_threads();

}  // namespace tilelab
