"""runtime/device.py: the device calls are planned for, in a process where nothing has touched
CUDA yet (no driver initialised, no context) and after."""

import subprocess
import sys

import pytest

from helpers import SIMULATOR

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


def test_plan_for_stands_in_for_the_current_device():
    from numba_flash.runtime import device

    a100 = device.Device(cc=(8, 0), sms=108, shared_per_block=166912)
    with device.plan_for(a100):
        assert device.current() == a100
    assert device.current() != a100
