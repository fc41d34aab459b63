// flash_attention: validate, then dispatch to the generated kernel or the reference.
#include "attention_problem.hpp"
#include "tilelab/error.hpp"

namespace tilelab {

using detail::AttentionProblem;

void flash_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const FlashAttentionOptions& options) {
  const AttentionProblem problem = detail::validate_flash_attention(q, k, v, out, options);
  if (problem.needs_paged_kernel()) {
    TILELAB_REQUIRE(options.implementation != Implementation::generated)
        << "implementation: 'generated' does not cover score options or fp8 k/v (they run on "
           "the paged kernel); use 'automatic' or 'reference'";
    detail::flash_attention_on_paged_kernel(problem);
    return;
  }
  switch (options.implementation) {
    case Implementation::reference:
      detail::reference_flash_attention(problem);
      return;
    case Implementation::generated:
      TILELAB_REQUIRE(detail::generated_flash_attention(problem))
          << "implementation: 'generated' does not cover this call (" << q.describe()
          << "); the generated kernels need innermost stride 1 on q, k, v, out and bias, and "
             "head_dim <= 256; use 'automatic' or 'reference'";
      return;
    case Implementation::automatic:
      if (problem.automatic_prefers_paged_kernel()) {
        detail::flash_attention_on_paged_kernel(problem);
      } else if (!detail::generated_flash_attention(problem)) {
        detail::reference_flash_attention(problem);
      }
      return;
  }
}

const char* flash_attention_implementation(const TensorView& q, const TensorView& k,
                                           const TensorView& v, const TensorView& out,
                                           const FlashAttentionOptions& options) {
  const AttentionProblem problem = detail::validate_flash_attention(q, k, v, out, options);
  if (problem.needs_paged_kernel() || problem.automatic_prefers_paged_kernel()) return "paged";
  return detail::generated_flash_attention_covers(problem) ? "generated" : "reference";
}

}  // namespace tilelab
