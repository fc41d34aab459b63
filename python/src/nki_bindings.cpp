// tilelab._core.nki: numpy arrays in, tilelab::nki calls with the GIL released. The facade
// (python/tilelab/nki.py) converts masks, block tables and slot mappings to int32 first.
#include "nki_bindings.hpp"

#include <pybind11/numpy.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "array_view.hpp"
#include "tilelab/error.hpp"
#include "tilelab/nki.hpp"

namespace py = pybind11;

namespace tilelab::python {
namespace {

// An int32 numpy array as a TensorView (the facade passes C-contiguous int32 arrays).
TensorView view_int32(const py::handle& object, const char* name) {
  reject_masked_array(object, name);
  if (!py::isinstance<py::array>(object)) {
    throw Error(std::string(name) + ": expected a numpy.ndarray of int32", ErrorKind::invalid_type);
  }
  py::array array = py::reinterpret_borrow<py::array>(object);
  if (!array.dtype().is(py::dtype::of<std::int32_t>()) || !(array.flags() & py::array::c_style)) {
    throw Error(std::string(name) + ": expected a C-contiguous int32 array, got dtype " +
                    py::str(array.dtype()).cast<std::string>(),
                ErrorKind::invalid_type);
  }
  if (array.ndim() < 1 || array.ndim() > TensorView::kMaxRank) {
    throw Error(std::string(name) + ": expected 1 to " + std::to_string(TensorView::kMaxRank) +
                " dimensions, got shape " + shape_string(array));
  }
  std::array<std::int64_t, TensorView::kMaxRank> shape{}, strides{};
  for (py::ssize_t i = 0; i < array.ndim(); ++i) {
    shape[i] = array.shape(i);
    strides[i] = array.strides(i) / array.itemsize();
  }
  return TensorView(const_cast<void*>(array.data()), DType::i32, static_cast<int>(array.ndim()),
                    shape.data(), strides.data());
}

nki::PagedSchedule parse_schedule(const std::string& name) {
  if (name == "cpu") return nki::PagedSchedule::cpu;
  if (name == "tile") return nki::PagedSchedule::tile;
  throw Error("schedule: expected 'cpu' or 'tile', got '" + name + "'");
}

py::array flash_paged_attention(const py::handle& query, const py::handle& key,
                                const py::handle& value, const py::handle& kv_cache,
                                const py::handle& block_tables, const py::handle& mask,
                                const py::handle& softmax_scale, const py::handle& mixed_precision,
                                std::int64_t large_tile_size, const std::string& schedule,
                                const py::handle& skip_masked_tiles) {
  const ArrayView q = view_array(require_attention_array(query, "query"), "query");
  const ArrayView k = view_array(require_attention_array(key, "key"), "key");
  const ArrayView v = view_array(require_attention_array(value, "value"), "value");
  const ArrayView cache = view_array(require_attention_array(kv_cache, "kv_cache"), "kv_cache");
  const TensorView table = view_int32(block_tables, "block_tables");
  const TensorView mask_view = view_int32(mask, "mask");
  if (q.view.rank() != 4) {
    throw Error("query: expected rank 4 [1, n_heads, d, seq_q], got shape " +
                shape_string(q.owner));
  }
  nki::FlashPagedAttentionOptions options;
  options.softmax_scale = parse_optional_scale(softmax_scale, "softmax_scale");
  options.mixed_precision = parse_bool(mixed_precision, "mixed_precision");
  options.large_tile_size = large_tile_size;
  options.schedule = parse_schedule(schedule);
  options.skip_masked_tiles = parse_bool(skip_masked_tiles, "skip_masked_tiles");
  // (1, n_heads, seq_q, d), query's dtype.
  py::array out =
      new_array(q.owner.dtype(), {q.view.dim(0), q.view.dim(1), q.view.dim(3), q.view.dim(2)});
  const TensorView out_view = view_output(out);
  {
    py::gil_scoped_release release;
    nki::flash_paged_attention(q.view, k.view, v.view, cache.view, table, mask_view, out_view,
                               options);
  }
  return out;
}

py::array reorder_context_mask(const py::handle& mask, std::int64_t large_tile_size,
                               std::int64_t block_size) {
  const TensorView mask_view = view_int32(mask, "mask");
  std::vector<py::ssize_t> shape;
  for (int i = 0; i < mask_view.rank(); ++i) shape.push_back(mask_view.dim(i));
  py::array_t<std::int32_t> out(shape);
  std::array<std::int64_t, TensorView::kMaxRank> extents{}, strides{};
  for (py::ssize_t i = 0; i < out.ndim(); ++i) {
    extents[i] = out.shape(i);
    strides[i] = out.strides(i) / 4;
  }
  const TensorView out_view(out.mutable_data(), DType::i32, static_cast<int>(out.ndim()),
                            extents.data(), strides.data());
  {
    py::gil_scoped_release release;
    nki::reorder_context_mask(mask_view, large_tile_size, block_size, out_view);
  }
  return out;
}

void reshape_and_cache(const py::handle& key, const py::handle& value, const py::handle& kv_cache,
                       const py::handle& slot_mapping) {
  const ArrayView k = view_array(require_attention_array(key, "key"), "key");
  const ArrayView v = view_array(require_attention_array(value, "value"), "value");
  py::array cache_array = require_attention_array(kv_cache, "kv_cache");
  const ArrayView cache = view_array(cache_array, "kv_cache");
  if (cache.copied || !cache_array.writeable()) {
    throw Error(
        "kv_cache: expected a writable array in native byte order with non-negative, "
        "element-aligned strides (it is updated in place)");
  }
  const TensorView slots = view_int32(slot_mapping, "slot_mapping");
  py::gil_scoped_release release;
  nki::reshape_and_cache(k.view, v.view, cache.view, slots);
}

}  // namespace

void register_nki_bindings(py::module_& core) {
  py::module_ nki = core.def_submodule("nki", "NKI-compatible flash paged attention");
  nki.def("flash_paged_attention", &flash_paged_attention, py::arg("query"), py::arg("key"),
          py::arg("value"), py::arg("kv_cache"), py::arg("block_tables"), py::arg("mask"),
          py::kw_only(), py::arg("softmax_scale") = py::none(), py::arg("mixed_precision") = true,
          py::arg("LARGE_TILE_SZ") = 2048, py::arg("schedule") = "cpu",
          py::arg("skip_masked_tiles") = true, "See tilelab.nki.flash_paged_attention.");
  nki.def("reorder_context_mask", &reorder_context_mask, py::arg("mask"), py::arg("LARGE_TILE_SZ"),
          py::arg("block_size"), "See tilelab.nki.reorder_context_mask.");
  nki.def("reshape_and_cache", &reshape_and_cache, py::arg("key"), py::arg("value"),
          py::arg("kv_cache"), py::arg("slot_mapping"), "See tilelab.nki.reshape_and_cache.");
}

}  // namespace tilelab::python
