"""tools/racecheck_pairs.py: reading racecheck's report (the pairs, their kernel's ABI tag,
offsets and counts), choosing the listing the offsets belong to and placing a pair among the
barriers of a listing. The disassembly itself needs nvdisasm, which CI does not have."""

import importlib.util
import pathlib

import pytest

TOOLS = pathlib.Path(__file__).resolve().parents[2] / "tools"

KERNEL = ("numba_flash::kernels::tc::mla_decode_seesaw::make_mla_decode_kernel::_3clocals_3e::"
          "mla_decode_seesaw[abi:v265,cw51cXTLSUwv1sDUaKthqaNg_3d_3d](Array<unsigned short, "
          "(int)4, A, mutable, aligned>, int, float)")
REPORT = f"""\
decode simt d=192 page=64 s_q=2 h_q=8 max error 1.95e-03
========= Error: Race reported between Read access at {KERNEL}+0x6c20
=========     and Write access at {KERNEL}+0xb2d0 [128 hazards]
========= 
========= Error: Race reported between Write access at {KERNEL}+0x70f0
=========     and Read access at {KERNEL}+0x15110 [16 hazards]
=========     and Read access at {KERNEL}+0x109c0 [16 hazards]
========= 
========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)
"""


def load(name):
    spec = importlib.util.spec_from_file_location(name + "_tool", TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pairs_tool():
    return load("racecheck_pairs")


def test_hazard_pairs_reads_every_pair_with_its_kernel_offsets_and_count(pairs_tool):
    tag = "v265,cw51cXTLSUwv1sDUaKthqaNg_3d_3d"
    assert pairs_tool.hazard_pairs(REPORT) == [
        (tag, ("Read", 0x6c20), ("Write", 0xb2d0), 128),
        (tag, ("Write", 0x70f0), ("Read", 0x15110), 16),
        (tag, ("Write", 0x70f0), ("Read", 0x109c0), 16),
    ]
    other = REPORT.replace("abi:v265", "abi:v266", 2)
    assert {t for t, *_ in pairs_tool.hazard_pairs(other)} == {tag, tag.replace("265", "266")}


LISTING = """\
        /*0000*/                   STS [R2], R4 ;
        /*0010*/                   BAR.ARV 0x1, 0x100 ;
        /*0020*/                   BAR.SYNC.DEFER_BLOCKING 0x1, 0x100 ;
        /*0030*/                   LDS R5, [R2] ;
        /*0040*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0050*/                   STS [R2], R6 ;
"""


def test_describe_places_a_pair_among_the_barriers(pairs_tool):
    instructions = load("sass").parse(LISTING)[0]
    lines = pairs_tool.describe(instructions, ("t", ("Write", 0x0), ("Read", 0x30), 4))
    assert lines[0] == "Write +0x0: STS [R2], R4"
    assert lines[1] == "Read +0x30: LDS R5, [R2]   [4 hazards]"
    assert lines[2] == ("  barriers between: +0x10 BAR.ARV 0x1, 0x100; "
                        "+0x20 BAR.SYNC.DEFER_BLOCKING 0x1, 0x100")
    assert lines[3:] == ["  first barrier after +0x0: +0x10 BAR.ARV 0x1, 0x100",
                         "  last barrier before +0x30: +0x20 BAR.SYNC.DEFER_BLOCKING 0x1, 0x100",
                         "  first barrier after +0x30: +0x40 BAR.SYNC.DEFER_BLOCKING 0x0"]
    later = pairs_tool.describe(instructions, ("t", ("Read", 0x30), ("Write", 0x50), 1))
    assert later[2] == "  barriers between: +0x40 BAR.SYNC.DEFER_BLOCKING 0x0"


def test_matching_keeps_the_listing_with_shared_accesses_at_every_offset(pairs_tool):
    parse = load("sass").parse
    ran = parse(LISTING)[0]
    other = parse(LISTING.replace("LDS R5", "FADD R5, R5").replace("STS [R2], R4", "MOV R9, R4"))[0]
    assert pairs_tool.matching([other, ran], {0x0, 0x30}) == [ran]
    assert pairs_tool.matching([other, ran], {0x30, 0x60}) == []
