// A kernel request resolved once for every front end (`tilelab sim`, `tilelab sweep`, Python).
#pragma once

#include <string>
#include <vector>

#include "sim/kernels/registry.hpp"
#include "sim/machine.hpp"

namespace tilelab::sim {

// The registered kernel, its parameters with defaults filled in and the machine it runs on.
struct ResolvedKernelRequest {
  const KernelInfo* kernel = nullptr;
  KernelParameters parameters;
  Machine machine;
};

// Finds `kernel_name` in the registry (Error listing the known kernels), fills default parameters
// and rejects undeclared ones, and loads the machine: `machine_source` is a preset or JSON path,
// empty for the kernel's default machine, with KEY=VALUE overrides.
ResolvedKernelRequest resolve_kernel_request(const std::string& kernel_name,
                                             const KernelParameters& given,
                                             const std::string& machine_source,
                                             const std::vector<std::string>& machine_overrides);

}  // namespace tilelab::sim
