// Block-sparse attention forward over packed variable-length sequences: for each query block,
// online softmax over only the key blocks its CSR row of the layout lists (the layout is a run-time
// input). The online softmax, the score classification and the schedule of the block loop are
// the dense forward's (generators/flash/online_softmax.hpp, schedules/flash/x86).
//
// Work comes as a task list built by the runtime (runtime/src/generated_blocksparse.cpp): a task
// is up to QT / F query rows of one sequence inside one layout row block, for F query heads: the
// stages' dimensions are the dense forward's with b = task, hk = the group of F query heads
// hk·F .. hk·F + F - 1, and rows (ii) = (head of the group, query) pairs; io has extent 1. The
// runtime folds a GQA group (F = Hq / Hkv) when its heads share one layout head's blocks, so one
// pass over a K/V tile serves the group (decode: a tile of F rows); otherwise F = 1.
#include <string>

#include "Halide.h"
#include "generators/flash/online_softmax.hpp"
#include "schedules/flash/tiling.hpp"
#include "schedules/flash/x86.hpp"

namespace {

using namespace Halide;

// Fields of a task (the first dimension of `tasks`); kept in sync with the runtime by
// schedules/flash/tiling.hpp's BlockSparseTaskField.
using Field = tilelab::schedules::flash::BlockSparseTaskField;

class BlockSparseAttentionForward : public Generator<BlockSparseAttentionForward> {
 public:
  GeneratorParam<Type> io_type{"io_type", Float(32)};  // q, k, v and out element type
  // "prefill" or "decode": the tiling of schedules/flash/tiling.hpp the runtime picks by.
  GeneratorParam<std::string> variant{"variant", "prefill"};

  Input<Buffer<void, 3>> q{"q"};  // (d, h, token): [total_q, Hq, D]
  Input<Buffer<void, 3>> k{"k"};  // (d, hk, token): [total_k, Hkv, D]
  Input<Buffer<void, 3>> v{"v"};
  Input<Buffer<int32_t, 2>> tasks{"tasks"};              // (field, task)
  Input<Buffer<int32_t, 1>> token_task{"token_task"};    // (query token) → its task
  Input<Buffer<int32_t, 2>> row_offsets{"row_offsets"};  // (row block, layout head): CSR crow
  Input<Buffer<int32_t, 2>> columns{"columns"};          // (index, layout head): CSR col
  Input<int> block_size{"block_size"};
  Input<int> max_row_blocks{"max_row_blocks"};  // the most key blocks in any layout row
  Input<int> folded_heads{"folded_heads"};      // F: query heads per task (1 or Hq / Hkv)
  Input<bool> causal{"causal"};
  Input<float> scale{"scale"};

  Output<Buffer<void, 3>> out{"out"};   // (d, h, token)
  Output<Buffer<float, 2>> lse{"lse"};  // (h, token)

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
    const int KT = tiling.key_block, QT = tiling.query_tile;
    s.key_block = KT;
    s.query_tile = QT;
    s.value_is_f32 = io_type.value() == Float(32);
    s.decode = tiling.decode;
    s.decode_lanes = get_target().natural_vector_size<float>();

    Expr head_dim = q.dim(0).extent();
    Expr q_heads = q.dim(1).extent();
    Expr group = q_heads / k.dim(1).extent();
    Expr layout_heads = row_offsets.dim(1).extent();
    Expr num_tasks = tasks.dim(1).extent();
    // A layout block spans `tiles_per_block` key tiles of KT keys; the last may be partial.
    Expr tiles_per_block = (block_size + KT - 1) / KT;

    // b is the task, hk the group of F query heads; row ii is query `row % rows` of head
    // hk·F + row / rows, rows past the task's last read the last one.
    auto field = [&](Field f, const Expr& task) { return tasks(static_cast<int>(f), task); };
    Expr rows = field(Field::rows, b);
    Expr row_in_task = min(ii, rows * folded_heads - 1);
    Expr row = row_in_task % rows;
    Func row_token("row_token"), row_key_limit("row_key_limit"), tile_first_key("tile_first_key");
    Func row_head("row_head");
    row_token(ii, b) = clamp(field(Field::query_token, b) + row, 0, q.dim(2).extent() - 1);
    row_head(ii, hk, b) = clamp(hk * folded_heads + row_in_task / rows, 0, q_heads - 1);
    Expr k_len = field(Field::key_count, b);
    // The last key (position in the sequence) the row sees.
    row_key_limit(ii, b) =
        select(causal, min(field(Field::query_position, b) + row, k_len - 1), k_len - 1);

    // Key tile jb of the task's row block for query head hk: layout block columns(slot), keys
    // from tile_first_key on.
    Expr layout_head = clamp(select(layout_heads == 1, 0, hk * folded_heads), 0, layout_heads - 1);
    Expr row_block = clamp(field(Field::row_block, b), 0, row_offsets.dim(0).extent() - 2);
    Expr row_begin = row_offsets(row_block, layout_head);
    Expr blocks_in_row = row_offsets(row_block + 1, layout_head) - row_begin;
    Expr slot = jb / tiles_per_block;
    Expr column = columns(clamp(row_begin + slot, 0, columns.dim(0).extent() - 1), layout_head);
    tile_first_key(jb, hk, b) = column * block_size + (jb % tiles_per_block) * KT;
    Expr key_in_block = (jb % tiles_per_block) * KT + jj;
    Expr key = tile_first_key(jb, hk, b) + jj;
    Expr key_token = field(Field::key_token, b) + clamp(key, 0, k_len - 1);
    key_token = clamp(key_token, 0, k.dim(2).extent() - 1);
    Expr kv_head = clamp(hk * folded_heads / group, 0, k.dim(1).extent() - 1);

    s.query_t(ii, d, io, hk, b) = cast<float>(q(d, row_head(ii, hk, b), row_token(ii, b))) * scale;
    s.key_f32(d, jj, jb, hk, b) = cast<float>(k(d, kv_head, key_token));
    s.value_f32(d, jj, jb, hk, b) = cast<float>(v(min(d, head_dim - 1), kv_head, key_token));

    tilelab::generators::define_scores(s, head_dim);
    Expr visible = key_in_block < block_size && key <= row_key_limit(ii, b);
    s.masked(ii, jj, jb, io, hk, b) =
        tilelab::generators::classify_score(s.score(ii, jj, jb, io, hk, b), visible);

    // Tiles in the row's blocks up to the task's last visible key; columns are sorted, so the
    // tiles skipped are a suffix.
    Expr task_key_limit = row_key_limit(QT - 1, b);
    tilelab::generators::define_online_softmax(s, max_row_blocks * tiles_per_block,
                                               [&](const Expr& rk) {
                                                 return rk / tiles_per_block < blocks_in_row &&
                                                        tile_first_key(rk, hk, b) <= task_key_limit;
                                               });

    Var h("h"), t("t");
    Expr task = clamp(token_task(t), 0, num_tasks - 1);
    Expr task_row =
        (h % folded_heads) * field(Field::rows, task) + t - field(Field::query_token, task);
    task_row = clamp(task_row, 0, QT - 1);
    auto state_at = [&](const Expr& dd) {
      return s.state(dd, task_row, 0, h / folded_heads, task);
    };
    Func out_f("out_f"), lse_f("lse_f");
    out_f(d, h, t) = cast(io_type, tilelab::generators::normalized_out(
                                       state_at(d)[0], state_at(d)[1], state_at(d)[2]));
    lse_f(h, t) = tilelab::generators::row_lse(state_at(0)[0], state_at(0)[1]);
    out = out_f;
    lse = lse_f;

    // Schedule: the dense forward's block loop; outputs parallel over tokens.
    const int VL = get_target().natural_vector_size<float>();
    const Var tile = tilelab::schedules::schedule_online_softmax_x86(s, get_target(), head_dim);
    row_token.compute_at(s.state, tile);
    row_key_limit.compute_at(s.state, tile);
    row_head.compute_at(s.state, tile);
    tile_first_key.compute_at(s.state, s.rk);
    Var to("to"), ti("ti");
    out_f.split(t, to, ti, 16, TailStrategy::GuardWithIf)
        .parallel(to)
        .vectorize(d, VL, TailStrategy::GuardWithIf);
    lse_f.split(t, to, ti, 64, TailStrategy::GuardWithIf).parallel(to);
  }
};

}  // namespace

HALIDE_REGISTER_GENERATOR(BlockSparseAttentionForward, blocksparse_attention_forward)
