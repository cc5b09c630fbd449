"""runtime/device.py: the device calls are planned for, in a process where nothing has touched
CUDA yet (no driver initialised, no context) and after."""

import subprocess
import sys

import pytest

from helpers import SIMULATOR, run_without, user_traceback

PROBE = """
from numba_flash.runtime import device
first = device.current()
assert first == device.current() and first.sms > 0 and first.cc >= (5, 0), first
print(first.cc)
"""


@pytest.mark.skipif(SIMULATOR, reason="the simulator has no driver to ask")
def test_the_first_question_in_a_fresh_process_initialises_the_driver():
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr


NO_DRIVER = """
from numba_flash.runtime import device
from numba_flash.runtime.env import CudaSetupError
try:
    device.context()
except CudaSetupError as e:
    print(e)
device.current()
"""


def test_without_a_driver_the_first_question_says_how_to_use_the_simulator():
    """No driver library and no NUMBA_ENABLE_CUDASIM (on a GPU too: the driver is hidden): one
    short error, whether the context or the device is asked for first."""
    run = run_without(["cuda"], NO_DRIVER, timeout=120)
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("numba_flash.runtime.env.CudaSetupError: no CUDA driver found"), \
        run.stderr
    assert run.stdout.startswith("no CUDA driver found")
    assert "NUMBA_ENABLE_CUDASIM=1" in last and "NumPy arrays" in last
    assert "DynamicLibNotFoundError" not in run.stderr
    assert len(user_traceback(run.stderr)) <= 3, run.stderr


def test_plan_for_stands_in_for_the_current_device():
    from numba_flash.runtime import device

    a100 = device.Device(cc=(8, 0), sms=108, shared_per_block=166912)
    with device.plan_for(a100):
        assert device.current() == a100
    assert device.current() != a100
