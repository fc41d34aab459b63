"""tilelab.torch's serving attention: paged_attention and reshape_and_cache_flash on torch CPU
tensors (every dtype, fp8 caches, the score options, out=, strided views) against the fp64
reference of the numpy API's tests; scaled_dot_product_attention's score-option keywords
against the fp64 reference of tests/python/test_attention_options.py; torch.compile and
torch.library.opcheck of the ops; what is refused."""

import pytest

torch = pytest.importorskip("torch")

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from attention_reference import reference_options, reference_options_backward  # noqa: E402
from cpu_policy import rounds_bf16_probabilities  # noqa: E402
from test_paged_attention import make_batch, reference_paged, tolerance  # noqa: E402

import tilelab  # noqa: E402
import tilelab.torch as tt  # noqa: E402

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
FP8 = {
    "float8_e4m3fn": (torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn),
    "float8_e5m2": (torch.float8_e5m2, ml_dtypes.float8_e5m2),
}
NAMES = ("query", "key_cache", "value_cache", "block_table", "seq_lens", "query_start_loc")
REQUESTS = [(5, 40), (1, 17), (3, 3), (0, 9), (1, 1), (7, 61)]


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """A torch tensor with the array's values (bfloat16 and float8 through their bit patterns)."""
    for torch_dtype, numpy_dtype in (
        (torch.bfloat16, ml_dtypes.bfloat16),
        *FP8.values(),
    ):
        if array.dtype == numpy_dtype:
            bits = torch.from_numpy(array.view(np.int16 if array.itemsize == 2 else np.uint8))
            return bits.view(torch_dtype)
    return torch.from_numpy(array)


def as_numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.float().numpy() if tensor.dtype == torch.bfloat16 else tensor.numpy()


def batch_of(dtype="float32", seed=0, **shape):
    shape = dict(q_heads=4, kv_heads=2, head_dim=16, block_size=5) | shape
    return make_batch(np.random.default_rng(seed), REQUESTS, dtype=dtype, **shape)


def tensors(batch):
    return [as_tensor(batch[name]) for name in NAMES]


def numpy_arguments(batch):
    return [batch[name] for name in NAMES]


OPTIONS = {
    "none": {},
    "softcap": dict(softcap=4.0),
    "window": dict(sliding_window=(6, -1)),
    "alibi_sinks": dict(alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625], np.float32),
                        sinks=np.array([0.5, -1.0, 2.0, -np.inf], np.float32)),
    "split_scale": dict(split_kv=3, scale=0.3),
    "non_causal": dict(causal=False),
}


def torch_options(options):
    return {name: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
            for name, value in options.items()}


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
@pytest.mark.parametrize("option", OPTIONS)
def test_paged_attention_matches_the_fp64_reference(dtype, option):
    batch = batch_of(dtype)
    options = OPTIONS[option]
    out = tt.paged_attention(*tensors(batch), **torch_options(options))
    assert out.dtype == TORCH_DTYPES[dtype] and tuple(out.shape) == batch["query"].shape
    want = reference_paged(*numpy_arguments(batch),
                           **{k: v for k, v in options.items() if k != "split_kv"})
    error = np.max(np.abs(as_numpy(out).astype(np.float64) - want))
    assert error <= tolerance(dtype, batch), error
    # The same numbers as the numpy API: the op is a view of the same kernel.
    same = tilelab.paged_attention(*numpy_arguments(batch), **options)
    np.testing.assert_array_equal(as_numpy(out), np.asarray(same, np.float32))


@pytest.mark.parametrize("fp32_probabilities", [False, True])
def test_prefill_sequences_and_fp32_probabilities(fp32_probabilities):
    """bf16 sequences long enough for the generated prefill kernels: the op gives the numpy API's
    numbers for either fp32_probabilities, and the flag reaches the kernels where the call rounds
    P (cpu_policy)."""
    batch = make_batch(np.random.default_rng(5), [(40, 100), (1, 30), (20, 20)], q_heads=4,
                       kv_heads=2, head_dim=32, block_size=16, dtype="bfloat16")
    out = tt.paged_attention(*tensors(batch), fp32_probabilities=fp32_probabilities)
    same = tilelab.paged_attention(*numpy_arguments(batch), fp32_probabilities=fp32_probabilities)
    np.testing.assert_array_equal(as_numpy(out), np.asarray(same, np.float32))
    other = tilelab.paged_attention(*numpy_arguments(batch),
                                    fp32_probabilities=not fp32_probabilities)
    differ = not np.array_equal(np.asarray(other, np.float32), np.asarray(same, np.float32))
    assert differ == rounds_bf16_probabilities()


@pytest.mark.parametrize("fp8", FP8)
def test_fp8_caches_written_by_reshape_and_cache_flash(fp8):
    torch_fp8, _ = FP8[fp8]
    batch = batch_of("bfloat16", seed=1, kv_heads=1, q_heads=3)
    query, key_cache, value_cache, block_table, seq_lens, query_start_loc = tensors(batch)
    # Write every position of the bfloat16 caches into fp8 caches through the op, then attend.
    num_blocks, kv_heads, block_size, head_dim = key_cache.shape
    slots = torch.arange(num_blocks * block_size, dtype=torch.int32)
    flat = [c.permute(0, 2, 1, 3).reshape(-1, kv_heads, head_dim) for c in (key_cache, value_cache)]
    k8 = torch.zeros(key_cache.shape, dtype=torch_fp8)
    v8 = torch.zeros(value_cache.shape, dtype=torch_fp8)
    tt.reshape_and_cache_flash(*flat, k8, v8, slots, 0.5, 2.0)
    # The numpy API on the same data writes the same bytes.
    k8_numpy = np.zeros(k8.shape, FP8[fp8][1])
    v8_numpy = np.zeros(v8.shape, FP8[fp8][1])
    tilelab.reshape_and_cache_flash(*(batch[n].transpose(0, 2, 1, 3).reshape(-1, 1, head_dim)
                                      for n in ("key_cache", "value_cache")),
                                    k8_numpy, v8_numpy, slots.numpy(), 0.5, 2.0)
    np.testing.assert_array_equal(k8.view(torch.uint8).numpy(), k8_numpy.view(np.uint8))
    np.testing.assert_array_equal(v8.view(torch.uint8).numpy(), v8_numpy.view(np.uint8))

    out = tt.paged_attention(query, k8, v8, block_table, seq_lens, query_start_loc,
                             k_scale=0.5, v_scale=2.0)
    quantized = dict(batch, key_cache=k8_numpy, value_cache=v8_numpy)
    want = reference_paged(*numpy_arguments(quantized), k_scale=0.5, v_scale=2.0)
    error = np.max(np.abs(as_numpy(out).astype(np.float64) - want))
    assert error <= tolerance("bfloat16", quantized, v_scale=2.0), error


def test_out_and_strided_inputs_are_used_in_place():
    batch = batch_of()
    query, *rest = tensors(batch)
    # A query with a padded head dimension: a strided view, read in place.
    padded = torch.zeros(query.shape[0], query.shape[1], query.shape[2] + 3)
    padded[..., : query.shape[2]] = query
    strided = padded[..., : query.shape[2]]
    out = torch.full(query.shape, float("nan"))
    result = tt.paged_attention(strided, *rest, out=out)
    assert result is out
    want = tilelab.paged_attention(*numpy_arguments(batch))
    np.testing.assert_array_equal(out.numpy(), want)


def serving_step(query, key, value, key_cache, value_cache, slot_mapping, block_table, seq_lens,
                 query_start_loc):
    tt.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping)
    out = tt.paged_attention(query, key_cache, value_cache, block_table, seq_lens,
                             query_start_loc, softcap=6.0)
    return out * 2


def serving_inputs():
    batch = batch_of(kv_heads=2, q_heads=4)
    query, key_cache, value_cache, block_table, seq_lens, query_start_loc = tensors(batch)
    # The new tokens' keys and values land in the last positions of their sequences.
    generator = torch.Generator().manual_seed(3)
    num_tokens = query.shape[0]
    key = torch.randn(num_tokens, 2, 16, generator=generator)
    value = torch.randn(num_tokens, 2, 16, generator=generator)
    block_size = key_cache.shape[2]
    slots = []
    for s, (q_len, seq_len) in enumerate(REQUESTS):
        for position in range(seq_len - q_len, seq_len):
            slots.append(int(block_table[s, position // block_size]) * block_size
                         + position % block_size)
    slot_mapping = torch.tensor(slots, dtype=torch.int32)
    return [query, key, value, key_cache, value_cache, slot_mapping, block_table, seq_lens,
            query_start_loc]


def test_compiled_serving_step_matches_eager():
    eager_inputs = serving_inputs()
    compiled_inputs = [t.clone() for t in eager_inputs]
    want = serving_step(*eager_inputs)
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(str(graph_module.graph))
        return graph_module.forward

    got = torch.compile(serving_step, fullgraph=True, backend=backend)(*compiled_inputs)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # The caches were mutated in the compiled run exactly as in the eager one.
    for compiled_cache, eager_cache in zip(compiled_inputs[3:5], eager_inputs[3:5], strict=True):
        torch.testing.assert_close(compiled_cache, eager_cache, rtol=0, atol=0)
    assert "tilelab.paged_attention" in graphs[0] and "tilelab.reshape_and_cache_flash" in graphs[0]


# Inductor itself touches torch.jit.script_method while compiling (torch's own deprecation).
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_compiled_with_inductor():
    inputs = serving_inputs()
    want = serving_step(*[t.clone() for t in inputs])
    got = torch.compile(serving_step, fullgraph=True)(*inputs)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_opcheck():
    query, key, value, key_cache, value_cache, slot_mapping, block_table, seq_lens, starts = (
        serving_inputs())
    torch.library.opcheck(
        torch.ops.tilelab.reshape_and_cache_flash.default,
        (key, value, key_cache, value_cache, slot_mapping, 1.0, 1.0),
    )
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    torch.library.opcheck(
        torch.ops.tilelab.paged_attention.default,
        (torch.empty(query.shape), query, key_cache, value_cache, block_table, seq_lens, starts,
         None, True, 7, -1, 3.0, None, sinks, 1.0, 1.0, 2, False),
    )


def test_refusals_name_the_argument():
    arguments = tensors(batch_of())
    query = arguments[0].clone().requires_grad_()
    with pytest.raises(ValueError, match=r"^query: tilelab.torch.paged_attention has no backward"):
        tt.paged_attention(query, *arguments[1:])
    with torch.no_grad():
        tt.paged_attention(query, *arguments[1:])  # fine without autograd
    with pytest.raises(TypeError, match=r"^key_cache: expected dtype .*, got torch.float64"):
        tt.paged_attention(arguments[0], arguments[1].double(), *arguments[2:])
    with pytest.raises(TypeError, match=r"^block_table: expected a torch.Tensor, got list"):
        tt.paged_attention(*arguments[:3], arguments[3].tolist(), *arguments[4:])
    with pytest.raises(TypeError, match=r"^split_kv: expected 'auto' or an int >= 1, got 'all'"):
        tt.paged_attention(*arguments, split_kv="all")
    with pytest.raises(TypeError, match=r"^sliding_window: expected None or a pair of ints"):
        tt.paged_attention(*arguments, sliding_window=(1.5, 2))
    # The kernel's own checks come through with their names: a block index out of range.
    table = arguments[3].clone()
    table[0, 0] = 10_000
    with pytest.raises(ValueError, match=r"block_table"):
        tt.paged_attention(*arguments[:3], table, *arguments[4:])
    with pytest.raises(TypeError, match=r"^out: expected dtype"):
        tt.paged_attention(*arguments, out=torch.empty(arguments[0].shape, dtype=torch.float16))


# --- scaled_dot_product_attention's score options ------------------------------------------------


def dense_inputs(dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, 9, 16, generator=generator).to(dtype)
    k = torch.randn(2, 2, 23, 16, generator=generator).to(dtype)
    v = torch.randn(2, 2, 23, 16, generator=generator).to(dtype)
    return q, k, v


DENSE_OPTIONS = {
    "softcap": dict(softcap=3.0),
    "window": dict(sliding_window=(4, 2)),
    "alibi": dict(alibi_slopes=torch.tensor([0.5, 0.25, 0.125, 0.0625])),
    "sinks": dict(sinks=torch.tensor([0.5, -1.0, 2.0, -float("inf")])),
    "all": dict(softcap=5.0, sliding_window=(6, -1), sinks=torch.tensor([1.0, 0.0, -2.0, 3.0]),
                alibi_slopes=torch.tensor([0.1, 0.2, 0.3, 0.4])),
}


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
@pytest.mark.parametrize("option", DENSE_OPTIONS)
@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
def test_sdpa_score_options_match_the_fp64_reference(dtype, option, alignment):
    q, k, v = dense_inputs(TORCH_DTYPES[dtype])
    options = DENSE_OPTIONS[option]
    out = tt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                          causal_alignment=alignment, **options)
    reference_arguments = {name: value.numpy() if torch.is_tensor(value) else value
                           for name, value in options.items()}
    want, _ = reference_options(*(as_numpy(t) for t in (q, k, v)), causal=True,
                                causal_alignment=alignment, **reference_arguments)
    rounding = {"float32": 1e-5, "float16": 4e-3, "bfloat16": 3e-2}[dtype]
    np.testing.assert_allclose(as_numpy(out), want, rtol=0, atol=rounding)


def test_sdpa_score_options_compile_and_gradients():
    q, k, v = dense_inputs(torch.float32)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    eager = tt.scaled_dot_product_attention(q, k, v, enable_gqa=True, softcap=2.0, sinks=sinks)
    compiled = torch.compile(
        lambda q, k, v: tt.scaled_dot_product_attention(q, k, v, enable_gqa=True, softcap=2.0,
                                                        sinks=sinks),
        fullgraph=True,
    )(q, k, v)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    # Gradients of q, k, v and the sinks through every option, against the fp64 reference.
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    options = dict(softcap=2.0, sliding_window=(4, 2), alibi_slopes=slopes)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    out = tt.scaled_dot_product_attention(*leaves[:3], is_causal=True, enable_gqa=True,
                                          sinks=leaves[3], **options)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    (out * grad_out).sum().backward()
    expected = reference_options_backward(grad_out.numpy(), q.numpy(), k.numpy(), v.numpy(),
                                          causal=True, sinks=sinks.numpy(),
                                          **dict(options, alibi_slopes=slopes.numpy()))
    for leaf, want in zip(leaves, expected, strict=True):
        np.testing.assert_allclose(leaf.grad.numpy(), want, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=r"^alibi_slopes: expected a tensor that does not "
                                         r"require grad"):
        tt.scaled_dot_product_attention(q, k, v, enable_gqa=True,
                                        alibi_slopes=slopes.clone().requires_grad_())
    with pytest.raises(TypeError, match=r"^sinks: expected a torch.Tensor, got list"):
        tt.scaled_dot_product_attention(q.detach(), k, v, enable_gqa=True, sinks=[0.0] * 4)
    # tilelab's own refusal: options do not combine with a bias.
    with pytest.raises(ValueError, match="bias"):
        tt.scaled_dot_product_attention(q.detach(), k, v, attn_mask=torch.zeros(9, 23),
                                        enable_gqa=True, softcap=2.0)
