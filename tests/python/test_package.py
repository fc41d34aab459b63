"""pip install . into a fresh venv (a full build: Halide kernels, C++ core, extension), then use
tilelab from outside the repository. Slow; scripts/test.sh runs it. Reuses pip's cache
(PIP_CACHE_DIR or ~/.cache/pip) for the build requirements. The kernels are built for the
baseline x86-64 target only: what this tests is the packaging, and the test command's own build
already compiles every target (a wheel for users has all of cmake/TilelabKernels.cmake's)."""

import pathlib
import subprocess
import sys
import textwrap
import venv

import pytest

ROOT = pathlib.Path(__file__).parents[2]

SMOKE = textwrap.dedent(
    """
    import pathlib, numpy as np, tilelab
    from tilelab import sim
    assert "site-packages" in tilelab.__file__, tilelab.__file__
    q = np.random.default_rng(0).standard_normal((1, 2, 16, 32)).astype(np.float32)
    out = tilelab.flash_attention(q, q, q, causal=True)
    assert out.shape == q.shape and np.isfinite(out).all()
    report = sim.simulate_paged_attention_batch(prefill=[(128, 2048)], num_heads=2, num_kv_heads=1)
    assert report.total_time_ns > 0
    rows = sim.sweep({"prefill": [(128, 2048)], "num_heads": 2, "num_kv_heads": 1},
                     grid={"kv_buffers": [1, 2]})
    assert [r["valid"] for r in rows] == [True, True]
    package = pathlib.Path(tilelab.__file__).parent
    print(tilelab.__version__, sorted(p.name for p in package.iterdir() if ".so" in p.name))
    """
)


@pytest.mark.slow
def test_pip_install_builds_a_working_wheel(tmp_path):
    environment = tmp_path / "venv"
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    install = subprocess.run(
        [python, "-m", "pip", "install", "--disable-pip-version-check",
         "--config-settings=cmake.define.TILELAB_HALIDE_TARGETS=x86-64-linux", str(ROOT)],
        capture_output=True, text=True, timeout=1200,
    )
    assert install.returncode == 0, install.stdout[-4000:] + install.stderr[-4000:]
    # Outside the repository, without PYTHONPATH: the installed package only.
    run = subprocess.run(
        [python, "-c", SMOKE], cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(pathlib.Path.home())},
    )
    assert run.returncode == 0, run.stderr
    version_line = run.stdout.strip().splitlines()[-1]
    cmake_lists = (ROOT / "CMakeLists.txt").read_text()
    version = cmake_lists.split("project(tilelab VERSION ", 1)[1].split()[0]
    assert version_line.startswith(version), version_line
    assert "libtilelab.so" in version_line and "_core" in version_line
    assert sys.version_info >= (3, 11)
