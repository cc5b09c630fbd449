"""Fixtures for the bench tests: the bench scripts are loaded by path (bench/ is not a package),
and the Triton kernels run on the GPU when there is one, else in Triton's interpreter on the CPU.

Torch, Triton and matplotlib are not dependencies of the test suite: tests that need them skip,
saying which is missing.
"""

import importlib
import os
import pathlib
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"

sys.path.insert(0, str(pathlib.Path(__file__).parent))  # triton_cases, for the Triton tests


def _load(name):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)


@pytest.fixture
def bench_module():
    """``bench_module("common")`` -> bench/common.py, imported as the scripts import it."""
    return _load


@pytest.fixture
def torch_device():
    """(torch, device): "cuda" with a GPU, else "cpu" with Triton in interpreter mode."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if torch.cuda.is_available():
        return torch, "cuda"
    os.environ["TRITON_INTERPRET"] = "1"  # read when a kernel module is first imported
    return torch, "cpu"


@pytest.fixture
def triton_kernels(torch_device):
    """``triton_kernels("flash_fwd")`` -> bench/triton_kernels/flash_fwd.py, or a skip without Triton."""
    torch, device = torch_device
    triton = pytest.importorskip("triton", reason="triton is not installed")
    if not hasattr(triton, "jit"):  # only bench/triton_kernels/ (a namespace folder) was found
        pytest.skip("triton is not installed")
    if device == "cpu":
        import numpy

        if tuple(int(x) for x in numpy.__version__.split(".")[:2]) >= (2, 4):
            pytest.skip("Triton's interpreter needs numpy < 2.4 (scalar arguments are 1-element "
                        "arrays there)")
    return lambda name: _load("common").triton_module(name)
