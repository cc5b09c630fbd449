"""numba_flash/__init__.py: the import is quick and loads neither Numba nor a GPU library, it
makes NumPy 2.5 usable by numba-cuda 0.30, and the public names resolve lazily to the API's."""

import json
import os
import subprocess
import sys

import pytest

import numba_flash as nf
from numba_flash import api

# NumPy comes first, outside the timing: every caller has it loaded, and numba_flash's own
# import is what is timed.
IMPORT = """
import json, sys, time
import numpy
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
    from numba_flash import precompile

    for name in nf.__all__:
        assert getattr(nf, name) is getattr(precompile if name == "warmup" else api, name)
    assert "warmup" in nf.__all__ and "warmup" in dir(nf)


# A NumPy without np.row_stack (as from 2.5 on): numba-cuda 0.30 registers an overload of it when
# its CUDA target first loads, so a real kernel compile is the check. Under NumPy < 2.5 the name
# is deleted first, which makes the child see what NumPy 2.5 looks like.
ROW_STACK = """
import numpy as np
if hasattr(np, "row_stack"):
    del np.row_stack
import numba_flash
assert np.row_stack is np.vstack
from numba import cuda, float32
from numba_flash.runtime import ptxcheck

def add_one(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += float32(1)

ptx = ptxcheck.compile_ptx(add_one, (float32[::1],), cc=(8, 0))
assert ".entry" in ptx
print("compiled")
"""


def test_numpy_without_row_stack_still_compiles_kernels():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    run = subprocess.run([sys.executable, "-c", ROW_STACK], capture_output=True, text=True,
                         timeout=300, env=env)
    assert run.returncode == 0 and run.stdout.strip() == "compiled", run.stderr[-3000:]


def test_an_existing_row_stack_is_left_alone():
    import numpy as np

    if np.lib.NumpyVersion(np.__version__) >= "2.5.0":
        pytest.skip("this NumPy has no row_stack of its own")
    assert np.row_stack is not np.vstack  # NumPy's own (deprecated) function stays
