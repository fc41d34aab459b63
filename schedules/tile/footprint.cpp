// Footprint pass of the tile schedule (see footprint.hpp). Bytes per partition = elements /
// partitions × the bytes the machine stores the element in: stages holding tensor-engine operands
// are bf16 with mixed precision (Halide keeps their bf16-rounded values in fp32 lanes; the machine
// stores 2 bytes), the rest fp32. Allocations outside the task (compute_root: the output) are HBM
// and not counted.
#include "schedules/tile/footprint.hpp"

#include <fstream>
#include <map>
#include <optional>
#include <vector>

namespace tilelab::schedules {
namespace {

using namespace Halide;
using namespace Halide::Internal;

// The tag of allocation `name` (Halide's uniquifying suffix stripped): the exact stage, else the
// longest stage name it starts with (rfactor intermediates), else none.
const TileMemoryTag* tag_of(const std::string& name, const std::vector<TileMemoryTag>& tags) {
  const std::string base = name.substr(0, name.find_first_of("$."));
  const TileMemoryTag* best = nullptr;
  for (const TileMemoryTag& tag : tags) {
    if (tag.stage == base) return &tag;
    if (base.rfind(tag.stage, 0) == 0 && (!best || tag.stage.size() > best->stage.size()))
      best = &tag;
  }
  return best;
}

const char* memory_name(TileMemoryTag::Memory memory) {
  return memory == TileMemoryTag::Memory::psum ? "psum" : "sbuf";
}

// Replaces _halide_buffer_get_extent/min(X.buffer, dim) and the variables X.extent.dim /
// X.min.dim / large_tile_size by the figures of the footprint configuration, in their own types.
class BufferQueries : public IRMutator {
 public:
  explicit BufferQueries(const std::map<std::string, int64_t>& known) : known_(known) {}

 protected:
  using IRMutator::visit;
  Expr visit(const Call* op) override {
    const bool extent = op->name == "_halide_buffer_get_extent";
    if ((extent || op->name == "_halide_buffer_get_min") && op->args.size() == 2) {
      const Variable* buffer = op->args[0].as<Variable>();
      const std::optional<int64_t> dim = as_const_int(op->args[1]);
      if (buffer && dim) {
        // The output is out$1 in the lowered IR.
        const std::string name = buffer->name.substr(0, buffer->name.find_first_of("$."));
        const auto it = known_.find(name + (extent ? ".extent." : ".min.") + std::to_string(*dim));
        if (it != known_.end()) return make_const(op->type, it->second);
      }
    }
    return IRMutator::visit(op);
  }
  Expr visit(const Variable* op) override {
    const auto it = known_.find(op->name);
    return it == known_.end() ? Expr(op) : make_const(op->type, it->second);
  }

 private:
  const std::map<std::string, int64_t>& known_;
};

class FootprintPass : public IRMutator {
 public:
  explicit FootprintPass(FootprintConfig config) : config_(std::move(config)) {
    const FootprintConfig& c = config_;
    const int blocks = c.context_len / c.block_size;
    known_ = {{"large_tile_size", c.large_tile_size},
              {"query.extent.0", c.seq_q},
              {"query.extent.1", c.head_dim},
              {"query.extent.2", c.num_heads},
              {"key.extent.0", c.seq_q},
              {"key.extent.1", c.head_dim},
              {"key.extent.2", c.num_kv_heads},
              {"value.extent.0", c.head_dim},
              {"value.extent.1", c.seq_q},
              {"value.extent.2", c.num_kv_heads},
              {"kv_cache.extent.0", c.head_dim},
              {"kv_cache.extent.1", c.block_size},
              {"kv_cache.extent.2", c.num_kv_heads},
              {"kv_cache.extent.3", blocks},
              {"block_tables.extent.0", blocks},
              {"mask.extent.0", c.context_len + c.seq_q},
              {"mask.extent.1", c.seq_q},
              {"out.extent.0", c.head_dim},
              {"out.extent.1", c.seq_q},
              {"out.extent.2", c.num_heads}};
    for (const char* buffer :
         {"query", "key", "value", "kv_cache", "block_tables", "mask", "out"}) {
      for (int dim = 0; dim < 5; ++dim) {
        known_[std::string(buffer) + ".min." + std::to_string(dim)] = 0;
      }
    }
  }

  // Lowering calls this once per target with the whole pipeline; the IR is left unchanged.
  Stmt mutate(const Stmt& s) override {
    if (depth_ > 0) return IRMutator::mutate(s);
    buffers_.clear();
    unmapped_.clear();
    live_.clear();
    peak_.clear();
    ++depth_;
    IRMutator::mutate(s);
    --depth_;
    finish();
    return s;
  }
  using IRMutator::mutate;

 protected:
  using IRMutator::visit;

  Stmt visit(const LetStmt* op) override {
    lets_.emplace_back(op->name, op->value);
    IRMutator::visit(op);
    lets_.pop_back();
    return op;
  }

  Stmt visit(const For* op) override {
    loops_.push_back({op->name, op->min, op->extent});
    IRMutator::visit(op);
    loops_.pop_back();
    return op;
  }

  // `e` with the enclosing lets and the configuration's buffer sizes substituted, simplified.
  Expr resolve(Expr e) const {
    for (auto it = lets_.rbegin(); it != lets_.rend(); ++it)
      e = substitute(it->first, it->second, e);
    return simplify(BufferQueries(known_).mutate(e));
  }

  // The largest value `e` takes over the enclosing loops: some allocations (e.g. the gathered K
  // of a large tile) are sized per iteration, like min(t·T + T, context) − t·T. At the footprint
  // configuration every loop has a constant trip count, so the iterations are enumerated
  // (outermost first, each loop's range evaluated at the outer loops' values); interval
  // arithmetic would lose the correlation between the terms and bound by the whole context.
  Expr max_over_loops(const Expr& e) const {
    std::map<std::string, Expr> values;
    std::optional<int64_t> best;
    int64_t visited = 0;
    const bool complete = enumerate(0, e, values, best, visited);
    _halide_user_assert(complete && best)
        << "tile footprint: cannot bound " << e << " over the enclosing loops";
    return make_const(Int(64), *best);
  }

  bool enumerate(std::size_t depth, const Expr& e, std::map<std::string, Expr>& values,
                 std::optional<int64_t>& best, int64_t& visited) const {
    constexpr int64_t kMaxIterations = 1 << 20;
    if (depth == loops_.size()) {
      const std::optional<int64_t> value = as_const_int(simplify(substitute(values, e)));
      if (!value) return false;
      best = best ? std::max(*best, *value) : *value;
      return ++visited <= kMaxIterations;
    }
    const Loop& loop = loops_[depth];
    if (!expr_uses_var(e, loop.name) && !uses_inner_loop_vars(depth, e)) {
      return enumerate(depth + 1, e, values, best, visited);
    }
    const std::optional<int64_t> min =
        as_const_int(simplify(substitute(values, resolve(loop.min))));
    const std::optional<int64_t> extent =
        as_const_int(simplify(substitute(values, resolve(loop.extent))));
    if (!min || !extent) return false;
    for (int64_t i = *min; i < *min + *extent; ++i) {
      values[loop.name] = make_const(Int(32), i);
      if (!enumerate(depth + 1, e, values, best, visited)) return false;
    }
    values.erase(loop.name);
    return true;
  }

  // Whether `e` uses a loop variable deeper than `depth` (whose range may depend on this loop).
  bool uses_inner_loop_vars(std::size_t depth, const Expr& e) const {
    for (std::size_t i = depth + 1; i < loops_.size(); ++i) {
      if (expr_uses_var(e, loops_[i].name)) return true;
    }
    return false;
  }

  Stmt visit(const Allocate* op) override {
    const TileMemoryTag* stage = tag_of(op->name, config_.stages);
    if (!stage) {
      unmapped_.push_back(op->name);
      return IRMutator::visit(op);
    }
    Expr elements = make_const(Int(64), 1);
    for (const Expr& extent : op->extents) elements = elements * cast<int64_t>(extent);
    elements = resolve(elements);
    if (!as_const_int(elements)) elements = max_over_loops(elements);
    const std::optional<int64_t> count = as_const_int(elements);
    _halide_user_assert(count) << "tile footprint: the size of allocation " << op->name
                               << " is not constant at the footprint configuration: " << elements;
    const int partitions =
        stage->partitions == TileMemoryTag::Partitions::head_dim ? config_.head_dim : 128;
    const bool bf16 =
        stage->element == TileMemoryTag::Element::kernel_dtype && config_.mixed_precision;
    const int element_bytes = bf16 ? 2 : 4;
    const long long bytes = *count / partitions * element_bytes;
    const std::string memory = memory_name(stage->memory);
    buffers_.push_back({op->name, memory, partitions, *count / partitions, bytes});
    live_[memory] += bytes;
    peak_[memory] = std::max(peak_[memory], live_[memory]);
    IRMutator::visit(op);
    live_[memory] -= bytes;
    return op;
  }

 private:
  struct BufferFigure {
    std::string name, memory;
    int partitions;
    long long elements_per_partition, bytes_per_partition;
  };

  void finish() {
    const long long sbuf = peak_["sbuf"], psum = peak_["psum"];
    if (!config_.json_path.empty()) {
      std::ofstream out(config_.json_path);
      out << "{\n  \"schema\": \"tilelab.tile_footprint\",\n";
      out << "  \"configuration\": {\"large_tile_size\": " << config_.large_tile_size
          << ", \"head_dim\": " << config_.head_dim << ", \"block_size\": " << config_.block_size
          << ", \"seq_q\": " << config_.seq_q << ", \"context_len\": " << config_.context_len
          << ", \"mixed_precision\": " << (config_.mixed_precision ? "true" : "false") << "},\n";
      out << "  \"peak_sbuf_bytes_per_partition\": " << sbuf << ",\n";
      out << "  \"peak_psum_bytes_per_partition\": " << psum << ",\n";
      out << "  \"buffers\": [";
      for (size_t i = 0; i < buffers_.size(); ++i) {
        const BufferFigure& b = buffers_[i];
        out << (i ? ",\n" : "\n") << "    {\"name\": \"" << b.name << "\", \"memory\": \""
            << b.memory << "\", \"partitions\": " << b.partitions
            << ", \"elements_per_partition\": " << b.elements_per_partition
            << ", \"bytes_per_partition\": " << b.bytes_per_partition << "}";
      }
      out << "\n  ],\n  \"not_counted\": [";
      for (size_t i = 0; i < unmapped_.size(); ++i) {
        out << (i ? ", " : "") << "\"" << unmapped_[i] << "\"";
      }
      out << "]\n}\n";
    }
  }

  FootprintConfig config_;
  std::map<std::string, int64_t> known_;
  std::vector<std::pair<std::string, Expr>> lets_;
  struct Loop {
    std::string name;
    Expr min, extent;
  };
  std::vector<Loop> loops_;
  std::vector<BufferFigure> buffers_;
  std::vector<std::string> unmapped_;
  std::map<std::string, long long> live_, peak_;
  int depth_ = 0;
};

}  // namespace

void add_tile_footprint_check(Pipeline pipeline, const FootprintConfig& config) {
  pipeline.add_custom_lowering_pass(new FootprintPass(config));
}

}  // namespace tilelab::schedules
