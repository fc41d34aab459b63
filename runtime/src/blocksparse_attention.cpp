// blocksparse_attention: validate, then dispatch to the paged kernel (decode), the generated
// kernels or the reference.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "blocksparse_problem.hpp"
#include "tilelab/error.hpp"

namespace tilelab {

namespace {

// implementation="generated" on a call no generated kernel covers.
void require_generated_covers(bool covered, const TensorView& q) {
  TILELAB_REQUIRE(covered) << "implementation: 'generated' does not cover this call ("
                           << q.describe()
                           << "); no generated block-sparse kernel covers it (or none was built); "
                              "use 'automatic' or 'reference'";
}

}  // namespace

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
      require_generated_covers(detail::generated_blocksparse_attention(problem), q);
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
  switch (options.implementation) {
    case Implementation::reference:
      return {};
    case Implementation::generated: {
      std::optional<std::vector<std::string>> names =
          detail::generated_blocksparse_kernels(problem);
      require_generated_covers(names.has_value(), q);
      return *std::move(names);
    }
    case Implementation::automatic:
      if (detail::blocksparse_decode_as_paged(problem)) return {"paged"};
      return detail::generated_blocksparse_kernels(problem).value_or(std::vector<std::string>{});
  }
  return {};
}

}  // namespace tilelab
