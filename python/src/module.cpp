// tilelab._core: the pybind11 binding of the C++ API (flash attention, threads, version). The
// documented public surface is the `tilelab` package that wraps it.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "array_view.hpp"
#include "blocksparse_bindings.hpp"
#include "nki_bindings.hpp"
#include "nki_builder_bindings.hpp"
#include "paged_bindings.hpp"
#include "sim_bindings.hpp"
#include "tilelab/tilelab.hpp"

namespace py = pybind11;

namespace tilelab::python {
namespace {

CausalAlignment parse_causal_alignment(const py::handle& value) {
  const std::string name = parse_choice(value, "causal_alignment", {"top_left", "bottom_right"});
  return name == "top_left" ? CausalAlignment::top_left : CausalAlignment::bottom_right;
}

// One flash_attention call: the numpy arrays that own every buffer the views point into.
struct AttentionCall {
  ArrayView q, k, v;
  std::optional<ArrayView> bias;
  py::array out;
  std::optional<py::array> lse;
  TensorView out_view;
  FlashAttentionOptions options;
  std::optional<ScoreArguments> score;  // owns the slopes' and sinks' arrays
};

// The forward's score options and fp8 scales (flash_attention and flash_attention_implementation).
struct ScoreKeywords {
  py::handle sliding_window, softcap, alibi_slopes, sinks, k_scale, v_scale;
};

AttentionCall prepare_call(const py::handle& q, const py::handle& k, const py::handle& v,
                           const py::handle& causal, const py::handle& causal_alignment,
                           const py::handle& scale, const py::handle& bias, bool return_lse,
                           const py::handle& implementation,
                           const std::optional<ScoreKeywords>& score = std::nullopt) {
  py::array q_array = require_attention_array(q, "q");
  // k and v may be fp8 (the C++ validation checks the combination).
  py::array k_array = require_cache_array(k, "k");
  py::array v_array = require_cache_array(v, "v");
  // out and lse take their shapes from q, so q's rank is checked here; everything else (shapes,
  // GQA, mixed dtypes, bias broadcasting, scale) by the C++ validation, which names the argument.
  if (q_array.ndim() != 4) {
    throw Error("q: expected rank 4 [B, Hq, M, D], got rank " + std::to_string(q_array.ndim()) +
                " with shape " + shape_string(q_array));
  }

  AttentionCall call{view_array(q_array, "q"),
                     view_array(k_array, "k"),
                     view_array(v_array, "v"),
                     std::nullopt,
                     py::array(),
                     std::nullopt,
                     TensorView(),
                     FlashAttentionOptions(),
                     std::nullopt};
  if (score) {
    call.score = parse_score_arguments(score->sliding_window, score->softcap, score->alibi_slopes,
                                       score->sinks);
    call.options.score = call.score->options;
    call.options.k_scale = parse_real(score->k_scale, "k_scale");
    call.options.v_scale = parse_real(score->v_scale, "v_scale");
  }
  call.options.causal = parse_bool(causal, "causal");
  call.options.causal_alignment = parse_causal_alignment(causal_alignment);
  call.options.scale = parse_optional_scale(scale, "scale");
  call.options.implementation = parse_implementation(implementation);
  if (!bias.is_none()) {
    const py::array bias_array = require_float32_array(bias, "bias", " or None");
    call.bias = view_array(bias_array, "bias");
    call.options.bias = call.bias->view;
  }

  const std::vector<py::ssize_t> out_shape{q_array.shape(0), q_array.shape(1), q_array.shape(2),
                                           q_array.shape(3)};
  // q's viewed array, not q itself: its dtype is in native byte order even when q's is not.
  call.out = new_array(call.q.owner.dtype(), out_shape);
  call.out_view = view_output(call.out);
  if (return_lse) {
    call.lse = new_array(py::dtype::of<float>(), {out_shape[0], out_shape[1], out_shape[2]});
    call.options.lse = view_output(*call.lse);
  }
  return call;
}

py::object flash_attention(const py::handle& q, const py::handle& k, const py::handle& v,
                           const py::handle& causal, const py::handle& causal_alignment,
                           const py::handle& scale, const py::handle& bias,
                           const py::handle& return_lse_value, const py::handle& sliding_window,
                           const py::handle& softcap, const py::handle& alibi_slopes,
                           const py::handle& sinks, const py::handle& k_scale,
                           const py::handle& v_scale, const py::handle& fp32_probabilities,
                           const py::handle& implementation) {
  const bool return_lse = parse_bool(return_lse_value, "return_lse");
  AttentionCall call =
      prepare_call(q, k, v, causal, causal_alignment, scale, bias, return_lse, implementation,
                   ScoreKeywords{sliding_window, softcap, alibi_slopes, sinks, k_scale, v_scale});
  call.options.fp32_probabilities = parse_bool(fp32_probabilities, "fp32_probabilities");
  {
    // The views point into arrays `call` keeps alive; no Python object is touched in here.
    py::gil_scoped_release release;
    tilelab::flash_attention(call.q.view, call.k.view, call.v.view, call.out_view, call.options);
  }
  if (return_lse) return py::make_tuple(call.out, *call.lse);
  return call.out;
}

// The questions about a flash_attention call (which implementation, which kernel) take its
// arguments and answer with `answer(q, k, v, out, options)`.
template <const char* (*answer)(const tilelab::TensorView&, const tilelab::TensorView&,
                                const tilelab::TensorView&, const tilelab::TensorView&,
                                const tilelab::FlashAttentionOptions&)>
py::object ask_about_flash_attention(const py::handle& q, const py::handle& k, const py::handle& v,
                                     const py::handle& causal, const py::handle& causal_alignment,
                                     const py::handle& scale, const py::handle& bias,
                                     const py::handle& return_lse, const py::handle& sliding_window,
                                     const py::handle& softcap, const py::handle& alibi_slopes,
                                     const py::handle& sinks, const py::handle& k_scale,
                                     const py::handle& v_scale,
                                     const py::handle& fp32_probabilities) {
  AttentionCall call =
      prepare_call(q, k, v, causal, causal_alignment, scale, bias,
                   parse_bool(return_lse, "return_lse"), py::str("automatic"),
                   ScoreKeywords{sliding_window, softcap, alibi_slopes, sinks, k_scale, v_scale});
  call.options.fp32_probabilities = parse_bool(fp32_probabilities, "fp32_probabilities");
  const char* text = answer(call.q.view, call.k.view, call.v.view, call.out_view, call.options);
  if (text == nullptr) return py::none();
  return py::str(text);
}

// Binds ask_about_flash_attention<answer> with flash_attention's keywords (less implementation).
template <const char* (*answer)(const tilelab::TensorView&, const tilelab::TensorView&,
                                const tilelab::TensorView&, const tilelab::TensorView&,
                                const tilelab::FlashAttentionOptions&)>
void def_flash_attention_question(py::module_& module, const char* name, const char* doc) {
  module.def(name, &ask_about_flash_attention<answer>, py::arg("q"), py::arg("k"), py::arg("v"),
             py::kw_only(), py::arg("causal") = false, py::arg("causal_alignment") = "top_left",
             py::arg("scale") = py::none(), py::arg("bias") = py::none(),
             py::arg("return_lse") = false, py::arg("sliding_window") = py::make_tuple(-1, -1),
             py::arg("softcap") = 0.0, py::arg("alibi_slopes") = py::none(),
             py::arg("sinks") = py::none(), py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0,
             py::arg("fp32_probabilities") = false, doc);
}

// The array's shape as a vector, for allocating an output like it.
std::vector<py::ssize_t> shape_of(const py::array& array) {
  return std::vector<py::ssize_t>(array.shape(), array.shape() + array.ndim());
}

py::object flash_attention_backward(const py::handle& dout, const py::handle& q,
                                    const py::handle& k, const py::handle& v, const py::handle& out,
                                    const py::handle& lse, const py::handle& causal,
                                    const py::handle& causal_alignment, const py::handle& scale,
                                    const py::handle& bias, const py::handle& return_dbias_value,
                                    const py::handle& sliding_window, const py::handle& softcap,
                                    const py::handle& alibi_slopes, const py::handle& sinks,
                                    const py::handle& return_dsinks_value,
                                    const py::handle& fp32_probabilities,
                                    const py::handle& implementation) {
  const bool return_dbias = parse_bool(return_dbias_value, "return_dbias");
  const bool return_dsinks = parse_bool(return_dsinks_value, "return_dsinks");
  // The forward's preparation checks q, k, v, bias and the options, and allocates an array with
  // q's shape and dtype: that is dq. (k and v of q's dtype: scales of 1.)
  const py::float_ unit_scale(1.0);
  AttentionCall call = prepare_call(
      q, k, v, causal, causal_alignment, scale, bias, false, implementation,
      ScoreKeywords{sliding_window, softcap, alibi_slopes, sinks, unit_scale, unit_scale});
  call.options.fp32_probabilities = parse_bool(fp32_probabilities, "fp32_probabilities");
  const ArrayView dout_view = view_array(require_attention_array(dout, "dout"), "dout");
  const ArrayView out_view = view_array(require_attention_array(out, "out"), "out");
  const py::array lse_array =
      require_float32_array(lse, "lse", " (from flash_attention(..., return_lse=True))");
  const ArrayView lse_view = view_array(lse_array, "lse");
  if (return_dbias && !call.bias) {
    throw Error("return_dbias: expected False without a bias (bias is None), got True");
  }
  if (return_dsinks && !call.options.score.sinks) {
    throw Error("return_dsinks: expected False without sinks (sinks is None), got True");
  }

  py::array dk = new_array(call.k.owner.dtype(), shape_of(call.k.owner));
  py::array dv = new_array(call.k.owner.dtype(), shape_of(call.k.owner));
  const TensorView dk_view = view_output(dk), dv_view = view_output(dv);
  std::optional<py::array> dbias, dsinks;
  std::optional<TensorView> dbias_view, dsinks_view;
  if (return_dbias) {
    dbias = new_array(py::dtype::of<float>(), shape_of(call.bias->owner));
    dbias_view = view_output(*dbias);
  }
  if (return_dsinks) {
    dsinks = new_array(py::dtype::of<float>(), {call.options.score.sinks->dim(0)});
    dsinks_view = view_output(*dsinks);
  }
  {
    py::gil_scoped_release release;
    tilelab::flash_attention_backward(dout_view.view, call.q.view, call.k.view, call.v.view,
                                      out_view.view, lse_view.view, call.out_view, dk_view, dv_view,
                                      call.options, dbias_view, dsinks_view);
  }
  py::list grads;
  for (const py::array& grad : {call.out, dk, dv}) grads.append(grad);
  if (dbias) grads.append(*dbias);
  if (dsinks) grads.append(*dsinks);
  return py::tuple(grads);
}

}  // namespace
}  // namespace tilelab::python

PYBIND11_MODULE(_core, module) {
  using namespace tilelab::python;
  module.doc() = "tilelab's compiled core; use the documented `tilelab` package instead.";

  // Errors a caller can fix: wrong types become TypeError, wrong values ValueError. A failed
  // internal invariant is a bug in tilelab, not in the arguments: RuntimeError.
  py::register_exception_translator([](std::exception_ptr pointer) {
    try {
      if (pointer) std::rethrow_exception(pointer);
    } catch (const tilelab::Error& error) {
      PyObject* type = PyExc_ValueError;
      if (error.kind() == tilelab::ErrorKind::invalid_type) type = PyExc_TypeError;
      if (error.kind() == tilelab::ErrorKind::internal) type = PyExc_RuntimeError;
      PyErr_SetString(type, error.what());
    }
  });

  module.def("flash_attention", &flash_attention, py::arg("q"), py::arg("k"), py::arg("v"),
             py::kw_only(), py::arg("causal") = false, py::arg("causal_alignment") = "top_left",
             py::arg("scale") = py::none(), py::arg("bias") = py::none(),
             py::arg("return_lse") = false, py::arg("sliding_window") = py::make_tuple(-1, -1),
             py::arg("softcap") = 0.0, py::arg("alibi_slopes") = py::none(),
             py::arg("sinks") = py::none(), py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0,
             py::arg("fp32_probabilities") = false, py::arg("implementation") = "automatic",
             "Flash attention forward; returns out or (out, lse). See tilelab.flash_attention.");
  def_flash_attention_question<tilelab::flash_attention_implementation>(
      module, "flash_attention_implementation",
      "'generated', 'reference' or 'paged': what flash_attention would run for these arguments.");
  def_flash_attention_question<tilelab::flash_attention_kernel>(
      module, "flash_attention_kernel",
      "The name of the generated kernel flash_attention would run for these arguments, or None.");
  module.def("flash_attention_backward", &flash_attention_backward, py::arg("dout"), py::arg("q"),
             py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"), py::kw_only(),
             py::arg("causal") = false, py::arg("causal_alignment") = "top_left",
             py::arg("scale") = py::none(), py::arg("bias") = py::none(),
             py::arg("return_dbias") = false, py::arg("sliding_window") = py::make_tuple(-1, -1),
             py::arg("softcap") = 0.0, py::arg("alibi_slopes") = py::none(),
             py::arg("sinks") = py::none(), py::arg("return_dsinks") = false,
             py::arg("fp32_probabilities") = false, py::arg("implementation") = "automatic",
             "Flash attention backward; returns (dq, dk, dv[, dbias][, dsinks]). See "
             "tilelab.flash_attention_backward.");
  module.def("set_num_threads", &tilelab::set_num_threads, py::arg("n"),
             "Sets the number of threads tilelab uses (>= 1).");
  module.def("num_threads", &tilelab::num_threads, "The number of threads tilelab uses.");
  module.def("prefers_bf16_dot_products", &tilelab::prefers_bf16_dot_products,
             "Whether bf16 calls round P to bf16 and run on bf16 dot products on this CPU.");
  module.def("max_num_threads", &tilelab::max_num_threads,
             "The largest thread count set_num_threads accepts.");
  module.def(
      "version", [] { return std::string(TILELAB_VERSION); },
      "The C++ library's version (TILELAB_VERSION).");
  module.def(
      "_views_in_place",
      [](const py::handle& array) {
        return !view_array(require_attention_array(array, "array"), "array").copied;
      },
      py::arg("array"),
      "Testing hook: whether flash_attention reads `array` in place (True) or copies it first.");
  module.def(
      "_as_array",
      [](const py::handle& array, const std::string& name) -> py::object {
        std::optional<py::array> result = as_numpy_array(array, name.c_str());
        return result ? py::object(*result) : py::object(py::none());
      },
      py::arg("array"), py::arg("name") = "array",
      "The numpy array tilelab reads for `array` (a numpy array, or an object with __dlpack__ or "
      "the buffer protocol), over the same memory; None when `array` is none of those.");
  module.def(
      "_raise_error",
      [](const std::string& kind) {
        if (kind == "value") {
          TILELAB_REQUIRE(false) << "value: raised for a test";
        }
        if (kind == "type") {
          TILELAB_REQUIRE_TYPE(false) << "type: raised for a test";
        }
        TILELAB_CHECK(kind != "internal") << "raised for a test";
        TILELAB_REQUIRE(false) << "kind: expected 'value', 'type' or 'internal', got '" << kind
                               << "'";
      },
      py::arg("kind"), "Testing hook: raises a tilelab::Error of `kind` through the translator.");
  register_blocksparse_bindings(module);
  register_paged_bindings(module);
  register_nki_bindings(module);
  register_nki_builder_bindings(module);
  register_sim_bindings(module);
}
