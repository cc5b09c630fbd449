"""runtime/ptxcheck.py: reading what ptxas reports (the compiles themselves are exercised by
every kernel's PTX test)."""

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
