"""The package surface: __all__, version from one source, thread count, stubs of _core."""

import ast
import inspect
import pathlib
import re
import shutil
import subprocess
import sys
import threading
import types

import pytest
from attention_reference import random_qkv

import tilelab
from tilelab import _core


def test_all_lists_the_public_api():
    assert set(tilelab.__all__) == {
        "BlockSparseLayout",
        "blocksparse_attention",
        "blocksparse_attention_kernels",
        "flash_attention",
        "flash_attention_backward",
        "flash_attention_implementation",
        "flash_attention_kernel",
        "num_threads",
        "paged_attention",
        "prefers_bf16_dot_products",
        "reshape_and_cache_flash",
        "set_num_threads",
        "__version__",
    }
    for name in tilelab.__all__:
        assert hasattr(tilelab, name)
    for name in tilelab.__all__:
        if callable(getattr(tilelab, name)):
            assert getattr(tilelab, name).__doc__, f"{name} has no docstring"


def test_version_matches_the_cpp_library():
    assert re.fullmatch(r"\d+\.\d+\.\d+", tilelab.__version__)
    assert tilelab.__version__ == _core.version()


def test_set_num_threads(restore_num_threads):
    for n in (1, 2, 3):
        tilelab.set_num_threads(n)
        assert tilelab.num_threads() == n


@pytest.mark.parametrize("n", [0, -1])
def test_set_num_threads_rejects_non_positive(restore_num_threads, n):
    with pytest.raises(ValueError, match=r"\bn\b"):
        tilelab.set_num_threads(n)


def test_results_do_not_depend_on_thread_count(rng, restore_num_threads):
    q, k, v = random_qkv(rng, 2, 4, 2, 33, 47, 32, "float32")
    results = []
    for n in (1, 2):
        tilelab.set_num_threads(n)
        results.append(tilelab.flash_attention(q, k, v, causal=True))
    # Each (batch, head, row) is computed by one thread in one order, so results are bitwise equal.
    assert (results[0] == results[1]).all()


def _signature_of(node):
    args = node.args
    return ([a.arg for a in args.posonlyargs + args.args], [a.arg for a in args.kwonlyargs])


def _methods(class_node):
    """The methods of a stubbed class, without properties and dunder methods."""
    for node in class_node.body:
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("__"):
            continue
        decorators = {ast.unparse(d) for d in node.decorator_list}
        if "property" not in decorators and not any(d.endswith(".setter") for d in decorators):
            yield node


def stub_signatures():
    """{name: signature} of _core.pyi's functions; a submodule `sub` is stubbed as a namespace
    class with static methods plus `sub: _Class`, and appears as {"sub.function": signature};
    a bound class's methods appear as {"Class.method": signature}."""
    stub = pathlib.Path(tilelab.__file__).with_name("_core.pyi")
    tree = ast.parse(stub.read_text())
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    namespaces = {
        node.annotation.id
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.annotation, ast.Name)
    }
    signatures = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            signatures[node.name] = _signature_of(node)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.annotation, ast.Name):
            for method in _methods(classes[node.annotation.id]):
                signatures[f"{node.target.id}.{method.name}"] = _signature_of(method)
        elif isinstance(node, ast.ClassDef) and node.name not in namespaces:
            for method in _methods(node):
                signatures[f"{node.name}.{method.name}"] = _signature_of(method)
    return signatures


def compiled_functions():
    """{name: function} of the compiled module, submodule functions as "sub.function"."""
    functions = {}
    for name in dir(_core):
        if name.startswith("__"):
            continue
        value = getattr(_core, name)
        if isinstance(value, types.ModuleType):
            for inner in dir(value):
                if not inner.startswith("__"):
                    functions[f"{name}.{inner}"] = getattr(value, inner)
        elif isinstance(value, type):
            for inner, member in vars(value).items():
                if not inner.startswith("_") and not isinstance(member, property):
                    functions[f"{name}.{inner}"] = getattr(value, inner)
        else:
            functions[name] = value
    return functions


def core_signature(function):
    """Parameter names from pybind11's docstring signature line."""
    line = function.__doc__.splitlines()[0]
    inside = line[line.index("(") + 1 : line.rindex(")")]
    # Split at top-level commas only: annotations like tuple[str, object] contain commas.
    parts, depth, current = [], 0, ""
    for char in inside:
        if char in "[(":
            depth += 1
        elif char in "])":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    positional, keyword_only, seen_star = [], [], False
    for part in (p.strip() for p in parts if p.strip()):
        if part == "*":
            seen_star = True
            continue
        name = part.split(":")[0].split("=")[0].strip()
        (keyword_only if seen_star else positional).append(name)
    return positional, keyword_only


def test_stubs_match_the_compiled_module():
    stubs = stub_signatures()
    functions = compiled_functions()
    assert set(stubs) == set(functions)
    for name, signature in stubs.items():
        assert core_signature(functions[name]) == signature, name


def generated_stub_signatures(out_dir):
    """{name: signature} of the stubs pybind11-stubgen writes for tilelab._core (a package:
    __init__.pyi plus one file per submodule), in stub_signatures()'s naming."""
    subprocess.run(
        [sys.executable, "-m", "pybind11_stubgen", "tilelab._core", "-o", str(out_dir)],
        check=True,
        capture_output=True,
    )
    package = out_dir / "tilelab" / "_core"
    signatures = {}
    for path in sorted(package.glob("*.pyi")):
        prefix = "" if path.stem == "__init__" else f"{path.stem}."
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef):
                signatures[prefix + node.name] = _signature_of(node)
            elif isinstance(node, ast.ClassDef):
                for method in _methods(node):
                    signatures[f"{prefix}{node.name}.{method.name}"] = _signature_of(method)
    return signatures


def test_stubs_match_the_stub_generator(tmp_path):
    # The hand-kept _core.pyi has sharper types (np.ndarray, not typing.Any) than the generator
    # gives; the generator checks that its functions and parameters are the module's.
    if shutil.which("pybind11-stubgen", path=str(pathlib.Path(sys.executable).parent)) is None:
        pytest.skip("pybind11-stubgen is not installed")
    assert generated_stub_signatures(tmp_path) == stub_signatures()


@pytest.mark.parametrize(
    "name", ["flash_attention", "flash_attention_implementation", "flash_attention_kernel"]
)
def test_facade_signatures_match_the_compiled_module(name):
    parameters = inspect.signature(getattr(tilelab, name)).parameters.values()
    positional = [p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD]
    keyword_only = [p.name for p in parameters if p.kind is p.KEYWORD_ONLY]
    assert (positional, keyword_only) == stub_signatures()[name]


def test_thread_count_is_process_wide(restore_num_threads):
    tilelab.set_num_threads(1)
    seen = []
    worker = threading.Thread(target=lambda: seen.append(tilelab.num_threads()))
    worker.start()
    worker.join()
    assert seen == [1]


@pytest.mark.parametrize(("kind", "exception"), [("value", ValueError), ("type", TypeError),
                                                 ("internal", RuntimeError)])
def test_errors_map_to_python_exceptions_by_kind(kind, exception):
    # Internal invariant failures are tilelab's bugs: RuntimeError, never a ValueError the
    # caller would look for in their arguments.
    with pytest.raises(exception) as raised:
        _core._raise_error(kind)
    assert type(raised.value) is exception
    if kind == "internal":
        assert "internal error" in str(raised.value)
