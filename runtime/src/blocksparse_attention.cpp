// blocksparse_attention: validate, then dispatch to the paged kernel (decode), the generated
// kernels or the reference.
#include "blocksparse_problem.hpp"
#include "tilelab/error.hpp"

namespace tilelab {

void blocksparse_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                           const BlockSparseLayout& layout, const TensorView& cu_seqlens_q,
                           const TensorView& cu_seqlens_k, const TensorView& out,
                           const BlockSparseAttentionOptions& options) {
  const detail::BlockSparseProblem problem = detail::validate_blocksparse_attention(
      q, k, v, layout, cu_seqlens_q, cu_seqlens_k, out, options);
  switch (options.implementation) {
    case Implementation::reference:
      detail::reference_blocksparse_attention(problem);
      return;
    case Implementation::generated:
      TILELAB_REQUIRE(detail::generated_blocksparse_attention(problem))
          << "implementation: 'generated' does not cover this call (" << q.describe()
          << "); no generated block-sparse kernel covers it (or none was built); use "
             "'automatic' or 'reference'";
      return;
    case Implementation::automatic:
      if (const auto paged = detail::blocksparse_decode_as_paged(problem)) {
        detail::paged_kernel_attention(*paged);
        return;
      }
      if (!detail::generated_blocksparse_attention(problem)) {
        detail::reference_blocksparse_attention(problem);
      }
      return;
  }
}

std::vector<std::string> blocksparse_attention_kernels(
    const TensorView& q, const TensorView& k, const TensorView& v, const BlockSparseLayout& layout,
    const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, const TensorView& out,
    const BlockSparseAttentionOptions& options) {
  const detail::BlockSparseProblem problem = detail::validate_blocksparse_attention(
      q, k, v, layout, cu_seqlens_q, cu_seqlens_k, out, options);
  if (options.implementation == Implementation::automatic &&
      detail::blocksparse_decode_as_paged(problem)) {
    return {"paged"};
  }
  return detail::generated_blocksparse_kernels(problem);
}

}  // namespace tilelab
