// Flash attention forward: softmax(scale · q kᵀ + bias, masked) v with online softmax, written as a
// block-wise merge over key blocks (no M×N buffer). Tiling and schedule: schedules/flash/.
//
// The query heads that share a kv head (the GQA group) are folded into one row dimension per kv
// head, row = (h mod group) · M + i, so one pass over a K/V block serves the whole group; for
// decode (M = 1) this is what fills a query tile.
#include <cmath>
#include <limits>
#include <string>

#include "Halide.h"
#include "schedules/flash/tiling.hpp"
#include "schedules/flash/x86.hpp"
#include "tilelab/detail/fp32_classes.hpp"

namespace {

using namespace Halide;

// Only the mask (causal, or a bias of exactly -inf) masks a key; every other score follows IEEE
// arithmetic: NaN or +inf among a row's scores makes the row NaN, a score of -inf contributes
// exp(-inf) = 0 (and a row whose scores are all -inf is NaN, 0 / 0). Halide compiles with
// fast-math flags (no NaN, no inf: float comparisons with them fold away) and its exp gives 0 for
// NaN, so the softmax works on finite values only: each score is classified once, from its bits
// (integer compares, fp32_classes.hpp), into one of these markers, ordered so that the row's
// running max carries the worst case to the end:
//   kMasked          masked: contributes nothing (below every score);
//   kMinusInfinity   -inf: contributes nothing, but the row is not masked;
//   kPoisoned        NaN or +inf: the row's result is NaN (above every score);
//   the score, clamped to [kLowestScore, kHighestScore] (moving only the extreme floats).
constexpr float kMasked = -std::numeric_limits<float>::max();
const float kMinusInfinity = std::nextafter(kMasked, 0.0f);
const float kLowestScore = std::nextafter(kMinusInfinity, 0.0f);
constexpr float kPoisoned = std::numeric_limits<float>::max();
const float kHighestScore = std::nextafter(kPoisoned, 0.0f);
using tilelab::detail::fp32_bits_is_finite;
using tilelab::detail::fp32_bits_is_nan;
using tilelab::detail::kFp32MinusInfinityBits;
using tilelab::detail::kFp32PlusInfinityBits;
using tilelab::detail::kFp32QuietNanBits;

class FlashAttentionForward : public Generator<FlashAttentionForward> {
 public:
  GeneratorParam<Type> io_type{"io_type", Float(32)};  // q, k, v and out element type
  GeneratorParam<bool> has_bias{"has_bias", false};
  // "prefill" or "decode": the tiling of schedules/flash/tiling.hpp the runtime picks by.
  GeneratorParam<std::string> variant{"variant", "prefill"};

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

  Output<Buffer<void, 4>> out{"out"};   // indexed by d, i, h, b
  Output<Buffer<float, 3>> lse{"lse"};  // indexed by i, h, b

  void configure() {
    q.set_type(io_type);
    k.set_type(io_type);
    v.set_type(io_type);
    out.set_type(io_type);
  }

  void generate() {
    // Algorithm
    tilelab::generators::FlashAttentionStages s;
    Var &d = s.d, &jj = s.jj, &jb = s.jb, &ii = s.ii, &io = s.io, &hk = s.hk, &b = s.b;
    Var &i = s.i, &h = s.h;
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
    Expr key_c = min(key, kv_len - 1);

    s.query_t(ii, d, io, hk, b) =
        cast<float>(q(d, s.row_query(ii, io), s.row_head(ii, io, hk), b)) * scale;
    s.key_f32(d, jj, jb, hk, b) = cast<float>(k(d, key_c, hk, b));
    // Head dims past D (the schedule may round the merge up to its register tile) read column D-1.
    s.value_f32(d, jj, jb, hk, b) = cast<float>(v(min(d, head_dim - 1), key_c, hk, b));

    // Scores of one (query tile, key block), rows innermost so row statistics are vertical ops.
    if (!decode) {
      RDom rd(0, head_dim, "rd");
      s.rd = rd.x;
      s.score(ii, jj, jb, io, hk, b) = 0.0f;
      s.score(ii, jj, jb, io, hk, b) += s.query_t(ii, rd, io, hk, b) * s.key_f32(rd, jj, jb, hk, b);
    } else {
      // Lane dl of the partial sum accumulates head dims dl, dl + L, dl + 2L, ...; dims past D add
      // 0.
      const int L = s.decode_lanes;
      Var dl("dl");
      RDom rd(0, (head_dim + L - 1) / L, "rd");
      s.rd = rd.x;
      Expr dim = rd * L + dl;
      s.score_partial(dl, ii, jj, jb, io, hk, b) = 0.0f;
      s.score_partial(dl, ii, jj, jb, io, hk, b) +=
          select(dim < head_dim,
                 s.query_t(ii, min(dim, head_dim - 1), io, hk, b) *
                     s.key_f32(min(dim, head_dim - 1), jj, jb, hk, b),
                 0.0f);
      s.dl = dl;
      RDom rl(0, L, "rl");
      s.rl = rl.x;
      s.score(ii, jj, jb, io, hk, b) = 0.0f;
      s.score(ii, jj, jb, io, hk, b) += s.score_partial(rl, ii, jj, jb, io, hk, b);
    }
    s.decode = decode;
    Expr biased = s.score(ii, jj, jb, io, hk, b);
    Expr visible = key <= s.row_key_limit(ii, io);
    if (has_bias) {
      Expr bias_value = bias(key_c, s.row_query(ii, io), s.row_head(ii, io, hk), b);
      biased += bias_value;
      // A bias of -inf masks the key whatever q·k is (NaN included).
      visible = visible && reinterpret<uint32_t>(bias_value) != Expr(kFp32MinusInfinityBits);
    }
    Expr bits = reinterpret<uint32_t>(biased);
    Expr poisoned = fp32_bits_is_nan(bits) || bits == Expr(kFp32PlusInfinityBits);
    Expr classified = select(poisoned, kPoisoned,
                             select(fp32_bits_is_finite(bits),
                                    clamp(biased, kLowestScore, kHighestScore), kMinusInfinity));
    s.masked(ii, jj, jb, io, hk, b) = select(visible, classified, kMasked);

    RDom rj(0, KB, "rj");
    s.rj = rj.x;
    // Reductions over a block go through *_in_block (per row vector, kept in registers); the
    // block-indexed Funcs the merge reads are plain copies the schedule can store and slide.
    s.block_max_in_block(ii, jb, io, hk, b) = kMasked;
    s.block_max_in_block(ii, jb, io, hk, b) =
        max(s.block_max_in_block(ii, jb, io, hk, b), s.masked(ii, rj, jb, io, hk, b));
    s.block_max(ii, jb, io, hk, b) = s.block_max_in_block(ii, jb, io, hk, b);
    // Running max over blocks 0..jb. Recomputed from the stored block maxima (cheap: one vector max
    // per block and row) so that the merge below needs no exp per output element.
    RDom rb(0, (kv_len + KB - 1) / KB, "rb");
    rb.where(rb <= jb);
    s.running_max(ii, jb, io, hk, b) = kMasked;
    s.running_max(ii, jb, io, hk, b) =
        max(s.running_max(ii, jb, io, hk, b), s.block_max(ii, rb, io, hk, b));
    s.rb = rb.x;
    Expr m_now = s.running_max(ii, jb, io, hk, b);
    // Rescale of what blocks < jb accumulated: exp(m(jb-1) - m(jb)), per row.
    s.rescale(ii, jb, io, hk, b) =
        select(jb == 0, 1.0f, exp(s.running_max(ii, max(jb - 1, 0), io, hk, b) - m_now));
    // exp's argument is <= 0; the clamp keeps the polynomial away from denormals.
    Expr masked = s.masked(ii, jj, jb, io, hk, b);
    s.prob(ii, jj, jb, io, hk, b) =
        select(masked > kMinusInfinity, exp(max(masked - m_now, -80.0f)), 0.0f);
    s.block_sum_in_block(ii, jb, io, hk, b) = 0.0f;
    s.block_sum_in_block(ii, jb, io, hk, b) += s.prob(ii, rj, jb, io, hk, b);
    s.block_sum(ii, jb, io, hk, b) = s.block_sum_in_block(ii, jb, io, hk, b);
    s.block_pv(d, ii, jb, io, hk, b) = 0.0f;
    s.block_pv(d, ii, jb, io, hk, b) +=
        s.prob(ii, rj, jb, io, hk, b) * s.value_f32(d, rj, jb, hk, b);

    // Merge block rk into (m, l, o): two FMAs per element, the exps were per row.
    RDom rk(0, (kv_len + KB - 1) / KB, "rk");
    // Causal: blocks wholly right of the tile's last visible key are skipped, not masked. The
    // tile's largest query index is its last row's, unless the tile crosses into the next head.
    Expr first_row = io * QT, last_row = min(io * QT + QT - 1, rows - 1);
    Expr tile_max_i = select(first_row / q_len == last_row / q_len, last_row % q_len, q_len - 1);
    rk.where(rk * KB <= tile_max_i + causal_offset);
    s.rk = rk.x;
    s.state(d, ii, io, hk, b) = {kMasked, 0.0f, 0.0f};
    Expr alpha = s.rescale(ii, rk, io, hk, b);
    s.state(d, ii, io, hk, b) = {
        s.running_max(ii, rk, io, hk, b),
        s.state(d, ii, io, hk, b)[1] * alpha + s.block_sum(ii, rk, io, hk, b),
        s.state(d, ii, io, hk, b)[2] * alpha + s.block_pv(d, ii, rk, io, hk, b)};

    // Back from rows to (i, h). A row to which no key contributed has l == 0: out 0, lse -inf,
    // never NaN. A row whose running max is kPoisoned or kMinusInfinity: out NaN, lse NaN.
    // NaN and -inf are selected as bits: fast-math would fold a select of a NaN or inf float away.
    Expr out_row = (h % group) * q_len + i;
    auto state_at = [&](const Expr& dd) {
      return s.state(dd, out_row % QT, out_row / QT, h / group, b);
    };
    Expr m = state_at(d)[0], l = state_at(d)[1], o = state_at(d)[2];
    auto is_nan_row = [](const Expr& max) { return max == kPoisoned || max == kMinusInfinity; };
    Expr out_bits = reinterpret<uint32_t>(select(l > 0.0f, o / l, 0.0f));
    s.out(d, i, h, b) =
        cast(io_type, reinterpret<float>(select(is_nan_row(m), Expr(kFp32QuietNanBits), out_bits)));
    Expr m0 = state_at(0)[0], l0 = state_at(0)[1];
    Expr lse_bits =
        select(l0 > 0.0f, reinterpret<uint32_t>(m0 + log(l0)), Expr(kFp32MinusInfinityBits));
    s.lse(i, h, b) = reinterpret<float>(select(is_nan_row(m0), Expr(kFp32QuietNanBits), lse_bits));
    out = s.out;
    lse = s.lse;

    // Schedule
    tilelab::schedules::schedule_flash_attention_x86(s, get_target(), head_dim);
  }
};

}  // namespace

HALIDE_REGISTER_GENERATOR(FlashAttentionForward, flash_attention_forward)
