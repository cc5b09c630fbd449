"""bench/every_kernel.py (the sanitizer stage's workload): every kernel runs and agrees with the
reference, here in its quick form (under the simulator when there is no GPU)."""


import pytest


@pytest.mark.parametrize("family", [[], ["--family", "mma"]], ids=["default", "mma"])
def test_every_kernel_runs_and_agrees(bench_module, capsys, family):
    every = bench_module("every_kernel")
    assert every.main(["--quick", *family]) == 0
    printed = capsys.readouterr().out
    for kernel in ("forward simt", "forward rowwise", "forward tc", "backward dq tc", "naive",
                   "decode simt", "decode tc"):
        assert kernel in printed, kernel
