"""numba_flash/__main__.py, the demo: it runs, checks its result and says which kernel ran; under
the simulator, that the simulator plays an sm_90 device, which is why auto picks the wgmma
forward."""

from numba_flash import __main__ as demo
from numba_flash.runtime import device
from helpers import SIMULATOR


def test_kernel_line_names_the_device_the_simulator_plays():
    line = demo.kernel_line("auto", "float16")
    if SIMULATOR:
        assert device.SIMULATED.cc == (9, 0)
        assert line.startswith("backend auto -> tc (kernel flash_fwd_wgmma_ws)\n")
        assert "simulator stands in for an sm_90 device" in line and "Hopper wgmma" in line
    else:
        assert "simulator" not in line
    assert "simulator" not in demo.kernel_line("simt", "float16")


def test_demo_runs_and_agrees(capsys):
    assert demo.main(["--backend", "simt", "--dtype", "float32"]) == 0
    printed = capsys.readouterr().out
    assert "backend simt -> simt (kernel flash_fwd_simt)" in printed and printed.endswith("OK\n")
