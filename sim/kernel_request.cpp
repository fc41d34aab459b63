// Kernel request resolution shared by the CLI and the Python bindings.
#include "sim/kernel_request.hpp"

namespace tilelab::sim {

ResolvedKernelRequest resolve_kernel_request(const std::string& kernel_name,
                                             const KernelParameters& given,
                                             const std::string& machine_source,
                                             const std::vector<std::string>& machine_overrides) {
  ResolvedKernelRequest r;
  r.kernel = &kernel_registry().find(kernel_name);
  r.parameters = resolve_parameters(*r.kernel, given);
  r.machine = load_machine(machine_source.empty() ? r.kernel->default_machine : machine_source,
                           machine_overrides);
  return r;
}

}  // namespace tilelab::sim
