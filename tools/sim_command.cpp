// `tilelab sim` implementation.
#include "sim_command.hpp"

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <random>
#include <sstream>

#include <tilelab/error.hpp>

#include "sim/analysis.hpp"
#include "sim/functional.hpp"
#include "sim/kernel_request.hpp"
#include "sim/kernels/registry.hpp"
#include "sim/machine.hpp"
#include "sim/output_file.hpp"
#include "sim/program.hpp"
#include "sim/report.hpp"
#include "sim/report_html.hpp"
#include "sim/timing.hpp"

namespace tilelab::tools {
namespace {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What both verbs take: the kernel, its parameters and the machine.
struct RequestOptions {
  std::string kernel;
  std::string machine;
  std::vector<std::string> machine_overrides;
  sim::KernelParameters parameters;
  sim::ProgramLimits limits;
  bool help = false;
};

struct Options : RequestOptions {
  std::string json_path;
  std::string trace_path;
  std::string html_path;
  std::string out_dir;
  std::vector<std::string> comparisons;
  bool no_compare = false;
  std::string text_path = "-";
  bool trace_dma_pieces = false;
  bool functional = false;
  size_t max_trace_events = 500000;
  bool list = false;
  bool describe_machine = false;
};

void add_parameter(sim::KernelParameters& parameters, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UsageError("parameter '" + assignment + "': expected KEY=VALUE");
  parameters[assignment.substr(0, eq)] = assignment.substr(eq + 1);
}

// A count given to option `flag`: decimal digits only, within [min_value, max_value].
uint64_t parse_count(const std::string& flag, const std::string& text, uint64_t min_value,
                     uint64_t max_value) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
  if (!digits || error != std::errc() || stop != end || value < min_value || value > max_value)
    throw UsageError(flag + ": expected a whole number in [" + std::to_string(min_value) + ", " +
                     std::to_string(max_value) + "], got '" + text + "'");
  return value;
}

// The value after option `flag`.
using OptionValue = std::function<std::string(const char* flag)>;

// Parses the options both verbs share and the kernel name and bare KEY=VALUE parameters; every
// other option goes to `own(option, value)`, which returns false for one it does not know.
void parse_request(const std::vector<std::string>& args, RequestOptions& o,
                   const std::function<bool(const std::string&, const OptionValue&)>& own) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const OptionValue value = [&](const char* flag) -> std::string {
      if (i + 1 >= args.size()) throw UsageError(std::string(flag) + " needs a value");
      return args[++i];
    };
    if (a == "-h" || a == "--help") {
      o.help = true;
    } else if (a == "--machine" || a == "-m") {
      o.machine = value("--machine");
    } else if (a == "--set") {
      o.machine_overrides.push_back(value("--set"));
    } else if (a == "--param" || a == "-p") {
      add_parameter(o.parameters, value("--param"));
    } else if (a == "--max-instructions") {
      o.limits.max_instructions = parse_count(a, value("--max-instructions"), 1, UINT64_MAX);
    } else if (a == "--max-buffer-elements") {
      o.limits.max_buffer_elements = parse_count(a, value("--max-buffer-elements"), 1, UINT64_MAX);
    } else if (!a.empty() && a[0] == '-') {
      if (!own(a, value)) throw UsageError("unknown option '" + a + "'");
    } else if (a.find('=') != std::string::npos) {
      add_parameter(o.parameters, a);  // bare KEY=VALUE after the kernel
    } else if (o.kernel.empty()) {
      o.kernel = a;
    } else {
      throw UsageError("unexpected argument '" + a + "' (kernel already given as '" + o.kernel +
                       "')");
    }
  }
}

Options parse(const std::vector<std::string>& args) {
  Options o;
  parse_request(args, o, [&o](const std::string& a, const OptionValue& value) {
    if (a == "--list") {
      o.list = true;
    } else if (a == "--describe-machine") {
      o.describe_machine = true;
    } else if (a == "--json") {
      o.json_path = value("--json");
    } else if (a == "--trace") {
      o.trace_path = value("--trace");
    } else if (a == "--html") {
      o.html_path = value("--html");
    } else if (a == "--out-dir") {
      o.out_dir = value("--out-dir");
    } else if (a == "--compare") {
      const std::string c = value("--compare");
      if (c.find('=') == std::string::npos || c.front() == '=')
        throw UsageError("--compare '" + c + "': expected KEY=VALUE");
      o.comparisons.push_back(c);
    } else if (a == "--no-compare") {
      o.no_compare = true;
    } else if (a == "--text") {
      o.text_path = value("--text");
    } else if (a == "--functional") {
      o.functional = true;
    } else if (a == "--trace-dma-pieces") {
      o.trace_dma_pieces = true;
    } else if (a == "--max-trace-events") {
      o.max_trace_events = parse_count(a, value("--max-trace-events"), 1, SIZE_MAX);
    } else {
      return false;
    }
    return true;
  });
  return o;
}

// Writes `text` to `path`, '-' being standard output; errors name the path and the reason.
void write_output(const std::string& path, const std::string& text) {
  if (path == "-") {
    std::cout << text << std::flush;
    if (!std::cout) throw Error("cannot write to standard output");
    return;
  }
  sim::write_file_whole(path, text);
}

// Runs `program` on random inputs (every HBM tensor read by a DMA and never written) and
// summarises every written HBM tensor.
std::string run_functional(const sim::Program& program,
                           const std::map<std::string, std::vector<float>>& given) {
  std::vector<bool> read(program.buffers.size(), false), written(program.buffers.size(), false);
  for (const sim::DmaRecord& d : program.dmas) {
    if (d.hbm.tensor == sim::kNone) continue;
    (d.hbm_is_source ? read : written)[d.hbm.tensor] = true;
  }
  const auto start = std::chrono::steady_clock::now();
  sim::FunctionalExecutor exec(program);
  std::mt19937 rng(12345);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (uint32_t i = 0; i < program.buffers.size(); ++i) {
    if (!read[i] || written[i]) continue;
    const auto it = given.find(program.buffers[i].name);
    if (it != given.end()) {
      exec.set_tensor(sim::Tensor{i}, it->second);
      continue;
    }
    std::vector<float> values(program.buffers[i].free_elements);
    for (float& v : values) v = dist(rng);
    exec.set_tensor(sim::Tensor{i}, values);
  }
  exec.run();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::ostringstream out;
  char line[300];
  std::snprintf(line, sizeof line,
                "functional run (inputs uniform in [-1, 1) except the kernel's index/mask "
                "inputs): %.3f s\n",
                seconds);
  out << line;
  for (uint32_t i = 0; i < program.buffers.size(); ++i) {
    if (!written[i]) continue;
    const std::vector<float> values = exec.tensor(sim::Tensor{i});
    size_t nan = 0;
    double lo = 1e300, hi = -1e300, sum_abs = 0;
    for (float v : values) {
      if (std::isnan(v)) {
        ++nan;
        continue;
      }
      lo = std::min(lo, double(v));
      hi = std::max(hi, double(v));
      sum_abs += std::fabs(v);
    }
    const size_t finite = values.size() - nan;
    std::snprintf(line, sizeof line,
                  "  %s: %zu elements, %zu NaN, min %.4g, max %.4g, mean |x| %.4g\n",
                  program.buffers[i].name.c_str(), values.size(), nan, finite ? lo : 0.0,
                  finite ? hi : 0.0, finite ? sum_abs / finite : 0.0);
    out << line;
  }
  return out.str();
}

std::string kernel_list() {
  std::ostringstream out;
  for (const auto& k : sim::kernel_registry().kernels()) {
    out << "  " << k.name << " (default machine " << k.default_machine << ")\n      "
        << k.description << "\n";
    for (const auto& p : k.parameters)
      out << "      " << p.name << "=" << p.default_value << "  " << p.help << "\n";
  }
  return out.str();
}

}  // namespace

std::string sim_usage() {
  std::ostringstream out;
  out << "usage: tilelab sim KERNEL [KEY=VALUE ...] [options]\n"
         "\n"
         "Builds KERNEL as a tile program for a NeuronCore-like machine, simulates its timing and\n"
         "writes a summary (engines, DMA, TensorE utilisation, idle-time blame, critical path).\n"
         "\n"
         "options:\n"
         "  -m, --machine NAME|FILE  machine preset (";
  const auto presets = sim::machine_preset_names();
  for (size_t i = 0; i < presets.size(); ++i) out << (i ? ", " : "") << presets[i];
  out << ") or a machine JSON file;\n"
         "                           default: the kernel's machine\n"
         "  --set KEY=VALUE          override a machine parameter (repeatable), e.g.\n"
         "                           --set dma_bytes_per_ns_per_engine=20\n"
         "  -p, --param KEY=VALUE    kernel shape/schedule parameter (repeatable; bare KEY=VALUE\n"
         "                           after the kernel works too)\n"
         "  --json PATH              write the JSON report (schema tilelab.sim_report v3; '-' =\n"
         "                           stdout)\n"
         "  --trace PATH             write a Chrome/Perfetto trace (one track per engine and DMA\n"
         "                           queue)\n"
         "  --html PATH              write a self-contained HTML report (timeline, DMA bandwidth,\n"
         "                           bytes-per-partition histogram, SBUF/PSUM occupancy)\n"
         "  --out-dir DIR            directory of the default reports of main-job kernels\n"
         "                           (paged-attention): without --json/--trace/--html they write\n"
         "                           DIR/report.json, DIR/trace.json, DIR/report.html (default .)\n"
         "  --compare KEY=VALUE      also simulate with this kernel parameter changed and compare\n"
         "                           (repeatable; paged-attention compares tiling_factor=1 by\n"
         "                           default)\n"
         "  --no-compare             skip the kernel's default comparisons\n"
         "  --trace-dma-pieces       add one track per DMA engine with every piece\n"
         "  --max-trace-events N     cap the trace size (default 500000)\n"
         "  --max-instructions N     program size limit (default " +
             std::to_string(sim::ProgramLimits::kDefaultMaxInstructions) +
             "), checked while building\n"
             "  --max-buffer-elements N  limit on the elements of all HBM tensors and tiles of "
             "the\n"
             "                           program (default " +
             std::to_string(sim::ProgramLimits::kDefaultMaxBufferElements) +
             ")\n"
             "  --text PATH              write the text summary to PATH (default '-' = stdout)\n"
             "  --functional             also run the program on data: inputs uniform in [-1, 1),\n"
             "                           outputs summarised (NaN counts reveal reads of\n"
             "                           uninitialised memory); slow for large shapes\n"
             "  --describe-machine       print the machine's parameters with their sources and "
             "exit\n"
             "  --list                   list kernels and their parameters\n"
             "  -h, --help               this help\n"
             "\n"
             "kernels:\n"
      << kernel_list()
      << "\nexamples:\n"
         "  tilelab sim matmul --machine trn1 variant=tiled M=4096 K=8192 N=8192 --json r.json "
         "--trace t.json\n"
         "  tilelab sim paged-attention            # writes report.json, trace.json, report.html\n"
         "  tilelab sim paged-attention tiling_factor=1 --out-dir /tmp/no_tiling\n";
  return out.str();
}

int run_sim_command(const std::vector<std::string>& args) {
  Options o;
  try {
    o = parse(args);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "tilelab sim: %s\nRun 'tilelab sim --help' for usage.\n", e.what());
    return 2;
  }
  try {
    if (o.help) {
      std::cout << sim_usage();
      return 0;
    }
    if (o.list) {
      std::cout << kernel_list();
      return 0;
    }
    if (o.describe_machine) {
      const sim::Machine machine =
          sim::load_machine(o.machine.empty() ? "trn1" : o.machine, o.machine_overrides);
      std::cout << machine.name << ": " << machine.description << "\n";
      for (const auto& [key, source] : machine.source_of_key)
        std::cout << "  " << key << "  <- " << source << "\n";
      return 0;
    }
    if (o.kernel.empty()) {
      std::fprintf(stderr, "tilelab sim: missing KERNEL\nRun 'tilelab sim --help' for usage.\n");
      return 2;
    }
    sim::set_program_limits(o.limits);
    const sim::ResolvedKernelRequest request =
        sim::resolve_kernel_request(o.kernel, o.parameters, o.machine, o.machine_overrides);
    const sim::KernelInfo& kernel = *request.kernel;
    const sim::KernelParameters& parameters = request.parameters;
    const sim::Machine& machine = request.machine;

    std::string json_path = o.json_path, trace_path = o.trace_path, html_path = o.html_path;
    bool trace_pieces = o.trace_dma_pieces;
    if (kernel.writes_reports_by_default && json_path.empty() && trace_path.empty() &&
        html_path.empty()) {
      const std::filesystem::path dir = o.out_dir.empty() ? "." : o.out_dir;
      std::error_code code;
      std::filesystem::create_directories(dir, code);
      if (code || !std::filesystem::is_directory(dir))
        throw Error("--out-dir '" + dir.string() + "': cannot create the directory: " +
                    (code ? code.message() : std::string("a file of that name exists")));
      json_path = (dir / "report.json").string();
      trace_path = (dir / "trace.json").string();
      html_path = (dir / "report.html").string();
      trace_pieces = true;
    } else if (!o.out_dir.empty()) {
      throw Error("--out-dir: only for the default reports of '" + kernel.name +
                  "'; with --json/--trace/--html give full paths");
    }

    const auto t0 = std::chrono::steady_clock::now();
    const sim::Program program = kernel.build(machine, parameters);
    const auto t1 = std::chrono::steady_clock::now();
    sim::TimingOptions timing_options;
    // The HTML's DMA-engine rows and bandwidth chart need the per-engine pieces.
    timing_options.record_dma_pieces = (!trace_path.empty() && trace_pieces) || !html_path.empty();
    const sim::TimingResult timing = sim::simulate_timing(program, timing_options);
    const auto t2 = std::chrono::steady_clock::now();

    sim::ReportOptions report_options;
    report_options.kernel = kernel.name;
    report_options.parameters = parameters;
    const sim::Report report = sim::make_report(program, timing, report_options);

    // Comparison runs: the same kernel with one parameter changed.
    std::vector<std::string> comparison_overrides;
    if (!o.no_compare)
      for (const auto& c : kernel.default_comparisons)
        if (!o.parameters.count(c.substr(0, c.find('=')))) comparison_overrides.push_back(c);
    for (const auto& c : o.comparisons) comparison_overrides.push_back(c);
    sim::HtmlOptions html_options;
    html_options.baseline_label = "this run";
    for (const auto& c : comparison_overrides) {
      sim::KernelParameters changed = o.parameters;
      add_parameter(changed, c);
      const sim::KernelParameters resolved = sim::resolve_parameters(kernel, changed);
      const sim::Program other = kernel.build(machine, resolved);
      sim::ReportOptions other_options = report_options;
      other_options.parameters = resolved;
      html_options.comparisons.push_back(
          {c, sim::make_report(other, sim::simulate_timing(other), other_options)});
    }

    std::string summary;
    if (!o.text_path.empty()) {
      std::string text = sim::report_text(report);
      const double build_s = std::chrono::duration<double>(t1 - t0).count();
      const double sim_s = std::chrono::duration<double>(t2 - t1).count();
      char line[400];
      std::snprintf(line, sizeof line, "(built in %.3f s, simulated in %.3f s)\n", build_s, sim_s);
      text += line;
      for (const auto& c : html_options.comparisons) {
        std::snprintf(line, sizeof line,
                      "compared with %s: total %.3f us vs %.3f us; DMA utilization while "
                      "active %.1f%% vs %.1f%%\n",
                      c.label.c_str(), report.total_time_ns / 1e3, c.report.total_time_ns / 1e3,
                      report.dma_utilization_percent, c.report.dma_utilization_percent);
        text += line;
        for (const auto& mine : report.dma_by_kind)
          for (const auto& theirs : c.report.dma_by_kind)
            if (mine.kind == theirs.kind) {
              std::snprintf(line, sizeof line,
                            "  %-13s %5.1f%% of peak on %d engines (%.0f B/partition) vs %5.1f%% "
                            "on %d engines (%.0f B/partition)\n",
                            mine.kind.c_str(), mine.utilization_percent, mine.engines_used,
                            mine.average_bytes_per_partition, theirs.utilization_percent,
                            theirs.engines_used, theirs.average_bytes_per_partition);
              text += line;
            }
      }
      if (o.functional) {
        const auto inputs = kernel.functional_inputs ? kernel.functional_inputs(parameters)
                                                     : std::map<std::string, std::vector<float>>{};
        text += run_functional(program, inputs);
      }
      for (const auto& [path, what] :
           {std::pair{json_path, "report"}, std::pair{trace_path, "trace"},
            std::pair{html_path, "HTML report"}})
        if (!path.empty() && path != "-") text += std::string("wrote ") + what + " " + path + "\n";
      summary = std::move(text);
    }
    // The reports first: the summary says "wrote" only once they are written.
    if (!json_path.empty()) write_output(json_path, sim::report_json(report).dump(2) + "\n");
    if (!trace_path.empty())
      write_output(trace_path, sim::chrome_trace(program, timing, o.max_trace_events) + "\n");
    if (!html_path.empty())
      write_output(html_path, sim::report_html(program, timing, report, html_options));
    if (!o.text_path.empty()) write_output(o.text_path, summary);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "tilelab sim: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "tilelab sim: error: out of memory (use a smaller problem)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tilelab sim: internal error: %s\n", e.what());
    return 1;
  }
}

namespace {

struct SweepOptions : RequestOptions {
  std::string over;  // the swept parameter, or machine.<field>
  std::vector<std::string> values;
  std::vector<std::string> metrics = {"total_time_us", "dma_utilization_percent",
                                      "tensor_active_time_percent", "mfu_percent"};
  std::string csv_path;
};

std::vector<std::string> split_list(const std::string& text, char separator) {
  std::vector<std::string> items;
  size_t begin = 0;
  while (true) {
    const size_t end = text.find(separator, begin);
    items.push_back(text.substr(begin, end - begin));
    if (end == std::string::npos) return items;
    begin = end + 1;
  }
}

SweepOptions parse_sweep(const std::vector<std::string>& args) {
  SweepOptions o;
  parse_request(args, o, [&o](const std::string& a, const OptionValue& value) {
    if (a == "--over") {
      const std::string over = value("--over");
      const auto sep = over.find('=');
      if (sep == std::string::npos || sep == 0 || sep + 1 == over.size())
        throw UsageError("--over '" + over + "': expected NAME=V1,V2,...");
      o.over = over.substr(0, sep);
      // ';' separates values that themselves hold commas (paged-attention's request lists).
      const std::string list = over.substr(sep + 1);
      o.values = split_list(list, list.find(';') == std::string::npos ? ',' : ';');
      for (const auto& v : o.values)
        if (v.empty()) throw UsageError("--over '" + over + "': empty value in the list");
    } else if (a == "--metrics") {
      o.metrics = split_list(value("--metrics"), ',');
    } else if (a == "--csv") {
      o.csv_path = value("--csv");
    } else {
      return false;
    }
    return true;
  });
  return o;
}

// CSV field: quoted when it holds a separator, a quote or a line break.
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string format_number(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}

}  // namespace

std::string sweep_usage() {
  return "usage: tilelab sweep KERNEL --over NAME=V1,V2,... [KEY=VALUE ...] [options]\n"
         "\n"
         "Simulates KERNEL once per value of one parameter (or machine field) and prints one\n"
         "row per value: the chosen metrics of the flat report summary.\n"
         "\n"
         "options:\n"
         "  --over NAME=V1,V2,...    the swept kernel parameter, or machine.FIELD for a machine\n"
         "                           field; values separated by ',', or by ';' when they hold\n"
         "                           commas ('prefill=128:2048,96:1024;256:4096')\n"
         "  -m, --machine NAME|FILE  machine preset or JSON file (default: the kernel's machine)\n"
         "  --set KEY=VALUE          override a machine parameter (repeatable)\n"
         "  -p, --param KEY=VALUE    fixed kernel parameter (repeatable; bare KEY=VALUE works)\n"
         "  --metrics A,B,...        columns of the table (default total_time_us,\n"
         "                           dma_utilization_percent, tensor_active_time_percent,\n"
         "                           mfu_percent)\n"
         "  --csv PATH               also write every metric of every point as CSV ('-' = stdout)\n"
         "  --max-instructions N     program size limit per point (default " +
         std::to_string(sim::ProgramLimits::kDefaultMaxInstructions) +
         ")\n"
         "  --max-buffer-elements N  limit on the elements of a program's HBM tensors and tiles\n"
         "                           (default " +
         std::to_string(sim::ProgramLimits::kDefaultMaxBufferElements) +
         ")\n"
         "  -h, --help               this help\n"
         "\n"
         "examples:\n"
         "  tilelab sweep paged-attention --over large_tile_size=1024,2048,4096\n"
         "  tilelab sweep matmul variant=tiled --over machine.dma_bytes_per_ns_per_engine=10,20 "
         "--csv out.csv\n";
}

int run_sweep_command(const std::vector<std::string>& args) {
  SweepOptions o;
  try {
    o = parse_sweep(args);
    if (!o.help && o.kernel.empty()) throw UsageError("missing KERNEL");
    if (!o.help && o.over.empty()) throw UsageError("missing --over NAME=V1,V2,...");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "tilelab sweep: %s\nRun 'tilelab sweep --help' for usage.\n", e.what());
    return 2;
  }
  if (o.help) {
    std::cout << sweep_usage();
    return 0;
  }
  try {
    const std::string machine_prefix = "machine.";
    const bool over_machine = o.over.rfind(machine_prefix, 0) == 0;
    if (!over_machine && o.parameters.count(o.over))
      throw Error("--over '" + o.over +
                  "': also given as a fixed parameter; give one or the other");
    sim::set_program_limits(o.limits);
    std::vector<std::vector<sim::Metric>> rows;
    for (const std::string& v : o.values) {
      sim::KernelParameters parameters = o.parameters;
      std::vector<std::string> overrides = o.machine_overrides;
      if (over_machine)
        overrides.push_back(o.over.substr(machine_prefix.size()) + "=" + v);
      else
        parameters[o.over] = v;
      try {
        const sim::ResolvedKernelRequest request =
            sim::resolve_kernel_request(o.kernel, parameters, o.machine, overrides);
        const sim::Program program = request.kernel->build(request.machine, request.parameters);
        sim::ReportOptions report_options;
        report_options.kernel = request.kernel->name;
        report_options.parameters = request.parameters;
        report_options.max_critical_path_segments = 0;
        rows.push_back(sim::flat_metrics(
            sim::make_report(program, sim::simulate_timing(program), report_options)));
      } catch (const Error& e) {
        throw Error(o.over + "=" + v + ": " + e.what(), e.kind());
      }
    }
    // Columns of the table, checked against the metric names of the first row.
    std::vector<size_t> columns;
    for (const std::string& name : o.metrics) {
      size_t found = rows.front().size();
      for (size_t i = 0; i < rows.front().size(); ++i)
        if (rows.front()[i].name == name) found = i;
      if (found == rows.front().size()) {
        std::string known;
        for (const auto& m : rows.front()) known += " " + m.name;
        throw Error("--metrics: unknown metric '" + name + "'; known:" + known);
      }
      columns.push_back(found);
    }
    std::ostringstream table;
    std::vector<std::string> header = {o.over};
    std::vector<std::string> units = {""};
    for (size_t c : columns) {
      header.push_back(rows.front()[c].name);
      units.push_back(std::string("[") + rows.front()[c].unit + "]");
    }
    std::vector<size_t> width(header.size());
    for (size_t c = 0; c < header.size(); ++c)
      width[c] = std::max(header[c].size(), units[c].size());
    for (const auto& v : o.values) width[0] = std::max(width[0], v.size());
    auto print_row = [&](const std::vector<std::string>& cells) {
      for (size_t c = 0; c < cells.size(); ++c) {
        table << (c ? "  " : "");
        table << std::string(width[c] > cells[c].size() ? width[c] - cells[c].size() : 0, ' ')
              << cells[c];
      }
      table << "\n";
    };
    print_row(header);
    print_row(units);
    for (size_t r = 0; r < rows.size(); ++r) {
      std::vector<std::string> cells = {o.values[r]};
      for (size_t c : columns) cells.push_back(format_number(rows[r][c].value));
      print_row(cells);
    }
    write_output("-", table.str());
    if (!o.csv_path.empty()) {
      std::ostringstream csv;
      csv << csv_field(o.over);
      for (const auto& m : rows.front()) csv << "," << m.name;
      csv << "\n";
      for (size_t r = 0; r < rows.size(); ++r) {
        csv << csv_field(o.values[r]);
        for (const auto& m : rows[r]) csv << "," << format_number(m.value);
        csv << "\n";
      }
      write_output(o.csv_path, csv.str());
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "tilelab sweep: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "tilelab sweep: error: out of memory (use a smaller problem)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tilelab sweep: internal error: %s\n", e.what());
    return 1;
  }
}

}  // namespace tilelab::tools
