"""numba_flash/__init__.py: the import is quick and loads neither Numba nor a GPU library, and
the public names resolve lazily to the API's."""

import json
import subprocess
import sys

import numba_flash as nf
from numba_flash import api

IMPORT = """
import json, sys, time
start = time.perf_counter()
import numba_flash
seconds = time.perf_counter() - start
print(json.dumps(dict(seconds=seconds, loaded=sorted(m for m in ("numba", "cupy", "torch", "cuda")
                                                     if m in sys.modules))))
"""


def test_import_takes_under_a_second_and_loads_no_gpu_library():
    run = subprocess.run([sys.executable, "-c", IMPORT], capture_output=True, text=True,
                         timeout=60, check=True)
    result = json.loads(run.stdout)
    assert result["loaded"] == [] and result["seconds"] < 1.0, result


def test_public_names_are_the_apis():
    for name in nf.__all__:
        assert getattr(nf, name) is getattr(api, name)
    assert "warmup" in nf.__all__ and "warmup" in dir(nf)
