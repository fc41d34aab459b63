// One thread count for the whole library: Halide's parallel loops and the reference kernels both
// run on the OpenMP pool.
#pragma once

namespace tilelab {

// At most this many threads per processor the system has.
inline constexpr int kMaxThreadsPerProcessor = 8;

// Sets the number of threads tilelab uses, in [1, max_num_threads()]; Error otherwise. Default:
// OpenMP's default.
void set_num_threads(int n);
int num_threads();
// The largest count set_num_threads accepts: kMaxThreadsPerProcessor × the processors.
int max_num_threads();

}  // namespace tilelab
