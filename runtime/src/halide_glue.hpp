// Glue between TensorViews and generated Halide kernels: TensorView → halide_buffer_t, and the
// process-wide Halide hooks (OpenMP parallel loops, cached scratch memory, errors kept per thread).
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <string>

#include "HalideRuntime.h"
#include "tilelab/tensor.hpp"

namespace tilelab::detail {

// Installs Halide's do_par_for (on the OpenMP pool), malloc/free (a per-thread scratch cache)
// and error handler once per process; cheap to call before every kernel call.
void install_halide_hooks();

// The last Halide error message on this thread (clear it before a call, read it after a failure).
std::string& halide_error_message_of_thread();

halide_type_t halide_type_of(DType dtype);

// A generated kernel and its name, which is also the name of its listings
// (build/generators/listings/<name>.{stmt,s}, target <name>_listings).
template <typename Fn>
struct NamedKernel {
  Fn run = nullptr;
  const char* name = nullptr;
};
#define TILELAB_NAMED(kernel) {kernel, #kernel}

// A halide_buffer_t over a TensorView (Halide dim i is the view's dim rank-1-i); `extents`
// (outermost first, as the view) may widen extent-1 dims, whose stride then becomes 0.
struct HalideView {
  std::array<halide_dimension_t, TensorView::kMaxRank> dims{};
  halide_buffer_t buffer{};

  explicit HalideView(const TensorView& view, const std::int64_t* extents = nullptr) {
    const int rank = view.rank();
    for (int i = 0; i < rank; ++i) {
      const int outer = rank - 1 - i;
      const bool broadcast = extents && view.dim(outer) == 1 && extents[outer] != 1;
      dims[i].min = 0;
      dims[i].extent = static_cast<int32_t>(extents ? extents[outer] : view.dim(outer));
      dims[i].stride = broadcast ? 0 : static_cast<int32_t>(view.stride(outer));
    }
    buffer.host = static_cast<uint8_t*>(view.data());
    buffer.type = halide_type_of(view.dtype());
    buffer.dimensions = rank;
  }
  // The buffer points into this object's dims, so it is wired up at use, not at construction.
  halide_buffer_t* get() {
    buffer.dim = dims.data();
    return &buffer;
  }
};

inline bool fits_int32(std::int64_t value) {
  return value <= std::numeric_limits<int32_t>::max();
}

// Halide addresses elements with int32 offsets; every reachable offset must fit.
inline bool offsets_fit_int32(const TensorView& view) {
  std::int64_t last = 0;
  for (int i = 0; i < view.rank(); ++i) {
    if (!fits_int32(view.dim(i))) return false;
    last += (view.dim(i) - 1) * view.stride(i);
  }
  return fits_int32(last);
}

}  // namespace tilelab::detail
