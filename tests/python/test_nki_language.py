"""tilelab.nki's NKI-language front end: kernels written with nl/nisa, traced into the simulator,
against fp64 numpy references; the matmul tutorial kernels against the C++ matmul kernel's
timing; the NKI rules and unsupported operations as errors naming file:line."""

import linecache
import pathlib
import re
import sys

import ml_dtypes
import numpy as np
import pytest
from nki_examples import EXAMPLES, load_example

import tilelab.nki as tn
from tilelab import sim
from tilelab.nki import isa as nisa
from tilelab.nki import language as nl


@pytest.fixture(scope="module")
def matmul_examples():
    return load_example("matmul")


def assert_names_line(error: BaseException, *words: str) -> None:
    """The message starts with this file:line, and that line contains each of `words`."""
    match = re.match(r"(.+?):(\d+): ", str(error))
    assert match, f"no file:line in: {error}"
    file, line = match.group(1), int(match.group(2))
    assert pathlib.Path(file).name == pathlib.Path(__file__).name, str(error)
    text = linecache.getline(file, line)
    for word in words:
        assert word in text, f"line {line} ({text.strip()!r}) lacks {word!r}: {error}"


# --- the matmul tutorial ------------------------------------------------------------------------

VARIANTS = {
    "tiled": "matmul_tiled",
    "hoist_load": "matmul_hoist_load",
    "block_free": "matmul_block_free",
    "fully_optimized": "matmul_fully_optimized",
}


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_matmul_tutorial_outputs(matmul_examples, rng, variant, dtype):
    kernel = getattr(matmul_examples, VARIANTS[variant])
    k, m, n = (256, 256, 1024)
    kwargs = {}
    if variant == "fully_optimized":
        kwargs = dict(BLOCK_TILES_M=2, BLOCK_TILES_N=1, BLOCK_TILES_K=2)
        k, m, n = 512, 256, 1024
    lhs_t = rng.standard_normal((k, m)).astype(dtype)
    rhs = rng.standard_normal((k, n)).astype(dtype)
    out = tn.simulate_kernel(kernel, lhs_t, rhs, **kwargs)
    assert out.dtype == np.dtype(dtype) and out.shape == (m, n)
    reference = lhs_t.astype(np.float64).T @ rhs.astype(np.float64)
    # bf16 results are rounded once at the end (and fully_optimized accumulates in bf16 SBUF).
    tolerance = 1e-5 if dtype == np.float32 else (0.05 if variant == "fully_optimized" else 0.01)
    np.testing.assert_allclose(
        out.astype(np.float64), reference, atol=tolerance * np.abs(reference).max()
    )


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_matmul_tutorial_times_equal_the_cpp_kernel(matmul_examples, variant):
    """Same loop nests, same buffering: the traced program is timed exactly as the C++ kernel."""
    k, m, n = (2048, 4096, 2048)
    kernel = getattr(matmul_examples, VARIANTS[variant])
    _, report = tn.profile_kernel(
        kernel, tn.tensor((k, m), nl.bfloat16), tn.tensor((k, n), nl.bfloat16), functional=False
    )
    reference = sim.simulate("matmul", {"variant": variant, "M": m, "K": k, "N": n})
    assert report.total_time_ns == pytest.approx(reference.total_time_ns, rel=0.01)
    ours = {e["name"]: e["instruction_count"] for e in report.engines}
    theirs = {e["name"]: e["instruction_count"] for e in reference.engines}
    if variant == "fully_optimized":
        # The tutorial zeroes result_tiles with one nl.zeros; the C++ kernel with one memset per
        # M block, per N block.
        assert ours["vector"] == theirs["vector"] - (m // 2048 - 1) * (n // 1024)
        ours["vector"] = theirs["vector"]
        assert report.total_time_ns == pytest.approx(reference.total_time_ns, rel=1e-3)
    else:
        assert report.total_time_ns == reference.total_time_ns
    assert ours == theirs
    assert report.kernel == VARIANTS[variant]
    assert report.parameters["lhsT"] == f"bf16[{k},{m}]"


# --- element-wise, reductions, transposes -------------------------------------------------------


@tn.jit
def elementwise_kernel(x, y, s):
    out = nl.ndarray((9, x.shape[0], x.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    a = nl.load(x)
    b = nl.load(y)
    col = nl.load(s)  # [P, 1]
    nl.store(out[0], value=nl.exp(a))
    nl.store(out[1], value=nl.add(a, b))
    nl.store(out[2], value=a * 3.0 - b)
    nl.store(out[3], value=nl.maximum(a, b))
    nl.store(out[4], value=nl.multiply(a, col))
    t = nisa.tensor_scalar(a, np.subtract, col, op1=np.multiply, operand1=0.5)
    nl.store(out[5], value=t)
    act = nisa.activation(op=nl.tanh, data=a, bias=col, scale=2.0)
    nl.store(out[6], value=act)
    nl.store(out[7], value=nl.where(b, a, -1.0))
    buffer = nl.ndarray((x.shape[0], x.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
    buffer[...] = nl.reciprocal(b)
    buffer[...] += a
    nl.store(out[8], value=buffer)
    return out


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_elementwise(rng, dtype):
    p, f = 96, 40
    x = rng.uniform(-2, 2, (p, f)).astype(dtype)
    y = rng.uniform(0.5, 2, (p, f)).astype(dtype)
    y[::7, ::3] = 0  # where() takes its else branch; reciprocal gives inf
    s = rng.uniform(-1, 1, (p, 1)).astype(dtype)
    with np.errstate(divide="ignore"):
        out = tn.simulate_kernel(elementwise_kernel, x, y, s)
        a, b, c = (v.astype(np.float64) for v in (x, y, s))
        expected = [
            np.exp(a),
            a + b,
            a * 3 - b,
            np.maximum(a, b),
            a * c,
            (a - c) * 0.5,
            np.tanh(2 * a + c),
            np.where(b != 0, a, -1.0),
            1 / b + a,
        ]
    # Results are rounded to the input dtype where the kernel keeps it (nl.exp(bf16) is bf16).
    rtol = 1e-5 if dtype == np.float32 else 1e-2
    for i, want in enumerate(expected):
        np.testing.assert_allclose(out[i], want, rtol=rtol, atol=rtol, err_msg=f"output {i}")


@tn.jit
def reduce_kernel(x):
    p, _ = x.shape
    out = nl.ndarray((p, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    a = nl.load(x)
    nl.store(out[:, 0:1], value=nl.max(a, axis=1))
    nl.store(out[:, 1:2], value=nl.sum(a, axis=1))
    nl.store(out[:, 2:3], value=nl.mean(a, axis=1))
    nl.store(out[:, 3:4], value=nisa.tensor_reduce(np.add, a, axis=1, negate=True))
    return out


def test_reductions(rng):
    x = rng.standard_normal((128, 300)).astype(np.float32)
    out = tn.simulate_kernel(reduce_kernel, x)
    expected = np.stack([x.max(1), x.sum(1), x.mean(1), -x.sum(1)], axis=1)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)


@tn.jit
def transpose_kernel(x, y):
    p, f = x.shape
    t_out = nl.ndarray((f, p), dtype=x.dtype, buffer=nl.shared_hbm)
    mm_out = nl.ndarray((p, y.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    a = nl.load(x)
    nl.store(t_out, value=nl.copy(nisa.nc_transpose(a)))
    # transpose_x=False: the compiler transposes a (through PSUM) before the matmul.
    nl.store(mm_out, value=nl.matmul(nl.load(x[:, 0 : y.shape[0]]), nl.load(y)))
    return t_out, mm_out


def test_transposes(rng):
    x = rng.standard_normal((64, 100)).astype(np.float32)
    y = rng.standard_normal((100, 72)).astype(np.float32)
    t, product = tn.simulate_kernel(transpose_kernel, x, y)
    np.testing.assert_array_equal(t, x.T)
    np.testing.assert_allclose(product, x.astype(np.float64) @ y, rtol=1e-4, atol=1e-3)


@tn.jit
def psum_zero_kernel(x):
    out = nl.ndarray((x.shape[0], 8), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.zeros((x.shape[0], 8), nl.float32, buffer=nl.psum)
    nl.store(out, value=nl.copy(acc))  # never written by a matmul: the zeros are real
    return out


def test_psum_zeros_read_before_any_matmul():
    out = tn.simulate_kernel(psum_zero_kernel, np.ones((16, 4), np.float32))
    np.testing.assert_array_equal(out, 0)


def test_nan_and_inf_propagate(rng):
    x = rng.uniform(-1, 1, (32, 16)).astype(np.float32)
    y = np.ones((32, 16), np.float32)
    s = np.zeros((32, 1), np.float32)
    x[3, 4], x[5, 6] = np.nan, np.inf
    with np.errstate(invalid="ignore"):
        out = tn.simulate_kernel(elementwise_kernel, x, y, s)
    assert np.isnan(out[0, 3, 4]) and out[0, 5, 6] == np.inf  # exp
    assert np.isnan(out[1, 3, 4]) and out[1, 5, 6] == np.inf  # add


# --- the SPMD grid ------------------------------------------------------------------------------


@tn.jit
def grid_kernel(x):
    rows, cols = x.shape
    out = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    i, j = nl.program_id(0), nl.program_id(1)
    h, w = rows // nl.num_programs(0), cols // nl.num_programs(1)
    tile = nl.load(x[i * h : (i + 1) * h, j * w : (j + 1) * w])
    nl.store(out[i * h : (i + 1) * h, j * w : (j + 1) * w], value=tile * float(1 + i + 10 * j))
    return out


def test_spmd_grid(rng):
    x = rng.standard_normal((64, 48)).astype(np.float32)
    out = tn.simulate_kernel(grid_kernel[2, 3], x)
    scale = np.ones_like(x)
    for i in range(2):
        for j in range(3):
            scale[i * 32 : (i + 1) * 32, j * 16 : (j + 1) * 16] = 1 + i + 10 * j
    np.testing.assert_allclose(out, x * scale, rtol=1e-6)
    _, report = tn.profile_kernel(grid_kernel[2, 3], x)
    assert report.parameters["grid"] == "2,3"
    assert report.instruction_count == 6 * 3  # load, multiply, store per instance
    runs = tn.instances(report)
    assert [r["program_id"] for r in runs] == [(i, j) for i in range(2) for j in range(3)]
    assert [r["instructions"] for r in runs] == [3] * 6
    assert [r["first_instruction"] for r in runs] == [0, 3, 6, 9, 12, 15]
    assert runs[-1]["end_ns"] == pytest.approx(report.total_time_ns)
    assert all(r["start_ns"] < r["end_ns"] for r in runs)
    _, single = tn.profile_kernel(grid_kernel[1, 1], x)
    assert len(tn.instances(single)) == 1 and tn.instances(single)[0]["instructions"] == 3


def test_calling_a_kernel_runs_it(rng):
    x = rng.standard_normal((8, 8)).astype(np.float32)
    np.testing.assert_allclose(grid_kernel[1, 1](x), x, rtol=1e-6)
    np.testing.assert_allclose(grid_kernel[2, 1](x), x * np.repeat([[1], [2]], 4, 0), rtol=1e-6)
    np.testing.assert_allclose(version_kernel(x), 2 * x, rtol=1e-6)


# --- machines and aliases -----------------------------------------------------------------------


@tn.jit
def version_kernel(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    value = float(nisa.get_nc_version())
    nl.store(out, value=nl.load(x) * value)
    return out


@pytest.mark.parametrize(("machine", "version"), [("trn1", 2), ("trn2", 3)])
def test_nc_version_follows_the_machine(machine, version):
    out, _ = tn.profile_kernel(version_kernel, np.ones((4, 4), np.float32), machine=machine)
    np.testing.assert_array_equal(out, version)
    assert nisa.nc_version.gen2 == 2 and nisa.nc_version.gen3 == 3


def test_neuronxcc_alias():
    tn.install_neuronxcc_alias()
    tn.install_neuronxcc_alias()  # idempotent
    import neuronxcc.nki.isa as aliased_isa
    import neuronxcc.nki.language as aliased_language
    from neuronxcc import nki

    assert nki is tn and aliased_language is nl and aliased_isa is nisa
    assert nki.jit is tn.jit


# --- NKI rules and unsupported operations -------------------------------------------------------


@tn.jit
def too_many_partitions(x):
    t = nl.ndarray((129, 4), dtype=nl.float32, buffer=nl.sbuf)
    t[...] = 0.0
    return None


@tn.jit
def psum_too_large(x):
    acc = nl.zeros((128, 513), nl.float32, buffer=nl.psum)
    return acc


@tn.jit
def moving_too_wide(x, y):
    a = nl.load(x)
    b = nl.load(y)
    nl.copy(nisa.nc_matmul(a, b))
    return None


@tn.jit
def stationary_too_wide(x, y):
    a = nl.load(x)
    b = nl.load(y)
    product = nisa.nc_matmul(a, b)
    nl.copy(product)
    return None


@tn.jit
def sbuf_overflow(x):
    big = nl.ndarray((128, 60000), dtype=nl.float32, buffer=nl.sbuf)
    big[...] = 0.0
    return None


@tn.jit
def writes_its_input(x):
    nl.store(x, value=nl.load(x))
    return None


@tn.jit
def unsupported_op(x):
    a = nl.load(x)
    nl.gelu_apprx_tanh(a)
    return None


@tn.jit
def masked_matmul(x):
    i = nl.arange(4)[:, None]
    a = nl.load(x)
    nl.copy(nl.matmul(a, a, transpose_x=True, mask=(i < 2)))
    return None


@tn.jit
def out_of_range_index(x):
    nl.load(x[0:9, :])
    return None


def test_partition_dimension_limit():
    with pytest.raises(tn.NkiError, match="pmax") as error:
        tn.simulate_kernel(too_many_partitions, np.ones((4, 4), np.float32))
    assert_names_line(error.value, "129")


def test_psum_tile_fits_one_bank():
    with pytest.raises(tn.NkiError, match="one bank") as error:
        tn.simulate_kernel(psum_too_large, np.ones((4, 4), np.float32))
    assert_names_line(error.value, "nl.zeros")


def test_matmul_limits():
    x = np.ones((128, 128), np.float32)
    with pytest.raises(tn.NkiError, match="gemm_moving_fmax") as error:
        tn.simulate_kernel(moving_too_wide, x, np.ones((128, 513), np.float32))
    assert_names_line(error.value, "nc_matmul")
    with pytest.raises(tn.NkiError, match="gemm_stationary_fmax") as error:
        tn.simulate_kernel(stationary_too_wide, np.ones((128, 129), np.float32), x)
    assert_names_line(error.value, "nc_matmul")


@tn.jit
def integer_matmul(x):
    a = nl.load(x)
    nl.copy(nisa.nc_matmul(a, a))
    return None


def test_dtype_rules():
    with pytest.raises(tn.NkiError, match="integer operands") as error:
        tn.simulate_kernel(integer_matmul, np.ones((8, 8), np.int32))
    assert_names_line(error.value, "nc_matmul")


def test_sbuf_capacity():
    with pytest.raises(tn.NkiError, match="SBUF allocation failed") as error:
        tn.simulate_kernel(sbuf_overflow, np.ones((4, 4), np.float32))
    assert_names_line(error.value, "nl.ndarray")


def test_kernel_inputs_are_read_only():
    with pytest.raises(tn.NkiError, match="kernel input") as error:
        tn.simulate_kernel(writes_its_input, np.ones((4, 4), np.float32))
    assert_names_line(error.value, "nl.store")


def test_unsupported_operations_name_themselves_and_the_line():
    with pytest.raises(NotImplementedError, match=r"nl\.gelu_apprx_tanh") as error:
        tn.simulate_kernel(unsupported_op, np.ones((4, 4), np.float32))
    assert_names_line(error.value, "gelu_apprx_tanh")
    with pytest.raises(NotImplementedError) as error:
        tn.simulate_kernel(masked_matmul, np.ones((4, 4), np.float32))
    assert_names_line(error.value, "mask")


def test_index_out_of_range():
    with pytest.raises(IndexError, match="out of range") as error:
        tn.simulate_kernel(out_of_range_index, np.ones((4, 4), np.float32))
    assert_names_line(error.value, "0:9")
    with pytest.raises(IndexError, match=r"covers 0\.\.127, out of range") as error:
        tn.simulate_kernel(masked_tiles, np.ones((100, 8), np.float32), use_mask=False)
    assert_names_line(error.value, "nl.load")


def test_bad_arguments():
    with pytest.raises(ValueError, match="TensorSpec has no data"):
        tn.simulate_kernel(grid_kernel, tn.tensor((4, 4), nl.float32))
    with pytest.raises(TypeError, match="x: unsupported dtype int64"):
        tn.simulate_kernel(grid_kernel, np.ones((4, 4), np.int64))
    with pytest.raises(TypeError, match="grid_kernel"):
        tn.simulate_kernel(grid_kernel, np.ones((4, 4), np.float32), np.ones(3))
    with pytest.raises(ValueError, match="grid"):
        grid_kernel[0]
    with pytest.raises(TypeError, match="kernel"):
        tn.simulate_kernel("not a kernel")
    with pytest.raises(RuntimeError, match="only inside a kernel"):
        nl.load(None)


# --- tiles with several free dimensions ---------------------------------------------------------


@tn.jit
def free_dims_kernel(x):
    p, rows, cols = x.shape
    out = nl.ndarray((p, rows, cols // 2), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((p, rows, cols), dtype=x.dtype, buffer=nl.sbuf)
    t[...] = nl.load(x)
    half = nl.ndarray((p, rows, cols // 2), dtype=x.dtype, buffer=nl.sbuf)
    half[...] = nl.exp(t[:, :, 1 : cols // 2 + 1])  # two free levels: rows x a run of columns
    nl.store(out, value=half)
    return out


@tn.jit
def three_levels_kernel(x):
    t = nl.load(x)
    nl.exp(t[:, 0:2, 0:2, 0:2])
    return None


def test_tiles_with_several_free_dimensions(rng):
    x = rng.uniform(-1, 1, (16, 3, 10)).astype(np.float32)
    out = tn.simulate_kernel(free_dims_kernel, x)
    np.testing.assert_allclose(out, np.exp(x[:, :, 1:6].astype(np.float64)), rtol=1e-6)
    with pytest.raises(NotImplementedError, match="3 strided levels") as error:
        tn.simulate_kernel(three_levels_kernel, np.ones((4, 3, 3, 3), np.float32))
    assert_names_line(error.value, "0:2, 0:2, 0:2")


# --- masks --------------------------------------------------------------------------------------


@tn.jit
def masked_tiles(x, use_mask=True):
    """exp(x) * 2 over [128, 64] tiles of any shape: masks cut the ragged edges."""
    rows, cols = x.shape
    out = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(64)[None, :]
    for r in nl.affine_range((rows + 127) // 128):
        for c in nl.affine_range((cols + 63) // 64):
            keep = (r * 128 + i_p < rows) & (c * 64 + i_f < cols) if use_mask else None
            t = nl.load(x[r * 128 + i_p, c * 64 + i_f], mask=keep)
            e = nl.exp(t, mask=keep)
            doubled = nl.multiply(e, 2.0, mask=keep)
            nl.store(out[r * 128 + i_p, c * 64 + i_f], value=doubled, mask=keep)
    return out


@pytest.mark.parametrize("shape", [(100, 70), (128, 64), (300, 5), (1, 1), (129, 65)])
def test_masks_cut_ragged_tiles(rng, shape):
    x = rng.uniform(-1, 1, shape).astype(np.float32)
    out, report = tn.profile_kernel(masked_tiles, x)
    np.testing.assert_allclose(out, 2 * np.exp(x.astype(np.float64)), rtol=1e-6)
    tiles = -(-shape[0] // 128) * -(-shape[1] // 64)
    assert report.instruction_count == 4 * tiles
    # The DMA moves only the kept elements.
    assert report.hbm_read_bytes == report.hbm_write_bytes == x.nbytes


@tn.jit
def fully_masked(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(x.shape[0])[:, None]
    t = nl.load(x)
    nl.store(out, value=t)
    nl.store(out, value=nl.exp(t, mask=(i_p < 0)), mask=(i_p < 0))  # emits nothing
    return out


def test_an_empty_mask_emits_nothing():
    x = np.full((8, 4), 3.0, np.float32)
    out, report = tn.profile_kernel(fully_masked, x)
    np.testing.assert_array_equal(out, x)
    assert report.instruction_count == 2


# --- indirect loads -----------------------------------------------------------------------------


@tn.jit
def gather_kernel(table, ids, cache):
    p = ids.shape[0]
    rows_out = nl.ndarray((p, 6), dtype=table.dtype, buffer=nl.shared_hbm)
    cache_out = nl.ndarray((p, cache.shape[2]), dtype=cache.dtype, buffer=nl.shared_hbm)
    index = nl.load(ids)  # int32 [P, 1]
    nl.store(rows_out, value=nl.load(table[index, 2:8]))
    i_f = nl.arange(cache.shape[2])[None, :]
    nl.store(cache_out, value=nl.load(cache[1, index, i_f]))
    return rows_out, cache_out


def test_indirect_loads_gather_rows(rng):
    table = rng.standard_normal((50, 10)).astype(np.float32)
    cache = rng.standard_normal((2, 50, 16)).astype(ml_dtypes.bfloat16)
    ids = rng.integers(0, 50, (96, 1)).astype(np.int32)
    (rows, cached), report = tn.profile_kernel(gather_kernel, table, ids, cache)
    np.testing.assert_array_equal(rows, table[ids[:, 0], 2:8])
    np.testing.assert_array_equal(cached, cache[1, ids[:, 0], :])
    gathers = [k for k in report.dma_by_kind if k["kind"] == "dma_gather"]
    assert gathers and gathers[0]["transfers"] == 2


def test_indirect_index_out_of_range_is_an_error(rng):
    table = np.zeros((50, 10), np.float32)
    cache = np.zeros((2, 50, 16), np.float32)
    ids = np.full((8, 1), 50, np.int32)
    with pytest.raises(ValueError, match="holds row 50"):
        tn.simulate_kernel(gather_kernel, table, ids, cache)
    with pytest.raises(tn.NkiError, match="int32") as error:
        tn.simulate_kernel(gather_kernel, table, ids.astype(np.float32), cache)
    assert_names_line(error.value, "table[index")


@tn.jit
def printing_kernel(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    t[...] = nl.load(x)
    nl.device_print("loaded", t[0:2, 1:3])
    t[...] = nl.multiply(t, 10.0)
    nl.device_print("scaled", t[0:1, :])
    nl.store(out, value=t)
    return out


def test_device_print_shows_values_at_that_point(capsys):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = tn.simulate_kernel(printing_kernel, x)
    np.testing.assert_array_equal(out, 10 * x)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "loaded [[1. 2.]"
    assert printed[1].strip() == "[5. 6.]]"
    assert printed[2] == "scaled [[ 0. 10. 20. 30.]]"
    _, report = tn.profile_kernel(printing_kernel, tn.tensor(x.shape, x.dtype), functional=False)
    assert capsys.readouterr().out == ""
    assert report.instruction_count == 3  # prints take no instructions


# --- the command line ---------------------------------------------------------------------------


def test_command_line_profile(tmp_path):
    import json
    import os
    import subprocess

    report = tmp_path / "report.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    command = [
        sys.executable,
        "-m",
        "tilelab.nki",
        "profile",
        f"{EXAMPLES}/matmul.py:matmul_tiled",
        "--arg",
        "lhsT=bf16[256,128]",
        "--arg",
        "rhs=bf16[256,512]",
        "--json",
        str(report),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert "kernel matmul_tiled on trn1" in done.stdout
    saved = json.loads(report.read_text())
    assert saved["parameters"]["lhsT"] == "bf16[256,128]"
    bad = subprocess.run(
        [*command[:5], "--arg", "lhsT=int64[4,4]"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert bad.returncode == 2 and "unknown dtype 'int64'" in bad.stderr


# --- tile lifetimes -----------------------------------------------------------------------------


@tn.jit
def keeps_tiles_alive(x, width=64):
    """Loads every row block first and uses them all afterwards: each kept tile needs its own
    buffer, whatever the double-buffering of its declaration."""
    blocks = x.shape[0] // 32
    out = nl.ndarray((32, width), dtype=x.dtype, buffer=nl.shared_hbm)
    total = nl.ndarray((32, width), dtype=nl.float32, buffer=nl.sbuf)
    total[...] = 0.0
    kept = []
    for b in nl.affine_range(blocks):
        kept.append(nl.load(x[b * 32 : (b + 1) * 32, 0:width])[...])
    for t in kept:
        total[...] += t
    nl.store(out, value=total)
    return out


def test_live_tiles_never_share_a_buffer(rng):
    x = rng.standard_normal((128, 64)).astype(np.float32)
    out = tn.simulate_kernel(keeps_tiles_alive, x)
    np.testing.assert_allclose(out, x.reshape(4, 32, 64).sum(0), rtol=1e-5, atol=1e-5)


def test_a_tile_evicted_for_lack_of_memory_is_an_error():
    # The sum and 4 tiles of 64 KB per partition cannot all live in a 192 KiB partition: the
    # third load takes the first one's buffer.
    x = np.zeros((128, 16000), np.float32)
    with pytest.raises(tn.NkiError, match="taken by a later tile declared at") as error:
        tn.simulate_kernel(keeps_tiles_alive, x, width=16000)
    assert_names_line(error.value, "total[...] += t")


# --- broadcasts, TensorE results in SBUF, numpy op names ----------------------------------------


@tn.jit
def broadcast_kernel(x, column):
    p, f = x.shape
    out = nl.ndarray((2, p, f), dtype=nl.float32, buffer=nl.shared_hbm)
    a = nl.load(x)
    c = nl.load(column)  # [P, 1]
    nl.store(out[0], value=nl.add(a, c.broadcast_to((p, f))))  # a stride-0 operand
    row_max = nisa.tensor_reduce(np.max, a, axis=(1,))  # np.max names the op
    t = nl.ndarray((f, p), dtype=nl.float32, buffer=nl.sbuf)
    t[...] = nl.transpose(a)  # TensorE writes PSUM; the SBUF destination gets a copy
    back = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
    back[...] = nisa.nc_transpose(t)
    nl.store(out[1], value=nl.subtract(back, row_max))
    return out


def test_broadcasts_and_sbuf_transposes(rng):
    x = rng.standard_normal((64, 48)).astype(np.float32)
    column = rng.standard_normal((64, 1)).astype(np.float32)
    out = tn.simulate_kernel(broadcast_kernel, x, column)
    np.testing.assert_allclose(out[0], x + column, rtol=1e-6)
    np.testing.assert_allclose(out[1], x - x.max(axis=1, keepdims=True), rtol=1e-6)


@tn.jit
def partition_broadcast(x, row):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    r = nl.load(row)  # [1, n]
    nl.store(out, value=nl.multiply(nl.load(x), r.broadcast_to(x.shape)))
    return out


@tn.jit
def broadcast_wrong_extent(x):
    nl.exp(nl.load(x).broadcast_to((8, 8)))
    return None


@pytest.mark.parametrize("n", [7, 512, 1300])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_partition_broadcast_is_a_ones_matmul(rng, n, dtype):
    x = rng.standard_normal((96, n)).astype(dtype)
    row = rng.standard_normal((1, n)).astype(dtype)
    out, report = tn.profile_kernel(partition_broadcast, x, row)
    expected = x.astype(np.float64) * row.astype(np.float64)
    np.testing.assert_allclose(
        out.astype(np.float64), expected, rtol=1e-6 if dtype == np.float32 else 1e-2
    )
    engines = {e["name"]: e["instruction_count"] for e in report.engines}
    assert engines["tensor"] == -(-n // 512)  # one matmul per PSUM bank of the row
    # The ones vector is set once; an fp32 row that fits one bank is read from PSUM directly,
    # otherwise each bank is copied to SBUF: memset, [copies,] multiply on VectorE.
    in_psum = dtype == np.float32 and n <= 512
    assert engines["vector"] == 1 + (0 if in_psum else -(-n // 512)) + 1
    with pytest.raises(tn.NkiError, match="only a partition dimension of 1") as error:
        tn.simulate_kernel(broadcast_wrong_extent, np.ones((4, 8), np.float32))
    assert_names_line(error.value, "broadcast_to")


# --- source lines -------------------------------------------------------------------------------


def _scaled(t, factor):
    return nl.multiply(t, factor)  # a helper: its line is attributed, called from the kernel


@tn.jit
def lines_kernel(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    u = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    u[...] = _scaled(t, 3.0)
    nl.store(out, value=nl.exp(u))
    return out


def test_by_line_table(rng, tmp_path):
    import inspect

    x = rng.standard_normal((128, 256)).astype(np.float32)
    out, report = tn.profile_kernel(lines_kernel, x)
    np.testing.assert_allclose(out, np.exp(3 * x.astype(np.float64)), rtol=1e-5)
    rows = report.by_line
    first = inspect.getsourcelines(lines_kernel.func)[1]
    by_text = {row["text"]: row for row in rows}
    load = by_text["t = nl.load(x)"]
    assert load["line"] == first + 3 and load["function"] == "lines_kernel"
    assert load["dma_transfers"] == 1 and load["dma_bytes"] == x.nbytes
    helper = by_text[
        "return nl.multiply(t, factor)  # a helper: its line is attributed, called from the kernel"
    ]
    assert helper["busy_ns"].keys() == {"vector"} and helper["instructions"] == 1
    sources = report.to_json()["sources"]
    caller = sources[helper["source"]]["caller"]
    assert sources[caller]["text"] == "u[...] = _scaled(t, 3.0)"
    store = by_text["nl.store(out, value=nl.exp(u))"]
    assert store["instructions"] == 2 and set(store["busy_ns"]) == {"scalar", "sync"}
    assert sum(row["instructions"] for row in rows) == report.instruction_count
    assert sum(row["critical_path_ns"] for row in rows) == pytest.approx(
        sum(report.to_json()["critical_path"]["time_ns_by_unit"].values())
    )
    assert load["idle_blamed_ns"] > 0  # the multiply waited for the load
    assert "by source line" in str(report)
    report.save_html(tmp_path / "r.html")
    assert "Kernel source lines" in (tmp_path / "r.html").read_text()


# --- sub-tensors, reshapes, lazy zeros ----------------------------------------------------------


@tn.jit
def views_kernel(x):
    batches, rows, cols = x.shape
    out = nl.ndarray((batches, rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    for b in nl.affine_range(batches):
        plane = x[b]  # the (rows, cols) tensor of batch b
        t = nl.load(plane[:, nl.ds(0, cols)])
        flat = nl.multiply(t, float(b + 1)).reshape((rows, cols))  # a result reshaped
        acc = nl.zeros((rows, cols), nl.float32, buffer=nl.sbuf, lazy_initialization=True)
        acc[...] = flat
        nl.store(out[b], value=acc)
    return out


def test_subtensors_reshapes_and_lazy_zeros(rng):
    x = rng.standard_normal((3, 16, 24)).astype(np.float32)
    out, report = tn.profile_kernel(views_kernel, x)
    np.testing.assert_allclose(out, x * np.arange(1, 4)[:, None, None], rtol=1e-6)
    # load, multiply, copy into acc, store per batch: lazy zeros emit no memset.
    assert report.instruction_count == 3 * 4


@tn.jit
def iota_kernel(x):
    out = nl.ndarray((4, 16), dtype=nl.int32, buffer=nl.shared_hbm)
    rows = nisa.iota(nl.arange(16)[:, None] * 3 + 5, dtype=nl.int32)  # [16, 1]
    cols = nisa.iota(nl.arange(16)[None, None, :] * 2, dtype=nl.int32)  # [1, 1, 16]
    one = nisa.iota(7, dtype=nl.int32)  # [1, 1]
    grid = nl.ndarray((16, 16), dtype=nl.int32, buffer=nl.sbuf)
    grid[...] = nl.add(
        rows.broadcast_to((16, 16)), nl.copy(cols.reshape((1, 16))).broadcast_to((16, 16))
    )
    nl.store(out[0:1, :], value=nl.copy(cols.reshape((1, 16))))
    nl.store(out[1:2, :], value=one.broadcast_to((1, 16)))
    nl.store(out[2:4, :], value=grid[0:2, :])
    return out


def test_iota():
    out = tn.simulate_kernel(iota_kernel, np.zeros((1, 1), np.float32))
    np.testing.assert_array_equal(out[0], 2 * np.arange(16))
    np.testing.assert_array_equal(out[1], 7)
    np.testing.assert_array_equal(out[2:4], (3 * np.arange(2) + 5)[:, None] + 2 * np.arange(16))


class _DlpackOnly:
    """An array known only through __dlpack__ (no shape or dtype attributes)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_dlpack_inputs_and_report_parameters(rng):
    x = rng.standard_normal((8, 8)).astype(np.float32)
    out, report = tn.profile_kernel(grid_kernel[1, 1], _DlpackOnly(x))
    np.testing.assert_array_equal(out, x)
    assert report.parameters["x"] == "fp32[8,8]"
    _, report = tn.profile_kernel(scale_kernel, x)
    assert report.parameters["factor"] == "2.0"  # defaults are filled in


@tn.jit
def scale_kernel(x, factor=2.0):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.multiply(nl.load(x), factor))
    return out


# --- nisa.tensor_tensor_scan --------------------------------------------------------------------


@tn.jit
def scan_kernel(x, y, start):
    p, f = x.shape
    out = nl.ndarray((4, p, f), dtype=nl.float32, buffer=nl.shared_hbm)
    a = nl.load(x)
    b = nl.load(y)
    initial = nl.load(start)  # [P, 1]
    nl.store(out[0], nisa.tensor_tensor_scan(a, b, 0.0, np.multiply, np.add))
    nl.store(out[1], nisa.tensor_tensor_scan(a, b, initial, np.add, np.maximum))
    nl.store(out[2], nisa.tensor_tensor_scan(a, b, 1.5, np.subtract, np.subtract, reverse0=True))
    nl.store(
        out[3],
        nisa.tensor_tensor_scan(a, b, initial, np.multiply, np.subtract, reverse1=True),
    )
    return out


def scan_reference(a, b, initial, op0, op1, reverse0=False, reverse1=False):
    out = np.empty_like(a)
    state = np.broadcast_to(initial, a[:, 0].shape).astype(np.float64)
    for i in range(a.shape[1]):
        t = op0(state, a[:, i]) if reverse0 else op0(a[:, i], state)
        state = op1(b[:, i], t) if reverse1 else op1(t, b[:, i])
        out[:, i] = state
    return out


@pytest.mark.parametrize(("p", "f"), [(1, 1), (37, 50), (128, 300)])
def test_tensor_tensor_scan(rng, p, f):
    x = rng.uniform(0.5, 1.0, (p, f)).astype(np.float32)
    y = rng.uniform(-1, 1, (p, f)).astype(np.float32)
    start = rng.uniform(-1, 1, (p, 1)).astype(np.float32)
    out = tn.simulate_kernel(scan_kernel, x, y, start)
    a, b, s = (v.astype(np.float64) for v in (x, y, start))
    expected = [
        scan_reference(a, b, 0.0, np.multiply, np.add),
        scan_reference(a, b, s[:, 0], np.add, np.maximum),
        scan_reference(a, b, 1.5, np.subtract, np.subtract, reverse0=True),
        scan_reference(a, b, s[:, 0], np.multiply, np.subtract, reverse1=True),
    ]
    for got, want in zip(out, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * f)


def test_tensor_tensor_scan_propagates_nan_and_inf():
    x = np.ones((2, 6), np.float32)
    y = np.zeros((2, 6), np.float32)
    x[0, 2] = np.nan
    y[1, 3] = np.inf
    out = tn.simulate_kernel(scan_kernel, x, y, np.zeros((2, 1), np.float32))[0]
    # h = x * h + y: NaN from step 2 on in row 0, inf from step 3 on in row 1.
    assert not np.isnan(out[0, :2]).any() and np.isnan(out[0, 2:]).all()
    assert np.isfinite(out[1, :3]).all() and np.isposinf(out[1, 3:]).all()


@tn.jit
def scan_shape_mismatch(x):
    a = nl.load(x)
    nisa.tensor_tensor_scan(a, a[:, 0:2], 0.0, np.multiply, np.add)
    return None


@tn.jit
def scan_wide_initial(x):
    a = nl.load(x)
    nisa.tensor_tensor_scan(a, a, a, np.multiply, np.add)
    return None


@tn.jit
def scan_unknown_op(x):
    a = nl.load(x)
    nisa.tensor_tensor_scan(a, a, 0.0, np.power, np.add)
    return None


def test_tensor_tensor_scan_errors():
    x = np.ones((4, 4), np.float32)
    with pytest.raises(tn.NkiError, match="operand shapes") as error:
        tn.simulate_kernel(scan_shape_mismatch, x)
    assert_names_line(error.value, "tensor_tensor_scan")
    with pytest.raises(tn.NkiError, match=r"number or a \[P, 1\] tile") as error:
        tn.simulate_kernel(scan_wide_initial, x)
    assert_names_line(error.value, "tensor_tensor_scan")
    with pytest.raises((tn.NkiError, NotImplementedError), match="power") as error:
        tn.simulate_kernel(scan_unknown_op, x)
    assert_names_line(error.value, "tensor_tensor_scan")


# --- sums of index expressions and partial reductions ------------------------------------------


@tn.jit
def window_reductions(x):
    p, h, w = x.shape
    out = nl.ndarray((5, p, h // 2, w // 2), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(x)
    i_p, i_r, i_dy, i_c, i_dx = nl.mgrid[0 : x.shape[0], 0 : h // 2, 0:2, 0 : w // 2, 0:2]
    windows = t[i_p, 2 * i_r + i_dy, 2 * i_c + i_dx]  # [p, h/2, 2, w/2, 2]
    nl.store(out[0], value=nl.max(windows, axis=(2, 4)))
    nl.store(out[1], value=nl.min(windows, axis=[4, 2]))
    nl.store(out[2], value=nl.mean(windows, axis=(2, 4)))
    nl.store(out[3], value=nl.sum(windows, axis=(2, 4), keepdims=True).reshape((p, h // 2, w // 2)))
    # Rows of each window only: the column axes stay.
    rows = nl.sum(windows, axis=2)  # [p, h/2, w/2, 2]
    nl.store(out[4], value=nl.sum(rows, axis=3))
    return out


def test_partial_reductions_over_index_sums(rng):
    x = rng.standard_normal((40, 6, 10)).astype(np.float32)
    out = tn.simulate_kernel(window_reductions, x)
    w = x.astype(np.float64).reshape(40, 3, 2, 5, 2)
    expected = [w.max((2, 4)), w.min((2, 4)), w.mean((2, 4)), w.sum((2, 4)), w.sum((2, 4))]
    for got, want in zip(out, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@tn.jit
def index_sum_out_of_range(x):
    i_p, i_a, i_b = nl.mgrid[0:4, 0:3, 0:4]
    t = nl.load(x)
    nl.sum(t[i_p, 4 * i_a + i_b], axis=(2,))
    return None


@tn.jit
def index_sum_same_axis(x):
    i_f = nl.arange(4)[None, :]
    t = nl.load(x)
    nl.exp(t[0:4, i_f + i_f])
    return None


@tn.jit
def index_sum_mask(x):
    i_p, i_a, i_b = nl.mgrid[0:4, 0:2, 0:2]
    nl.load(x[i_p, 2 * i_a + i_b], mask=(2 * i_a + i_b < 3))
    return None


@tn.jit
def reduce_partition_axis(x):
    nl.sum(nl.load(x), axis=0)
    return None


def test_index_sum_errors():
    x = np.ones((4, 11), np.float32)
    with pytest.raises(IndexError, match=r"covers 0\.\.11, out of range for dim 1 of size 11"):
        tn.simulate_kernel(index_sum_out_of_range, x)
    with pytest.raises(NotImplementedError, match="different output axes") as error:
        tn.simulate_kernel(index_sum_same_axis, x)
    assert_names_line(error.value, "i_f + i_f")
    with pytest.raises(NotImplementedError, match="mask= with a sum") as error:
        tn.simulate_kernel(index_sum_mask, x)
    assert_names_line(error.value, "mask=")
    with pytest.raises(NotImplementedError, match="free axes") as error:
        tn.simulate_kernel(reduce_partition_axis, x)
    assert_names_line(error.value, "axis=0")


# --- what vLLM's kernel file needs: integer transposes, views of views, DMA transposes ----------


@tn.jit
def integer_transpose(table):
    p, f = table.shape
    out = nl.ndarray((f, p), dtype=nl.int32, buffer=nl.shared_hbm)
    result = nl.ndarray((f, p), dtype=nl.int32, buffer=nl.sbuf)
    result[...] = nl.transpose(nl.load(table))
    nl.store(out, value=result)
    return out


def test_integer_transpose_goes_through_fp32_exactly(rng):
    table = rng.integers(-(2**24), 2**24, (96, 40), dtype=np.int32)
    out, report = tn.profile_kernel(integer_transpose, table)
    np.testing.assert_array_equal(out, table.T)
    # int -> fp32 copy, the PE transpose, the PSUM -> int32 copy.
    engines = {e["name"]: e["instruction_count"] for e in report.engines}
    assert engines["tensor"] == 1 and engines["vector"] == 2


@tn.jit
def views_of_views(x, y):
    out = nl.ndarray((2, 3, x.shape[0], 4), dtype=nl.float32, buffer=nl.shared_hbm)
    buffers = nl.zeros((2, 3, nl.par_dim(x.shape[0]), 4), dtype=nl.float32, buffer=nl.sbuf)
    block = buffers[1, 2]
    block[:, 0:1] = nl.load(x)  # a column of one block, written through the block's view
    buffers[0, 1][:, 3] = nl.load(y)
    column = buffers[1, 2][:, 0:1]
    buffers[0, 0][:, 1:2] = nl.multiply(column, 2.0)
    # [P, n, 1] broadcast along its trailing axis.
    wide = nl.load(y).reshape((x.shape[0], 1, 1)).broadcast_to((x.shape[0], 1, 4))
    buffers[1, 0][...] = nl.copy(wide)
    for i in range(2):
        for j in range(3):
            nl.store(out[i, j], value=buffers[i, j])
    return out


def test_views_of_views_and_trailing_broadcast(rng):
    x = rng.standard_normal((20, 1)).astype(np.float32)
    y = rng.standard_normal((20, 1)).astype(np.float32)
    out = tn.simulate_kernel(views_of_views, x, y)
    expected = np.zeros((2, 3, 20, 4), np.float32)
    expected[1, 2][:, 0:1] = x
    expected[0, 1][:, 3] = y[:, 0]
    expected[0, 0][:, 1:2] = 2 * x
    expected[1, 0] = np.repeat(y, 4, axis=1)
    np.testing.assert_array_equal(out, expected)


@tn.jit
def psum_declared_on_many_lines(x, eye):
    out = nl.ndarray((10, x.shape[0], x.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    t, e = nl.load(x), nl.load(eye)
    # Ten declarations of a whole PSUM bank (there are 8), each dead after its line: its bank
    # goes back to the allocator for the later ones.
    nl.store(out[0], value=nl.matmul(e, t, transpose_x=True))
    nl.store(out[1], value=nl.matmul(e, t, transpose_x=True))
    nl.store(out[2], value=nl.matmul(e, t, transpose_x=True))
    nl.store(out[3], value=nl.matmul(e, t, transpose_x=True))
    nl.store(out[4], value=nl.matmul(e, t, transpose_x=True))
    nl.store(out[5], value=nl.matmul(e, t, transpose_x=True))
    nl.store(out[6], value=nl.matmul(e, t, transpose_x=True))
    nl.store(out[7], value=nl.matmul(e, t, transpose_x=True))
    nl.store(out[8], value=nl.matmul(e, t, transpose_x=True))
    nl.store(out[9], value=nl.matmul(e, t, transpose_x=True))
    return out


@tn.jit
def psum_banks_all_held(x, eye):
    held = [nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(8)]
    extra = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
    held.append(extra)
    return None


def test_dead_declarations_return_their_memory(rng):
    x = rng.standard_normal((128, 512)).astype(np.float32)
    eye = np.eye(128, dtype=np.float32)
    out = tn.simulate_kernel(psum_declared_on_many_lines, x, eye)
    np.testing.assert_array_equal(out, np.broadcast_to(x, out.shape))
    with pytest.raises(tn.NkiError, match="PSUM allocation failed") as error:
        tn.simulate_kernel(psum_banks_all_held, x, eye)
    assert_names_line(error.value, "extra")


@tn.jit
def dma_transposes(x):
    p, f = x.shape
    out = nl.ndarray((2, f, p), dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out[0], value=nisa.dma_transpose(x))  # HBM -> SBUF
    nl.store(out[1], value=nisa.dma_transpose(nl.load(x)))  # SBUF -> SBUF
    return out


def test_dma_transpose(rng):
    x = rng.standard_normal((64, 96)).astype(ml_dtypes.bfloat16)
    out, report = tn.profile_kernel(dma_transposes, x, machine="trn2")
    np.testing.assert_array_equal(out[0], x.T)
    np.testing.assert_array_equal(out[1], x.T)
    kinds = {k["kind"]: k["transfers"] for k in report.dma_by_kind}
    assert kinds["dma_transpose"] == 2
    with pytest.raises(tn.NkiError, match="dma_transpose_supported") as error:
        tn.simulate_kernel(dma_transposes, x)  # trn1: NeuronCore-v2 has no DMA transpose
    assert_names_line(error.value, "dma_transpose")


# --- nisa.bn_stats / bn_aggr --------------------------------------------------------------------


@tn.jit
def batch_norm_stats(x, y):
    p = x.shape[0]
    out = nl.ndarray((p, 16), dtype=nl.float32, buffer=nl.shared_hbm)
    stats = nl.ndarray((p, 12), dtype=nl.float32, buffer=nl.sbuf)
    stats[:, 0:6] = nisa.bn_stats(nl.load(x), dtype=nl.float32)
    stats[:, 6:12] = nisa.bn_stats(nl.load(y), dtype=nl.float32)
    nl.store(out[:, 0:12], value=stats)
    nl.store(out[:, 12:14], value=nisa.bn_aggr(stats))
    nl.store(out[:, 14:16], value=nisa.bn_aggr(stats[:, 0:6]))
    return out


def parity_stats(a):
    out = []
    for half in (a[:, 0::2], a[:, 1::2]):
        n = half.shape[1]
        mean = half.mean(1) if n else np.zeros(len(a))
        out += [np.full(len(a), n), mean, ((half - mean[:, None]) ** 2).sum(1) if n else mean * 0]
    return np.stack(out, axis=1)


@pytest.mark.parametrize(("fx", "fy"), [(1, 1), (37, 512), (300, 2)])
def test_bn_stats_and_bn_aggr(rng, fx, fy):
    x = (rng.standard_normal((20, fx)) * 2 + 3).astype(np.float32)
    y = (rng.standard_normal((20, fy)) - 1).astype(np.float32)
    out = tn.simulate_kernel(batch_norm_stats, x, y)
    a, b = x.astype(np.float64), y.astype(np.float64)
    np.testing.assert_allclose(out[:, 0:6], parity_stats(a), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(out[:, 6:12], parity_stats(b), rtol=1e-5, atol=1e-4)
    both = np.concatenate([a, b], axis=1)
    np.testing.assert_allclose(out[:, 12], both.mean(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[:, 13], both.var(1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out[:, 14], a.mean(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[:, 15], a.var(1), rtol=1e-4, atol=1e-5)


def test_bn_stats_propagates_nan():
    x = np.ones((3, 8), np.float32)
    x[1, 3] = np.nan
    out = tn.simulate_kernel(batch_norm_stats, x, x)
    assert np.isnan(out[1, 4:6]).all() and np.isfinite(out[1, 0:3]).all()  # the odd half only
    assert np.isnan(out[1, 12:16]).all() and np.isfinite(np.delete(out, 1, axis=0)).all()


@tn.jit
def bn_stats_too_wide(x):
    nisa.bn_stats(nl.load(x))
    return None


@tn.jit
def bn_aggr_not_groups(x):
    nisa.bn_aggr(nl.load(x))
    return None


def test_bn_stats_errors():
    with pytest.raises(tn.NkiError, match="bn_stats_max_free_elements") as error:
        tn.simulate_kernel(bn_stats_too_wide, np.ones((4, 513), np.float32))
    assert_names_line(error.value, "bn_stats")
    with pytest.raises(tn.NkiError, match="multiple of 3") as error:
        tn.simulate_kernel(bn_aggr_not_groups, np.ones((4, 7), np.float32))
    assert_names_line(error.value, "bn_aggr")
