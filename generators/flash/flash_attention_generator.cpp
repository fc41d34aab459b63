// Flash attention forward: softmax(scale · q kᵀ + bias, masked) v with online softmax, written as a
// block-wise merge over key blocks (no M×N buffer). Tiling and schedule: schedules/flash/.
//
// The query heads that share a kv head (the GQA group) are folded into one row dimension per kv
// head, row = (h mod group) · M + i, so one pass over a K/V block serves the whole group; for
// decode (M = 1) this is what fills a query tile. The outputs are indexed by that row too, so that
// each query tile is written where it is computed (the runtime passes views in that layout).
#include <string>

#include "Halide.h"
#include "generators/common/narrowed_output.hpp"
#include "generators/flash/online_softmax.hpp"
#include "generators/flash/row_transpose.hpp"
#include "schedules/flash/tiling.hpp"
#include "schedules/flash/x86.hpp"
#include "tilelab/detail/fp32_classes.hpp"

namespace {

using namespace Halide;

using tilelab::detail::kFp32MinusInfinityBits;
using tilelab::generators::classify_score;

class FlashAttentionForward : public Generator<FlashAttentionForward> {
 public:
  GeneratorParam<Type> io_type{"io_type", Float(32)};  // q, k, v and out element type
  GeneratorParam<bool> has_bias{"has_bias", false};
  // A tiling of schedules/flash/tiling.hpp by name ("prefill", "prefill_wide", "prefill_wide_tall",
  // "decode"; tiling_of_variant), which the runtime picks by.
  GeneratorParam<std::string> variant{"variant", "prefill"};
  // bf16 prefill: q·k and P·V on bf16 dot products with P rounded to bf16 (FlashAttention's mixed
  // precision), on targets that have them (AVX-512 BF16); elsewhere, and when false, P stays fp32
  // and the products run on fp32 FMAs.
  GeneratorParam<bool> bf16_products{"bf16_products", false};
  // Prefill with the score options of docs/attention_options.md (softcap, ALiBi, sliding window,
  // sinks) as run-time inputs, appended after causal_offset; no bias.
  GeneratorParam<bool> score_options{"score_options", false};

  // Indexed by d, i, h, b (head dim innermost).
  Input<Buffer<void, 4>> q{"q"};
  // Indexed by d, j, hk, b; query head h reads kv head h / (Hq / Hkv).
  Input<Buffer<void, 4>> k{"k"};
  Input<Buffer<void, 4>> v{"v"};
  // Indexed by j, i, h, b; broadcast dimensions are passed with stride 0. Ignored without has_bias.
  Input<Buffer<float, 4>> bias{"bias"};
  Input<float> scale{"scale"};
  // Key j is visible to query i iff j <= i + causal_offset (non-causal: pass N).
  Input<int> causal_offset{"causal_offset"};

  // Indexed by d, row, hk, b: out (io_type), and lse (fp32), whose buffer's d dim has stride 0 (a
  // Tuple's buffers share their dims; one value per row).
  Output<Func> out{"out", 4};

  void configure() {
    q.set_type(io_type);
    k.set_type(io_type);
    v.set_type(io_type);
    if (score_options) {
      // 0 turns soft-capping off.
      softcap = add_input<float>("softcap");
      // Indexed by query head: the ALiBi slope (0 without ALiBi) and the sink (-inf without).
      alibi_slopes = add_input<Buffer<float, 1>>("alibi_slopes");
      sinks = add_input<Buffer<float, 1>>("sinks");
      // Query row i is at absolute position i + position_offset (ALiBi).
      position_offset = add_input<int>("position_offset");
      // Key j is visible to query i only if j >= i + window_begin_offset (the window's left edge;
      // its right edge is folded into causal_offset by the caller).
      window_begin_offset = add_input<int>("window_begin_offset");
    }
  }

  void generate() {
    // Algorithm
    tilelab::generators::FlashAttentionStages s;
    Var &d = s.d, &jj = s.jj, &jb = s.jb, &ii = s.ii, &io = s.io, &hk = s.hk, &b = s.b;
    const tilelab::schedules::flash::FlashAttentionTiling tiling =
        tilelab::schedules::flash::tiling_of_variant(std::string(variant));
    const bool decode = tiling.decode;
    const int KB = tiling.key_block, QT = tiling.query_tile;
    // Partial sums of a decode score fill one native vector: wider would take more registers
    // than the target has for the QT × 4 accumulators (AVX2: 16 ymm).
    s.decode_lanes = get_target().natural_vector_size<float>();
    s.key_block = KB;
    s.query_tile = QT;
    s.value_is_f32 = io_type.value() == Float(32);
    s.bf16_products = tilelab::schedules::uses_bf16_products(bf16_products, io_type.value(), decode,
                                                             get_target());
    s.operands_at_root = score_options;
    s.split_state = tiling.split_state;
    TILELAB_REQUIRE(!score_options || (!has_bias && !decode))
        << "score_options: a prefill variant without bias only";

    Expr head_dim = q.dim(0).extent();
    Expr q_len = q.dim(1).extent();
    Expr kv_len = k.dim(1).extent();
    Expr group = q.dim(2).extent() / k.dim(2).extent();
    Expr rows = group * q_len;  // rows per kv head

    // Row (ii, io) of kv head hk is query i of query head h; rows past the end read the last one.
    Expr row = min(io * QT + ii, rows - 1);
    // (The clamps only tell bounds inference what the arithmetic already guarantees.)
    s.row_query(ii, io) = clamp(row % q_len, 0, q_len - 1);
    s.row_head(ii, io, hk) = clamp(hk * group + row / q_len, 0, q.dim(2).extent() - 1);
    // The last key row (ii, io) sees (causal and length limits folded into one bound).
    s.row_key_limit(ii, io) = min(s.row_query(ii, io) + causal_offset, kv_len - 1);
    Expr key = jb * KB + jj;
    // Keys right of the tile's last visible key are skipped, not masked, from the group of
    // kKeyGroup keys after it (decode tiles: from the block after it): the causal diagonal, or the
    // last key there is, which a last block that kv_len cuts short stops at too. The tile's largest
    // query index is its last row's, unless the tile crosses into the next head.
    Expr first_row = io * QT, last_row = min(io * QT + QT - 1, rows - 1);
    Expr one_head = first_row / q_len == last_row / q_len;
    // Written without % or select (last_row % q_len in one head, q_len - 1 across two), so that
    // bounds inference, which bounds x % n by n - 1, sizes the tile's scores to its keys.
    Expr tile_max_i = min(last_row - (first_row / q_len) * q_len, q_len - 1);
    Expr tile_last_key = min(tile_max_i + causal_offset, kv_len - 1);
    if (!decode) s.tile_last_key = tile_last_key;
    // Clamped below too: the scores of a block a causal tile does not reach are bounded at a key
    // before it (define_online_softmax), where one register tile reduces no head dim.
    Expr key_c = clamp(key, 0, kv_len - 1);

    tilelab::generators::define_row_transpose(
        s.query_t, s.query_rows, head_dim,
        [&](const Expr& dd) {
          return cast<float>(q(dd, s.row_query(ii, io), s.row_head(ii, io, hk), b)) * scale;
        },
        ii, d, io, hk, b);
    s.key_f32(d, jj, jb, hk, b) = cast<float>(k(d, key_c, hk, b));
    // Head dims past D (the schedule may round the merge up to its register tile) read column D-1.
    s.value_f32(d, jj, jb, hk, b) = cast<float>(v(min(d, head_dim - 1), key_c, hk, b));

    s.decode = decode;
    if (has_bias) {
      s.bias_row_stride = bias.dim(1).stride();
      s.bias_head_stride = bias.dim(2).stride();
    }
    if (s.bf16_products) {
      tilelab::generators::define_bf16_operands(
          s, head_dim, scale,
          [&](const Expr& dd) { return q(dd, s.row_query(ii, io), s.row_head(ii, io, hk), b); },
          [&](const Expr& dd) { return k(dd, key_c, hk, b); },
          [&](const Expr& dd) { return v(min(dd, head_dim - 1), key_c, hk, b); });
    } else {
      tilelab::generators::define_scores(s, head_dim);
    }
    Expr biased = s.score(ii, jj, jb, io, hk, b);
    Expr visible = key <= s.row_key_limit(ii, io);
    if (has_bias) {
      // Read directly where the bias is broadcast over rows, else through its transposed copy:
      // the schedule specializes `masked` on the row stride, which drops one side of the select
      // and, in the broadcast case, the copy with it.
      Expr bias_direct = bias(key_c, s.row_query(ii, io), s.row_head(ii, io, hk), b);
      s.bias_rows(jj, ii, jb, io, hk, b) = bias_direct;
      s.bias_t(ii, jj, jb, io, hk, b) = s.bias_rows(jj, ii, jb, io, hk, b);
      Expr bias_value =
          select(s.bias_row_stride == 0, bias_direct, s.bias_t(ii, jj, jb, io, hk, b));
      biased += bias_value;
      // A bias of -inf masks the key whatever q·k is (NaN included).
      visible = visible && reinterpret<uint32_t>(bias_value) != Expr(kFp32MinusInfinityBits);
    }
    Expr softcap_on;
    if (score_options) {
      // docs/attention_options.md, in its order: softcap, ALiBi, then the window's left edge.
      Expr cap = *softcap;
      softcap_on = cap > 0.0f;
      biased = select(softcap_on, tilelab::generators::softcapped(biased, cap, 1.0f / cap), biased);
      s.row_slope(ii, io, hk) = (*alibi_slopes)(s.row_head(ii, io, hk));
      s.row_sink(ii, io, hk) = (*sinks)(s.row_head(ii, io, hk));
      s.row_key_first(ii, io) = s.row_query(ii, io) + *window_begin_offset;
      Expr position = s.row_query(ii, io) + *position_offset;
      biased += s.row_slope(ii, io, hk) * cast<float>(key - position);
      visible = visible && key >= s.row_key_first(ii, io);
    }
    s.masked(ii, jj, jb, io, hk, b) = classify_score(biased, visible);

    // A window's left edge: blocks wholly left of the tile's first row's window are skipped too.
    Expr first_block;
    if (score_options) {
      Expr tile_min_i = select(one_head, first_row % q_len, 0);
      first_block = max(tile_min_i + *window_begin_offset, 0) / KB;
    }
    tilelab::generators::define_online_softmax(
        s, (kv_len + KB - 1) / KB, [&](const Expr& rk) { return rk * KB <= tile_last_key; },
        first_block);

    // Finished rows: out per column, and the row's lse and 1 / l once per row.
    Tuple first_column = s.state(0, ii, io, hk, b);
    Tuple state = s.state(d, ii, io, hk, b);
    if (score_options) {
      Expr sink = s.row_sink(ii, io, hk);
      s.row_lse_and_scale(ii, io, hk, b) =
          tilelab::generators::finish_row_with_sink(first_column[0], first_column[1], sink);
      Tuple finished_row = s.row_lse_and_scale(ii, io, hk, b);
      s.out_rows(d, ii, io, hk, b) = {tilelab::generators::normalized_out_with_sink(
                                          state[0], state[1], state[2], sink, finished_row[1]),
                                      finished_row[0]};
    } else {
      s.row_lse_and_scale(ii, io, hk, b) = {
          tilelab::generators::row_lse(first_column[0], first_column[1]), 1.0f / first_column[1]};
      Tuple finished_row = s.row_lse_and_scale(ii, io, hk, b);
      s.out_rows(d, ii, io, hk, b) = {
          tilelab::generators::normalized_out(state[0], state[1], state[2], finished_row[1]),
          finished_row[0]};
    }
    Tuple finished = s.out_rows(d, s.row % QT, s.row / QT, hk, b);
    s.out(d, s.row, hk, b) = {
        tilelab::generators::narrowed_output(io_type, finished[0], get_target()), finished[1]};
    out = s.out;
    s.out.output_buffers()[1].dim(0).set_stride(0);

    // Schedule
    tilelab::schedules::schedule_flash_attention_x86(s, get_target(), head_dim);
    // Soft-capping costs about as much per score as the q·k of 16 head dims: only when asked.
    if (score_options) s.masked.specialize(softcap_on);
  }

 private:
  Input<float>* softcap = nullptr;
  Input<Buffer<float, 1>>* alibi_slopes = nullptr;
  Input<Buffer<float, 1>>* sinks = nullptr;
  Input<int>* position_offset = nullptr;
  Input<int>* window_begin_offset = nullptr;
};

}  // namespace

HALIDE_REGISTER_GENERATOR(FlashAttentionForward, flash_attention_forward)
