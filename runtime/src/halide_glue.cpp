// The process-wide Halide hooks and TensorView → halide_buffer_t helpers (halide_glue.hpp).
#include "halide_glue.hpp"

#include <omp.h>

#include <cstdlib>
#include <initializer_list>
#include <vector>

#include "cpu_features.hpp"
#include "scratch_memory.hpp"
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

// Halide's scratch memory comes from the per-thread cache (scratch_memory.hpp): the backward's
// accumulators and the bf16 forward's V in key pairs are MiBs per call, and small per-block
// buffers whose extents bounds inference cannot prove constant are allocated and freed once per
// key block by each task.
void* scratch_malloc(void*, std::size_t size) {
  return scratch_allocate(size);
}
void scratch_free(void*, void* data) {
  scratch_release(data);
}

// Halide reports runtime errors through this handler; the message is kept per thread and raised
// as a tilelab::Error by the caller.
thread_local std::string halide_error_message;
void record_halide_error(void*, const char* message) {
  halide_error_message = message;
}

// TILELAB_MAX_CPU_ISA below avx512 (cpu_features.hpp): the multitarget kernels skip the variants
// that need an instruction set above it (avx2: the AVX-512 ones; sse2: all but the baseline).
int can_use_target_features_up_to_cap(int count, const uint64_t* features) {
  const auto uses = [&](std::initializer_list<int> listed) {
    for (const int feature : listed) {
      const int word = feature / 64;
      if (word < count && (features[word] >> (feature % 64) & 1) != 0) return true;
    }
    return false;
  };
  if (uses({halide_target_feature_avx512, halide_target_feature_avx512_knl,
            halide_target_feature_avx512_skylake, halide_target_feature_avx512_cannonlake,
            halide_target_feature_avx512_zen4, halide_target_feature_avx512_zen5,
            halide_target_feature_avx512_sapphirerapids, halide_target_feature_avx10_1,
            halide_target_feature_avxvnni})) {
    return 0;
  }
  if (max_cpu_isa() == CpuIsa::sse2 &&
      uses({halide_target_feature_sse41, halide_target_feature_avx, halide_target_feature_avx2,
            halide_target_feature_fma, halide_target_feature_fma4, halide_target_feature_f16c})) {
    return 0;
  }
  return halide_default_can_use_target_features(count, features);
}

}  // namespace

void install_halide_hooks() {
  static const bool installed = [] {
    halide_set_custom_do_par_for(openmp_do_par_for);
    halide_set_error_handler(record_halide_error);
    halide_set_custom_malloc(scratch_malloc);
    halide_set_custom_free(scratch_free);
    if (max_cpu_isa() < CpuIsa::avx512) {
      halide_set_custom_can_use_target_features(can_use_target_features_up_to_cap);
    }
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
