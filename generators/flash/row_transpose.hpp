// A query tile's rows (q, or dout in the backward) as read and transposed, rows innermost, for the
// products that take rows in the vector lanes; schedules/flash/x86_shared.hpp
// (schedule_row_transpose) places it.
#pragma once

#include <functional>

#include "Halide.h"
#include "schedules/flash/tiling.hpp"

namespace tilelab::generators {

// Defines `by_row(din, ii, dblock, io, hk, b)`: the row (ii, io, hk, b) at head dim
// d = dblock · kRowTransposeHeadDims + din, read by `row_at(d)` for d < D (past D: at D - 1, which
// the transpose's tail never stores). Blocks of head dims outermost: one block of every row of the
// tile is one dense vector. And `transposed(ii, d, io, hk, b)`, the same values with rows
// innermost.
inline void define_row_transpose(Halide::Func transposed, Halide::Func by_row,
                                 const Halide::Expr& head_dim,
                                 const std::function<Halide::Expr(const Halide::Expr&)>& row_at,
                                 const Halide::Var& ii, const Halide::Var& d, const Halide::Var& io,
                                 const Halide::Var& hk, const Halide::Var& b) {
  using namespace Halide;
  constexpr int kBlock = schedules::flash::kRowTransposeHeadDims;
  Var din("din"), dblock("dblock");
  by_row(din, ii, dblock, io, hk, b) = row_at(min(dblock * kBlock + din, head_dim - 1));
  transposed(ii, d, io, hk, b) = by_row(d % kBlock, ii, d / kBlock, io, hk, b);
}

}  // namespace tilelab::generators
