"""runtime/env.py: the error that says which CUDA library is missing and what to do about it,
from the error cuda-pathfinder raises (its messages as numba-cuda and the bindings pass them on)."""

import pytest
from cuda.pathfinder import DynamicLibNotFoundError

from numba_flash.runtime.env import CudaSetupError, setup_error

DRIVER = ('"cuda" is an NVIDIA driver library and can only be found via system search. Ensure '
          'the NVIDIA display driver is installed.')


def test_a_missing_driver_says_how_to_run_on_the_simulator():
    error = setup_error(DynamicLibNotFoundError(DRIVER))
    assert isinstance(error, CudaSetupError) and isinstance(error, RuntimeError)
    message = str(error)
    assert message.startswith("no CUDA driver found")
    assert "NUMBA_ENABLE_CUDASIM=1" in message and "NumPy arrays" in message
    assert "numba_flash[cu13]" not in message


@pytest.mark.parametrize("found, library", [
    ('Failure finding "libnvvm.so.4 or libnvvm.so": \n', "libnvvm.so.4 or libnvvm.so"),
    ('Failure finding "libnvrtc.so.13 or libnvrtc.so.12": \n', "libnvrtc.so.13 or libnvrtc.so.12"),
    ('Failure finding "libcudart.so.13 or libcudart.so.12": \n', "libcudart.so.13"),
    # numba-cuda's own search for NVVM, which retries from NVRTC's directory
    ('nvrtc found via site-packages, cannot infer CUDA_HOME; original nvvm error: Failure '
     'finding "libnvvm.so.4 or libnvvm.so": \n', "libnvvm.so.4"),
])
def test_a_missing_toolkit_library_names_it_and_the_extras(found, library):
    message = str(setup_error(DynamicLibNotFoundError(found)))
    assert message.startswith("the CUDA toolkit library") and library in message
    assert 'pip install "numba_flash[cu13]"' in message and '"numba_flash[cu12]"' in message
    assert "NUMBA_ENABLE_CUDASIM" not in message
