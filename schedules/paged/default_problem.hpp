// The default paged-attention problem: the batch `tilelab sim paged-attention` simulates, the
// tile schedule's footprint is evaluated at, and bench/paged runs (through
// tilelab.sim.default_batch()). Plain C++.
#pragma once

#include <array>
#include <cstdint>

namespace tilelab::schedules::paged {

struct DefaultRequest {
  std::int64_t query_len, context_len;
};

// 4 prefill requests with context, then 12 decode requests (one new token each): 500 + 12 = 512
// query rows (4 tiles); contexts of whole 32-token blocks summing to 16384 tokens = 8 large tiles
// of 2048.
inline constexpr std::array<DefaultRequest, 16> kDefaultRequests = {{{160, 2048},
                                                                     {96, 1024},
                                                                     {128, 3072},
                                                                     {116, 512},
                                                                     {1, 512},
                                                                     {1, 1024},
                                                                     {1, 768},
                                                                     {1, 640},
                                                                     {1, 896},
                                                                     {1, 1152},
                                                                     {1, 384},
                                                                     {1, 1280},
                                                                     {1, 640},
                                                                     {1, 768},
                                                                     {1, 896},
                                                                     {1, 768}}};
inline constexpr std::int64_t kDefaultNumHeads = 32;
inline constexpr std::int64_t kDefaultNumKvHeads = 8;
inline constexpr std::int64_t kDefaultHeadDim = 128;

constexpr std::int64_t default_query_rows() {
  std::int64_t rows = 0;
  for (const DefaultRequest& r : kDefaultRequests) rows += r.query_len;
  return rows;
}
constexpr std::int64_t default_context_len() {
  std::int64_t tokens = 0;
  for (const DefaultRequest& r : kDefaultRequests) tokens += r.context_len;
  return tokens;
}
static_assert(default_query_rows() == 512 && default_context_len() == 16384);

}  // namespace tilelab::schedules::paged
