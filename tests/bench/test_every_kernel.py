"""bench/every_kernel.py (the sanitizer stage's workload): every kernel runs and agrees with the
reference, here in its quick form (on a GPU); ``--help`` prints help instead, and a GPU without
CuPy is refused with a message (both under the simulator too)."""

import sys

import pytest

from helpers import SIMULATOR

TC = ("forward tc", "backward dq tc", "decode tc")
SIMT = ("forward simt", "forward rowwise", "naive", "decode simt")


# A run of every kernel once more, for the sanitize stage's workload: on a GPU only. Under the
# simulator it repeats what each kernel's own tests run (2 minutes of the CI suite for the default
# family, 2.5 more for mma). Both cases are slow: each compiles every kernel (3 minutes of one
# worker on the H200, the quick selection's longest test).
@pytest.mark.skipif(SIMULATOR, reason="each kernel's own tests run it under the simulator")
@pytest.mark.parametrize("family", [
    pytest.param([], id="default", marks=pytest.mark.slow),
    pytest.param(["--family", "mma"], id="mma"),
])
def test_every_kernel_runs_and_agrees(bench_module, capsys, family):
    every = bench_module("every_kernel")
    assert every.main(["--quick", *family]) == 0
    printed = capsys.readouterr().out
    for kernel in TC + (() if family else SIMT):
        assert kernel in printed, kernel
    if family:  # the simt calls do not depend on the family: the default run covers them
        assert not any(kernel in printed for kernel in SIMT), printed


def test_help_prints_the_flags_and_runs_nothing(bench_module, capsys):
    every = bench_module("every_kernel")
    with pytest.raises(SystemExit) as exc:
        every.main(["--help"])
    assert exc.value.code == 0
    printed = capsys.readouterr().out
    for flag in ("--quick", "--family {default,mma}", "--no-seesaw"):
        assert flag in printed, flag
    assert "max error" not in printed


def test_gpu_without_cupy_says_what_to_install(bench_module, monkeypatch):
    every = bench_module("every_kernel")
    monkeypatch.setattr(every, "use_simulator_without_gpu", lambda: False)
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    with pytest.raises(SystemExit, match="CuPy is not installed.*cupy13"):
        every.main(["--quick"])
