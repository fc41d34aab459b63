"""The tilelab.torch tests run only where torch is installed (the .venv-torch of scripts/test.sh).

Without torch, `import torch` would find this folder itself as a namespace package (tests/python
is on sys.path), so pytest.importorskip("torch") alone would not skip: the folder is left out
of collection here instead, before any test module imports torch.
"""

import importlib.util

_torch = importlib.util.find_spec("torch")
if _torch is None or _torch.origin is None:  # absent, or only this folder (a namespace package)
    collect_ignore_glob = ["test_*.py"]
