// Block-sparse attention forward over packed variable-length sequences: for each task (query rows
// of one sequence inside one layout row block, for one group of query heads), online softmax over
// only the key blocks the task's CSR row of the layout lists; the layout is a run-time input. The
// online softmax, the score classification and the schedule of the block loop are the dense
// forward's (generators/flash/online_softmax.hpp, schedules/flash/x86).
//
// The runtime (runtime/src/generated_blocksparse.cpp) builds the task list and calls the kernel
// once per number of live key tiles, passing it as the block loop's extent: Halide cannot bound a
// loop by a per-task value loaded from memory (a predicate that loads is tested per tile after the
// tile's stages are computed), and a scalar extent means the tiles a task skips are never computed.
// Each call writes its tasks' rows to a task-indexed output the runtime scatters to (token, head).
//
// The stages' dimensions are the dense forward's with b = task; io and hk have extent 1. A task's
// rows (ii) are (head of the group, query) pairs: the runtime folds a GQA group of F = Hq / Hkv
// query heads into a task, so one pass over a K/V tile serves the group (decode: a tile of F
// rows), when its heads share their blocks; otherwise F = 1. (Over the union of different blocks,
// a row's masked keys would still meet its p·v as 0 · v, NaN where v is not finite.)
#include <string>

#include "Halide.h"
#include "generators/common/narrowed_output.hpp"
#include "generators/flash/online_softmax.hpp"
#include "generators/flash/row_transpose.hpp"
#include "schedules/flash/blocksparse_tasks.hpp"
#include "schedules/flash/x86.hpp"

namespace {

using namespace Halide;

using Field = tilelab::schedules::flash::BlockSparseTaskField;

class BlockSparseAttentionForward : public Generator<BlockSparseAttentionForward> {
 public:
  GeneratorParam<Type> io_type{"io_type", Float(32)};  // q, k, v and out element type
  // "prefill" or "decode": the tiling of schedules/flash/tiling.hpp the runtime picks by.
  GeneratorParam<std::string> variant{"variant", "prefill"};
  // bf16 prefill on bf16 dot products with P rounded to bf16, where the target has them (as the
  // dense forward's bf16_products).
  GeneratorParam<bool> bf16_products{"bf16_products", false};

  Input<Buffer<void, 3>> q{"q"};             // (d, h, token): [total_q, Hq, D]
  Input<Buffer<void, 3>> k{"k"};             // (d, hk, token): [total_k, Hkv, D]
  Input<Buffer<void, 3>> v{"v"};             //
  Input<Buffer<int32_t, 2>> tasks{"tasks"};  // (field, task)
  // The key blocks each task visits, sorted: task t's start at its column_begin field.
  Input<Buffer<int32_t, 1>> columns{"columns"};
  Input<int> block_size{"block_size"};
  Input<int> live_tiles{"live_tiles"};      // key tiles every task of this call visits
  Input<int> folded_heads{"folded_heads"};  // F: query heads per task (1 or Hq / Hkv)
  Input<bool> causal{"causal"};
  Input<float> scale{"scale"};

  // (d, row, task): row ii of a task is query ii % rows of head head_group·F + ii / rows; rows
  // past rows·F repeat the last one.
  Output<Buffer<void, 3>> out{"out"};

  void configure() {
    q.set_type(io_type);
    k.set_type(io_type);
    v.set_type(io_type);
    out.set_type(io_type);
  }

  void generate() {
    tilelab::generators::FlashAttentionStages s;
    Var &d = s.d, &jj = s.jj, &jb = s.jb, &ii = s.ii, &io = s.io, &hk = s.hk, &b = s.b;
    const tilelab::schedules::flash::FlashAttentionTiling tiling =
        tilelab::schedules::flash::blocksparse_tiling_of_variant(std::string(variant));
    const int KT = tiling.key_block;
    s.key_block = KT;
    s.query_tile = tiling.query_tile;
    s.value_is_f32 = io_type.value() == Float(32);
    s.decode = tiling.decode;
    s.decode_lanes = get_target().natural_vector_size<float>();
    s.bf16_products = tilelab::schedules::uses_bf16_products(bf16_products, io_type.value(),
                                                             s.decode, get_target());
    // Each task's key tiles come from its own blocks: V pairs are made per (task, tile).
    s.value_pairs_shared_by_tiles = false;

    Expr head_dim = q.dim(0).extent();
    Expr q_heads = q.dim(1).extent();
    Expr group = q_heads / k.dim(1).extent();
    // A layout block spans `tiles_per_block` key tiles of KT keys; the last may be partial.
    Expr tiles_per_block = (block_size + KT - 1) / KT;

    auto field = [&](Field f) { return tasks(static_cast<int>(f), b); };
    Expr rows = field(Field::rows);
    Expr row_in_task = min(ii, rows * folded_heads - 1);
    Expr row = row_in_task % rows;
    Expr first_head = field(Field::head_group) * folded_heads;
    Func row_token("row_token"), row_head("row_head"), row_key_limit("row_key_limit");
    Func tile_first_key("tile_first_key");
    row_token(ii, b) = clamp(field(Field::query_token) + row, 0, q.dim(2).extent() - 1);
    row_head(ii, b) = clamp(first_head + row_in_task / rows, 0, q_heads - 1);
    Expr k_len = field(Field::key_count);
    // The last key (position in the sequence) the row sees.
    row_key_limit(ii, b) =
        select(causal, min(field(Field::query_position) + row, k_len - 1), k_len - 1);

    // Key tile jb of the task: tile jb % tiles_per_block of block columns(column_begin + jb /
    // tiles_per_block); masked past the block's end and past the row's last key.
    Expr column_entry =
        clamp(field(Field::column_begin) + jb / tiles_per_block, 0, columns.dim(0).extent() - 1);
    Expr column = columns(column_entry);
    tile_first_key(jb, b) = column * block_size + (jb % tiles_per_block) * KT;
    Expr key_in_block = (jb % tiles_per_block) * KT + jj;
    Expr key = tile_first_key(jb, b) + jj;
    // A tile that runs past its block's end or the sequence's last key reads that block's last
    // key instead (absent blocks are never read), and its V there is 0 so that the padding adds
    // exactly nothing (0 · NaN would be NaN).
    Expr is_key = key_in_block < block_size && key < k_len;
    Expr block_last_key = min(column * block_size + block_size, k_len) - 1;
    Expr key_token =
        clamp(field(Field::key_token) + clamp(key, 0, block_last_key), 0, k.dim(2).extent() - 1);
    Expr kv_head = clamp(first_head / group, 0, k.dim(1).extent() - 1);

    tilelab::generators::define_row_transpose(
        s.query_t, s.query_rows, head_dim,
        [&](const Expr& dd) {
          return cast<float>(q(dd, row_head(ii, b), row_token(ii, b))) * scale;
        },
        ii, d, io, hk, b);
    s.key_f32(d, jj, jb, hk, b) = cast<float>(k(d, kv_head, key_token));
    s.value_f32(d, jj, jb, hk, b) =
        select(is_key, cast<float>(v(min(d, head_dim - 1), kv_head, key_token)), 0.0f);
    if (s.bf16_products) {
      // V is 0 past the block's keys, like value_f32.
      tilelab::generators::define_bf16_operands(
          s, head_dim, scale,
          [&](const Expr& dd) { return q(dd, row_head(ii, b), row_token(ii, b)); },
          [&](const Expr& dd) { return k(dd, kv_head, key_token); },
          [&](const Expr& dd) {
            return select(is_key, v(min(dd, head_dim - 1), kv_head, key_token),
                          cast(BFloat(16), 0.0f));
          });
    } else {
      tilelab::generators::define_scores(s, head_dim);
    }
    Expr visible = is_key && key <= row_key_limit(ii, b);
    s.masked(ii, jj, jb, io, hk, b) =
        tilelab::generators::classify_score(s.score(ii, jj, jb, io, hk, b), visible);
    tilelab::generators::define_online_softmax(s, live_tiles, {});

    auto state_at = [&](const Expr& dd) { return s.state(dd, ii, 0, 0, b); };
    Func out_f("out_f");
    out_f(d, ii, b) = tilelab::generators::narrowed_output(
        io_type,
        tilelab::generators::normalized_out(state_at(d)[0], state_at(d)[1], state_at(d)[2]),
        get_target());
    out = out_f;
    // One row per tile row: the state's row loop then has a constant extent to unroll.
    out.dim(1).set_bounds(0, tiling.query_tile);

    // Schedule: the dense forward's block loop, then the rows out, parallel over tasks.
    const int VL = get_target().natural_vector_size<float>();
    const LoopLevel task(out_f, b);
    tilelab::schedules::schedule_online_softmax_x86(s, get_target(), head_dim, task);
    row_token.compute_at(task);
    row_head.compute_at(task);
    row_key_limit.compute_at(task);
    tile_first_key.compute_at(s.state, s.rk);
    out_f.parallel(b).vectorize(d, VL, TailStrategy::GuardWithIf);
  }
};

}  // namespace

HALIDE_REGISTER_GENERATOR(BlockSparseAttentionForward, blocksparse_attention_forward)
