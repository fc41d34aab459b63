// tilelab._core sim_* functions: build the NKI-style flash paged attention tile program from a
// PagedAttentionSchedule and a batch (or NKI-layout arrays), simulate it, and hand the report,
// timeline and HTML/trace writers to python/tilelab/sim.py; sweeps run in parallel (OpenMP).
#include "sim_bindings.hpp"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <climits>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/json_input.hpp"
#include "schedules/paged/schedule.hpp"
#include "sim/analysis.hpp"
#include "sim/functional.hpp"
#include "sim/kernel_request.hpp"
#include "sim/kernels/flash_paged_attention.hpp"
#include "sim/kernels/registry.hpp"
#include "sim/machine.hpp"
#include "sim/output_file.hpp"
#include "sim/program.hpp"
#include "sim/report.hpp"
#include "sim/report_html.hpp"
#include "sim/timing.hpp"
#include "tilelab/detail/argument_checks.hpp"
#include "tilelab/error.hpp"
#include "tilelab/threading.hpp"

namespace py = pybind11;

namespace tilelab::python {
namespace {

using schedules::PagedAttentionSchedule;

// The kernel name the CLI registers; reports of both front ends carry it.
constexpr const char* kKernelName = "paged-attention";
constexpr const char* kRunCapsuleName = "tilelab.sim_run";

// One simulated run: the program, its timing and the report. Kept alive by a capsule so that
// Report.save_html / save_trace / timeline can read the program after the call returned.
struct SimRun {
  sim::Program program;
  sim::TimingResult timing;
  sim::Report report;
};

// A shape-based simulation point: the schedule, the batch and the kernel-only knobs.
struct PagedPoint {
  std::string schedule_json;
  std::vector<sim::PagedAttentionRequest> requests;
  int64_t num_heads = 32;
  int64_t num_kv_heads = 8;
  int64_t head_dim = 128;
  std::string dtype = "bf16";
  int64_t tiling_factor = 0;  // 0: the schedule's block_size_tiling_factor()
  int64_t seed = 1;
  std::optional<double> softmax_scale;  // none: 1 / sqrt(head_dim)
  size_t machine = 0;                   // index into the sweep's machines
};

sim::DType parse_dtype(const std::string& name) {
  if (name == "bf16") return sim::DType::bf16;
  if (name == "fp16") return sim::DType::fp16;
  if (name == "fp32") return sim::DType::fp32;
  throw Error("dtype: expected 'bf16', 'fp16' or 'fp32', got '" + name + "'");
}

// The report's parameters, named as the CLI's (`tilelab sim paged-attention KEY=VALUE`).
sim::KernelParameters report_parameters(const sim::FlashPagedAttentionConfig& config,
                                        int64_t tiling_factor) {
  const PagedAttentionSchedule& s = config.schedule;
  return {{"num_heads", std::to_string(config.shape.num_heads)},
          {"num_kv_heads", std::to_string(config.shape.num_kv_heads)},
          {"head_dim", std::to_string(config.shape.head_dim)},
          {"dtype", std::string(sim::dtype_name(config.dtype))},
          {"block_size", std::to_string(s.block_size)},
          {"large_tile_size", std::to_string(s.large_tile_size)},
          {"mixed_precision", s.mixed_precision ? "true" : "false"},
          {"transpose", schedules::transpose_method_name(s.transpose)},
          {"kv_buffers", std::to_string(s.kv_buffers)},
          {"tiling_factor", tiling_factor == 0 ? "auto" : std::to_string(tiling_factor)},
          {"query_len", std::to_string(config.shape.query_len)},
          {"num_active_blocks", std::to_string(config.shape.num_active_blocks)}};
}

struct ResolvedPoint {
  sim::FlashPagedAttentionConfig config;
  sim::KernelParameters parameters;
};

// Schedule JSON is parsed (and validated) here: a bad knob is an Error naming the field.
ResolvedPoint resolve_point(const PagedPoint& point) {
  ResolvedPoint r;
  r.config.schedule = PagedAttentionSchedule::from_json(point.schedule_json);
  const PagedAttentionSchedule& s = r.config.schedule;
  TILELAB_REQUIRE(!point.requests.empty()) << "prefill, decode: no requests given";
  TILELAB_REQUIRE(point.seed >= 0 && point.seed <= UINT32_MAX)
      << "seed: expected 0 <= seed < 2**32, got " << point.seed;
  // Timing only: the batch's sizes, not its block table and mask (the seed places blocks).
  const sim::PagedAttentionBatchShape batch = sim::paged_attention_batch_shape(point.requests, s);
  r.config.shape.num_heads = point.num_heads;
  r.config.shape.num_kv_heads = point.num_kv_heads;
  r.config.shape.head_dim = point.head_dim;
  r.config.shape.query_len = batch.query_len;
  r.config.shape.num_active_blocks = batch.num_active_blocks;
  r.config.num_cache_blocks = batch.num_cache_blocks;
  r.config.dtype = parse_dtype(point.dtype);
  if (point.softmax_scale) r.config.softmax_scale = static_cast<float>(*point.softmax_scale);
  r.config.schedule.block_size_tiling_factor_override = point.tiling_factor;
  r.parameters = report_parameters(r.config, point.tiling_factor);
  r.parameters["prefill"] = sim::format_paged_attention_requests(point.requests, true);
  r.parameters["decode"] = sim::format_paged_attention_requests(point.requests, false);
  r.parameters["seed"] = std::to_string(point.seed);
  return r;
}

std::shared_ptr<SimRun> time_program(sim::Program program, const std::string& kernel_name,
                                     const sim::KernelParameters& parameters,
                                     bool record_dma_pieces, size_t max_critical_path_segments) {
  auto run = std::make_shared<SimRun>();
  run->program = std::move(program);
  sim::TimingOptions timing_options;
  timing_options.record_dma_pieces = record_dma_pieces;
  run->timing = sim::simulate_timing(run->program, timing_options);
  sim::ReportOptions report_options;
  report_options.kernel = kernel_name;
  report_options.parameters = parameters;
  report_options.max_critical_path_segments = max_critical_path_segments;
  run->report = sim::make_report(run->program, run->timing, report_options);
  return run;
}

// --- flat summary: one number per key, the same keys for Report attributes and sweep columns ---

using Summary = std::vector<sim::Metric>;

Summary flat_summary(const sim::Report& r) {
  return sim::flat_metrics(r);
}

py::dict summary_dict(const Summary& summary) {
  py::dict out;
  for (const auto& metric : summary) out[py::str(metric.name)] = metric.value;
  return out;
}

// --- capsules ------------------------------------------------------------------------------

py::capsule wrap_run(std::shared_ptr<SimRun> run) {
  return py::capsule(new std::shared_ptr<SimRun>(std::move(run)), kRunCapsuleName,
                     [](void* pointer) { delete static_cast<std::shared_ptr<SimRun>*>(pointer); });
}

const SimRun& unwrap_run(const py::handle& handle, const char* argument) {
  const char* name = py::isinstance<py::capsule>(handle)
                         ? py::reinterpret_borrow<py::capsule>(handle).name()
                         : nullptr;
  if (name == nullptr || std::string(name) != kRunCapsuleName) {
    throw Error(std::string(argument) + ": expected a simulation run handle, got " +
                    py::str(py::type::handle_of(handle).attr("__name__")).cast<std::string>(),
                ErrorKind::invalid_type);
  }
  return **py::reinterpret_borrow<py::capsule>(handle).get_pointer<std::shared_ptr<SimRun>>();
}

// --- machines --------------------------------------------------------------------------------

sim::Machine load_machine_spec(const std::string& source,
                               const std::vector<std::string>& overrides) {
  return sim::load_machine(source, overrides);
}

py::object to_python(const nlohmann::json& value) {
  return py::module_::import("json").attr("loads")(value.dump());
}

// A machine field value: a bool, int, float or list of them, as JSON (NaN and infinities, which
// JSON cannot hold, and other types are errors naming the field).
nlohmann::json from_python(const std::string& name, const py::handle& value) {
  const auto text = py::module_::import("json")
                        .attr("dumps")(value, py::arg("allow_nan") = false)
                        .cast<std::string>();
  return parse_user_json(text, name);
}

// --- points ----------------------------------------------------------------------------------

PagedPoint parse_point(const py::dict& d) {
  PagedPoint p;
  p.schedule_json = d["schedule_json"].cast<std::string>();
  for (const auto& [query_len, context_len] :
       d["requests"].cast<std::vector<std::pair<int64_t, int64_t>>>())
    p.requests.push_back({query_len, context_len});
  p.num_heads = d["num_heads"].cast<int64_t>();
  p.num_kv_heads = d["num_kv_heads"].cast<int64_t>();
  p.head_dim = d["head_dim"].cast<int64_t>();
  p.dtype = d["dtype"].cast<std::string>();
  p.tiling_factor = d["tiling_factor"].cast<int64_t>();
  p.seed = d["seed"].cast<int64_t>();
  if (!d["softmax_scale"].is_none()) p.softmax_scale = d["softmax_scale"].cast<double>();
  if (d.contains("machine")) p.machine = d["machine"].cast<size_t>();
  return p;
}

py::capsule simulate_point(const std::string& machine_source,
                           const std::vector<std::string>& machine_overrides, const py::dict& point,
                           bool record_dma_pieces) {
  const PagedPoint parsed = parse_point(point);
  const sim::Machine machine = load_machine_spec(machine_source, machine_overrides);
  std::shared_ptr<SimRun> run;
  {
    py::gil_scoped_release release;
    const ResolvedPoint resolved = resolve_point(parsed);
    run = time_program(sim::build_flash_paged_attention(machine, resolved.config), kKernelName,
                       resolved.parameters, record_dma_pieces, 200);
  }
  return wrap_run(std::move(run));
}

// Any registered kernel, its parameters resolved as the CLI resolves them.
py::capsule simulate_kernel(const std::string& kernel, const sim::KernelParameters& parameters,
                            const std::string& machine_source,
                            const std::vector<std::string>& machine_overrides,
                            bool record_dma_pieces) {
  std::shared_ptr<SimRun> run;
  {
    py::gil_scoped_release release;
    const sim::ResolvedKernelRequest request =
        sim::resolve_kernel_request(kernel, parameters, machine_source, machine_overrides);
    run = time_program(request.kernel->build(request.machine, request.parameters),
                       request.kernel->name, request.parameters, record_dma_pieces, 200);
  }
  return wrap_run(std::move(run));
}

py::list kernels() {
  py::list out;
  for (const sim::KernelInfo& k : sim::kernel_registry().kernels()) {
    py::list parameters;
    for (const sim::KernelParameter& p : k.parameters)
      parameters.append(py::make_tuple(p.name, p.default_value, p.help));
    py::dict d;
    d["name"] = k.name;
    d["description"] = k.description;
    d["default_machine"] = k.default_machine;
    d["parameters"] = parameters;
    out.append(d);
  }
  return out;
}

// Per point of a sweep: its summary or, when the point is invalid, the reason (non-empty).
struct SweepOutcomes {
  std::vector<Summary> summaries;
  std::vector<std::string> errors;
};

// Runs `summarize(i)` for i < count on OpenMP threads (the GIL must be released); a point whose
// summarize throws tilelab::Error gets the message. Errors other than tilelab::Error (internal
// faults) are rethrown after the loop.
template <typename Summarize>
SweepOutcomes summarize_in_parallel(size_t point_count, const Summarize& summarize) {
  const int64_t count = static_cast<int64_t>(point_count);
  SweepOutcomes out{std::vector<Summary>(point_count), std::vector<std::string>(point_count)};
  std::exception_ptr internal_error;
  std::atomic<bool> failed{false};
  // dynamic: points differ in cost by orders of magnitude (block size, context length). The
  // thread count is tilelab's (tilelab.set_num_threads), not OpenMP's default.
  const int threads = tilelab::num_threads();
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t i = 0; i < count; ++i) {
    if (failed.load()) continue;
    try {
      out.summaries[static_cast<size_t>(i)] = summarize(static_cast<size_t>(i));
    } catch (const Error& error) {
      if (error.kind() == ErrorKind::internal) {
#pragma omp critical(tilelab_sweep_error)
        if (!internal_error) internal_error = std::current_exception();
        failed.store(true);
      } else {
        out.errors[static_cast<size_t>(i)] = error.what();
      }
    } catch (...) {
#pragma omp critical(tilelab_sweep_error)
      if (!internal_error) internal_error = std::current_exception();
      failed.store(true);
    }
  }
  if (internal_error) std::rethrow_exception(internal_error);
  return out;
}

// Per point its summary dict or, when it is invalid, the message.
py::list to_python(const SweepOutcomes& outcomes) {
  py::list out;
  for (size_t i = 0; i < outcomes.errors.size(); ++i) {
    if (outcomes.errors[i].empty())
      out.append(summary_dict(outcomes.summaries[i]));
    else
      out.append(py::str(outcomes.errors[i]));
  }
  return out;
}

// What a timing-only run of a resolved point depends on: everything but the seed, which places
// the batch's blocks in the cache (the program and its timing do not depend on the placement).
std::string timing_key(const PagedPoint& p) {
  std::string key = p.schedule_json;
  for (const sim::PagedAttentionRequest& r : p.requests)
    key += "|" + std::to_string(r.query_len) + ":" + std::to_string(r.context_len);
  key += "|" + std::to_string(p.num_heads) + "|" + std::to_string(p.num_kv_heads) + "|" +
         std::to_string(p.head_dim) + "|" + p.dtype + "|" + std::to_string(p.tiling_factor) + "|" +
         (p.softmax_scale ? std::to_string(std::bit_cast<uint64_t>(*p.softmax_scale)) : "-") + "|" +
         std::to_string(p.machine);
  return key;
}

// The paged-attention shape-based points. Each distinct point builds and times its own program
// (timing only, no DMA pieces); points that differ only in their seed share one run.
// `machines` is a list of (source, overrides) pairs; taken as py::list so that the signature line
// stays free of nested type names (tests/python/test_api.py parses it against _core.pyi).
py::list sweep(const py::list& machine_specs, const py::list& points) {
  std::vector<sim::Machine> machines;
  for (const auto& [source, overrides] :
       machine_specs.cast<std::vector<std::pair<std::string, std::vector<std::string>>>>())
    machines.push_back(load_machine_spec(source, overrides));
  std::vector<PagedPoint> parsed;
  for (const py::handle& point : points) {
    parsed.push_back(parse_point(py::reinterpret_borrow<py::dict>(point)));
    if (parsed.back().machine >= machines.size())
      throw Error("points: machine index " + std::to_string(parsed.back().machine) +
                  " out of range (" + std::to_string(machines.size()) + " machines)");
  }
  py::gil_scoped_release release;
  // Resolve every point (cheap: the schedule's JSON and the batch's sizes); invalid points get
  // the message, the valid ones a run each distinct key.
  std::vector<ResolvedPoint> resolved(parsed.size());
  SweepOutcomes resolve_outcomes = summarize_in_parallel(parsed.size(), [&](size_t i) {
    resolved[i] = resolve_point(parsed[i]);
    return Summary{};
  });
  std::vector<size_t> run_of(parsed.size(), SIZE_MAX);
  std::vector<size_t> representatives;  // per run, its first point
  std::unordered_map<std::string, size_t> run_by_key;
  for (size_t i = 0; i < parsed.size(); ++i) {
    if (!resolve_outcomes.errors[i].empty()) continue;
    const auto [it, added] = run_by_key.emplace(timing_key(parsed[i]), representatives.size());
    if (added) representatives.push_back(i);
    run_of[i] = it->second;
  }
  const SweepOutcomes runs = summarize_in_parallel(representatives.size(), [&](size_t r) {
    const size_t i = representatives[r];
    const sim::Program program =
        sim::build_flash_paged_attention(machines[parsed[i].machine], resolved[i].config);
    sim::ReportOptions options;
    options.kernel = kKernelName;
    options.max_critical_path_segments = 0;  // the per-unit totals are enough for a table
    options.idle_blame = false;              // not among the flat metrics
    return flat_summary(sim::make_report(program, sim::simulate_timing(program), options));
  });
  SweepOutcomes out{std::vector<Summary>(parsed.size()), std::move(resolve_outcomes.errors)};
  for (size_t i = 0; i < parsed.size(); ++i) {
    if (run_of[i] == SIZE_MAX) continue;
    out.summaries[i] = runs.summaries[run_of[i]];
    out.errors[i] = runs.errors[run_of[i]];
  }
  py::gil_scoped_acquire acquire;
  return to_python(out);
}

// Any registered kernel over points of KEY=VALUE parameters, each with a machine index; as
// `sweep`, invalid points get the Error's message.
py::list sweep_kernel(const std::string& kernel_name, const py::list& machine_specs,
                      const py::list& points) {
  const sim::KernelInfo& kernel = sim::kernel_registry().find(kernel_name);
  std::vector<sim::Machine> machines;
  for (const auto& [source, overrides] :
       machine_specs.cast<std::vector<std::pair<std::string, std::vector<std::string>>>>())
    machines.push_back(
        sim::load_machine(source.empty() ? kernel.default_machine : source, overrides));
  std::vector<std::pair<sim::KernelParameters, size_t>> parsed;
  for (const auto& [parameters, machine] :
       points.cast<std::vector<std::pair<sim::KernelParameters, size_t>>>()) {
    if (machine >= machines.size())
      throw Error("points: machine index " + std::to_string(machine) + " out of range (" +
                  std::to_string(machines.size()) + " machines)");
    parsed.emplace_back(parameters, machine);
  }
  py::gil_scoped_release release;
  const SweepOutcomes out = summarize_in_parallel(parsed.size(), [&](size_t i) {
    const sim::KernelParameters parameters = sim::resolve_parameters(kernel, parsed[i].first);
    const sim::Program program = kernel.build(machines[parsed[i].second], parameters);
    sim::ReportOptions options;
    options.kernel = kernel.name;
    options.parameters = parameters;
    options.max_critical_path_segments = 0;
    options.idle_blame = false;  // not among the flat metrics
    return flat_summary(sim::make_report(program, sim::simulate_timing(program), options));
  });
  py::gil_scoped_acquire acquire;
  return to_python(out);
}

// --- array-based (functional) entry ----------------------------------------------------------

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;
using IntArray = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

// The runtime's shape check on a C-contiguous numpy array (the facade passes float32 / int32).
void require_shape(const py::array& array, const char* name,
                   std::initializer_list<std::int64_t> expected, const char* layout) {
  TILELAB_REQUIRE(array.ndim() == static_cast<py::ssize_t>(expected.size()))
      << name << ": expected shape " << layout << " (rank " << expected.size() << "), got a rank-"
      << array.ndim() << " array";
  std::vector<std::int64_t> shape(array.shape(), array.shape() + array.ndim());
  std::vector<std::int64_t> strides(shape.size());
  for (size_t i = 0; i < strides.size(); ++i)
    strides[i] = array.strides(static_cast<py::ssize_t>(i)) / array.itemsize();
  const TensorView view(const_cast<void*>(array.data()), DType::f32, static_cast<int>(shape.size()),
                        shape.data(), strides.data());
  tilelab::detail::require_shape(view, name, layout, expected);
}

std::span<const float> span_of(const FloatArray& array) {
  return {array.data(), static_cast<size_t>(array.size())};
}

py::tuple simulate_arrays(const std::string& machine_source,
                          const std::vector<std::string>& machine_overrides,
                          const std::string& schedule_json, const py::array& query_array,
                          const py::array& key_array, const py::array& value_array,
                          const py::array& kv_cache_array, const py::array& block_tables_array,
                          const py::array& mask_array, const std::string& dtype,
                          std::optional<double> softmax_scale, int64_t tiling_factor) {
  // Plain py::array parameters keep the signature line simple (the stub test parses it); the
  // facade already passes C-contiguous float32 / int32, so these casts do not copy.
  const FloatArray query = FloatArray::ensure(query_array), key = FloatArray::ensure(key_array),
                   value = FloatArray::ensure(value_array),
                   kv_cache = FloatArray::ensure(kv_cache_array);
  const IntArray block_tables = IntArray::ensure(block_tables_array),
                 mask = IntArray::ensure(mask_array);
  TILELAB_REQUIRE(query && key && value && kv_cache && block_tables && mask)
      << "query, key, value, kv_cache, block_tables, mask: expected numeric arrays";
  sim::FlashPagedAttentionConfig config;
  config.schedule = PagedAttentionSchedule::from_json(schedule_json);
  require_shape(query, "query", {1, -1, -1, -1}, "(1, n_heads, d, seq_q)");
  const py::ssize_t n_heads = query.shape(1), d = query.shape(2), seq_q = query.shape(3);
  require_shape(key, "key", {1, -1, d, seq_q}, "(1, n_kv_heads, d, seq_q)");
  const py::ssize_t n_kv_heads = key.shape(1);
  require_shape(value, "value", {1, n_kv_heads, seq_q, d}, "(1, n_kv_heads, seq_q, d)");
  require_shape(kv_cache, "kv_cache", {2, -1, n_kv_heads, -1, d},
                "(2, num_blocks, n_kv_heads, block_size, d)");
  TILELAB_REQUIRE(kv_cache.shape(3) == config.schedule.block_size)
      << "kv_cache: block_size (dimension 3) is " << kv_cache.shape(3)
      << " but the schedule's block_size is " << config.schedule.block_size;
  require_shape(block_tables, "block_tables", {-1}, "(num_active_blocks,)");
  const py::ssize_t num_blocks = kv_cache.shape(1), active = block_tables.shape(0);
  const py::ssize_t context = active * config.schedule.block_size;
  require_shape(mask, "mask", {seq_q, context + seq_q},
                "(seq_q, num_active_blocks * block_size + seq_q)");
  tilelab::detail::require_block_table_entries(block_tables.data(), active, 1, num_blocks);

  config.shape.num_heads = n_heads;
  config.shape.num_kv_heads = n_kv_heads;
  config.shape.head_dim = d;
  config.shape.query_len = seq_q;
  config.shape.num_active_blocks = active;
  config.num_cache_blocks = num_blocks;
  config.dtype = parse_dtype(dtype);
  if (softmax_scale) config.softmax_scale = static_cast<float>(*softmax_scale);
  config.schedule.block_size_tiling_factor_override = tiling_factor;
  const sim::Machine machine = load_machine_spec(machine_source, machine_overrides);

  std::vector<float> block_table_values(block_tables.data(), block_tables.data() + active);
  // The mask comes reordered for the schedule's own tiling factor (the NKI convention of
  // reorder_context_mask); a forced tiling_factor consumes columns in another order, so the
  // context columns are put back in token order and reordered for the forced layout.
  std::vector<uint8_t> mask_values(mask.data(), mask.data() + mask.size());
  for (uint8_t& v : mask_values) v = v != 0;
  std::shared_ptr<SimRun> run;
  FloatArray output({py::ssize_t(1), n_heads, seq_q, d});
  {
    py::gil_scoped_release release;
    const sim::KvTileLayout layout = sim::kv_tile_layout(config);
    sim::FlashPagedAttentionConfig auto_config = config;
    auto_config.schedule.block_size_tiling_factor_override = 0;
    const sim::KvTileLayout auto_layout = sim::kv_tile_layout(auto_config);
    const int64_t large = config.schedule.large_tile_size;
    if (layout.tiled_block_size() != auto_layout.tiled_block_size() && context % large == 0) {
      const std::vector<int64_t> token = sim::context_token_of_column(auto_layout, large);
      const int64_t width = context + seq_q;
      std::vector<uint8_t> natural = mask_values;
      for (int64_t row = 0; row < seq_q; ++row)
        for (int64_t tile = 0; tile < context / large; ++tile)
          for (int64_t column = 0; column < large; ++column)
            natural[size_t(row * width + tile * large + token[size_t(column)])] =
                mask_values[size_t(row * width + tile * large + column)];
      mask_values = sim::reorder_context_mask(natural, seq_q, context, layout, large);
    }
    std::vector<float> mask_floats(mask_values.begin(), mask_values.end());

    sim::Program program = sim::build_flash_paged_attention(machine, config);
    sim::FunctionalExecutor executor(program);
    executor.set_tensor("query", span_of(query));
    executor.set_tensor("key", span_of(key));
    executor.set_tensor("value", span_of(value));
    executor.set_tensor("kv_cache", span_of(kv_cache));
    executor.set_tensor("block_tables", block_table_values);
    executor.set_tensor("mask", mask_floats);
    executor.run();
    const std::vector<float> result = executor.tensor("output");
    TILELAB_CHECK(result.size() == static_cast<size_t>(output.size()))
        << "output: " << result.size() << " elements, expected " << output.size();
    std::copy(result.begin(), result.end(), output.mutable_data());
    run = time_program(std::move(program), kKernelName, report_parameters(config, tiling_factor),
                       true, 200);
  }
  return py::make_tuple(wrap_run(std::move(run)), output);
}

// --- reports ---------------------------------------------------------------------------------

// The critical path as a per-instruction flag, for timeline plots.
std::vector<uint8_t> critical_flags(const SimRun& run) {
  std::vector<uint8_t> flags(run.program.instructions.size(), 0);
  for (uint32_t i : sim::critical_path(run.program, run.timing)) flags[i] = 1;
  return flags;
}

template <typename T>
py::array_t<T> to_array(const std::vector<T>& values) {
  py::array_t<T> out(static_cast<py::ssize_t>(values.size()));
  std::copy(values.begin(), values.end(), out.mutable_data());
  return out;
}

// Column arrays of the timeline (one row per instruction, program order) plus the code tables
// of its categorical columns; sim.py assembles the numpy structured array.
py::dict timeline(const py::handle& handle) {
  const SimRun& run = unwrap_run(handle, "handle");
  const size_t n = run.program.instructions.size();
  std::vector<uint8_t> engine(n), opcode(n), wait_reason(n), transfer_reason(n), is_dma(n);
  std::vector<double> start(n), issue_end(n), end(n), transfer_start(n);
  std::vector<int64_t> wait_on(n), dma_queue(n), dma_partitions(n);
  std::vector<uint64_t> dma_bytes(n), dma_bytes_per_partition(n);
  // Memory codes (memory_names) of a DMA's source and destination; -1 for compute instructions.
  std::vector<int8_t> dma_source(n, -1), dma_destination(n, -1);
  for (size_t i = 0; i < n; ++i) {
    const sim::Instruction& instr = run.program.instructions[i];
    const sim::InstructionTiming& t = run.timing.instructions[i];
    engine[i] = static_cast<uint8_t>(instr.engine);
    opcode[i] = static_cast<uint8_t>(instr.opcode);
    start[i] = t.start_ns;
    issue_end[i] = t.issue_end_ns;
    end[i] = t.end_ns;
    transfer_start[i] = t.transfer_start_ns;
    wait_reason[i] = static_cast<uint8_t>(t.wait_reason);
    transfer_reason[i] = static_cast<uint8_t>(t.transfer_reason);
    wait_on[i] = t.wait_on == sim::kNone ? -1 : int64_t(t.wait_on);
    is_dma[i] = instr.dma != sim::kNone;
    dma_queue[i] = is_dma[i] ? run.program.dmas[instr.dma].queue : -1;
    dma_bytes[i] = is_dma[i] ? run.program.dmas[instr.dma].bytes() : 0;
    if (is_dma[i]) {
      const sim::DmaRecord& dma = run.program.dmas[instr.dma];
      dma_partitions[i] = dma.partitions;
      dma_bytes_per_partition[i] = dma.bytes_per_partition;
      // The tile side of a DMA is its operand; the HBM side has no operand (isa.hpp).
      const auto memory_of = [&](bool is_hbm, int slot) -> int8_t {
        if (is_hbm) return static_cast<int8_t>(sim::Memory::hbm);
        const sim::TileRef& ref = instr.operands[size_t(slot)];
        return ref.valid() ? static_cast<int8_t>(run.program.buffers[ref.tile].memory) : -1;
      };
      dma_source[i] = memory_of(dma.hbm_is_source, sim::kSrc0);
      dma_destination[i] = memory_of(dma.hbm_is_destination, sim::kDst);
    }
  }
  py::list engine_names, opcode_names, reason_names, memory_names;
  for (sim::Memory memory : {sim::Memory::hbm, sim::Memory::sbuf, sim::Memory::psum})
    memory_names.append(std::string(sim::memory_name(memory)));
  for (int e = 0; e < sim::kEngineCount; ++e)
    engine_names.append(std::string(sim::engine_name(static_cast<sim::Engine>(e))));
  for (int o = 0; o < sim::kOpcodeCount; ++o)
    opcode_names.append(std::string(sim::opcode_name(static_cast<sim::Opcode>(o))));
  for (sim::WaitReason reason : sim::kWaitReasons)
    reason_names.append(sim::wait_reason_name(reason));
  py::dict d;
  d["engine"] = to_array(engine);
  d["opcode"] = to_array(opcode);
  d["start_ns"] = to_array(start);
  d["issue_end_ns"] = to_array(issue_end);
  d["end_ns"] = to_array(end);
  d["transfer_start_ns"] = to_array(transfer_start);
  d["wait_reason"] = to_array(wait_reason);
  d["transfer_wait_reason"] = to_array(transfer_reason);
  d["wait_on"] = to_array(wait_on);
  d["is_dma"] = to_array(is_dma);
  d["dma_queue"] = to_array(dma_queue);
  d["dma_bytes"] = to_array(dma_bytes);
  d["dma_partitions"] = to_array(dma_partitions);
  d["dma_bytes_per_partition"] = to_array(dma_bytes_per_partition);
  d["dma_source"] = to_array(dma_source);
  d["dma_destination"] = to_array(dma_destination);
  d["on_critical_path"] = to_array(critical_flags(run));
  d["engine_names"] = engine_names;
  d["opcode_names"] = opcode_names;
  d["wait_reason_names"] = reason_names;
  d["memory_names"] = memory_names;
  return d;
}

// Column arrays of the run's DMA pieces (one row per piece: the share of one transfer that one
// DMA engine moves), in the order the timing scheduled them.
py::dict dma_pieces(const py::handle& handle) {
  const SimRun& run = unwrap_run(handle, "handle");
  const std::vector<sim::DmaPieceTiming>& pieces = run.timing.dma_pieces;
  const bool has_dma = std::any_of(run.program.instructions.begin(), run.program.instructions.end(),
                                   [](const sim::Instruction& i) { return i.dma != sim::kNone; });
  // Every run the Python front end keeps records its pieces (time_program); a run without them
  // would give an empty table that looks like a program without DMA.
  TILELAB_CHECK(!pieces.empty() || !has_dma) << "handle: the run did not record its DMA pieces";
  const size_t n = pieces.size();
  std::vector<uint32_t> instruction(n);
  std::vector<int64_t> engine(n), queue(n);
  std::vector<uint64_t> bytes(n);
  std::vector<double> start(n), end(n);
  for (size_t i = 0; i < n; ++i) {
    instruction[i] = pieces[i].instruction;
    engine[i] = pieces[i].engine;
    queue[i] = pieces[i].queue;
    bytes[i] = pieces[i].bytes;
    start[i] = pieces[i].start_ns;
    end[i] = pieces[i].end_ns;
  }
  py::dict d;
  d["instruction"] = to_array(instruction);
  d["dma_engine"] = to_array(engine);
  d["queue"] = to_array(queue);
  d["bytes"] = to_array(bytes);
  d["start_ns"] = to_array(start);
  d["end_ns"] = to_array(end);
  return d;
}

void write_text(const std::string& path, const std::string& text) {
  try {
    sim::write_file_whole(path, text);
  } catch (const Error& e) {
    throw Error(std::string("path: ") + e.what(), e.kind());
  }
}

void save_html(const py::handle& handle, const std::string& path,
               const std::vector<std::pair<std::string, py::object>>& comparisons,
               const std::string& title, const std::string& baseline_label) {
  const SimRun& run = unwrap_run(handle, "handle");
  sim::HtmlOptions options;
  options.title = title;
  if (!baseline_label.empty()) options.baseline_label = baseline_label;
  for (const auto& [label, other] : comparisons)
    options.comparisons.push_back({label, unwrap_run(other, "compare").report});
  std::string html;
  {
    py::gil_scoped_release release;
    html = sim::report_html(run.program, run.timing, run.report, options);
  }
  write_text(path, html);
}

void save_trace(const py::handle& handle, const std::string& path, size_t max_events) {
  const SimRun& run = unwrap_run(handle, "handle");
  std::string text;
  {
    py::gil_scoped_release release;
    text = sim::chrome_trace(run.program, run.timing, max_events) + "\n";
  }
  write_text(path, text);
}

}  // namespace

py::capsule simulate_program(sim::Program program, const std::string& kernel_name,
                             const std::map<std::string, std::string>& parameters,
                             bool record_dma_pieces) {
  std::shared_ptr<SimRun> run;
  {
    py::gil_scoped_release release;
    run = time_program(std::move(program), kernel_name, parameters, record_dma_pieces, 200);
  }
  return wrap_run(std::move(run));
}

void register_sim_bindings(py::module_& core) {
  core.def("sim_machine_presets", &sim::machine_preset_names,
           "Names of the built-in machine presets (sim/machines/*.json).");
  core.def(
      "sim_default_requests",
      [] {
        std::vector<std::pair<int64_t, int64_t>> out;
        for (const auto& r : sim::default_paged_attention_requests())
          out.emplace_back(r.query_len, r.context_len);
        return out;
      },
      "The default batch of `tilelab sim paged-attention` as (query_len, context_len) pairs.");
  py::class_<sim::Machine>(core, "SimMachine",
                           "A loaded machine; fields are read and set by name, validated.")
      .def_static("load", &load_machine_spec, py::arg("source"), py::arg("overrides"),
                  "Loads a machine (preset name or JSON path) with KEY=VALUE overrides.")
      .def_static(
          "fields",
          [] {
            std::vector<std::tuple<std::string, std::string, double, double>> out;
            for (const sim::MachineField& f : sim::machine_fields())
              out.emplace_back(f.name, f.kind, f.min, f.max);
            return out;
          },
          "Every parameter as (name, kind, min, max), from the machine JSON's key table.")
      .def(
          "get",
          [](const sim::Machine& m, const std::string& name) {
            return to_python(sim::machine_field_value(m, name));
          },
          py::arg("name"), "The value of one parameter.")
      .def(
          "set",
          [](sim::Machine& m, const std::string& name, const py::object& value) {
            nlohmann::json json;
            try {
              json = from_python(name, value);
            } catch (const py::error_already_set& e) {
              throw Error(
                  name + ": expected a finite number, a bool or a list of numbers, got " +
                      py::str(py::repr(value)).cast<std::string>().substr(0, 80),
                  e.matches(PyExc_TypeError) ? ErrorKind::invalid_type : ErrorKind::invalid_value);
            }
            sim::set_machine_field(m, name, json);
          },
          py::arg("name"), py::arg("value"),
          "Sets one parameter in place, validated (range and consistency); unchanged on error.")
      .def(
          "copy", [](const sim::Machine& m) { return m; }, "An independent copy.")
      .def_readonly("name", &sim::Machine::name)
      .def_readonly("description", &sim::Machine::description)
      .def_readonly("source_of_key", &sim::Machine::source_of_key);
  core.def(
      "sim_schedule",
      [](const std::string& json) { return PagedAttentionSchedule::from_json(json).to_json(); },
      py::arg("json"),
      "Parses and validates a PagedAttentionSchedule JSON; returns the normalized JSON with its "
      "derived values.");
  core.def(
      "sim_program_limits",
      [] {
        const sim::ProgramLimits limits = sim::program_limits();
        return std::make_pair(limits.max_instructions, limits.max_buffer_elements);
      },
      "The program size limits (max_instructions, max_buffer_elements) of every build.");
  core.def(
      "sim_set_program_limits",
      [](uint64_t max_instructions, uint64_t max_buffer_elements) {
        sim::set_program_limits({max_instructions, max_buffer_elements});
      },
      py::arg("max_instructions"), py::arg("max_buffer_elements"),
      "Sets the program size limits of every later build (process-wide).");
  core.def("sim_simulate", &simulate_point, py::arg("machine_source"), py::arg("machine_overrides"),
           py::arg("point"), py::arg("record_dma_pieces") = true,
           "Builds and times the paged attention kernel for one shape-based point; returns a run "
           "handle.");
  core.def(
      "sim_metrics",
      [] {
        std::vector<std::pair<std::string, std::string>> out;
        for (const sim::Metric& m : sim::flat_metrics(sim::Report{}))
          out.emplace_back(m.name, m.unit);
        return out;
      },
      "The flat summary's metrics as (name, unit), in order (sim/analysis.hpp).");
  core.def("sim_kernels", &kernels,
           "The registered kernels: name, description, default_machine and parameters as "
           "(name, default, help) tuples.");
  core.def("sim_simulate_kernel", &simulate_kernel, py::arg("kernel"), py::arg("parameters"),
           py::arg("machine_source"), py::arg("machine_overrides"),
           py::arg("record_dma_pieces") = true,
           "Builds and times any registered kernel with KEY=VALUE parameters (defaults filled "
           "in, unknown keys rejected) on a machine ('' = the kernel's default); returns a run "
           "handle.");
  core.def("sim_simulate_arrays", &simulate_arrays, py::arg("machine_source"),
           py::arg("machine_overrides"), py::arg("schedule_json"), py::arg("query"), py::arg("key"),
           py::arg("value"), py::arg("kv_cache"), py::arg("block_tables"), py::arg("mask"),
           py::arg("dtype"), py::arg("softmax_scale"), py::arg("tiling_factor"),
           "Runs the paged attention kernel functionally on NKI-layout arrays and times it; "
           "returns (run handle, float32 output).");
  core.def("sim_sweep", &sweep, py::arg("machines"), py::arg("points"),
           "Simulates many shape-based points in parallel (OpenMP, GIL released); returns per "
           "point a summary dict or the reason the point is invalid.");
  core.def("sim_sweep_kernel", &sweep_kernel, py::arg("kernel"), py::arg("machines"),
           py::arg("points"),
           "Simulates any registered kernel at many (parameters, machine index) points in "
           "parallel; returns per point a summary dict or the reason the point is invalid.");
  core.def(
      "sim_summary",
      [](const py::handle& handle) {
        return summary_dict(flat_summary(unwrap_run(handle, "handle").report));
      },
      py::arg("handle"), "The flat summary of a run (one number per key).");
  core.def(
      "sim_report_json",
      [](const py::handle& handle) {
        return sim::report_json(unwrap_run(handle, "handle").report).dump();
      },
      py::arg("handle"), "The run's report as JSON text (schema tilelab.sim_report).");
  core.def(
      "sim_report_text",
      [](const py::handle& handle) {
        return sim::report_text(unwrap_run(handle, "handle").report);
      },
      py::arg("handle"), "The run's report as a text table.");
  core.def("sim_timeline", &timeline, py::arg("handle"),
           "Per-instruction timing columns of a run.");
  core.def("sim_dma_pieces", &dma_pieces, py::arg("handle"),
           "Per-DMA-piece columns of a run: instruction, dma_engine, queue, bytes, start_ns, "
           "end_ns.");
  core.def("sim_save_html", &save_html, py::arg("handle"), py::arg("path"), py::arg("comparisons"),
           py::arg("title"), py::arg("baseline_label"),
           "Writes the self-contained HTML report of a run.");
  core.def("sim_save_trace", &save_trace, py::arg("handle"), py::arg("path"), py::arg("max_events"),
           "Writes the Chrome/Perfetto trace of a run.");
}

}  // namespace tilelab::python
