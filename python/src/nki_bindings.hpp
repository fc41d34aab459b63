// tilelab._core.nki: bindings of tilelab/nki.hpp (the facade is python/tilelab/nki.py).
#pragma once

#include <pybind11/pybind11.h>

namespace tilelab::python {

// Adds the submodule `nki` to `core`.
void register_nki_bindings(pybind11::module_& core);

}  // namespace tilelab::python
