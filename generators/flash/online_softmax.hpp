// The online softmax over key blocks, shared by every forward attention generator (dense flash
// attention in flash_attention_generator.cpp, block-sparse in generators/blocksparse/): how a
// score is classified, the block-wise merge into (running max, running sum, unnormalized out), and
// how a finished row becomes out and lse. A generator defines the score and the stages that feed
// it (query_t, key_f32, value_f32, score, what is visible); everything after is defined here.
#pragma once

#include <cmath>
#include <functional>
#include <limits>
#include <span>

#include "Halide.h"
#include "generators/flash/stages.hpp"
#include "tilelab/detail/exp_nonpositive.hpp"
#include "tilelab/detail/fp32_classes.hpp"
#include "tilelab/error.hpp"

namespace tilelab::generators {

// Only the mask (the caller's visibility, or a bias of exactly -inf) masks a key; every other
// score follows IEEE arithmetic: NaN or +inf among a row's scores makes the row NaN, a score of
// -inf contributes exp(-inf) = 0 (and a row whose scores are all -inf is NaN, 0 / 0). Halide
// compiles with fast-math flags (no NaN, no inf: float comparisons with them fold away) and its exp
// gives 0 for NaN, so the softmax works on finite values only: each score is classified once, from
// its bits (integer compares, fp32_classes.hpp), into one of these markers, ordered so that the
// row's running max carries the worst case to the end:
//   kMasked          masked: contributes nothing (below every score);
//   kMinusInfinity   -inf: contributes nothing, but the row is not masked;
//   kPoisoned        NaN or +inf: the row's result is NaN (above every score);
//   the score, clamped to [kLowestScore, kHighestScore] (moving only the extreme floats).
struct ScoreMarkers {
  static constexpr float kMasked = -std::numeric_limits<float>::max();
  static constexpr float kPoisoned = std::numeric_limits<float>::max();
  static float minus_infinity() { return std::nextafter(kMasked, 0.0f); }
  static float lowest_score() { return std::nextafter(minus_infinity(), 0.0f); }
  static float highest_score() { return std::nextafter(kPoisoned, 0.0f); }
};

// The classified score (ScoreMarkers) of `biased` (score + bias) where `visible`, else kMasked.
inline Halide::Expr classify_score(const Halide::Expr& biased, const Halide::Expr& visible) {
  using namespace Halide;
  using S = ScoreMarkers;
  // One test for "not finite" (NaN or ±inf), then -inf apart: fewer vector ops per score than
  // testing NaN, +inf and finiteness separately.
  Expr bits = reinterpret<uint32_t>(biased);
  Expr not_finite = !detail::fp32_bits_is_finite(bits);
  Expr marker =
      select(bits == Expr(detail::kFp32MinusInfinityBits), S::minus_infinity(), S::kPoisoned);
  Expr classified =
      select(not_finite, marker, clamp(biased, S::lowest_score(), S::highest_score()));
  return select(visible, classified, S::kMasked);
}

// cap · tanh(score / cap) for cap > 0 (logit soft-capping, docs/attention_options.md), as IEEE
// says: NaN stays NaN, ±inf becomes ±cap. tanh(u) for u = |score / cap| (clamped to 10, where
// fp32 tanh is 1) is u + u³·P(u²) below 0.625 (P a degree-4 least-squares fit of
// (tanh(u)/u - 1)/u² on [0, 0.625]: 1.3 ulp at most, measured in fp32 on 200001 points) and
// 1 - 2 / (e^(2u) + 1) above (no cancellation there: the result is above 0.55); the sign is
// copied back. Computed from bits where fast-math would fold NaN and inf away.
inline Halide::Expr softcapped(const Halide::Expr& score, const Halide::Expr& cap,
                               const Halide::Expr& inverse_cap) {
  using namespace Halide;
  Expr bits = reinterpret<uint32_t>(score);
  Expr sign = bits & Expr(0x80000000u);
  Expr u = min(reinterpret<float>((bits & Expr(0x7fffffffu))) * inverse_cap, 10.0f);
  Expr w = u * u;
  Expr p = -0.005704042501747608f;
  for (float c :
       {0.020637862384319305f, -0.05373915657401085f, 0.133314311504364f, -0.3333328068256378f}) {
    p = p * w + c;
  }
  Expr small = u + u * w * p;
  Expr large = 1.0f - 2.0f / (exp(2.0f * u) + 1.0f);
  Expr capped = cap * select(u < 0.625f, small, large);
  Expr capped_bits = reinterpret<uint32_t>(capped) | sign;
  return reinterpret<float>(select(detail::fp32_bits_is_nan(bits), bits, capped_bits));
}

// e^x for x in [-87, 0] (the callers clamp; NaN and inf are classified before), as
// tilelab/detail/exp_nonpositive.hpp describes, in about half the vector ops of Halide's exp, whose
// rounding to integers ran on ymm halves on AVX-512 targets. `for_bf16`: the degree-4 polynomial
// and ln2 in one part, for probabilities rounded to bf16 next.
inline Halide::Expr exp_nonpositive(const Halide::Expr& x, bool for_bf16) {
  using namespace Halide;
  using E = detail::ExpNonpositive;
  Expr n = cast<int32_t>(x * E::kLog2E);
  Expr whole = cast<float>(n);
  Expr r =
      for_bf16 ? x - whole * E::kLn2 : strict_float((x - whole * E::kLn2High) - whole * E::kLn2Low);
  const std::span<const float> coefficients =
      for_bf16 ? std::span<const float>(E::kDegree4) : std::span<const float>(E::kDegree6);
  Expr p = coefficients[0];
  for (float c : coefficients.subspan(1)) p = p * r + c;
  return reinterpret<float>(reinterpret<int32_t>(p) + (n << 23));
}

// Bounds a score's reduction `dims` (over head dims, or their pairs, `extent` of them) to none in a
// block past s.tile_last_key. Such a block reduces no key (define_online_softmax), but a
// split_state merge visits it and computes one register tile of its scores; with this bound (it
// loads nothing, so Halide makes it the loop's) that tile reduces nothing. Causal B1 H16 S512
// D128 fp32 on Zen 4, one thread: 2% less time. Only there, and without a bias (set
// s.bias_row_stride first): the other merges skip those blocks, and the bound's test, which stays
// in the loop, spilled registers in the score loops of the other merges and of the bias kernels.
inline void skip_scores_past_tile(const FlashAttentionStages& s, Halide::RDom& rd,
                                  const Halide::RVar& dims, const Halide::Expr& extent) {
  if (!s.split_state || !s.tile_last_key.defined() || s.bias_row_stride.defined()) return;
  rd.where(dims < Halide::select(s.jb * s.key_block <= s.tile_last_key, extent, 0));
}

// Defines s.score(ii, jj, jb, io, hk, b) = Σ_d query_t · key_f32 (query_t carries the scale).
// Prefill: rows innermost, so the row statistics that follow are vertical ops. Decode
// (s.decode): per-lane partial sums with the head dim in s.decode_lanes vector lanes, then one
// horizontal sum per score; dims past head_dim add 0.
inline void define_scores(FlashAttentionStages& s, const Halide::Expr& head_dim) {
  using namespace Halide;
  Var &jj = s.jj, &jb = s.jb, &ii = s.ii, &io = s.io, &hk = s.hk, &b = s.b;
  if (!s.decode) {
    RDom rd(0, head_dim, "rd");
    skip_scores_past_tile(s, rd, rd.x, head_dim);
    s.rd = rd.x;
    s.score(ii, jj, jb, io, hk, b) = 0.0f;
    s.score(ii, jj, jb, io, hk, b) += s.query_t(ii, rd, io, hk, b) * s.key_f32(rd, jj, jb, hk, b);
    return;
  }
  const int L = s.decode_lanes;
  Var dl("dl");
  RDom rd(0, (head_dim + L - 1) / L, "rd");
  s.rd = rd.x;
  Expr dim = rd * L + dl;
  Expr dim_c = min(dim, head_dim - 1);
  s.score_partial(dl, ii, jj, jb, io, hk, b) = 0.0f;
  s.score_partial(dl, ii, jj, jb, io, hk, b) += select(
      dim < head_dim, s.query_t(ii, dim_c, io, hk, b) * s.key_f32(dim_c, jj, jb, hk, b), 0.0f);
  s.dl = dl;
  RDom rl(0, L, "rl");
  s.rl = rl.x;
  s.score(ii, jj, jb, io, hk, b) = 0.0f;
  s.score(ii, jj, jb, io, hk, b) += s.score_partial(rl, ii, jj, jb, io, hk, b);
}

// Defines s.score = scale · Σ query_bf16 · key_bf16 for s.bf16_products: bf16 × bf16 products are
// exact in fp32, so the reduction (vdpbf16ps: two products per fp32 lane, added in fp32) rounds
// only the sums, like the fp32 path; the scale is applied to the sum, so q is never rounded.
// Whole pairs of head dims are reduced in pairs (rdp within a pair, rd over pairs), reading K in
// place; an odd D's last head dim is one more product per score.
inline void define_scores_bf16(FlashAttentionStages& s, const Halide::Expr& head_dim,
                               const Halide::Expr& scale) {
  using namespace Halide;
  Var &jj = s.jj, &jb = s.jb, &ii = s.ii, &io = s.io, &hk = s.hk, &b = s.b;
  RDom rd(0, 2, 0, head_dim / 2, "rd");
  skip_scores_past_tile(s, rd, rd.y, head_dim / 2);
  s.rdp = rd.x;
  s.rd = rd.y;
  s.score_products(ii, jj, jb, io, hk, b) = 0.0f;
  s.score_products(ii, jj, jb, io, hk, b) +=
      cast<float>(s.query_bf16(rd.x, ii, rd.y, io, hk, b)) *
      cast<float>(s.key_bf16(2 * rd.y + rd.x, jj, jb, hk, b));
  Expr last = head_dim - 1;
  Expr odd_dim = select(head_dim % 2 == 1,
                        cast<float>(s.query_bf16(0, ii, head_dim / 2, io, hk, b)) *
                            cast<float>(s.key_bf16(last, jj, jb, hk, b)),
                        0.0f);
  s.score(ii, jj, jb, io, hk, b) = (s.score_products(ii, jj, jb, io, hk, b) + odd_dim) * scale;
}

// Defines the bf16 operands in pairs and the scores on them (define_scores_bf16), from a
// generator's element reads: `query_at(d)` is q of row (ii, io, hk, b) at head dim d < D,
// `key_at(d)` K of key (jj, jb, hk, b) at d < D, `value_at(d)` the V row of key (jj, jb, hk, b)
// at d (0 <= d, clamped by the caller where the merge's rounding reads past D). q pads an odd D
// with a zero (not a clamped column: 0 · inf would be NaN). V's key pairs are interleaved from
// whole rows: clamping each key of a pair would make every load a gather, and so would an index
// that mixes the pair into the vector lanes; a select of the two rows is two dense loads and a
// blend.
inline void define_bf16_operands(FlashAttentionStages& s, const Halide::Expr& head_dim,
                                 const Halide::Expr& scale,
                                 const std::function<Halide::Expr(const Halide::Expr&)>& query_at,
                                 const std::function<Halide::Expr(const Halide::Expr&)>& key_at,
                                 const std::function<Halide::Expr(const Halide::Expr&)>& value_at) {
  using namespace Halide;
  Var &d = s.d, &jj = s.jj, &jb = s.jb, &ii = s.ii, &io = s.io, &hk = s.hk, &b = s.b;
  Expr dd = 2 * s.dh + s.dp;
  s.query_bf16(s.dp, ii, s.dh, io, hk, b) =
      select(dd < head_dim, query_at(min(dd, head_dim - 1)), cast(BFloat(16), 0.0f));
  s.key_bf16(d, jj, jb, hk, b) = key_at(d);  // read where d < D only (define_scores_bf16)
  s.value_rows(d, jj, jb, hk, b) = value_at(d);
  s.value_bf16(s.jp, d, s.jo, jb, hk, b) = select(s.jp == 0, s.value_rows(d, 2 * s.jo, jb, hk, b),
                                                  s.value_rows(d, 2 * s.jo + 1, jb, hk, b));
  define_scores_bf16(s, head_dim, scale);
}

// Defines, from s.masked (the classified scores), the block statistics, the probabilities, the
// per-block P·V and the running state s.state, merged over key blocks 0 .. num_blocks - 1 in order.
// With s.tile_last_key, the reductions over a block stop at that key's group of kKeyGroup keys (a
// causal tile's diagonal), and blocks past it reduce nothing. `block_is_live(rk)`, when given, says
// which blocks the merge visits (a predicate on the pure vars and rk; Halide turns it into a loop
// bound only when it loads nothing, and not in a split_state merge); the blocks it skips must be a
// suffix of first_block .. num_blocks - 1. `first_block`, when given (a function of the pure vars),
// is where the merge and the running max start: every key of the blocks before it is masked for
// every row of the tile (a sliding window's left edge), so they change nothing.
inline void define_online_softmax(
    FlashAttentionStages& s, const Halide::Expr& num_blocks,
    const std::function<Halide::Expr(const Halide::Expr&)>& block_is_live,
    const Halide::Expr& first_block = Halide::Expr()) {
  using namespace Halide;
  using S = ScoreMarkers;
  Var &d = s.d, &jj = s.jj, &jb = s.jb, &ii = s.ii, &io = s.io, &hk = s.hk, &b = s.b;

  // Keys are reduced in groups of G: a causal tile's last block stops at the group of the tile's
  // last visible key, and a block it does not reach reduces nothing. `last_group` (of block jb)
  // bounds the groups with a where clause, which trims the reductions' loops; their operands are
  // read at groups clamped to it as well, because bounds inference takes an RDom's box whatever
  // its predicate: only so are the scores and probabilities of the groups past it not computed.
  TILELAB_REQUIRE(s.key_block % kKeyGroup == 0)
      << "key_block: a multiple of " << kKeyGroup << ", got " << s.key_block;
  const Expr& tile_last_key = s.tile_last_key;
  const int G = tile_last_key.defined() ? kKeyGroup : s.key_block;
  Expr last_group = tile_last_key.defined() ? (tile_last_key - jb * s.key_block) / G : Expr();
  auto reached = [&](const Expr& group) {
    return last_group.defined() ? max(min(group, last_group), 0) : group;
  };
  // The index within a group of `size`, for the scores and probabilities of a split_state merge,
  // which visits every block: in a block the tile does not reach (last_group < 0) their box then
  // holds one element instead of a group. Not for V, whose box may be taken over a whole call
  // (value_bf16 at root): there a negative index would widen it.
  auto within = [&](const Expr& index, int size) {
    return last_group.defined() && s.split_state ? min(index, size - 1 + size * min(last_group, 0))
                                                 : index;
  };
  RDom rj_groups(0, G, 0, s.key_block / G, "rj");
  if (last_group.defined()) rj_groups.where(rj_groups.y <= last_group);
  s.rj = rj_groups.x;
  s.rjg = rj_groups.y;
  Expr rj = reached(rj_groups.y) * G + within(rj_groups.x, G);
  Expr rj_value = reached(rj_groups.y) * G + rj_groups.x;  // the same key where the loop runs
  // Reductions over a block go through *_in_block (per row vector, kept in registers); the
  // block-indexed Funcs the merge reads are plain copies the schedule can store and slide.
  s.block_max_in_block(ii, jb, io, hk, b) = S::kMasked;
  s.block_max_in_block(ii, jb, io, hk, b) =
      max(s.block_max_in_block(ii, jb, io, hk, b), s.masked(ii, rj, jb, io, hk, b));
  s.block_max(ii, jb, io, hk, b) = s.block_max_in_block(ii, jb, io, hk, b);
  // Running max over blocks 0..jb. Recomputed from the stored block maxima (cheap: one vector max
  // per block and row) so that the merge below needs no exp per output element.
  RDom rb(0, num_blocks, "rb");
  rb.where(rb <= jb);
  if (first_block.defined()) rb.where(rb >= first_block);
  s.running_max(ii, jb, io, hk, b) = S::kMasked;
  s.running_max(ii, jb, io, hk, b) =
      max(s.running_max(ii, jb, io, hk, b), s.block_max(ii, rb, io, hk, b));
  s.rb = rb.x;
  Expr m_now = s.running_max(ii, jb, io, hk, b);
  // Rescale of what blocks < jb accumulated: exp(m(jb-1) - m(jb)), per row (at first_block,
  // m(jb-1) is a max over no block, kMasked, and the state it rescales is still 0).
  s.rescale(ii, jb, io, hk, b) =
      select(jb == 0, 1.0f, exp(s.running_max(ii, max(jb - 1, 0), io, hk, b) - m_now));
  // exp's argument is <= 0; the clamp keeps the polynomial away from denormals.
  Expr masked = s.masked(ii, jj, jb, io, hk, b);
  s.prob(ii, jj, jb, io, hk, b) =
      select(masked > S::minus_infinity(),
             exp_nonpositive(max(masked - m_now, -80.0f), s.bf16_products), 0.0f);
  s.block_sum_in_block(ii, jb, io, hk, b) = 0.0f;
  s.block_sum_in_block(ii, jb, io, hk, b) += s.prob(ii, rj, jb, io, hk, b);
  s.block_sum(ii, jb, io, hk, b) = s.block_sum_in_block(ii, jb, io, hk, b);
  s.block_pv(d, ii, jb, io, hk, b) = 0.0f;
  if (s.bf16_products) {
    // P rounded to bf16 (round to nearest even) before P·V, as FlashAttention's mixed precision
    // does; the block sum above stays fp32. Keys pair up like the head dims of the scores.
    Var &jp = s.jp, &jo = s.jo;
    s.prob_bf16(jp, ii, jo, jb, io, hk, b) =
        cast(BFloat(16), s.prob(ii, 2 * jo + jp, jb, io, hk, b));
    TILELAB_REQUIRE(s.key_block % 2 == 0)
        << "key_block: bf16 products pair the keys of a block, got " << s.key_block;
    RDom rp(0, 2, 0, G / 2, 0, s.key_block / G, "rp");
    if (last_group.defined()) rp.where(rp.z <= last_group);
    s.rjp = rp.x;
    s.rjo = rp.y;
    s.rjpg = rp.z;
    Expr pair = reached(rp.z) * (G / 2) + within(rp.y, G / 2);
    Expr pair_value = reached(rp.z) * (G / 2) + rp.y;
    s.block_pv(d, ii, jb, io, hk, b) += cast<float>(s.prob_bf16(rp.x, ii, pair, jb, io, hk, b)) *
                                        cast<float>(s.value_bf16(rp.x, d, pair_value, jb, hk, b));
  } else {
    s.block_pv(d, ii, jb, io, hk, b) +=
        s.prob(ii, rj, jb, io, hk, b) * s.value_f32(d, rj_value, jb, hk, b);
  }

  // Merge block rk into (m, l, o): two FMAs per element, the exps were per row. With
  // s.split_state, one FMA per element and (m, l) per row (row_stats, out_sum).
  RDom rk(0, num_blocks, "rk");
  if (block_is_live) rk.where(block_is_live(rk));
  if (first_block.defined()) rk.where(rk >= first_block);
  s.rk = rk.x;
  Expr alpha = s.rescale(ii, rk, io, hk, b);
  if (s.split_state) {
    s.row_stats(ii, io, hk, b) = {S::kMasked, 0.0f};
    s.row_stats(ii, io, hk, b) = {
        s.running_max(ii, rk, io, hk, b),
        s.row_stats(ii, io, hk, b)[1] * alpha + s.block_sum(ii, rk, io, hk, b)};
    s.out_sum(d, ii, io, hk, b) = 0.0f;
    s.out_sum(d, ii, io, hk, b) =
        s.out_sum(d, ii, io, hk, b) * alpha + s.block_pv(d, ii, rk, io, hk, b);
    Tuple row = s.row_stats(ii, io, hk, b);
    s.state(d, ii, io, hk, b) = {row[0], row[1], s.out_sum(d, ii, io, hk, b)};
    return;
  }
  s.state(d, ii, io, hk, b) = {S::kMasked, 0.0f, 0.0f};
  s.state(d, ii, io, hk, b) = {
      s.running_max(ii, rk, io, hk, b),
      s.state(d, ii, io, hk, b)[1] * alpha + s.block_sum(ii, rk, io, hk, b),
      s.state(d, ii, io, hk, b)[2] * alpha + s.block_pv(d, ii, rk, io, hk, b)};
}

// A finished row: out (fp32) from its state (m, l, o) at one head dim, lse from (m, l). A row to
// which no key contributed has l == 0: out 0, lse -inf, never NaN. A row whose running max is
// kPoisoned or minus_infinity(): out NaN, lse NaN. NaN and -inf are selected as bits: fast-math
// would fold a select of a NaN or inf float away.
inline Halide::Expr row_is_nan(const Halide::Expr& m) {
  return m == ScoreMarkers::kPoisoned || m == ScoreMarkers::minus_infinity();
}
// `inverse_l`, when given, is 1 / l computed once per row: a multiply per element instead of a
// division (within one rounding of o / l).
inline Halide::Expr normalized_out(const Halide::Expr& m, const Halide::Expr& l,
                                   const Halide::Expr& o,
                                   const Halide::Expr& inverse_l = Halide::Expr()) {
  using namespace Halide;
  Expr quotient = inverse_l.defined() ? o * inverse_l : o / l;
  Expr out_bits = reinterpret<uint32_t>(select(l > 0.0f, quotient, 0.0f));
  return reinterpret<float>(select(row_is_nan(m), Expr(detail::kFp32QuietNanBits), out_bits));
}
inline Halide::Expr row_lse(const Halide::Expr& m, const Halide::Expr& l) {
  using namespace Halide;
  Expr lse_bits =
      select(l > 0.0f, reinterpret<uint32_t>(m + log(l)), Expr(detail::kFp32MinusInfinityBits));
  return reinterpret<float>(select(row_is_nan(m), Expr(detail::kFp32QuietNanBits), lse_bits));
}

// A finished row whose softmax denominator also holds e^(sink - m) (docs/attention_options.md): a
// sink of -inf adds nothing (the row finishes as above), NaN or +inf makes the row NaN; a finite
// sink also turns a row whose scores were all -inf (0 / 0 without it) into 0. Tuple(lse, scale)
// with out = select(l > 0, o · scale, 0) (normalized_out with inverse_l = scale), and
// row_is_nan_with_sink says which rows are NaN instead.
inline Halide::Expr sink_counts(const Halide::Expr& sink) {
  using namespace Halide;
  return detail::fp32_bits_is_finite(reinterpret<uint32_t>(sink));
}
inline Halide::Expr row_is_nan_with_sink(const Halide::Expr& m, const Halide::Expr& sink) {
  using namespace Halide;
  Expr bits = reinterpret<uint32_t>(sink);
  Expr sink_is_nan_or_plus_inf = !sink_counts(sink) && bits != Expr(detail::kFp32MinusInfinityBits);
  return m == ScoreMarkers::kPoisoned || sink_is_nan_or_plus_inf ||
         (m == ScoreMarkers::minus_infinity() && !sink_counts(sink));
}
inline Halide::Tuple finish_row_with_sink(const Halide::Expr& m, const Halide::Expr& l,
                                          const Halide::Expr& sink) {
  using namespace Halide;
  // exp of an argument <= 0, exactly 0 where fp32 underflows (no clamp bends the result).
  auto exp_or_zero = [](const Expr& x) { return select(x < -87.0f, 0.0f, exp(max(x, -87.0f))); };
  Expr saw_key = l > 0.0f;
  Expr top = select(saw_key, max(m, sink), sink);
  Expr alpha = select(saw_key, exp_or_zero(m - top), 0.0f);
  Expr total = l * alpha + exp_or_zero(sink - top);
  Expr lse_bits = select(sink_counts(sink), reinterpret<uint32_t>(top + log(total)),
                         reinterpret<uint32_t>(row_lse(m, l)));
  Expr lse = reinterpret<float>(
      select(row_is_nan_with_sink(m, sink), Expr(detail::kFp32QuietNanBits), lse_bits));
  return {lse, select(sink_counts(sink), alpha / total, 1.0f / l)};
}
inline Halide::Expr normalized_out_with_sink(const Halide::Expr& m, const Halide::Expr& l,
                                             const Halide::Expr& o, const Halide::Expr& sink,
                                             const Halide::Expr& scale) {
  using namespace Halide;
  Expr out_bits = reinterpret<uint32_t>(select(l > 0.0f, o * scale, 0.0f));
  return reinterpret<float>(
      select(row_is_nan_with_sink(m, sink), Expr(detail::kFp32QuietNanBits), out_bits));
}

}  // namespace tilelab::generators
