"""Decides where the suite runs: real kernels on a GPU, or Numba's CUDA simulator without one.

The choice has to be made before numba.cuda is first imported (importing numba_flash does not
import Numba, see its __init__).

Random inputs come from the ``rng`` fixture: a fresh ``np.random.Generator`` per test, seeded
with ``NUMBA_FLASH_TEST_SEED`` when that is set (every test then gets that seed), else with a
fixed seed of the test's own (from ``BASE_SEED`` and a CRC-32 of its node id), so each test draws
its own reproducible stream. A failing test prints its seed in an "rng seed" section of its
report, as the command that reruns it with that seed::

    NUMBA_FLASH_TEST_SEED=<seed> python -m pytest 'tests/test_api.py::test_name[param]'

The quick selection, ``python -m pytest -m "not slow"``, runs every test function once: each
unparametrized test and the first case of each parametrized one. The other cases carry the
``slow`` marker, as do the tests marked so by hand: ``tests/bench/test_every_kernel.py``, which
repeats every kernel's own test, and those whose first case alone compiles for over a minute on
a fresh GPU machine (the DeepSeek-sized decodes, the 70,000-row grid, the CUDA-graph replay,
tutorial 07, the host-overhead run), which kept the selection past four minutes there. On a GPU most of the suite's time is compiling one kernel specialization per
case (each worker of a fresh machine compiles its own), so that selection is the one for a GPU
check after a change; the whole suite, plain ``python -m pytest``, is what CI runs on the
simulator and what a GPU run before a release runs.
"""

import os
import sys
import zlib

import numpy as np
import pytest

import numba_flash as nf
from numba_flash.runtime.env import use_simulator_without_gpu

SIMULATOR = use_simulator_without_gpu()

# The simulator runs every CUDA thread as a Python thread; a short switch interval makes its
# barriers several times faster.
sys.setswitchinterval(5e-4)

BASE_SEED = 20240917
SEED_ENV = "NUMBA_FLASH_TEST_SEED"


def pytest_report_header(config):
    return "numba_flash: " + ("CUDA simulator (no GPU found)" if SIMULATOR else "real GPU kernels")


def seed_of(nodeid):
    """The seed of the test ``nodeid``: ``NUMBA_FLASH_TEST_SEED`` if set, else its default."""
    if os.environ.get(SEED_ENV, "").strip():
        return int(os.environ[SEED_ENV], 0)
    return (BASE_SEED * 2**32 + zlib.crc32(nodeid.encode())) % 2**63


def pytest_collection_modifyitems(config, items):
    """Mark every case of a parametrized test but its first ``slow`` (the quick selection), and
    run the compile checks first: they are the longest tests, and started last they would hold
    the run's end on one or two workers."""
    seen = set()
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None:
            continue
        function = (item.path, item.cls, item.originalname)
        if function in seen:
            item.add_marker(pytest.mark.slow)
        seen.add(function)
    items.sort(key=lambda item: "compiles" not in item.name)  # stable: the rest keep their order


@pytest.fixture
def rng(request):
    """A fresh ``np.random.Generator`` for this test, seeded by ``seed_of``; the seed goes into
    the report of a failing test."""
    seed = seed_of(request.node.nodeid)
    request.node.user_properties.append(("rng seed", seed))
    return np.random.default_rng(seed)


@pytest.fixture(autouse=True)
def device_status_is_clean():
    """After every test: no kernel reported a bad device-side value (docs/api.md, "Errors") that
    the test did not itself read with ``nf.check_errors()``."""
    yield
    status = sys.modules.get("numba_flash.runtime.status")
    if status is not None and status._words:
        nf.check_errors()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if report.failed:
        for name, seed in item.user_properties:
            if name == "rng seed":
                report.sections.append(
                    ("rng seed", f"{SEED_ENV}={seed} python -m pytest {item.nodeid!r}"))


# Tests that see the registry's own order of forward kernels under the simulator too (the demo
# names the kernel it runs).
WARP_SPECIALIZED_TESTS = ("test_forward_wgmma_ws", "test_registry", "test_backends", "test_main")


@pytest.fixture(autouse=True)
def _cp_async_forward_under_the_simulator(request):
    """Under the simulator, the tc forward of dense and varlen batches runs the cp.async wgmma
    kernel outside the tests of the warp-specialized one (its own, and the registry's): at the
    tiny shapes of the suite the simulator spends 1.4-2.5x the time on the warp-specialized
    kernel's tiles (up to four warpgroups of emulated threads), which the suite's time cannot
    afford, and the two kernels compute the same thing. On a GPU every test runs the registry's
    choice."""
    if SIMULATOR and request.module.__name__.rpartition(".")[2] not in WARP_SPECIALIZED_TESTS:
        from numba_flash.kernels import registry

        with registry.setting_aside("tc.forward_wgmma_ws"):
            yield
    else:
        yield
