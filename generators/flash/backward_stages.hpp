// The stages of the flash attention backward pipeline
// (generators/flash/flash_attention_backward_generator.cpp), beside the algorithm that defines
// them; schedules/flash/x86_backward places them.
#pragma once

#include "Halide.h"

namespace tilelab::generators {

// The recomputation of one (row tile, key block) of the backward, defined once and instantiated
// per loop nest (the gradients' and the bias gradient's place their copies differently).
// Dimensions, innermost first, as the forward's (generators/flash/stages.hpp): d head dim, jj key
// within a block, jb key block, ii row within a row tile, io row tile, hk kv head, b batch; a row
// is one (query head of the group, query) pair.
struct FlashBackwardTileStages {
  Halide::Func query_t;  // (ii, d, io, hk, b) fp32 q · scale, rows innermost
  Halide::Func dout_t;   // (ii, d, io, hk, b) fp32 dout, rows innermost
  // (din, ii, dblock, io, hk, b) the same row by row, as stored, in blocks of head dims
  // (generators/flash/row_transpose.hpp): transposed into them.
  Halide::Func query_rows, dout_rows;
  Halide::Func key_f32;    // (d, jj, jb, hk, b) fp32 K block
  Halide::Func value_f32;  // (d, jj, jb, hk, b) fp32 V block
  Halide::Func row_lse;    // (ii, io, hk, b) the forward's log-sum-exp of the row
  Halide::Func row_delta;  // (ii, io, hk, b) rowsum(dout ∘ out)
  Halide::Func row_slope;  // (ii, io, hk, b) the ALiBi slope of the row's query head (options)
  Halide::Func score;      // (ii, jj, jb, io, hk, b) scale · q·k
  Halide::Func dprob;      // (ii, jj, jb, io, hk, b) dP = dout · v
  Halide::Func prob;       // (ii, jj, jb, io, hk, b) P = exp(score + bias − lse), 0 where masked
  // (ii, jj, jb, io, hk, b) dS = P ∘ (dP − delta), the gradient of the score before the bias
  // (with a softcap: times its derivative 1 − tanh², the gradient of scale · q·k)
  Halide::Func dscore;
  Halide::RVar rd_score;  // head dim (fp32) or pairs of head dims (bf16 products), for `score`
  Halide::RVar rd_dprob;  // the same, for `dprob`
  // bf16 products (bf16 inputs, CPUs with AVX-512 BF16): q and dout rows in pairs of head dims,
  // (dp, ii, dh, io, hk, b) for head dim 2·dh + dp, 0 past D; the head-dim reductions of score
  // and dprob run on them, one vdpbf16ps per pair (bf16 products are exact in fp32).
  Halide::Func query_pairs, dout_pairs;
  Halide::Func score_products;  // (ii, jj, jb, io, hk, b) Σ over whole pairs of q·k
  Halide::Func dprob_products;  // (ii, jj, jb, io, hk, b) Σ over whole pairs of dout·v
  Halide::RVar rd_score_pair, rd_dprob_pair;  // the element within a pair
};

struct FlashBackwardStages {
  FlashBackwardTileStages key_pass;       // feeds dk, dv and dq: parallel over key chunks
  FlashBackwardTileStages bias_pass;      // feeds ds (the bias gradient), when it is asked for
  Halide::Func delta{"delta"};            // (i, h, b) rowsum(dout ∘ out)
  Halide::Func row_query{"row_query"};    // (ii, io) the query index of a row
  Halide::Func row_member{"row_member"};  // (ii, io) its query head's index within the group
  Halide::Func dout_f32{"dout_f32"};      // (d, ii, io, hk, b) fp32 dout rows, head dim innermost
  Halide::Func query_f32{"query_f32"};    // (d, ii, io, hk, b) fp32 q rows (unscaled)
  // (d, jj, kb, task) Tuple(Σ Pᵀ dout, Σ dSᵀ q) over all rows: dv and dk / scale of key block
  // kb of the task's chunk.
  Halide::Func grad_kv{"grad_kv"};
  Halide::Func block_dv{"block_dv"};  // (d, jj, jb, io, hk, b) Σ over the tile's rows of P · dout
  Halide::Func block_dk{"block_dk"};  // (d, jj, jb, io, hk, b) Σ over the tile's rows of dS · q
  // (d, ii, io, task) Σ over the key blocks of the task's chunk of dS · k, accumulated in the
  // loop nest of grad_kv (computed with it), so dS is computed once for dk, dv and dq.
  Halide::Func dq_partial{"dq_partial"};
  // (d, x, task) both accumulations of a task, computed per task (their only consumer): dv of key
  // x of the task's chunk, then dk / scale of key x − chunk keys, then dq / scale of row
  // x − 2 · chunk keys.
  Halide::Func task_grads{"task_grads"};
  Halide::Func grad_q{"grad_q"};  // (d, ii, io, hk, b) Σ over key chunks of dq_partial: dq / scale
  Halide::Func block_dq{"block_dq"};  // (d, ii, jb, io, hk, b) Σ over the block's keys of dS · k
  Halide::Func dq{"dq"}, dk{"dk"}, dv{"dv"};  // (d, i, h, b), (d, j, hk, b) ×2
  Halide::Func ds{"ds"};                      // (j, row, hk, b) dS of every (row, key)
  Halide::Var d{"d"}, jj{"jj"}, jb{"jb"}, ii{"ii"}, io{"io"}, hk{"hk"}, b{"b"}, i{"i"}, h{"h"};
  Halide::Var j{"j"}, row{"row"};
  // One (key chunk, kv head, batch), numbered chunks innermost; a chunk is `chunk_blocks` key
  // blocks.
  Halide::Var task{"task"};
  Halide::Var kb{"kb"};  // a key block within its chunk
  // The (row tile, key block of the chunk) pairs reduced by grad_kv and dq_partial alike: one
  // RDom, so that their loops have the same names (compute_with fuses them). Row tile ro of
  // group rg, key block rc of the chunk; ro innermost, then rc, then rg.
  Halide::RVar ro, rc, rg;
  Halide::RVar rkc;       // key chunks, reduced by grad_q
  Halide::RVar rd_delta;  // the head dim, reduced by delta
  Halide::RVar ri;  // rows of a tile (pairs of rows: bf16_probabilities), by block_dv / block_dk
  Halide::RVar rj;  // keys of a block (pairs of keys: bf16_probabilities), by block_dq
  Halide::RVar ri_pair, rj_pair;  // bf16_probabilities: the row or key within a pair
  // bf16_probabilities: the operands of dV, dK and dQ in pairs along their reduction, bf16.
  Halide::Func prob_row_pairs{"prob_row_pairs"};      // (pair, half, jj, jb, io, hk, b) P
  Halide::Func dscore_row_pairs{"dscore_row_pairs"};  // (pair, half, jj, jb, io, hk, b) dS
  Halide::Func dout_row_pairs{"dout_row_pairs"};      // (pair, d, half, io, hk, b) dout rows
  Halide::Func query_row_pairs{"query_row_pairs"};    // (pair, d, half, io, hk, b) q rows
  Halide::Func dscore_key_pairs{"dscore_key_pairs"};  // (pair, ii, half, jb, io, hk, b) dS
  Halide::Func key_rows{"key_rows"};                  // (d, jj, jb, hk, b) K rows as stored
  Halide::Func key_pairs{"key_pairs"};                // (pair, d, half, jb, hk, b) K rows
  Halide::Var dp{"dp"}, dh{"dh"};                     // a pair of head dims: 2·dh + dp
  Halide::Var pair{"pair"}, half{"half"};             // a pair of rows or keys: 2·half + pair
  int key_block = 0, query_tile = 0;
  Halide::Expr chunk_blocks;  // key blocks per chunk (a run-time input)
  // The bias's strides across rows and query heads: both 0 when the bias is absent or broadcast
  // over them, and then a tile's rows (in the vector lanes) read one bias value per key.
  Halide::Expr bias_row_stride, bias_head_stride;
  bool io_is_f32 = false;      // inputs are fp32 already: read in place, no conversion copies
  bool bf16_products = false;  // score and dprob on bf16 dot products (FlashBackwardTileStages)
  bool bf16_probabilities = false;  // and dV, dK, dQ, on P and dS rounded to bf16
  // Score options: dS reads the score too (the softcap's derivative), so its tile is stored.
  bool score_options = false;
};

}  // namespace tilelab::generators
