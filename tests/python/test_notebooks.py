"""Every notebook in notebooks/ runs headless top to bottom (nbclient) and is committed without
outputs."""

import os
import pathlib
import time

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

NOTEBOOKS = sorted((pathlib.Path(__file__).parents[2] / "notebooks").glob("*.ipynb"))
TIME_LIMIT_SECONDS = 120


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 5


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name}: strip outputs"
            assert cell.execution_count is None, f"{path.name}: strip execution counts"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, monkeypatch, tmp_path):
    # The kernel inherits this environment: a non-interactive backend (inline: figures become
    # PNG outputs, nothing opens a window), and this tilelab.
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    import tilelab

    package_root = str(pathlib.Path(tilelab.__file__).parents[1])
    python_path = os.pathsep.join([package_root, os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", python_path)
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=TIME_LIMIT_SECONDS, kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError naming the failing cell
    elapsed = time.perf_counter() - start
    print(f"{path.name}: {elapsed:.1f} s")
    assert elapsed < TIME_LIMIT_SECONDS
    images = sum(
        1 for cell in notebook.cells if cell.cell_type == "code"
        for output in cell.get("outputs", []) if "image/png" in output.get("data", {})
    )
    assert images >= 1, f"{path.name} drew no plot"
