// tilelab._core sim_* functions: the simulator's paged attention kernel, machines, schedules,
// reports and parallel sweeps for the Python facade python/tilelab/sim.py.
#pragma once

#include <pybind11/pybind11.h>

#include <map>
#include <string>

#include "sim/program.hpp"

namespace tilelab::python {

// Adds the sim_* functions to `core`. Runs and their programs travel to Python as opaque capsules
// (no classes, so _core's surface stays a flat list of functions with stubs in _core.pyi).
void register_sim_bindings(pybind11::module_& core);

// Times `program` and returns a simulation run handle, as every sim_* function that simulates
// does, for python/tilelab/sim.py's Report.
pybind11::capsule simulate_program(tilelab::sim::Program program, const std::string& kernel_name,
                                   const std::map<std::string, std::string>& parameters,
                                   bool record_dma_pieces);

}  // namespace tilelab::python
