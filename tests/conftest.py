"""Decides where the suite runs: real kernels on a GPU, or Numba's CUDA simulator without one.

The choice has to be made before numba.cuda is first imported (importing numba_flash does not
import Numba, see its __init__).
"""

import pathlib
import sys

from numba_flash._env import use_simulator_without_gpu

SIMULATOR = use_simulator_without_gpu()

# The simulator runs every CUDA thread as a Python thread; a short switch interval makes its
# barriers several times faster.
sys.setswitchinterval(5e-4)

sys.path.insert(0, str(pathlib.Path(__file__).parent))


def pytest_report_header(config):
    return "numba_flash: " + ("CUDA simulator (no GPU found)" if SIMULATOR else "real GPU kernels")
