"""bench/every_kernel.py (the sanitizer stage's workload): every kernel runs and agrees with the
reference, here in its quick form (under the simulator when there is no GPU)."""


import pytest

TC = ("forward tc", "backward dq tc", "decode tc")
SIMT = ("forward simt", "forward rowwise", "naive", "decode simt")


@pytest.mark.parametrize("family", [[], ["--family", "mma"]], ids=["default", "mma"])
def test_every_kernel_runs_and_agrees(bench_module, capsys, family):
    every = bench_module("every_kernel")
    assert every.main(["--quick", *family]) == 0
    printed = capsys.readouterr().out
    for kernel in TC + (() if family else SIMT):
        assert kernel in printed, kernel
    if family:  # the simt calls do not depend on the family: the default run covers them
        assert not any(kernel in printed for kernel in SIMT), printed
