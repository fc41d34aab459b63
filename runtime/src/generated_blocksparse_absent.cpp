// No generated block-sparse kernel is built: every call takes the reference implementation.
#include "blocksparse_problem.hpp"

namespace tilelab::detail {

bool generated_blocksparse_attention(const BlockSparseProblem&) {
  return false;
}
std::optional<std::vector<std::string>> generated_blocksparse_kernels(const BlockSparseProblem&) {
  return std::nullopt;
}

}  // namespace tilelab::detail
