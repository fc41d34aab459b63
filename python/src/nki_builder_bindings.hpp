// tilelab._core nki_* functions: the simulator's program builder, functional executor and timed
// runs for the NKI-language tracer (python/tilelab/nki/).
#pragma once

#include <pybind11/pybind11.h>

namespace tilelab::python {

void register_nki_builder_bindings(pybind11::module_& core);

}  // namespace tilelab::python
