// Built when TILELAB_BUILD_KERNELS is OFF: no generated kernels exist, so every call takes the
// reference implementation.
#include "attention_problem.hpp"

namespace tilelab::detail {

const char* generated_flash_attention_kernel(const AttentionProblem&) {
  return nullptr;
}
bool generated_flash_attention(const AttentionProblem&) {
  return false;
}

}  // namespace tilelab::detail

namespace tilelab::detail {

bool generated_flash_attention_backward_runs(const AttentionBackwardProblem&) {
  return false;
}
bool generated_flash_attention_backward(const AttentionBackwardProblem&, const TensorView*) {
  return false;
}

}  // namespace tilelab::detail
