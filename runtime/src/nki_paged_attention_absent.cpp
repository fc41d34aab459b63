// tilelab::nki::flash_paged_attention without Halide at build time: there is no reference
// implementation of the NKI kernel in the runtime, so the call is an Error.
#include "tilelab/error.hpp"
#include "tilelab/nki.hpp"

namespace tilelab::nki {

void flash_paged_attention(const TensorView&, const TensorView&, const TensorView&,
                           const TensorView&, const TensorView&, const TensorView&,
                           const TensorView&, const FlashPagedAttentionOptions&) {
  throw Error(
      "flash_paged_attention: this tilelab was built without its generated kernels "
      "(TILELAB_BUILD_KERNELS=OFF); rebuild with Halide to use it");
}

}  // namespace tilelab::nki
