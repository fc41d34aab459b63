// BlockSparseLayout and blocksparse_attention for Python: numpy arrays in and out, the checks of
// the C++ API behind them.
#include "blocksparse_bindings.hpp"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "array_view.hpp"
#include "tilelab/blocksparse.hpp"
#include "tilelab/error.hpp"

namespace py = pybind11;

namespace tilelab::python {
namespace {

std::string dtype_string(const py::array& array) {
  return py::str(array.dtype()).cast<std::string>();
}

std::vector<std::int32_t> to_vector(const py::array_t<std::int32_t>& array) {
  return std::vector<std::int32_t>(array.data(), array.data() + array.size());
}

// A bool array of `shape` holding `mask` (0/1 bytes).
py::array_t<bool> bool_array(const std::vector<std::uint8_t>& mask,
                             const std::vector<py::ssize_t>& shape) {
  py::array_t<bool> result(shape);
  std::copy(mask.begin(), mask.end(), result.mutable_data());
  return result;
}

// An int32 array of `shape` holding `values`.
py::array_t<std::int32_t> int32_array(const std::vector<std::int32_t>& values,
                                      const std::vector<py::ssize_t>& shape) {
  py::array_t<std::int32_t> result(shape);
  std::copy(values.begin(), values.end(), result.mutable_data());
  return result;
}

BlockSparseLayout layout_from_csr(const py::handle& crow, const py::handle& col,
                                  std::int64_t block_size, bool causal) {
  const auto crow_array = require_int32_array(crow, "crow", 2, "[n_heads, num_row_blocks + 1]");
  const auto col_array = require_int32_array(col, "col", 2, "[n_heads, nnz_max]");
  if (col_array.shape(0) != crow_array.shape(0)) {
    throw Error("col: expected " + std::to_string(crow_array.shape(0)) +
                " rows (n_heads, from crow), got shape " + shape_string(col_array));
  }
  return BlockSparseLayout(crow_array.shape(0), block_size, to_vector(crow_array),
                           to_vector(col_array), causal);
}

BlockSparseLayout layout_from_dense(const py::handle& block_mask, std::int64_t block_size,
                                    bool causal) {
  reject_masked_array(block_mask, "block_mask");
  if (!py::isinstance<py::array>(block_mask) ||
      py::reinterpret_borrow<py::array>(block_mask).dtype().kind() != 'b') {
    throw Error(
        "block_mask: expected a numpy.ndarray of bool, got " +
            (py::isinstance<py::array>(block_mask)
                 ? "dtype " + dtype_string(py::reinterpret_borrow<py::array>(block_mask))
                 : py::str(py::type::handle_of(block_mask).attr("__name__")).cast<std::string>()),
        ErrorKind::invalid_type);
  }
  const auto mask = py::array_t<bool, py::array::c_style | py::array::forcecast>::ensure(
      py::reinterpret_borrow<py::array>(block_mask));
  if (mask.ndim() != 3 || mask.shape(1) != mask.shape(2)) {
    throw Error("block_mask: expected shape [n_heads, num_blocks, num_blocks], got shape " +
                shape_string(mask));
  }
  const std::vector<std::uint8_t> bytes(mask.data(), mask.data() + mask.size());
  return BlockSparseLayout::from_dense(bytes, mask.shape(0), mask.shape(1), block_size, causal);
}

py::array_t<bool> token_mask(const BlockSparseLayout& layout, std::int64_t seqlen,
                             const std::optional<std::int64_t>& head) {
  if (head) return bool_array(layout.token_mask(*head, seqlen), {seqlen, seqlen});
  // Check the length before allocating n_heads masks.
  if (seqlen < 0 || seqlen > layout.max_seqlen()) layout.token_mask(0, seqlen);
  py::array_t<bool> result({layout.n_heads(), seqlen, seqlen});
  for (std::int64_t h = 0; h < layout.n_heads(); ++h) {
    const std::vector<std::uint8_t> mask = layout.token_mask(h, seqlen);
    std::copy(mask.begin(), mask.end(), result.mutable_data() + h * seqlen * seqlen);
  }
  return result;
}

std::string layout_repr(const BlockSparseLayout& layout) {
  std::ostringstream text;
  text << "BlockSparseLayout(n_heads=" << layout.n_heads() << ", block_size=" << layout.block_size()
       << ", num_row_blocks=" << layout.num_row_blocks()
       << ", causal=" << (layout.causal() ? "True" : "False") << ", density=" << layout.density()
       << ")";
  return text.str();
}

// The arguments of one blocksparse_attention call, checked and viewed.
struct BlockSparseCall {
  ArrayView q, k, v;
  py::array cu_q, cu_k;
  BlockSparseAttentionOptions options;
  WrittenArray out;
};

BlockSparseCall prepare_blocksparse_call(const py::handle& q, const py::handle& k,
                                         const py::handle& v, const py::handle& cu_seqlens_q,
                                         const py::handle& cu_seqlens_k, const py::handle& scale,
                                         const py::handle& out,
                                         const py::handle& fp32_probabilities,
                                         const py::handle& implementation) {
  BlockSparseCall call{view_array(require_attention_array(q, "q"), "q"),
                       view_array(require_attention_array(k, "k"), "k"),
                       view_array(require_attention_array(v, "v"), "v"),
                       require_int32_array(cu_seqlens_q, "cu_seqlens_q", 1, "[num_seqs + 1]"),
                       require_int32_array(cu_seqlens_k, "cu_seqlens_k", 1, "[num_seqs + 1]"),
                       {},
                       {}};
  call.options.scale = parse_optional_scale(scale, "scale");
  call.options.fp32_probabilities = parse_bool(fp32_probabilities, "fp32_probabilities");
  call.options.implementation = parse_implementation(implementation);
  call.out = packed_output(out, call.q, "q", "[total_q, Hq, D]");
  return call;
}

py::array blocksparse_attention(const py::handle& q, const py::handle& k, const py::handle& v,
                                const BlockSparseLayout& layout, const py::handle& cu_seqlens_q,
                                const py::handle& cu_seqlens_k, const py::handle& scale,
                                const py::handle& out, const py::handle& fp32_probabilities,
                                const py::handle& implementation) {
  const BlockSparseCall call = prepare_blocksparse_call(q, k, v, cu_seqlens_q, cu_seqlens_k, scale,
                                                        out, fp32_probabilities, implementation);
  {
    py::gil_scoped_release release;
    tilelab::blocksparse_attention(call.q.view, call.k.view, call.v.view, layout,
                                   view_int32(call.cu_q), view_int32(call.cu_k), call.out.view,
                                   call.options);
  }
  return call.out.array;
}

std::vector<std::string> blocksparse_attention_kernels(
    const py::handle& q, const py::handle& k, const py::handle& v, const BlockSparseLayout& layout,
    const py::handle& cu_seqlens_q, const py::handle& cu_seqlens_k, const py::handle& scale,
    const py::handle& fp32_probabilities, const py::handle& implementation) {
  const BlockSparseCall call =
      prepare_blocksparse_call(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, py::none(),
                               fp32_probabilities, implementation);
  return tilelab::blocksparse_attention_kernels(call.q.view, call.k.view, call.v.view, layout,
                                                view_int32(call.cu_q), view_int32(call.cu_k),
                                                call.out.view, call.options);
}

}  // namespace

void register_blocksparse_bindings(py::module_& core) {
  py::class_<BlockSparseLayout>(
      core, "BlockSparseLayout",
      "Which key blocks each query block attends to, per head, for blocksparse_attention.\n\n"
      "Positions are split into blocks of block_size tokens; the layout has num_row_blocks query\n"
      "blocks and as many key blocks (it covers sequences up to max_seqlen tokens). Storage is\n"
      "int32 CSR per head: crow [n_heads, num_row_blocks + 1] (crow[h, 0] = 0), col\n"
      "[n_heads, nnz_max] (sorted, unique columns per row; -1 padding past crow[h, -1]).\n"
      "causal (default True): no block above the diagonal, and j <= i inside diagonal blocks.\n"
      "density: kept blocks / blocks on or below the diagonal (all blocks when not causal).\n\n"
      "BlockSparseLayout(crow, col, block_size, causal=True) validates the arrays (errors name\n"
      "the array, head and row); see also local_strided and from_dense. docs/blocksparse.md.")
      .def(py::init(&layout_from_csr), py::arg("crow"), py::arg("col"), py::arg("block_size"),
           py::arg("causal") = true)
      .def_static("local_strided", &BlockSparseLayout::local_strided, py::arg("n_heads"),
                  py::arg("max_seqlen"), py::arg("block_size"), py::arg("local_blocks"),
                  py::arg("vert_stride"), py::arg("homo_head") = false,
                  py::arg("head_sliding_step") = py::none(),
                  "Local plus vertically strided blocks (Phi-3-small).")
      .def_static("from_dense", &layout_from_dense, py::arg("block_mask"), py::arg("block_size"),
                  py::arg("causal") = true,
                  "From a bool block mask [n_heads, num_blocks, num_blocks].")
      .def(
          "to_dense",
          [](const BlockSparseLayout& layout) {
            const py::ssize_t rows = layout.num_row_blocks();
            return bool_array(layout.to_dense(), {layout.n_heads(), rows, rows});
          },
          "The bool block mask [n_heads, num_row_blocks, num_row_blocks].")
      .def("token_mask", &token_mask, py::arg("seqlen"), py::arg("head") = py::none(),
           "The bool token mask [n_heads, seqlen, seqlen], or [seqlen, seqlen] of one head.")
      .def_property_readonly("crow",
                             [](const BlockSparseLayout& layout) {
                               return int32_array(layout.crow(),
                                                  {layout.n_heads(), layout.num_row_blocks() + 1});
                             })
      .def_property_readonly("col",
                             [](const BlockSparseLayout& layout) {
                               return int32_array(layout.col(),
                                                  {layout.n_heads(), layout.nnz_max()});
                             })
      .def_property_readonly("n_heads", &BlockSparseLayout::n_heads)
      .def_property_readonly("block_size", &BlockSparseLayout::block_size)
      .def_property_readonly("num_row_blocks", &BlockSparseLayout::num_row_blocks)
      .def_property_readonly("max_seqlen", &BlockSparseLayout::max_seqlen)
      .def_property_readonly("nnz_max", &BlockSparseLayout::nnz_max)
      .def_property_readonly("causal", &BlockSparseLayout::causal)
      .def_property_readonly("density", &BlockSparseLayout::density)
      .def("__repr__", &layout_repr);

  core.def("blocksparse_attention", &blocksparse_attention, py::arg("q"), py::arg("k"),
           py::arg("v"), py::arg("layout"), py::kw_only(), py::arg("cu_seqlens_q"),
           py::arg("cu_seqlens_k"), py::arg("scale") = py::none(), py::arg("out") = py::none(),
           py::arg("fp32_probabilities") = false, py::arg("implementation") = "automatic",
           "Block-sparse attention over packed varlen sequences; returns out. See "
           "tilelab.blocksparse_attention.");
  core.def("blocksparse_attention_kernels", &blocksparse_attention_kernels, py::arg("q"),
           py::arg("k"), py::arg("v"), py::arg("layout"), py::kw_only(), py::arg("cu_seqlens_q"),
           py::arg("cu_seqlens_k"), py::arg("scale") = py::none(),
           py::arg("fp32_probabilities") = false, py::arg("implementation") = "automatic",
           "The names of the generated kernels blocksparse_attention would run for these "
           "arguments, sorted. See tilelab.blocksparse_attention_kernels.");
}

}  // namespace tilelab::python
