// tilelab._core bindings of tilelab/paged.hpp: paged_attention and reshape_and_cache_flash (the
// facade is python/tilelab/__init__.py).
#pragma once

#include <pybind11/pybind11.h>

namespace tilelab::python {

// Adds paged_attention and reshape_and_cache_flash to `core`.
void register_paged_bindings(pybind11::module_& core);

}  // namespace tilelab::python
