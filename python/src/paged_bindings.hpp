// tilelab._core bindings of tilelab/paged.hpp: paged_attention and reshape_and_cache_flash (the
// facade is python/tilelab/__init__.py).
#pragma once

#include <pybind11/pybind11.h>

#include <optional>

#include "array_view.hpp"
#include "tilelab/attention.hpp"

namespace tilelab::python {

// The score-option keyword arguments shared by paged_attention and flash_attention, parsed, and
// the arrays their views point into.
struct ScoreArguments {
  ScoreOptions options;
  std::optional<ArrayView> alibi_slopes, sinks;
};
ScoreArguments parse_score_arguments(const pybind11::handle& sliding_window,
                                     const pybind11::handle& softcap,
                                     const pybind11::handle& alibi_slopes,
                                     const pybind11::handle& sinks);

// Adds paged_attention and reshape_and_cache_flash to `core`.
void register_paged_bindings(pybind11::module_& core);

}  // namespace tilelab::python
