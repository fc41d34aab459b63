"""Loads the NKI-language kernels of examples/nki/ for the tests (with the neuronxcc alias they
are written against)."""

import importlib.util
import pathlib
import sys

import tilelab.nki

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "nki"


def load_example(name: str):
    """examples/nki/<name>.py as a module."""
    tilelab.nki.install_neuronxcc_alias()
    spec = importlib.util.spec_from_file_location(f"nki_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
