"""python -m tilelab.nki profile FILE.py:KERNEL [--grid 1,8] --arg lhsT=bf16[8192,4096] ...

Traces an NKI kernel from a file (written with ``neuronxcc`` or ``tilelab.nki`` imports), times
it on a simulated NeuronCore with shape-only arguments, prints the report and optionally writes
it as HTML, a Perfetto trace or JSON.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import re
import sys

from . import TensorSpec, install_neuronxcc_alias, profile_kernel

_DTYPES = {
    "fp32": "float32",
    "float32": "float32",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "int32": "int32",
    "uint8": "uint8",
}


def _argument(text: str) -> tuple[str, object]:
    """NAME=DTYPE[d0,d1,...] (a tensor known by shape) or NAME=LITERAL (a Python value)."""
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise ValueError(f"--arg {text!r}: expected NAME=DTYPE[SHAPE] or NAME=VALUE")
    match = re.fullmatch(r"(\w+)\[([\d,\s]+)\]", value.strip())
    if match:
        dtype = _DTYPES.get(match.group(1))
        if dtype is None:
            raise ValueError(
                f"--arg {name}: unknown dtype {match.group(1)!r}; allowed: {', '.join(_DTYPES)}"
            )
        import ml_dtypes
        import numpy as np

        resolved = getattr(np, dtype, None) or getattr(ml_dtypes, dtype)
        shape = [int(s) for s in match.group(2).split(",") if s.strip()]
        return name, TensorSpec(shape, resolved)
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        raise ValueError(
            f"--arg {name}: {value!r} is neither DTYPE[SHAPE] (e.g. bf16[128,512]) nor a Python "
            "literal"
        ) from None


def _load_kernel(target: str):
    path, sep, name = target.rpartition(":")
    if not sep or not path or not name:
        raise ValueError(f"kernel: expected FILE.py:KERNEL, got {target!r}")
    if not os.path.isfile(path):
        raise ValueError(f"kernel: no file {path!r}")
    install_neuronxcc_alias()
    spec = importlib.util.spec_from_file_location("_tilelab_nki_profiled", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec.loader.exec_module(module)
    kernel = getattr(module, name, None)
    if kernel is None:
        raise ValueError(f"kernel: {path} defines no {name!r}")
    return kernel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tilelab.nki", description=__doc__.split("\n\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    profile = commands.add_parser("profile", help="time a kernel on a simulated NeuronCore")
    profile.add_argument("kernel", help="FILE.py:KERNEL")
    profile.add_argument("--grid", default="1", help="SPMD launch grid, e.g. 1,8 (default 1)")
    profile.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="NAME=DTYPE[SHAPE]|NAME=VALUE",
        help="a kernel argument: a tensor by dtype and shape, or a Python literal",
    )
    profile.add_argument("--machine", default="trn1", help="trn1, trn2 or a machine JSON file")
    profile.add_argument("--html", help="write the HTML report here")
    profile.add_argument("--trace", help="write a Chrome/Perfetto trace here")
    profile.add_argument("--json", help="write the JSON report here")
    options = parser.parse_args(argv)
    try:
        kernel = _load_kernel(options.kernel)
        grid = tuple(int(g) for g in options.grid.split(","))
        arguments = dict(_argument(a) for a in options.arg)
        _, report = profile_kernel(
            kernel[grid], machine=options.machine, functional=False, **arguments
        )
    except (ValueError, TypeError, NotImplementedError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(report)
    if options.html:
        report.save_html(options.html)
    if options.trace:
        report.save_trace(options.trace)
    if options.json:
        report.save_json(options.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
