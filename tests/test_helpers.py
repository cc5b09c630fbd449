"""tests/helpers.py: the spill rule of the compile checks."""

from helpers import spill_problem


def report(registers, spilled):
    return {"registers": registers, "spill_stores": spilled, "spill_loads": spilled}


def test_no_spill_passes_under_every_nvjitlink():
    assert spill_problem(report(255, 0), (13, 5)) is None
    assert spill_problem(report(128, 0), (12, 8)) is None


def test_any_spill_fails_under_the_nvjitlink_ci_runs():
    assert "8 bytes of spill stores" in spill_problem(report(255, 8), (13, 5))


def test_an_older_nvjitlink_may_spill_a_little_at_the_register_edge_only():
    assert spill_problem(report(255, 20), (13, 0)) is None
    assert spill_problem(report(254, 8), (13, 0)) is None
    assert "at 200 registers" in spill_problem(report(200, 8), (13, 0))
    assert "nvJitLink 13.0" in spill_problem(report(255, 64), (13, 0))
