"""Decides where the suite runs: real kernels on a GPU, or Numba's CUDA simulator without one.

The choice has to be made before numba.cuda is imported, so _env.py is loaded by path (importing
the numba_flash package would import Numba first).
"""

import importlib.util
import pathlib
import sys

_spec = importlib.util.spec_from_file_location(
    "_numba_flash_env", pathlib.Path(__file__).parents[1] / "numba_flash" / "_env.py")
_env = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_env)
SIMULATOR = _env.use_simulator_without_gpu()

# The simulator runs every CUDA thread as a Python thread; a short switch interval makes its
# barriers several times faster.
sys.setswitchinterval(5e-4)

sys.path.insert(0, str(pathlib.Path(__file__).parent))


def pytest_report_header(config):
    return "numba_flash: " + ("CUDA simulator (no GPU found)" if SIMULATOR else "real GPU kernels")
