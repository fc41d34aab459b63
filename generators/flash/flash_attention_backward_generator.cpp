// Flash attention backward: the gradients of out = softmax(scale · q kᵀ + bias, masked) v with
// respect to q, k, v (and the bias), recomputing P from q, k and the forward's log-sum-exp per
// (row tile, key block) as FlashAttention-2 does; no M×N buffer.
//
//   P = exp(scale · q kᵀ + bias − lse)   dV = Pᵀ dO        dP = dO Vᵀ
//   dS = P ∘ (dP − delta), delta = rowsum(dO ∘ O)         dK = scale · dSᵀ Q     dQ = scale · dS K
//
// One pass computes P, dP and dS once per (row tile, key block), parallel over (key chunk, kv
// head, batch) without atomics: dk and dv of the chunk's keys are reduced over the row tiles, and
// each task accumulates dq over its own chunk's key blocks into a partial sum of its own; the
// partial sums are then added in chunk order (deterministic, whatever the thread count).
// Rows fold the GQA group as in the forward, so a kv head's dk and dv sum over its query heads.
// With score_options (docs/attention_options.md; no bias), P is recomputed from the capped,
// ALiBi-shifted score and the window's mask, the softcap's derivative 1 − tanh² scales dS, and
// the sinks need nothing here: they are in lse (their gradient is the runtime's, from lse).
// Tiling and schedule: schedules/flash/.
#include <limits>
#include <string>

#include "Halide.h"
#include "generators/common/narrowed_output.hpp"
#include "generators/flash/backward_stages.hpp"
#include "generators/flash/online_softmax.hpp"
#include "generators/flash/row_transpose.hpp"
#include "schedules/flash/backward_tiling.hpp"
#include "schedules/flash/x86.hpp"
#include "schedules/flash/x86_backward.hpp"
#include "tilelab/detail/fp32_classes.hpp"

namespace {

using namespace Halide;

using tilelab::detail::fp32_bits_is_nan;
using tilelab::detail::fp32_bits_is_zero;
using tilelab::detail::kFp32MinusInfinityBits;

class FlashAttentionBackward : public Generator<FlashAttentionBackward> {
 public:
  GeneratorParam<Type> io_type{"io_type", Float(32)};  // q, k, v, out, dout and gradients
  // bf16 only: P and dS rounded to bf16 so that dV = Pᵀ dO, dK = dSᵀ Q and dQ = dS K run on bf16
  // dot products where the CPU has them (FlashAttention's mixed precision); false keeps them fp32.
  GeneratorParam<bool> bf16_probabilities{"bf16_probabilities", false};
  // bf16 only: q·k and dout·v on bf16 dot products where the CPU has them; false keeps every
  // product on fp32 FMAs (for CPUs whose bf16 dot products are slower: runtime/src/cpu_features).
  GeneratorParam<bool> bf16_products{"bf16_products", false};
  // The score options of docs/attention_options.md but the sinks (softcap, ALiBi, the window's
  // left edge) as run-time inputs appended after chunk_blocks, as the forward's; no bias.
  GeneratorParam<bool> score_options{"score_options", false};

  // Layouts as the forward's: (d, i, h, b) and (d, j, hk, b), head dim innermost.
  Input<Buffer<void, 4>> dout{"dout"};
  Input<Buffer<void, 4>> q{"q"};
  Input<Buffer<void, 4>> k{"k"};
  Input<Buffer<void, 4>> v{"v"};
  Input<Buffer<void, 4>> out{"out"};
  Input<Buffer<float, 3>> lse{"lse"};  // (i, h, b), from the forward
  // (j, i, h, b); broadcast dimensions are passed with stride 0 (no bias: one 0 everywhere).
  Input<Buffer<float, 4>> bias{"bias"};
  Input<float> scale{"scale"};
  // Key j is visible to query i iff j <= i + causal_offset (non-causal: pass N).
  Input<int> causal_offset{"causal_offset"};
  // Key blocks per chunk (>= 1): the keys of one task, whose dq contributions are summed in one
  // partial dq. Fewer chunks, less memory and summing; more, more parallel tasks (the runtime's
  // choice: detail::flash_backward_chunk_blocks).
  Input<int> chunk_blocks{"chunk_blocks"};

  Output<Buffer<void, 4>> dq{"dq"};  // (d, i, h, b)
  Output<Buffer<void, 4>> dk{"dk"};  // (d, j, hk, b)
  Output<Buffer<void, 4>> dv{"dv"};  // (d, j, hk, b)
  // (j, row, hk, b), row = (h mod group) · M + i: the same memory as a dense [B, Hq, M, N]. The
  // caller passes extents of 1 when it does not want the bias gradient; only that is computed.
  Output<Buffer<float, 4>> ds{"ds"};

  void configure() {
    for (auto* input : {&dout, &q, &k, &v, &out}) input->set_type(io_type);
    for (auto* output : {&dq, &dk, &dv}) output->set_type(io_type);
    if (score_options) {
      softcap = add_input<float>("softcap");  // 0 turns soft-capping off
      // By query head: the ALiBi slope (0 without ALiBi).
      alibi_slopes = add_input<Buffer<float, 1>>("alibi_slopes");
      // Query row i is at absolute position i + position_offset (ALiBi).
      position_offset = add_input<int>("position_offset");
      // Key j is visible to query i only if j >= i + window_begin_offset (the window's left edge;
      // the right edge is folded into causal_offset by the caller).
      window_begin_offset = add_input<int>("window_begin_offset");
    }
  }

  void generate() {
    // The absent bias is a single 0 read through stride-0 dims, the key dim included. (A bias
    // that varies across a tile's rows is read as a gather anyway.)
    bias.dim(0).set_stride(Expr());
    tilelab::generators::FlashBackwardStages s;
    const tilelab::schedules::flash::FlashAttentionTiling tiling =
        tilelab::schedules::flash::kBackwardTiling;
    const int KB = tiling.key_block, QT = tiling.query_tile;
    s.key_block = KB;
    s.query_tile = QT;
    s.io_is_f32 = io_type.value() == Float(32);
    s.bf16_products = tilelab::schedules::uses_bf16_products(bf16_products, io_type.value(),
                                                             /*decode=*/false, get_target());
    TILELAB_REQUIRE(!bf16_probabilities || io_type.value() == BFloat(16))
        << "bf16_probabilities: needs io_type bfloat16, got " << io_type.value();
    TILELAB_REQUIRE(!bf16_probabilities || bf16_products)
        << "bf16_probabilities: needs bf16_products, the dot products that read them";
    s.bf16_probabilities = s.bf16_products && bf16_probabilities;
    s.score_options = score_options;
    s.bias_row_stride = bias.dim(1).stride();
    s.bias_head_stride = bias.dim(2).stride();
    TILELAB_REQUIRE(KB % 2 == 0 && QT % 2 == 0)
        << "bf16 products pair keys and rows: key_block and query_tile must be even";
    Var &d = s.d, &jj = s.jj, &jb = s.jb, &ii = s.ii, &io = s.io, &hk = s.hk, &b = s.b;

    Expr head_dim = q.dim(0).extent();
    Expr q_len = q.dim(1).extent();
    Expr q_heads = q.dim(2).extent();
    Expr kv_len = k.dim(1).extent();
    Expr group = q_heads / k.dim(2).extent();
    Expr rows = group * q_len;  // rows per kv head
    Expr key_blocks = (kv_len + KB - 1) / KB;
    s.chunk_blocks = max(chunk_blocks, 1);
    Expr key_chunks = (key_blocks + s.chunk_blocks - 1) / s.chunk_blocks;
    Expr row_tiles = (rows + QT - 1) / QT;

    // Row (ii, io) of kv head hk is query `row_query` of query head `row_head`; rows past the end
    // read the last one and are masked (they must add nothing to dk and dv). The divisions are
    // computed once per row: inside the tiles, one integer division per vector lane cost more
    // than the products. The clamps give bounds inference the range of the loaded indices.
    Expr row = io * QT + ii;
    Expr row_c = min(row, rows - 1);
    s.row_query(ii, io) = row_c % q_len;
    s.row_member(ii, io) = row_c / q_len;
    auto query_of_row = [&](const Expr& within_tile) {
      return clamp(s.row_query(within_tile, io), 0, q_len - 1);
    };
    auto head_of_row = [&](const Expr& within_tile) {
      return hk * group + clamp(s.row_member(within_tile, io), 0, group - 1);
    };
    Expr row_query = query_of_row(ii);
    Expr row_head = head_of_row(ii);
    Expr key = jb * KB + jj;
    Expr key_c = min(key, kv_len - 1);
    Expr dim_c = min(d, head_dim - 1);  // schedules may round head dims up to a register tile

    // The tile's largest query index (rows of one tile may span two query heads): a key block
    // wholly right of it is skipped by both passes, not masked.
    auto tile_max_query = [&](const Expr& tile) {
      Expr first = tile * QT, last = min(tile * QT + QT - 1, rows - 1);
      return select(first / q_len == last / q_len, last % q_len, q_len - 1);
    };

    // The tile's smallest query index: a key block wholly left of its window is skipped too.
    auto tile_min_query = [&](const Expr& tile) {
      Expr first = tile * QT, last = min(tile * QT + QT - 1, rows - 1);
      return select(first / q_len == last / q_len, first % q_len, 0);
    };
    Expr softcap_on, inverse_cap;
    if (score_options) {
      softcap_on = *softcap > 0.0f;
      inverse_cap = 1.0f / *softcap;
    }

    RDom rd_delta(0, head_dim, "rd_delta");
    s.rd_delta = rd_delta.x;
    s.delta(s.i, s.h, b) = 0.0f;
    s.delta(s.i, s.h, b) +=
        cast<float>(dout(rd_delta, s.i, s.h, b)) * cast<float>(out(rd_delta, s.i, s.h, b));

    // Padding rows read as 0, so even a NaN in the last row adds nothing through them.
    s.dout_f32(d, ii, io, hk, b) =
        select(row < rows, cast<float>(dout(dim_c, row_query, row_head, b)), 0.0f);
    s.query_f32(d, ii, io, hk, b) =
        select(row < rows, cast<float>(q(dim_c, row_query, row_head, b)), 0.0f);

    // bf16 products: score = scale · Σ q·k and dprob = Σ dout·v over pairs of head dims, read
    // from q and dout rows in pairs and K and V in place; an odd D's last head dim alone.
    auto define_pair_products = [&](tilelab::generators::FlashBackwardTileStages& t,
                                    const std::string& pass) {
      t.query_pairs = Func("query_pairs_" + pass);
      t.dout_pairs = Func("dout_pairs_" + pass);
      t.score_products = Func("score_products_" + pass);
      t.dprob_products = Func("dprob_products_" + pass);
      Expr dd = 2 * s.dh + s.dp;
      Expr zero = cast(BFloat(16), 0.0f);
      t.query_pairs(s.dp, ii, s.dh, io, hk, b) =
          select(dd < head_dim, q(min(dd, head_dim - 1), row_query, row_head, b), zero);
      t.dout_pairs(s.dp, ii, s.dh, io, hk, b) =
          select(dd < head_dim, dout(min(dd, head_dim - 1), row_query, row_head, b), zero);
      RDom rs(0, 2, 0, head_dim / 2, "rd_score_" + pass);
      RDom rp(0, 2, 0, head_dim / 2, "rd_dprob_" + pass);
      t.rd_score_pair = rs.x;
      t.rd_score = rs.y;
      t.rd_dprob_pair = rp.x;
      t.rd_dprob = rp.y;
      t.score_products(ii, jj, jb, io, hk, b) = 0.0f;
      t.score_products(ii, jj, jb, io, hk, b) +=
          cast<float>(t.query_pairs(rs.x, ii, rs.y, io, hk, b)) *
          cast<float>(k(2 * rs.y + rs.x, key_c, hk, b));
      t.dprob_products(ii, jj, jb, io, hk, b) = 0.0f;
      t.dprob_products(ii, jj, jb, io, hk, b) +=
          cast<float>(t.dout_pairs(rp.x, ii, rp.y, io, hk, b)) *
          cast<float>(v(2 * rp.y + rp.x, key_c, hk, b));
      Expr last = head_dim - 1, odd = head_dim % 2 == 1;
      Expr odd_score = select(odd,
                              cast<float>(t.query_pairs(0, ii, head_dim / 2, io, hk, b)) *
                                  cast<float>(k(last, key_c, hk, b)),
                              0.0f);
      Expr odd_dprob = select(odd,
                              cast<float>(t.dout_pairs(0, ii, head_dim / 2, io, hk, b)) *
                                  cast<float>(v(last, key_c, hk, b)),
                              0.0f);
      t.score(ii, jj, jb, io, hk, b) =
          (t.score_products(ii, jj, jb, io, hk, b) + odd_score) * scale;
      t.dprob(ii, jj, jb, io, hk, b) = t.dprob_products(ii, jj, jb, io, hk, b) + odd_dprob;
    };

    // One recomputation chain per pass.
    auto define_tile = [&](tilelab::generators::FlashBackwardTileStages& t,
                           const std::string& pass) {
      auto func = [&](const char* name) { return Func(std::string(name) + "_" + pass); };
      t.query_t = func("query_t");
      t.dout_t = func("dout_t");
      t.key_f32 = func("key_f32");
      t.value_f32 = func("value_f32");
      t.row_lse = func("row_lse");
      t.row_delta = func("row_delta");
      t.score = func("score");
      t.dprob = func("dprob");
      t.prob = func("prob");
      t.dscore = func("dscore");
      t.query_rows = func("query_rows");
      t.dout_rows = func("dout_rows");
      tilelab::generators::define_row_transpose(
          t.query_t, t.query_rows, head_dim,
          [&](const Expr& dd) { return cast<float>(q(dd, row_query, row_head, b)) * scale; }, ii, d,
          io, hk, b);
      tilelab::generators::define_row_transpose(
          t.dout_t, t.dout_rows, head_dim,
          [&](const Expr& dd) { return cast<float>(dout(dd, row_query, row_head, b)); }, ii, d, io,
          hk, b);
      t.key_f32(d, jj, jb, hk, b) = cast<float>(k(d, key_c, hk, b));
      t.value_f32(d, jj, jb, hk, b) = cast<float>(v(d, key_c, hk, b));
      t.row_lse(ii, io, hk, b) = lse(row_query, row_head, b);
      t.row_delta(ii, io, hk, b) = s.delta(row_query, row_head, b);
      if (s.bf16_products) {
        define_pair_products(t, pass);
      } else {
        RDom rs(0, head_dim, "rd_score_" + pass), rp(0, head_dim, "rd_dprob_" + pass);
        t.rd_score = rs.x;
        t.rd_dprob = rp.x;
        t.score(ii, jj, jb, io, hk, b) = 0.0f;
        t.score(ii, jj, jb, io, hk, b) +=
            t.query_t(ii, rs, io, hk, b) * t.key_f32(rs, jj, jb, hk, b);
        t.dprob(ii, jj, jb, io, hk, b) = 0.0f;
        t.dprob(ii, jj, jb, io, hk, b) +=
            t.dout_t(ii, rp, io, hk, b) * t.value_f32(rp, jj, jb, hk, b);
      }
      // Only the mask (causal, lengths, padding rows, the window) and a bias of exactly -inf mask a
      // score; NaN and inf elsewhere propagate. Below e^-87 the result is not a normal float: 0.
      // The bias is tested as loaded, and the two subtractions are strict IEEE: under fast-math an
      // inf or NaN result is undefined, so testing its bits afterwards would not be reliable.
      Expr bias_value = bias(key_c, row_query, row_head, b);
      Expr visible = row < rows && key <= min(row_query + causal_offset, kv_len - 1) &&
                     reinterpret<uint32_t>(bias_value) != Expr(kFp32MinusInfinityBits);
      Expr score = t.score(ii, jj, jb, io, hk, b);
      // d(softcapped score) / d(score): 1 without options.
      Expr cap_derivative = 1.0f;
      if (score_options) {
        // docs/attention_options.md, in its order: softcap, ALiBi, then the window's left edge.
        t.row_slope = func("row_slope");
        t.row_slope(ii, io, hk, b) = (*alibi_slopes)(row_head);
        Expr capped = tilelab::generators::softcapped(score, *softcap, inverse_cap);
        Expr tanh_value = capped * inverse_cap;
        cap_derivative = select(softcap_on, 1.0f - tanh_value * tanh_value, 1.0f);
        score = select(softcap_on, capped, score) +
                t.row_slope(ii, io, hk, b) * cast<float>(key - (row_query + *position_offset));
        visible = visible && key >= row_query + *window_begin_offset;
      }
      Expr exponent = strict_float(score + bias_value - t.row_lse(ii, io, hk, b));
      // Halide compiles with fast-math flags (no NaN, no inf), so classes are read from the bits
      // (detail/fp32_classes.hpp), NaN first: `NaN < -87` may come out true, and Halide's exp
      // turns NaN into 0.
      t.prob(ii, jj, jb, io, hk, b) =
          select(!visible, 0.0f, fp32_bits_is_nan(reinterpret<uint32_t>(exponent)), exponent,
                 exponent < -87.0f, 0.0f, exp(exponent));
      // A masked pair contributes nothing, whatever dP holds: the same as a skipped block.
      Expr p = t.prob(ii, jj, jb, io, hk, b);
      t.dscore(ii, jj, jb, io, hk, b) = select(
          fp32_bits_is_zero(reinterpret<uint32_t>(p)), 0.0f,
          p * (t.dprob(ii, jj, jb, io, hk, b) - t.row_delta(ii, io, hk, b)) * cap_derivative);
    };
    define_tile(s.key_pass, "kpass");
    define_tile(s.bias_pass, "bpass");

    // A task is one (key chunk, kv head, batch), numbered chunks innermost; its (row tile, key
    // block) pairs, row tiles innermost, only those where the tile sees the block. dk, dv and dq
    // all reduce over them, in one loop nest (the schedule computes grad_kv with dq_partial).
    Expr kv_heads = k.dim(2).extent();
    auto task_of = [&](const Expr& chunk, const Expr& kv_head, const Expr& batch) {
      return (batch * kv_heads + kv_head) * key_chunks + chunk;
    };
    Var& task = s.task;
    // Without %: bounds inference keeps a single task's chunk and head to single values through
    // divisions, not through a modulus by a run-time value; the clamps (identities) bound them
    // over all tasks.
    Expr task_batch = task / (key_chunks * kv_heads);
    Expr task_head = clamp(task / key_chunks - task_batch * kv_heads, 0, kv_heads - 1);
    Expr task_chunk = clamp(task - task / key_chunks * key_chunks, 0, key_chunks - 1);
    // Row tiles in groups (kBackwardGroupTiles): a task passes its key blocks over one group at a
    // time, so that the group's q, dout and partial dq stay in cache. A constant, so bounds
    // inference sees single tiles.
    const int GT = tilelab::schedules::flash::kBackwardGroupTiles;
    RDom tile_block(0, GT, 0, s.chunk_blocks, 0, (row_tiles + GT - 1) / GT, "tile_block");
    Expr pair_block = task_chunk * s.chunk_blocks + tile_block.y;
    Expr pair_tile = tile_block.z * GT + tile_block.x;
    Expr pair_is_live = pair_tile < row_tiles && pair_block < key_blocks &&
                        pair_block * KB <= tile_max_query(pair_tile) + causal_offset;
    if (score_options) {
      pair_is_live = pair_is_live &&
                     pair_block * KB + KB - 1 >= tile_min_query(pair_tile) + *window_begin_offset;
    }
    tile_block.where(pair_is_live);
    s.ro = tile_block.x;
    s.rc = tile_block.y;
    s.rg = tile_block.z;

    // dk and dv, per key block, reduced over the row tiles that see the block.
    {
      const tilelab::generators::FlashBackwardTileStages& t = s.key_pass;
      s.block_dv(d, jj, jb, io, hk, b) = 0.0f;
      s.block_dk(d, jj, jb, io, hk, b) = 0.0f;
      if (s.bf16_probabilities) {
        // Rows pair up: P and dS in bf16, (pair, half, jj) for row 2·half + pair (the layout of
        // the fp32 tiles), dout and q rows interleaved in pairs, (pair, d, half).
        Var &pair = s.pair, &half = s.half;
        s.prob_row_pairs(pair, half, jj, jb, io, hk, b) =
            cast(BFloat(16), t.prob(2 * half + pair, jj, jb, io, hk, b));
        s.dscore_row_pairs(pair, half, jj, jb, io, hk, b) =
            cast(BFloat(16), t.dscore(2 * half + pair, jj, jb, io, hk, b));
        // Each from two whole rows (as key_pairs): indexed by the pair's own row, every lane of a
        // vector over (pair, d) was a load of its own (no 16-bit gathers).
        Expr zero = cast(BFloat(16), 0.0f);
        Func dout_rows("dout_rows_bf16"), query_rows("query_rows_bf16");
        dout_rows(d, ii, io, hk, b) = select(row < rows, dout(dim_c, row_query, row_head, b), zero);
        query_rows(d, ii, io, hk, b) = select(row < rows, q(dim_c, row_query, row_head, b), zero);
        s.dout_row_pairs(pair, d, half, io, hk, b) = select(
            pair == 0, dout_rows(d, 2 * half, io, hk, b), dout_rows(d, 2 * half + 1, io, hk, b));
        s.query_row_pairs(pair, d, half, io, hk, b) = select(
            pair == 0, query_rows(d, 2 * half, io, hk, b), query_rows(d, 2 * half + 1, io, hk, b));
        RDom ri(0, 2, 0, QT / 2, "ri");
        s.ri_pair = ri.x;
        s.ri = ri.y;
        s.block_dv(d, jj, jb, io, hk, b) +=
            cast<float>(s.prob_row_pairs(ri.x, ri.y, jj, jb, io, hk, b)) *
            cast<float>(s.dout_row_pairs(ri.x, d, ri.y, io, hk, b));
        s.block_dk(d, jj, jb, io, hk, b) +=
            cast<float>(s.dscore_row_pairs(ri.x, ri.y, jj, jb, io, hk, b)) *
            cast<float>(s.query_row_pairs(ri.x, d, ri.y, io, hk, b));
      } else {
        RDom ri(0, QT, "ri");
        s.ri = ri.x;
        s.block_dv(d, jj, jb, io, hk, b) +=
            t.prob(ri, jj, jb, io, hk, b) * s.dout_f32(d, ri, io, hk, b);
        s.block_dk(d, jj, jb, io, hk, b) +=
            t.dscore(ri, jj, jb, io, hk, b) * s.query_f32(d, ri, io, hk, b);
      }
      Var& kb = s.kb;
      const RVar& rc = s.rc;
      // compute_with fuses loops of one kind only: the row tile and key block are reduction
      // loops in both Funcs, so neither is a plain (pure) index of the left-hand side (here the
      // min is the identity; in dq_partial it also bounds the rows written to the row tiles).
      s.grad_kv(d, jj, kb, task) = {0.0f, 0.0f};
      Expr kb_of_pair = min(rc, s.chunk_blocks - 1);
      Expr dv_of_pair = s.block_dv(d, jj, pair_block, pair_tile, task_head, task_batch);
      Expr dk_of_pair = s.block_dk(d, jj, pair_block, pair_tile, task_head, task_batch);
      s.grad_kv(d, jj, kb_of_pair, task) = {s.grad_kv(d, jj, kb_of_pair, task)[0] + dv_of_pair,
                                            s.grad_kv(d, jj, kb_of_pair, task)[1] + dk_of_pair};
    }

    // dq, from the same dS: per row tile, reduced over the key blocks of a chunk that the tile
    // sees, then over the chunks.
    {
      const tilelab::generators::FlashBackwardTileStages& t = s.key_pass;
      s.block_dq(d, ii, jb, io, hk, b) = 0.0f;
      if (s.bf16_probabilities) {
        // Keys pair up: dS in bf16, (pair, ii, half), and K rows interleaved, (pair, d, half),
        // each from two whole rows (as the forward's V).
        Var &pair = s.pair, &half = s.half;
        s.dscore_key_pairs(pair, ii, half, jb, io, hk, b) =
            cast(BFloat(16), t.dscore(ii, 2 * half + pair, jb, io, hk, b));
        s.key_rows(d, jj, jb, hk, b) = k(dim_c, key_c, hk, b);
        s.key_pairs(pair, d, half, jb, hk, b) = select(
            pair == 0, s.key_rows(d, 2 * half, jb, hk, b), s.key_rows(d, 2 * half + 1, jb, hk, b));
        RDom rj(0, 2, 0, KB / 2, "rj");
        s.rj_pair = rj.x;
        s.rj = rj.y;
        s.block_dq(d, ii, jb, io, hk, b) +=
            cast<float>(s.dscore_key_pairs(rj.x, ii, rj.y, jb, io, hk, b)) *
            cast<float>(s.key_pairs(rj.x, d, rj.y, jb, hk, b));
      } else {
        RDom rj(0, KB, "rj");
        s.rj = rj.x;
        s.block_dq(d, ii, jb, io, hk, b) +=
            t.dscore(ii, rj, jb, io, hk, b) * t.key_f32(dim_c, rj, jb, hk, b);
      }
      s.dq_partial(d, ii, io, task) = 0.0f;
      s.dq_partial(d, ii, min(pair_tile, row_tiles - 1), task) +=
          s.block_dq(d, ii, pair_block, pair_tile, task_head, task_batch);
    }

    // Each task's sums, gathered in one Func per task so that both accumulations are computed
    // per task, in one loop (their only consumer): x < chunk_keys is dv of key x of the chunk,
    // then dk / scale of key x - chunk_keys, then dq / scale of row x - 2 · chunk_keys. The
    // clamps keep each read's bounds to its own part.
    {
      Var x("x");
      Expr chunk_keys = s.chunk_blocks * KB;
      Expr dv_key = min(x, chunk_keys - 1);
      Expr dk_key = clamp(x - chunk_keys, 0, chunk_keys - 1);
      Expr task_row = clamp(x - 2 * chunk_keys, 0, row_tiles * QT - 1);
      s.task_grads(d, x, task) =
          select(x < chunk_keys, s.grad_kv(d, dv_key % KB, dv_key / KB, task)[0],
                 x < 2 * chunk_keys, s.grad_kv(d, dk_key % KB, dk_key / KB, task)[1],
                 s.dq_partial(d, task_row % QT, task_row / QT, task));
      auto grad_of_key = [&](int which) {
        return s.task_grads(d, which * chunk_keys + s.j % chunk_keys,
                            task_of(s.j / chunk_keys, hk, b));
      };
      s.dv(d, s.j, hk, b) =
          tilelab::generators::narrowed_output(io_type, grad_of_key(0), get_target());
      s.dk(d, s.j, hk, b) =
          tilelab::generators::narrowed_output(io_type, grad_of_key(1) * scale, get_target());
      RDom rkc(0, key_chunks, "rkc");
      s.rkc = rkc.x;
      s.grad_q(d, ii, io, hk, b) = 0.0f;
      s.grad_q(d, ii, io, hk, b) +=
          s.task_grads(d, 2 * chunk_keys + io * QT + ii, task_of(rkc, hk, b));
      Expr out_row = (s.h % group) * q_len + s.i;
      s.dq(d, s.i, s.h, b) = tilelab::generators::narrowed_output(
          io_type, s.grad_q(d, out_row % QT, out_row / QT, s.h / group, b) * scale, get_target());
    }

    // The bias gradient dS, written only where the caller's ds buffer asks for it.
    {
      const tilelab::generators::FlashBackwardTileStages& t = s.bias_pass;
      s.ds(s.j, s.row, hk, b) = t.dscore(s.row % QT, s.j % KB, s.j / KB, s.row / QT, hk, b);
    }

    dq = s.dq;
    dk = s.dk;
    dv = s.dv;
    ds = s.ds;

    tilelab::schedules::schedule_flash_attention_backward_x86(s, get_target(), head_dim);
  }

 private:
  Input<float>* softcap = nullptr;
  Input<Buffer<float, 1>>* alibi_slopes = nullptr;
  Input<int>* position_offset = nullptr;
  Input<int>* window_begin_offset = nullptr;
};

}  // namespace

HALIDE_REGISTER_GENERATOR(FlashAttentionBackward, flash_attention_backward)
