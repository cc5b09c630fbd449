"""runtime/ptxcheck.py: reading what ptxas reports (the compiles themselves are exercised by
every kernel's PTX test), and the sharing of one front-end pass between capabilities."""

import pathlib
import re

import pytest

from numba_flash.runtime import ptxcheck


def test_parse_ptxas_log():
    log = ("ptxas info    : 0 bytes gmem\n"
           "ptxas info    : Compiling entry function '_Z1kPf' for 'sm_90'\n"
           "ptxas info    : Function properties for _Z1kPf\n"
           "ptxas         .     24 bytes stack frame, 16 bytes spill stores, 8 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 1 barriers, 24 bytes cumulative stack size\n"
           "info    : Function properties for '_Z1kPf':\n"
           "info    : used 255 registers, used 1 barriers, 24 stack, 3072 bytes smem, "
           "708 bytes cmem[0], 24 bytes lmem\n")
    r = ptxcheck.parse_ptxas_log(log)
    assert (r["registers"], r["spill_stores"], r["spill_loads"], r["stack"]) == (255, 16, 8, 24)
    assert (r["barriers"], r["smem"], r["lmem"]) == (1, 3072, 24)
    assert list(r["functions"]) == ["_Z1kPf"]


def test_parse_a_log_that_holds_only_the_linker_summary():
    """The CUDA 13.0 nvJitLink of the H200 image wrote this for the probe kernel (sm_80, one
    of its links): no ptxas lines, the linker's summary alone. Its local memory stands for the
    spills, so a kernel that spills still fails the spill checks."""
    name = "_ZN22_ptxcheck__ptx_kernels12fragment_mma12_3clocals_3e6kernelB2v1E"
    log = ("info    : 8 bytes gmem\n"
           f"info    : Function properties for '{name}':\n"
           "info    : used 22 registers, used 0 barriers, 0 stack, 0 bytes smem, "
           "640 bytes cmem[0], 0 bytes lmem\n")
    r = ptxcheck.parse_ptxas_log(log)
    assert (r["registers"], r["spill_stores"], r["spill_loads"], r["stack"]) == (22, 0, 0, 0)
    assert (r["barriers"], r["smem"], r["lmem"]) == (0, 0, 0)
    assert list(r["functions"]) == [name]
    spilled = ptxcheck.parse_ptxas_log(log.replace("0 stack", "48 stack")
                                       .replace("0 bytes lmem", "48 bytes lmem"))
    assert (spilled["spill_stores"], spilled["spill_loads"], spilled["stack"]) == (48, 48, 48)


def test_parse_rejects_a_log_without_functions():
    with pytest.raises(ValueError, match="no function properties"):
        ptxcheck.parse_ptxas_log("info    : 8 bytes gmem\n")


def unmangled(ptx):
    return re.sub(r"_ZN\w+", "KERNEL", ptx)


def test_one_front_end_gives_each_capability_its_own_ptx():
    """The jobs of one kernel for sm_80 and sm_90 share a front-end pass in one child: their PTX
    equals that of compiles run alone, each in its own child, but for the kernel's mangled name
    (Numba hashes the closure into it per process)."""
    target = str(pathlib.Path(__file__).parents[1] / "kernels" / "ptx" / "_ptx_kernels.py")
    jobs = [(target + ":probe", cc, ("fragment_mma", "bfloat16")) for cc in ((8, 0), (9, 0))]
    shared = ptxcheck.compile_reports_isolated(jobs)
    alone = [ptxcheck.compile_reports_isolated([job])[0] for job in jobs]
    for (ptx, report), (ptx_alone, report_alone), cc in zip(shared, alone, ("80", "90")):
        assert f".target sm_{cc}" in ptx
        assert unmangled(ptx) == unmangled(ptx_alone)
        assert report["registers"] == report_alone["registers"]
    assert shared[0][0] != shared[1][0]


def test_link_cubin_gives_the_machine_code_of_the_reported_assembly():
    """The cubin that tools/sass.py disassembles: an ELF image for the capability asked for,
    assembled from the same PTX as the register report."""
    target = str(pathlib.Path(__file__).parents[1] / "kernels" / "ptx" / "_ptx_kernels.py")
    ptx, report = ptxcheck.compile_reports_isolated([(target + ":probe", (9, 0),
                                                     ("fragment_mma", "float16"))])[0]
    cubin = ptxcheck.link_cubin(ptx, cc=(9, 0))
    assert cubin[:4] == b"\x7fELF" and len(cubin) > 1000
    assert report["registers"] > 0
