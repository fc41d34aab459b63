// flash_attention: validate, then dispatch to the generated kernel, the paged kernel or the
// reference.
#include "attention_problem.hpp"
#include "finite_values.hpp"
#include "schedules/flash/tiling.hpp"
#include "tilelab/error.hpp"

namespace tilelab {

using detail::AttentionProblem;

namespace {

// The dense reference implements neither score options nor fp8 k/v: the paged kernel runs those.
void run_reference(const AttentionProblem& problem) {
  if (problem.has_score_options_or_fp8()) {
    detail::flash_attention_on_paged_kernel(problem);
  } else {
    detail::reference_flash_attention(problem);
  }
}

// Whether the generated kernels may run the problem: they multiply a masked key's v row by 0, and
// with score options masked keys must never reach the output (docs/attention_options.md), so a v
// holding NaN or inf runs on the paged kernel, which never reads them.
bool generated_may_run(const AttentionProblem& problem) {
  return detail::generated_flash_attention_covers(problem) &&
         (!problem.score.any() || detail::every_value_finite(problem.v));
}

}  // namespace

void flash_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const FlashAttentionOptions& options) {
  const AttentionProblem problem = detail::validate_flash_attention(q, k, v, out, options);
  switch (options.implementation) {
    case Implementation::reference:
      run_reference(problem);
      return;
    case Implementation::generated:
      TILELAB_REQUIRE(generated_may_run(problem) && detail::generated_flash_attention(problem))
          << "implementation: 'generated' does not cover this call (" << q.describe()
          << "); the generated kernels need innermost stride 1 on q, k, v, out and bias, "
             "head_dim <= 256 and k, v of q's dtype, and with score options more than "
          << schedules::flash::kDecodeMaxRows << " query rows per kv head and finite v; use "
          << "'automatic' or 'reference'";
      return;
    case Implementation::automatic:
      if (problem.automatic_prefers_paged_kernel()) {
        detail::flash_attention_on_paged_kernel(problem);
      } else if (!generated_may_run(problem) || !detail::generated_flash_attention(problem)) {
        run_reference(problem);
      }
      return;
  }
}

const char* flash_attention_implementation(const TensorView& q, const TensorView& k,
                                           const TensorView& v, const TensorView& out,
                                           const FlashAttentionOptions& options) {
  const AttentionProblem problem = detail::validate_flash_attention(q, k, v, out, options);
  if (problem.automatic_prefers_paged_kernel()) return "paged";
  if (generated_may_run(problem)) return "generated";
  return problem.has_score_options_or_fp8() ? "paged" : "reference";
}

const char* flash_attention_kernel(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& out, const FlashAttentionOptions& options) {
  const AttentionProblem problem = detail::validate_flash_attention(q, k, v, out, options);
  if (problem.automatic_prefers_paged_kernel() || !generated_may_run(problem)) return nullptr;
  return detail::generated_flash_attention_kernel(problem);
}

}  // namespace tilelab
