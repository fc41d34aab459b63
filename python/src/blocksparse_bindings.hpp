// tilelab._core bindings of tilelab/blocksparse.hpp: the BlockSparseLayout class and
// blocksparse_attention (the facade is python/tilelab/__init__.py).
#pragma once

#include <pybind11/pybind11.h>

namespace tilelab::python {

// Adds BlockSparseLayout and blocksparse_attention to `core`.
void register_blocksparse_bindings(pybind11::module_& core);

}  // namespace tilelab::python
