// paged_attention and reshape_and_cache_flash for Python: numpy arrays in and out (fp8 caches as
// ml_dtypes float8 arrays), the checks of the C++ API behind them.
#include "paged_bindings.hpp"

#include <pybind11/numpy.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "array_view.hpp"
#include "tilelab/error.hpp"
#include "tilelab/paged.hpp"

namespace py = pybind11;

namespace tilelab::python {
namespace {

// (left, right): a tuple or list of two ints.
SlidingWindow parse_sliding_window(const py::handle& value) {
  const bool sequence = py::isinstance<py::tuple>(value) || py::isinstance<py::list>(value);
  if (!sequence || py::len(value) != 2) {
    throw Error("sliding_window: expected a pair (left, right) of ints (-1: unbounded), got " +
                    py::repr(value).cast<std::string>(),
                ErrorKind::invalid_type);
  }
  SlidingWindow window;
  std::int64_t* sides[2] = {&window.left, &window.right};
  for (int i = 0; i < 2; ++i) {
    const py::handle side = value[py::int_(i)];
    if (PyBool_Check(side.ptr()) ||
        !py::isinstance(side, py::module_::import("numbers").attr("Integral"))) {
      throw Error("sliding_window: expected a pair (left, right) of ints (-1: unbounded), got " +
                      py::repr(value).cast<std::string>(),
                  ErrorKind::invalid_type);
    }
    *sides[i] = side.cast<std::int64_t>();
  }
  return window;
}

std::int64_t parse_split_kv(const py::handle& value) {
  if (py::isinstance<py::str>(value)) {
    if (value.cast<std::string>() == "auto") return 0;
  } else if (!PyBool_Check(value.ptr()) &&
             py::isinstance(value, py::module_::import("numbers").attr("Integral"))) {
    const auto pieces = value.cast<std::int64_t>();
    if (pieces < 1) {
      throw Error("split_kv: expected 'auto' or a number of pieces >= 1, got " +
                  std::to_string(pieces));
    }
    return pieces;
  }
  throw Error("split_kv: expected 'auto' or a number of pieces >= 1, got " +
                  py::repr(value).cast<std::string>(),
              py::isinstance<py::str>(value) ? ErrorKind::invalid_value : ErrorKind::invalid_type);
}

// An optional fp32 [Hq] option (alibi_slopes, sinks), viewed (or copied) for the call.
std::optional<ArrayView> optional_head_values(const py::handle& value, const char* name) {
  if (value.is_none()) return std::nullopt;
  return view_array(require_float32_array(value, name, " or None"), name);
}

}  // namespace

ScoreArguments parse_score_arguments(const py::handle& sliding_window, const py::handle& softcap,
                                     const py::handle& alibi_slopes, const py::handle& sinks) {
  ScoreArguments arguments;
  arguments.options.sliding_window = parse_sliding_window(sliding_window);
  arguments.options.softcap = parse_real(softcap, "softcap");
  arguments.alibi_slopes = optional_head_values(alibi_slopes, "alibi_slopes");
  arguments.sinks = optional_head_values(sinks, "sinks");
  if (arguments.alibi_slopes) arguments.options.alibi_slopes = arguments.alibi_slopes->view;
  if (arguments.sinks) arguments.options.sinks = arguments.sinks->view;
  return arguments;
}

namespace {

py::array paged_attention(const py::handle& query, const py::handle& key_cache,
                          const py::handle& value_cache, const py::handle& block_table,
                          const py::handle& seq_lens, const py::handle& query_start_loc,
                          const py::handle& scale, const py::handle& causal,
                          const py::handle& sliding_window, const py::handle& softcap,
                          const py::handle& alibi_slopes, const py::handle& sinks,
                          const py::handle& k_scale, const py::handle& v_scale,
                          const py::handle& split_kv, const py::handle& fp32_probabilities,
                          const py::handle& out) {
  const ArrayView q_view = view_array(require_attention_array(query, "query"), "query");
  const ArrayView k_view = view_array(require_cache_array(key_cache, "key_cache"), "key_cache");
  const ArrayView v_view =
      view_array(require_cache_array(value_cache, "value_cache"), "value_cache");
  const auto table =
      require_int32_array(block_table, "block_table", 2, "[num_seqs, max_blocks_per_seq]");
  const auto lens = require_int32_array(seq_lens, "seq_lens", 1, "[num_seqs]");
  const auto starts = require_int32_array(query_start_loc, "query_start_loc", 1, "[num_seqs + 1]");
  const ScoreArguments score = parse_score_arguments(sliding_window, softcap, alibi_slopes, sinks);

  PagedAttentionOptions options;
  options.scale = parse_optional_scale(scale, "scale");
  options.causal = parse_bool(causal, "causal");
  options.score = score.options;
  options.k_scale = parse_real(k_scale, "k_scale");
  options.v_scale = parse_real(v_scale, "v_scale");
  options.split_kv = parse_split_kv(split_kv);
  options.fp32_probabilities = parse_bool(fp32_probabilities, "fp32_probabilities");

  const WrittenArray written = packed_output(out, q_view, "query", "[num_tokens, Hq, D]");
  {
    py::gil_scoped_release release;
    tilelab::paged_attention(q_view.view, k_view.view, v_view.view, view_int32(table),
                             view_int32(lens), view_int32(starts), written.view, options);
  }
  return written.array;
}

void reshape_and_cache_flash(const py::handle& key, const py::handle& value,
                             const py::handle& key_cache, const py::handle& value_cache,
                             const py::handle& slot_mapping, const py::handle& k_scale,
                             const py::handle& v_scale) {
  const ArrayView k = view_array(require_attention_array(key, "key"), "key");
  const ArrayView v = view_array(require_attention_array(value, "value"), "value");
  const TensorView k_cache =
      view_written_array(require_cache_array(key_cache, "key_cache"), "key_cache");
  const TensorView v_cache =
      view_written_array(require_cache_array(value_cache, "value_cache"), "value_cache");
  const auto slots = require_int32_array(slot_mapping, "slot_mapping", 1, "[num_tokens]");
  const float key_scale = parse_real(k_scale, "k_scale");
  const float value_scale = parse_real(v_scale, "v_scale");
  py::gil_scoped_release release;
  tilelab::reshape_and_cache_flash(k.view, v.view, k_cache, v_cache, view_int32(slots), key_scale,
                                   value_scale);
}

}  // namespace

void register_paged_bindings(py::module_& core) {
  core.def("paged_attention", &paged_attention, py::arg("query"), py::arg("key_cache"),
           py::arg("value_cache"), py::arg("block_table"), py::arg("seq_lens"),
           py::arg("query_start_loc"), py::kw_only(), py::arg("scale") = py::none(),
           py::arg("causal") = true, py::arg("sliding_window") = py::make_tuple(-1, -1),
           py::arg("softcap") = 0.0, py::arg("alibi_slopes") = py::none(),
           py::arg("sinks") = py::none(), py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0,
           py::arg("split_kv") = "auto", py::arg("fp32_probabilities") = false,
           py::arg("out") = py::none(),
           "Attention over a paged KV cache (vLLM layout); returns out. See "
           "tilelab.paged_attention.");
  core.def("reshape_and_cache_flash", &reshape_and_cache_flash, py::arg("key"), py::arg("value"),
           py::arg("key_cache"), py::arg("value_cache"), py::arg("slot_mapping"),
           py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0,
           "Writes key/value rows into the paged caches at slot_mapping (in place). See "
           "tilelab.reshape_and_cache_flash.");
}

}  // namespace tilelab::python
