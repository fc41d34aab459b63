// Flash paged attention forward, as vLLM's NKI kernel computes it: prefix prefill with a paged KV
// cache (block tables), continuous batching through a boolean mask, GQA. The prior context is
// consumed in large tiles gathered from the cache (online softmax merged per large tile), then the
// new tokens' own keys/values as one more tile. Schedules: schedules/tile/ (the NeuronCore tiling)
// and schedules/x86/ (fast on CPUs).
//
// Numerics (NKI-compatible): masked scores are -9984 (not -inf: a fully masked row averages V);
// with mixed_precision, q·scale, K, V and P are rounded to bf16 (round to nearest even) before the
// tensor engine and accumulated in fp32, softmax statistics are fp32, and the output is rounded to
// bf16; without it everything is fp32. The exp-sum adds P before its bf16 rounding (ScalarE reduces
// the fp32 activation). Normalization divides by the sum where the NKI kernel multiplies by
// exp(m - lse): equal up to fp32 rounding. On CPUs with AVX-512 BF16 the cpu schedule's mixed
// precision sums the same bf16 products on vdpbf16ps (exact products, fp32 sums in another
// order), which reads subnormal bf16 operands (|x| < 2^-126) as zero.
//
// The query heads sharing a kv head (the GQA group) are folded into rows, row = g · seq_q + i;
// seq_q is a multiple of 128, so a query tile never spans two heads.
//
// The cpu schedule computes, per call, the query blocks the runtime lists (query_blocks), each
// against the context large tiles its row of live_tiles lists (live_tile_count of them, in
// order), and writes its rows per task: out(d, row in tile, g · tasks + task, kv head). Which
// large tiles a block may leave out, and why that changes nothing, is
// schedules/paged/masked_tiles.hpp. The tile schedule ignores these inputs: it computes every
// query tile against every large tile and writes out in the NKI layout.
#include <cmath>
#include <limits>
#include <string>

#include "Halide.h"
#include "schedules/flash/x86.hpp"
#include "schedules/paged/default_problem.hpp"
#include "schedules/paged/kv_tiling.hpp"
#include "schedules/paged/masked_tiles.hpp"
#include "schedules/paged/schedule.hpp"
#include "schedules/paged/tile.hpp"
#include "schedules/paged/x86.hpp"
#include "schedules/tile/footprint.hpp"
#include "tilelab/detail/bf16_rounding.hpp"
#include "tilelab/detail/fp32_classes.hpp"

namespace {

using namespace Halide;

// The NKI kernel's fill for masked scores.
constexpr float kMaskedScore = -9984.0f;
// Below any score: the start of a max reduction.
constexpr float kLowest = std::numeric_limits<float>::lowest();
// A visible score that is NaN or +inf makes its row NaN, as IEEE arithmetic does. Halide compiles
// with fast-math flags (no NaN, no inf: float comparisons with them fold away) and its exp gives 0
// for NaN, so such a score is recognized from its bits and becomes this finite marker above every
// other (scores are clamped to kHighestScore), which the row's running max carries to the end,
// where the output's bits become NaN.
constexpr float kPoisoned = std::numeric_limits<float>::max();
const float kHighestScore = std::nextafter(kPoisoned, 0.0f);
using tilelab::schedules::paged::kFreeTile;
using tilelab::schedules::paged::kLog2PartitionTile;
using tilelab::schedules::paged::kPartitionTile;
using KvGatherTiling = tilelab::schedules::paged::KvGatherTiling<Expr>;

// Rounds fp32 to the nearest bf16 (ties to even, NaN kept) and back, staying in fp32 lanes.
Expr round_to_bf16(const Expr& x) {
  auto halide_select = [](const Expr& c, const Expr& a, const Expr& b) { return select(c, a, b); };
  return reinterpret<float>(
      tilelab::detail::round_fp32_bits_to_bf16(reinterpret<uint32_t>(x), halide_select));
}

Expr log2_of_power_of_two(const Expr& x) {
  return 31 - count_leading_zeros(x);
}

class PagedAttentionForward : public Generator<PagedAttentionForward> {
 public:
  // bf16 inputs and output, bf16 tensor-engine operands with fp32 accumulation; else all fp32.
  GeneratorParam<bool> mixed_precision{"mixed_precision", true};
  // "tile" (mirrors the NeuronCore tiling) or "cpu" (tuned for x86).
  GeneratorParam<std::string> schedule_name{"schedule", "cpu"};
  // Where the tile schedule's SBUF/PSUM footprint is written (empty: not computed).
  GeneratorParam<std::string> footprint_json{"footprint_json", ""};

  // Indexed by i (query token), d, h, b: NKI layout (1, n_heads, d, seq_q).
  Input<Buffer<void, 4>> query{"query"};
  // Indexed by j (new token), d, hk, b: (1, n_kv_heads, d, seq_q).
  Input<Buffer<void, 4>> key{"key"};
  // Indexed by d, j, hk, b: (1, n_kv_heads, seq_q, d).
  Input<Buffer<void, 4>> value{"value"};
  // Indexed by d, token in block, hk, block, k/v: (2, num_blocks, n_kv_heads, block_size, d).
  Input<Buffer<void, 5>> kv_cache{"kv_cache"};
  // Indexed by active block: the cache block holding prior-context tokens n·block_size + [0, bs).
  Input<Buffer<int32_t, 1>> block_tables{"block_tables"};
  // Indexed by column, i: (seq_q, context_len + seq_q), nonzero = attend; context columns
  // reordered per large tile (reorder_context_mask), then the new tokens in order.
  Input<Buffer<int32_t, 2>> mask{"mask"};
  Input<float> softmax_scale{"softmax_scale"};
  // LARGE_TILE_SZ; the runtime validates it (PagedAttentionSchedule) with the block size.
  Input<int32_t> large_tile_size{"large_tile_size"};
  // cpu schedule only. Indexed by task: the query block (kPagedCpuQueryTile query positions)
  // the task computes.
  Input<Buffer<int32_t, 1>> query_blocks{"query_blocks"};
  // cpu schedule only. Indexed by (n, task): the n-th context large tile the task computes,
  // ascending, within [first_live_tile, last_live_tile] (the large tiles the call gathers).
  Input<Buffer<int32_t, 2>> live_tiles{"live_tiles"};
  Input<int32_t> live_tile_count{"live_tile_count"};
  Input<int32_t> first_live_tile{"first_live_tile"};
  Input<int32_t> last_live_tile{"last_live_tile"};

  // tile schedule: indexed by d, i, h, b: (1, n_heads, seq_q, d). cpu schedule: indexed by d,
  // row in tile, g · tasks + task, kv head (the runtime scatters the rows).
  Output<Buffer<void, 4>> out{"out"};

  void configure() {
    const Type io_type = mixed_precision ? BFloat(16) : Float(32);
    query.set_type(io_type);
    key.set_type(io_type);
    value.set_type(io_type);
    kv_cache.set_type(io_type);
    out.set_type(io_type);
  }

  void generate() {
    // Algorithm
    const bool tile = std::string(schedule_name) == "tile";
    tilelab::generators::PagedAttentionStages s;
    s.query_tile = tile ? kPartitionTile : tilelab::schedules::kPagedCpuQueryTile;
    s.mixed_precision = mixed_precision;
    s.kv_is_f32 = !mixed_precision;
    s.bf16_products =
        !tile && mixed_precision && tilelab::schedules::target_has_bf16_dot_products(get_target());
    Var &c = s.c, &d = s.d, &ii = s.ii, &io = s.io, &hk = s.hk, &lt = s.lt;
    Var &tb = s.tb, &p = s.p, &ld = s.ld;
    const int QT = s.query_tile;
    auto kernel_round = [&](const Expr& x) { return mixed_precision ? round_to_bf16(x) : x; };

    Expr seq_q = query.dim(0).extent();
    Expr head_dim = query.dim(1).extent();
    s.head_dim = head_dim;
    Expr num_heads = query.dim(2).extent();
    Expr num_kv_heads = key.dim(2).extent();
    Expr group = num_heads / num_kv_heads;
    Expr block_size = kv_cache.dim(1).extent();
    Expr num_blocks = kv_cache.dim(3).extent();
    Expr num_active_blocks = block_tables.dim(0).extent();
    Expr lts = large_tile_size;
    Expr context_len = num_active_blocks * block_size;
    Expr num_large_tiles = context_len / lts;

    // Tiling of a large tile's gather (schedules/paged/kv_tiling.hpp), derived from the runtime
    // shapes; all powers of two, so the generated code shifts.
    const KvGatherTiling kv =
        KvGatherTiling::derived(log2_of_power_of_two(lts), log2_of_power_of_two(block_size));

    // Rows: row (ii, io) of kv head hk is query i of head hk · group + g. The cpu schedule's io
    // is g · tasks + task, the task's query block from query_blocks.
    Expr row_query, row_head;
    if (tile) {
      Expr row = io * QT + ii;
      row_query = clamp(row % seq_q, 0, seq_q - 1);
      row_head = clamp(hk * group + row / seq_q, 0, num_heads - 1);
    } else {
      Expr tasks = query_blocks.dim(0).extent();
      Expr block = clamp(query_blocks(clamp(io % tasks, 0, tasks - 1)), 0,
                         tilelab::schedules::paged::cpu_query_blocks(seq_q) - 1);
      row_query = clamp(block * QT + ii, 0, seq_q - 1);
      row_head = clamp(hk * group + io / tasks, 0, num_heads - 1);
    }
    // The context large tiles row tile io computes: lt is the position in its list (cpu) or the
    // large tile itself (tile).
    Expr context_tiles = tile ? num_large_tiles : Expr(live_tile_count);
    Expr large_tile = lt;
    if (!tile) {
      Expr tasks = query_blocks.dim(0).extent();
      Expr listed = live_tiles(clamp(lt, 0, live_tiles.dim(0).extent() - 1),
                               clamp(io % tasks, 0, live_tiles.dim(1).extent() - 1));
      large_tile = clamp(listed, first_live_tile, last_live_tile);
    }
    s.query_t(ii, d, io, hk) = kernel_round(
        cast<float>(query(row_query, clamp(d, 0, head_dim - 1), row_head, 0)) * softmax_scale);
    if (s.bf16_products) {
      // An odd head_dim's last pair is padded with 0 (never multiplied: see build_scores).
      Expr dd = 2 * s.dh + s.dp;
      s.query_pairs(s.dp, ii, s.dh, io, hk) =
          select(dd < head_dim, cast(BFloat(16), s.query_t(ii, min(dd, head_dim - 1), io, hk)),
                 cast(BFloat(16), 0.0f));
    }

    // Prior context, gathered as KvGatherTiling lays it out: partition p of load ld, token tb of
    // its piece; the reordered mask indexes the columns in the tensor engine's order.
    Expr kv_head = clamp(hk, 0, num_kv_heads - 1), dim = clamp(d, 0, head_dim - 1);
    auto cached = [&](const Expr& dim_at, const Expr& token, const Expr& partition,
                      const Expr& load, int k_or_v) {
      Expr tile_block = (lt << kv.log2_blocks_per_large_tile) + kv.block_of(load, partition);
      Expr cache_block =
          clamp(block_tables(clamp(tile_block, 0, num_active_blocks - 1)), 0, num_blocks - 1);
      Expr block_token = clamp(kv.token_in_block_of(partition, token), 0, block_size - 1);
      return kv_cache(dim_at, block_token, kv_head, cache_block, k_or_v);
    };
    s.key_loaded(d, tb, p, ld, lt, hk) = kernel_round(cast<float>(cached(dim, tb, p, ld, 0)));
    s.value_loaded(d, tb, p, ld, lt, hk) = kernel_round(cast<float>(cached(dim, tb, p, ld, 1)));
    // (Clamps tell bounds inference what the bit arithmetic guarantees.)
    Expr tiled_block = 1 << kv.log2_tiled_block_size();
    Expr loads = 1 << kv.log2_loads_per_large_tile();
    auto col_tb = [&](const Expr& col) {
      return clamp(kv.piece_token_of_column(col), 0, tiled_block - 1);
    };
    auto col_ld = [&](const Expr& col) { return clamp(kv.load_of_column(col), 0, loads - 1); };
    auto col_p = [&](const Expr& col) { return kv.partition_of_column(col); };
    s.context.key_t(c, d, lt, hk) = s.key_loaded(d, col_tb(c), col_p(c), col_ld(c), lt, hk);
    s.context.value_t(d, c, lt, hk) = s.value_loaded(d, col_tb(c), col_p(c), col_ld(c), lt, hk);

    // New tokens: K arrives transposed already, V in rows.
    auto new_token = [&](const Expr& col) { return clamp(col, 0, seq_q - 1); };
    s.active.key_t(c, d, lt, hk) = kernel_round(cast<float>(key(new_token(c), dim, kv_head, 0)));
    s.active.value_t(d, c, lt, hk) =
        kernel_round(cast<float>(value(dim, new_token(c), kv_head, 0)));

    if (s.bf16_products) {
      // K in rows and V interleaved in column pairs, read as they are (bf16 already). A pair is
      // a select of two whole rows: two dense loads and a blend, not a gather. Head dims are
      // only bounded above: they start at 0, and a lower clamp made every load a gather.
      Var &cp = s.cp, &co = s.co;
      Expr row_dim = min(d, head_dim - 1);
      auto context_row = [&](const Expr& col, int k_or_v) {
        return cached(row_dim, col_tb(col), col_p(col), col_ld(col), k_or_v);
      };
      s.context.key_rows(d, c, lt, hk) = context_row(c, 0);
      s.context.value_pairs(cp, d, co, lt, hk) =
          select(cp == 0, context_row(2 * co, 1), context_row(2 * co + 1, 1));
      s.active.key_rows(d, c, lt, hk) = key(new_token(c), row_dim, kv_head, 0);
      s.active.value_pairs(cp, d, co, lt, hk) =
          select(cp == 0, value(row_dim, new_token(2 * co), kv_head, 0),
                 value(row_dim, new_token(2 * co + 1), kv_head, 0));
    }

    // The new tokens' tile skips (fills) score blocks of min(seq_q, 512) columns that lie wholly
    // right of the query tile's first row, as the NKI kernel does; for the causal masks of
    // continuous batching nothing visible is skipped. Columns below the limit are candidates.
    s.active_limit(ii, io) = tilelab::schedules::paged::active_column_limit(row_query, seq_q);
    Expr mask_width = mask.dim(0).extent();
    auto mask_at = [&](const Expr& col) {
      return mask(clamp(col, 0, mask_width - 1), row_query) != 0;
    };

    // One key tile's pass (the NKI kernel's _flash_attention_core), in two halves: scores and
    // their max, then (given the running max) P, its sum and P·V.
    RDom rd(0, head_dim, "rd");
    // key_lt: the large tile whose K (and V) the pass reads.
    auto build_scores = [&](tilelab::generators::KeyTileStages& t, const Expr& width,
                            const Expr& key_lt, const Expr& visible) {
      if (s.bf16_products) {
        // Whole pairs of head dims on vdpbf16ps; an odd head_dim's last one is one more product.
        RDom rp(0, 2, 0, head_dim / 2, "rdp");
        t.rdp = rp.x;
        t.rd = rp.y;
        t.score_products(c, ii, lt, io, hk) = 0.0f;
        t.score_products(c, ii, lt, io, hk) +=
            cast<float>(s.query_pairs(rp.x, ii, rp.y, io, hk)) *
            cast<float>(t.key_rows(2 * rp.y + rp.x, c, key_lt, hk));
        Expr last = head_dim - 1;
        Expr odd_dim = select(head_dim % 2 == 1,
                              cast<float>(s.query_pairs(0, ii, head_dim / 2, io, hk)) *
                                  cast<float>(t.key_rows(last, c, key_lt, hk)),
                              0.0f);
        t.score(c, ii, lt, io, hk) = t.score_products(c, ii, lt, io, hk) + odd_dim;
      } else {
        t.rd = rd.x;
        t.score(c, ii, lt, io, hk) = 0.0f;
        t.score(c, ii, lt, io, hk) += s.query_t(ii, rd, io, hk) * t.key_t(c, rd, key_lt, hk);
      }
      Expr score = t.score(c, ii, lt, io, hk);
      Expr bits = reinterpret<uint32_t>(score);
      Expr poisoned = tilelab::detail::fp32_bits_is_nan(bits) ||
                      bits == Expr(tilelab::detail::kFp32PlusInfinityBits);
      t.masked(c, ii, lt, io, hk) =
          select(visible, select(poisoned, kPoisoned, min(score, kHighestScore)), kMaskedScore);
      RDom rj(0, width, "rj");
      t.rj = rj.x;
      t.block_max(ii, lt, io, hk) = kLowest;
      t.block_max(ii, lt, io, hk) = max(t.block_max(ii, lt, io, hk), t.masked(rj, ii, lt, io, hk));
    };
    auto build_probs = [&](tilelab::generators::KeyTileStages& t, const Expr& width,
                           const Expr& key_lt, const Expr& m_now) {
      t.prob_f32(c, ii, lt, io, hk) = exp(t.masked(c, ii, lt, io, hk) - m_now);
      t.prob(c, ii, lt, io, hk) = kernel_round(t.prob_f32(c, ii, lt, io, hk));
      t.prob_t(ii, c, lt, io, hk) = t.prob(c, ii, lt, io, hk);
      t.block_sum(ii, lt, io, hk) = 0.0f;
      t.block_sum(ii, lt, io, hk) += t.prob_f32(t.rj, ii, lt, io, hk);
      t.block_pv(d, ii, lt, io, hk) = 0.0f;
      if (s.bf16_products) {
        // P rounded to bf16 (as `prob`), columns in pairs (the widths are even).
        Var &cp = s.cp, &co = s.co;
        t.prob_pairs(cp, ii, co, lt, io, hk) =
            cast(BFloat(16), t.prob_f32(2 * co + cp, ii, lt, io, hk));
        RDom rp(0, 2, 0, width / 2, "rjp");
        t.rjp = rp.x;
        t.rjo = rp.y;
        t.block_pv(d, ii, lt, io, hk) += cast<float>(t.prob_pairs(rp.x, ii, rp.y, lt, io, hk)) *
                                         cast<float>(t.value_pairs(rp.x, d, rp.y, key_lt, hk));
      } else {
        t.block_pv(d, ii, lt, io, hk) +=
            t.prob_t(ii, t.rj, lt, io, hk) * t.value_t(d, t.rj, key_lt, hk);
      }
    };

    // Context tiles. The running max over tiles 0..lt is recomputed from stored tile maxima, so
    // the merge below needs one exp per (row, tile) rather than one per output element.
    // bf16 products read the mask in row vectors: transposed once per task, not per head.
    Expr context_visible = mask_at(large_tile * lts + c);
    Expr active_visible = mask_at(context_len + c);
    if (s.bf16_products) {
      s.context.visible(c, ii, lt, io) = cast<uint8_t>(context_visible);
      s.active.visible(c, ii, lt, io) = cast<uint8_t>(active_visible);
      Expr tasks = query_blocks.dim(0).extent();
      Expr task = clamp(io % tasks, 0, tasks - 1);
      context_visible = s.context.visible(c, ii, lt, task) != 0;
      active_visible = s.active.visible(c, ii, 0, task) != 0;
    }
    build_scores(s.context, lts, large_tile, context_visible);
    RDom rb(0, context_tiles, "rb");
    rb.where(rb <= lt);
    s.rb = rb.x;
    s.running_max(ii, lt, io, hk) = kLowest;
    s.running_max(ii, lt, io, hk) =
        max(s.running_max(ii, lt, io, hk), s.context.block_max(ii, rb, io, hk));
    build_probs(s.context, lts, large_tile, s.running_max(ii, lt, io, hk));
    s.rescale(ii, lt, io, hk) =
        select(lt == 0, 1.0f,
               exp(s.running_max(ii, max(lt - 1, 0), io, hk) - s.running_max(ii, lt, io, hk)));

    RDom rk(0, context_tiles, "rk");
    s.rk = rk.x;
    s.state(d, ii, io, hk) = {kLowest, 0.0f, 0.0f};
    Expr alpha = s.rescale(ii, rk, io, hk);
    s.state(d, ii, io, hk) = {
        s.running_max(ii, rk, io, hk),
        s.state(d, ii, io, hk)[1] * alpha + s.context.block_sum(ii, rk, io, hk),
        s.state(d, ii, io, hk)[2] * alpha + s.context.block_pv(d, ii, rk, io, hk)};

    // The new tokens' tile (its lt is always 0), merged last.
    build_scores(s.active, seq_q, 0, active_visible && c < s.active_limit(ii, io));
    // Left-out large tiles score -9984 everywhere: they bound the context's max from below (and
    // keep it finite when every large tile is left out).
    Expr context_max = s.state(0, ii, io, hk)[0];
    if (!tile) {
      context_max =
          select(live_tile_count < num_large_tiles, max(context_max, kMaskedScore), context_max);
    }
    s.final_max(ii, io, hk) = max(context_max, s.active.block_max(ii, 0, io, hk));
    build_probs(s.active, seq_q, 0, s.final_max(ii, io, hk));
    Expr active_alpha = exp(context_max - s.final_max(ii, io, hk));
    s.final_sum(ii, io, hk) =
        s.state(0, ii, io, hk)[1] * active_alpha + s.active.block_sum(ii, 0, io, hk);
    // Every row has a positive sum (masked scores are finite, so nothing is -inf). A poisoned
    // row's NaN is selected as bits: fast-math would fold a select of a NaN float away.
    Expr value = (s.state(d, ii, io, hk)[2] * active_alpha + s.active.block_pv(d, ii, 0, io, hk)) /
                 s.final_sum(ii, io, hk);
    s.final_out(d, ii, io, hk) = reinterpret<float>(select(s.final_max(ii, io, hk) == kPoisoned,
                                                           Expr(tilelab::detail::kFp32QuietNanBits),
                                                           reinterpret<uint32_t>(value)));

    // Back from rows to (i, h) (tile) or per task (cpu); the cast rounds to nearest even.
    Var &i = s.i, &h = s.h, &b = s.b;
    const Type out_type = mixed_precision ? BFloat(16) : Float(32);
    if (tile) {
      Expr out_row = (h % group) * seq_q + i;
      Expr out_ii = out_row % QT, out_io = out_row / QT, out_hk = h / group;
      s.out(d, i, h, b) = cast(out_type, s.final_out(d, out_ii, out_io, out_hk));
    } else {
      s.out(d, i, h, b) = cast(out_type, s.final_out(d, i, h, b));
    }
    out = s.out;

    // Schedule
    if (tile) {
      tilelab::schedules::schedule_paged_attention_tile(s, get_target());
    } else {
      tilelab::schedules::schedule_paged_attention_x86(s, get_target());
    }
  }

  // The footprint check reads the lowered pipeline (get_pipeline() is available here only).
  void schedule() {
    if (std::string(schedule_name) != "tile" || std::string(footprint_json).empty()) return;
    // Evaluated at the default problem the simulator runs, so the cross test can compare them.
    namespace paged = tilelab::schedules::paged;
    tilelab::schedules::FootprintConfig config;
    config.large_tile_size =
        static_cast<int>(tilelab::schedules::PagedAttentionTiling{}.large_tile_size);
    config.block_size = static_cast<int>(tilelab::schedules::PagedAttentionTiling{}.block_size);
    config.head_dim = static_cast<int>(paged::kDefaultHeadDim);
    config.num_heads = static_cast<int>(paged::kDefaultNumHeads);
    config.num_kv_heads = static_cast<int>(paged::kDefaultNumKvHeads);
    config.seq_q = static_cast<int>(paged::default_query_rows());
    config.context_len = static_cast<int>(paged::default_context_len());
    config.mixed_precision = mixed_precision;
    config.stages = tilelab::generators::PagedAttentionStages::tile_memory_tags();
    config.json_path = footprint_json;
    tilelab::schedules::add_tile_footprint_check(get_pipeline(), config);
  }
};

}  // namespace

HALIDE_REGISTER_GENERATOR(PagedAttentionForward, paged_attention_forward)
