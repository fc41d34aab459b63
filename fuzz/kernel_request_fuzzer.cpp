// A `tilelab sim` request -> resolve_kernel_request: the kernel name, KEY=VALUE parameters and
// the machine with its `--set KEY=VALUE` overrides (values in JSON syntax), then the typed
// parameter accessors kernel builders use.
//
// Input: command-line arguments, one per line, as after `tilelab sim`:
//   paged-attention
//   --machine
//   trn2
//   --set
//   dma_bytes_per_ns_per_engine=20
//   decode=40,300
// `--machine` takes preset names only (a path would make the target read arbitrary files).
//
// Building the program is left out by default: builders have no size limit yet, so a large but
// valid request only measures the allocator. TILELAB_FUZZ_BUILD_PROGRAMS=1 adds the build and
// the functional inputs (use with -rss_limit_mb and -timeout).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz/fuzz_outcome.hpp"
#include "sim/kernel_request.hpp"
#include "sim/kernels/registry.hpp"

namespace {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find('\n', start), text.size());
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

bool build_programs() {
  static const bool enabled = [] {
    const char* flag = std::getenv("TILELAB_FUZZ_BUILD_PROGRAMS");
    return flag != nullptr && std::string(flag) == "1";
  }();
  return enabled;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace sim = tilelab::sim;
  const std::vector<std::string> args =
      split_lines(std::string(reinterpret_cast<const char*>(data), size));
  std::string kernel;
  std::string machine;
  std::vector<std::string> overrides;
  sim::KernelParameters parameters;
  const std::vector<std::string> presets = sim::machine_preset_names();
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool has_value = i + 1 < args.size();
    if (a == "--set" && has_value) {
      overrides.push_back(args[++i]);
    } else if (a == "--machine" && has_value) {
      const std::string& source = args[++i];
      if (std::find(presets.begin(), presets.end(), source) != presets.end()) machine = source;
    } else if (const size_t eq = a.find('='); eq != std::string::npos && eq > 0) {
      parameters[a.substr(0, eq)] = a.substr(eq + 1);
    } else if (kernel.empty()) {
      kernel = a;
    }
  }

  tilelab::fuzz::expect_only_tilelab_errors("resolve_kernel_request", [&] {
    const sim::ResolvedKernelRequest request =
        sim::resolve_kernel_request(kernel, parameters, machine, overrides);
    for (const auto& [name, value] : request.parameters) {
      tilelab::fuzz::expect_only_tilelab_errors(
          "parameter_int", [&] { sim::parameter_int(request.parameters, name); });
      tilelab::fuzz::expect_only_tilelab_errors("parameter_int (bounded)", [&] {
        sim::parameter_int(request.parameters, name, 1, 4096);
      });
      tilelab::fuzz::expect_only_tilelab_errors(
          "parameter_dtype", [&] { sim::parameter_dtype(request.parameters, name); });
      tilelab::fuzz::expect_only_tilelab_errors("parameter_choice", [&] {
        sim::parameter_choice(request.parameters, name, {"true", "false"});
      });
    }
    if (build_programs()) {
      tilelab::fuzz::expect_only_tilelab_errors(
          "kernel build", [&] { request.kernel->build(request.machine, request.parameters); });
      if (request.kernel->functional_inputs)
        tilelab::fuzz::expect_only_tilelab_errors(
            "functional inputs", [&] { request.kernel->functional_inputs(request.parameters); });
    }
  });
  return 0;
}
