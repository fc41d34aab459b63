// tilelab._core nki_* functions: the simulator's ProgramBuilder for the NKI-language tracer in
// python/tilelab/nki/. A builder and a finished program travel as capsules; tile views are
// tuples (tile, partition_start, partitions, free_offset, free_count, free_stride) and HBM access
// patterns (tensor, offset, partition_stride, partitions, [(count, stride), ...]).
#include "nki_builder_bindings.hpp"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sim/functional.hpp"
#include "sim/machine.hpp"
#include "sim/program.hpp"
#include "sim_bindings.hpp"
#include "tilelab/error.hpp"

namespace py = pybind11;

namespace tilelab::python {
namespace {

constexpr const char* kBuilderCapsuleName = "tilelab.nki_builder";
constexpr const char* kProgramCapsuleName = "tilelab.nki_program";

using HbmTuple =
    std::tuple<uint32_t, int64_t, int64_t, int, std::vector<std::pair<int64_t, int64_t>>>;

// The enum value whose isa name is `name` (the names the reports print), else an Error naming
// `argument` and the allowed names.
template <typename Enum, typename NameOf>
Enum enum_from_name(std::string_view name, int count, NameOf name_of, const char* argument) {
  std::string allowed;
  for (int i = 0; i < count; ++i) {
    const auto value = static_cast<Enum>(i);
    if (name_of(value) == name) return value;
    if (i) allowed += ", ";
    allowed += name_of(value);
  }
  throw Error(std::string(argument) + ": unknown '" + std::string(name) + "'; allowed: " + allowed);
}

sim::DType dtype_of(const std::string& name) {
  return enum_from_name<sim::DType>(name, sim::kDTypeCount, sim::dtype_name, "dtype");
}
sim::AluOp alu_op_of(const std::string& name) {
  return enum_from_name<sim::AluOp>(name, sim::kAluOpCount, sim::alu_op_name, "op");
}
sim::ActFunc act_func_of(const std::string& name) {
  return enum_from_name<sim::ActFunc>(name, sim::kActFuncCount, sim::act_func_name, "op");
}
sim::Engine engine_of(const std::string& name) {
  return enum_from_name<sim::Engine>(name, sim::kEngineCount, sim::engine_name, "engine");
}
sim::Memory memory_of(const std::string& name) {
  return enum_from_name<sim::Memory>(name, sim::kMemoryCount, sim::memory_name, "buffer");
}

sim::ProgramBuilder& builder_of(const py::capsule& handle) {
  TILELAB_REQUIRE(handle.name() != nullptr && std::string(handle.name()) == kBuilderCapsuleName)
      << "builder: expected an NKI program builder handle";
  auto* builder = handle.get_pointer<std::unique_ptr<sim::ProgramBuilder>>();
  TILELAB_REQUIRE(*builder) << "builder: the program was already finished";
  return **builder;
}

std::shared_ptr<sim::Program>& program_of(const py::capsule& handle) {
  TILELAB_REQUIRE(handle.name() != nullptr && std::string(handle.name()) == kProgramCapsuleName)
      << "program: expected an NKI program handle";
  auto& program = *handle.get_pointer<std::shared_ptr<sim::Program>>();
  TILELAB_REQUIRE(program) << "program: the program was handed to a timed run already";
  return program;
}

// A checked view: (tile, p0, partitions, offset, count, stride) or, for two levels,
// (tile, p0, partitions, offset, outer_count, outer_stride, inner_count, inner_stride).
sim::TileRef tile_ref(const sim::ProgramBuilder& b, const py::handle& value) {
  const auto t = value.cast<py::tuple>();
  TILELAB_REQUIRE(t.size() == 6 || t.size() == 8)
      << "tile view: expected a tuple of 6 or 8 integers, got " << t.size();
  const sim::Tile tile{t[0].cast<uint32_t>()};
  const int p0 = t[1].cast<int>(), partitions = t[2].cast<int>();
  const auto offset = t[3].cast<int64_t>();
  if (t.size() == 6)
    return b.view(tile, p0, partitions, offset, t[4].cast<int64_t>(), t[5].cast<int64_t>());
  return b.view(tile, p0, partitions, offset, t[4].cast<int64_t>(), t[5].cast<int64_t>(),
                t[6].cast<int64_t>(), t[7].cast<int64_t>());
}

sim::TileRef optional_ref(const sim::ProgramBuilder& b, const py::object& t) {
  return t.is_none() ? sim::TileRef{} : tile_ref(b, t);
}

sim::HbmPattern hbm_pattern(sim::ProgramBuilder& b, const HbmTuple& t) {
  const auto& [tensor, offset, partition_stride, partitions, free_dims] = t;
  return b.hbm_pattern(sim::Tensor{tensor}, offset, partition_stride, partitions, free_dims);
}

// A scalar operand: a float constant or a [P, 1] tile view.
sim::Scalar scalar_of(const sim::ProgramBuilder& b, const py::handle& value) {
  if (value.is_none()) return {};
  if (py::isinstance<py::tuple>(value)) return sim::Scalar::per_partition(tile_ref(b, value));
  return sim::Scalar::constant(value.cast<float>());
}

sim::DmaOptions dma_options(const std::string& trigger, int queue) {
  sim::DmaOptions o;
  o.trigger = engine_of(trigger);
  o.queue = queue;
  return o;
}

py::capsule new_builder(const std::string& machine_source,
                        const std::vector<std::string>& machine_overrides,
                        const std::string& name) {
  auto builder = std::make_unique<sim::ProgramBuilder>(
      sim::load_machine(machine_source, machine_overrides), name);
  return py::capsule(
      new std::unique_ptr<sim::ProgramBuilder>(std::move(builder)), kBuilderCapsuleName,
      [](void* pointer) { delete static_cast<std::unique_ptr<sim::ProgramBuilder>*>(pointer); });
}

py::dict machine_facts(const py::capsule& handle) {
  const sim::Machine& m = builder_of(handle).machine();
  py::dict d;
  d["name"] = m.name;
  d["nc_version"] = m.nc_version;
  d["partitions"] = m.partitions;
  d["sbuf_bytes_per_partition"] = m.sbuf_bytes_per_partition;
  d["psum_bytes_per_partition"] = m.psum_bytes_per_partition;
  d["psum_bank_bytes_per_partition"] = m.psum_bank_bytes_per_partition;
  d["psum_banks"] = m.psum_banks;
  d["pe_transpose_16bit_output_supported"] = m.pe_transpose_16bit_output_supported;
  d["matmul_max_contraction"] = m.matmul_max_contraction;
  d["matmul_max_stationary_free"] = m.matmul_max_stationary_free;
  d["matmul_max_moving_free"] = m.matmul_max_moving_free;
  return d;
}

py::capsule finish(const py::capsule& handle) {
  auto& builder = *handle.get_pointer<std::unique_ptr<sim::ProgramBuilder>>();
  builder_of(handle);  // checks the handle
  auto program = std::make_shared<sim::Program>(builder->finish());
  builder.reset();
  return py::capsule(
      new std::shared_ptr<sim::Program>(std::move(program)), kProgramCapsuleName,
      [](void* pointer) { delete static_cast<std::shared_ptr<sim::Program>*>(pointer); });
}

// Runs the program on `inputs` (HBM tensor name -> float32 array of all its elements) and returns
// the tensors named in `outputs` as float32 arrays (NaN where never written) and, for each
// (instruction index, tile id) of `snapshots`, that whole tile's [partitions, free] contents
// before the instruction runs.
py::tuple run_functional(const py::capsule& handle, const py::dict& inputs,
                         const std::vector<std::string>& outputs,
                         const std::vector<std::pair<size_t, uint32_t>>& snapshots) {
  const sim::Program& program = *program_of(handle);
  sim::FunctionalExecutor executor(program);
  for (const auto& [key, value] : inputs) {
    const auto array = value.cast<py::array_t<float, py::array::c_style | py::array::forcecast>>();
    executor.set_tensor(key.cast<std::string>(),
                        std::span<const float>(array.data(), static_cast<size_t>(array.size())));
  }
  auto to_array = [](const std::vector<float>& values) {
    py::array_t<float> array(static_cast<py::ssize_t>(values.size()));
    std::copy(values.begin(), values.end(), array.mutable_data());
    return array;
  };
  py::list tiles;
  size_t done = 0;
  for (const auto& [instruction, tile] : snapshots) {
    TILELAB_REQUIRE(instruction >= done && tile < program.buffers.size() &&
                    program.buffers[tile].memory != sim::Memory::hbm)
        << "snapshots: expected (instruction, tile) pairs in program order";
    {
      py::gil_scoped_release release;
      executor.run(done, instruction);
    }
    done = instruction;
    tiles.append(to_array(executor.tile(sim::Tile{tile})));
  }
  {
    py::gil_scoped_release release;
    executor.run(done, program.instructions.size());
  }
  py::dict out;
  for (const std::string& name : outputs) out[py::str(name)] = to_array(executor.tensor(name));
  return py::make_tuple(out, tiles);
}

py::capsule time_program(const py::capsule& handle, const std::string& kernel_name,
                         const std::map<std::string, std::string>& parameters,
                         bool record_dma_pieces) {
  std::shared_ptr<sim::Program>& program = program_of(handle);
  sim::Program owned = std::move(*program);
  program.reset();
  return simulate_program(std::move(owned), kernel_name, parameters, record_dma_pieces);
}

}  // namespace

void register_nki_builder_bindings(py::module_& core) {
  core.def("nki_builder", &new_builder, py::arg("machine_source"), py::arg("machine_overrides"),
           py::arg("name"), "A program builder for the machine (a capsule).");
  core.def("nki_machine_facts", &machine_facts, py::arg("builder"));
  core.def(
      "nki_hbm_tensor",
      [](const py::capsule& h, const std::string& name, std::vector<int64_t> shape,
         const std::string& dtype) {
        sim::ProgramBuilder& builder = builder_of(h);
        return builder.hbm_tensor(name, std::move(shape), dtype_of(dtype)).id;
      },
      py::arg("builder"), py::arg("name"), py::arg("shape"), py::arg("dtype"));
  core.def(
      "nki_tile",
      [](const py::capsule& h, const std::string& name, const std::string& memory, int partitions,
         int64_t free_elements, const std::string& dtype, bool required) -> int64_t {
        sim::ProgramBuilder& builder = builder_of(h);
        const sim::Memory m = memory_of(memory);
        const sim::DType d = dtype_of(dtype);
        if (required) {
          return (m == sim::Memory::psum ? builder.psum_tile(name, partitions, free_elements, d)
                                         : builder.sbuf_tile(name, partitions, free_elements, d))
              .id;
        }
        const sim::Tile t = builder.try_tile(name, m, partitions, free_elements, d);
        return t.id == sim::kNone ? -1 : static_cast<int64_t>(t.id);
      },
      py::arg("builder"), py::arg("name"), py::arg("memory"), py::arg("partitions"),
      py::arg("free_elements"), py::arg("dtype"), py::arg("required"),
      "A tile's id, or -1 when required is False and it does not fit.");
  core.def(
      "nki_release_tile",
      [](const py::capsule& h, int64_t tile) {
        builder_of(h).release(sim::Tile{static_cast<uint32_t>(tile)});
      },
      py::arg("builder"), py::arg("tile"),
      "Returns a tile's memory; a later tile at the same addresses waits for its accesses.");
  core.def(
      "nki_dma",
      [](const py::capsule& h, const py::object& dst, const py::object& src,
         const std::string& trigger, int queue) {
        sim::ProgramBuilder& builder = builder_of(h);
        const sim::DmaOptions o = dma_options(trigger, queue);
        const bool dst_hbm = py::len(dst) == 5, src_hbm = py::len(src) == 5;
        TILELAB_REQUIRE(!(dst_hbm && src_hbm)) << "dma: HBM to HBM copies are not supported";
        if (src_hbm)
          builder.dma_copy(tile_ref(builder, dst), hbm_pattern(builder, src.cast<HbmTuple>()), o);
        else if (dst_hbm)
          builder.dma_copy(hbm_pattern(builder, dst.cast<HbmTuple>()), tile_ref(builder, src), o);
        else
          builder.dma_copy(tile_ref(builder, dst), tile_ref(builder, src), o);
      },
      py::arg("builder"), py::arg("dst"), py::arg("src"), py::arg("trigger"), py::arg("queue"));
  core.def(
      "nki_dma_transpose",
      [](const py::capsule& h, const py::object& dst, const py::object& src,
         const std::string& trigger, int queue) {
        sim::ProgramBuilder& builder = builder_of(h);
        const sim::DmaOptions o = dma_options(trigger, queue);
        if (py::len(src) == 5)
          builder.dma_transpose(tile_ref(builder, dst), hbm_pattern(builder, src.cast<HbmTuple>()),
                                o);
        else
          builder.dma_transpose(tile_ref(builder, dst), tile_ref(builder, src), o);
      },
      py::arg("builder"), py::arg("dst"), py::arg("src"), py::arg("trigger"), py::arg("queue"),
      "dst[f, p] = src[p, f] on the DMA engines (NeuronCore-v3 and later).");
  core.def(
      "nki_dma_gather",
      [](const py::capsule& h, const py::object& dst, uint32_t tensor, int64_t row_offset,
         int64_t rows, int64_t cols, const py::object& index, int64_t col0) {
        sim::ProgramBuilder& builder = builder_of(h);
        builder.gather_rows(tile_ref(builder, dst), sim::Tensor{tensor}, row_offset, rows, cols,
                            tile_ref(builder, index), col0);
      },
      py::arg("builder"), py::arg("dst"), py::arg("tensor"), py::arg("row_offset"), py::arg("rows"),
      py::arg("cols"), py::arg("index"), py::arg("col0"),
      "dst[p, f] = tensor row (row_offset + index[p]) of `cols` elements, column col0 + f.");
  core.def(
      "nki_matmul",
      [](const py::capsule& h, const py::object& dst, const py::object& stationary,
         const py::object& moving, bool accumulate) {
        sim::ProgramBuilder& builder = builder_of(h);
        builder.matmul(tile_ref(builder, dst), tile_ref(builder, stationary),
                       tile_ref(builder, moving), accumulate);
      },
      py::arg("builder"), py::arg("dst"), py::arg("stationary"), py::arg("moving"),
      py::arg("accumulate"));
  core.def(
      "nki_pe_transpose",
      [](const py::capsule& h, const py::object& dst, const py::object& src) {
        sim::ProgramBuilder& builder = builder_of(h);
        builder.pe_transpose(tile_ref(builder, dst), tile_ref(builder, src));
      },
      py::arg("builder"), py::arg("dst"), py::arg("src"));
  core.def(
      "nki_activation",
      [](const py::capsule& h, const py::object& dst, const py::object& src,
         const std::string& func, const py::object& scale, const py::object& bias,
         const py::object& reduce_result) {
        sim::ProgramBuilder& builder = builder_of(h);
        sim::ActivationOptions o;
        const sim::Scalar s = scalar_of(builder, scale.is_none() ? py::float_(1.0) : scale);
        o.scale = s.value;
        o.scale_tile = s.tile;
        o.bias = optional_ref(builder, bias);
        o.reduce_result = optional_ref(builder, reduce_result);
        builder.activation(tile_ref(builder, dst), tile_ref(builder, src), act_func_of(func), o);
      },
      py::arg("builder"), py::arg("dst"), py::arg("src"), py::arg("func"), py::arg("scale"),
      py::arg("bias"), py::arg("reduce_result"));
  core.def(
      "nki_tensor_tensor",
      [](const py::capsule& h, const py::object& dst, const py::object& a, const py::object& b,
         const std::string& op) {
        sim::ProgramBuilder& builder = builder_of(h);
        builder.tensor_tensor(tile_ref(builder, dst), tile_ref(builder, a), tile_ref(builder, b),
                              alu_op_of(op));
      },
      py::arg("builder"), py::arg("dst"), py::arg("a"), py::arg("b"), py::arg("op"));
  core.def(
      "nki_tensor_tensor_scan",
      [](const py::capsule& h, const py::object& dst, const py::object& a, const py::object& b,
         const py::object& initial, const std::string& op0, const std::string& op1, bool reverse0,
         bool reverse1) {
        sim::ProgramBuilder& builder = builder_of(h);
        builder.tensor_tensor_scan(tile_ref(builder, dst), tile_ref(builder, a),
                                   tile_ref(builder, b), alu_op_of(op0), alu_op_of(op1),
                                   scalar_of(builder, initial), reverse0, reverse1);
      },
      py::arg("builder"), py::arg("dst"), py::arg("a"), py::arg("b"), py::arg("initial"),
      py::arg("op0"), py::arg("op1"), py::arg("reverse0"), py::arg("reverse1"));
  core.def(
      "nki_tensor_scalar",
      [](const py::capsule& h, const py::object& dst, const py::object& src, const std::string& op0,
         const py::object& s0, const std::string& op1, const py::object& s1,
         const std::string& engine) {
        sim::ProgramBuilder& builder = builder_of(h);
        builder.tensor_scalar(tile_ref(builder, dst), tile_ref(builder, src), alu_op_of(op0),
                              scalar_of(builder, s0), alu_op_of(op1), scalar_of(builder, s1),
                              engine_of(engine));
      },
      py::arg("builder"), py::arg("dst"), py::arg("src"), py::arg("op0"), py::arg("scalar0"),
      py::arg("op1"), py::arg("scalar1"), py::arg("engine"));
  core.def(
      "nki_tensor_reduce",
      [](const py::capsule& h, const py::object& dst, const py::object& src, const std::string& op,
         bool negate) {
        sim::ProgramBuilder& builder = builder_of(h);
        builder.tensor_reduce(tile_ref(builder, dst), tile_ref(builder, src), alu_op_of(op),
                              negate);
      },
      py::arg("builder"), py::arg("dst"), py::arg("src"), py::arg("op"), py::arg("negate"));
  core.def(
      "nki_bn_stats",
      [](const py::capsule& h, const py::object& dst, const py::object& src) {
        sim::ProgramBuilder& builder = builder_of(h);
        builder.bn_stats(tile_ref(builder, dst), tile_ref(builder, src));
      },
      py::arg("builder"), py::arg("dst"), py::arg("src"));
  core.def(
      "nki_bn_aggr",
      [](const py::capsule& h, const py::object& dst, const py::object& src) {
        sim::ProgramBuilder& builder = builder_of(h);
        builder.bn_aggr(tile_ref(builder, dst), tile_ref(builder, src));
      },
      py::arg("builder"), py::arg("dst"), py::arg("src"));
  core.def(
      "nki_tensor_copy",
      [](const py::capsule& h, const py::object& dst, const py::object& src,
         const std::string& engine) {
        sim::ProgramBuilder& builder = builder_of(h);
        builder.tensor_copy(tile_ref(builder, dst), tile_ref(builder, src), engine_of(engine));
      },
      py::arg("builder"), py::arg("dst"), py::arg("src"), py::arg("engine"));
  core.def(
      "nki_select",
      [](const py::capsule& h, const py::object& dst, const py::object& condition,
         const py::object& x, const py::object& y) {
        sim::ProgramBuilder& builder = builder_of(h);
        sim::Scalar s;
        if (py::isinstance<py::tuple>(y))
          s.tile = tile_ref(builder, y);
        else
          s.value = y.cast<float>();
        builder.select(tile_ref(builder, dst), tile_ref(builder, condition), tile_ref(builder, x),
                       s);
      },
      py::arg("builder"), py::arg("dst"), py::arg("condition"), py::arg("x"), py::arg("y"));
  core.def(
      "nki_memset",
      [](const py::capsule& h, const py::object& dst, float value, const std::string& engine) {
        sim::ProgramBuilder& builder = builder_of(h);
        builder.memset(tile_ref(builder, dst), value, engine_of(engine));
      },
      py::arg("builder"), py::arg("dst"), py::arg("value"), py::arg("engine"));
  core.def(
      "nki_iota",
      [](const py::capsule& h, const py::object& dst, int base, int partition_step, int free_step) {
        sim::ProgramBuilder& builder = builder_of(h);
        builder.iota(tile_ref(builder, dst), base, partition_step, free_step);
      },
      py::arg("builder"), py::arg("dst"), py::arg("base"), py::arg("partition_step"),
      py::arg("free_step"));
  core.def(
      "nki_add_source",
      [](const py::capsule& h, const std::string& file, int line, const std::string& function,
         const std::string& text, int64_t caller) {
        sim::SourceLocation location{file, line, function, text,
                                     caller < 0 ? sim::kNone : static_cast<uint32_t>(caller)};
        return builder_of(h).add_source(location);
      },
      py::arg("builder"), py::arg("file"), py::arg("line"), py::arg("function"), py::arg("text"),
      py::arg("caller"), "The id of a kernel source line (caller: an id, or -1 at the kernel).");
  core.def(
      "nki_set_source",
      [](const py::capsule& h, int64_t source) {
        builder_of(h).set_source(source < 0 ? sim::kNone : static_cast<uint32_t>(source));
      },
      py::arg("builder"), py::arg("source"),
      "Instructions built from now on carry this source id (-1: none).");
  core.def(
      "nki_instruction_count",
      [](const py::capsule& h) { return builder_of(h).instruction_count(); }, py::arg("builder"));
  core.def("nki_finish", &finish, py::arg("builder"),
           "Hands the program over (a capsule); the builder cannot be used afterwards.");
  core.def("nki_run_functional", &run_functional, py::arg("program"), py::arg("inputs"),
           py::arg("outputs"), py::arg("snapshots"));
  core.def("nki_time_program", &time_program, py::arg("program"), py::arg("kernel"),
           py::arg("parameters"), py::arg("record_dma_pieces"),
           "Times the program (which it takes over) and returns a simulation run handle.");
}

}  // namespace tilelab::python
