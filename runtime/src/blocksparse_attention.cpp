// blocksparse_attention: validate, then dispatch to the generated kernels or the reference.
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
  return detail::generated_blocksparse_kernels(detail::validate_blocksparse_attention(
      q, k, v, layout, cu_seqlens_q, cu_seqlens_k, out, options));
}

}  // namespace tilelab
