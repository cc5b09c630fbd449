"""tools/sass.py: reading nvdisasm's listing (instructions, labels, loops, opcode mix), the
capability argument and where nvdisasm is looked for. The disassembly itself needs nvdisasm,
which CI does not have; runtime/ptxcheck.link_cubin, which makes what it reads, is tested there."""

import argparse
import importlib.util
import pathlib

import pytest

TOOL = pathlib.Path(__file__).resolve().parents[2] / "tools" / "sass.py"


@pytest.fixture(scope="module")
def sass():
    spec = importlib.util.spec_from_file_location("sass_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LISTING = """\
\t.text.kernel:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   IMAD R2, R2, 0x2, RZ ;
        /*0020*/               @P0 HGMMA.64x64x16.F32.BF16 R24, R8, gdesc[UR4], R24 ;
        /*0030*/              @!P1 BRA `(.L_x_1) ;
        /*0040*/                   BRA `(.L_x_2) ;
.L_x_2:
        /*0050*/                   EXIT ;
.L_x_3:
        /*0060*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR6], R2 ;
        /*0070*/                   BRA `(.L_x_1) ;
"""


def test_parse_keeps_every_instruction_and_label(sass):
    instructions, labels = sass.parse(LISTING)
    assert [i["family"] for i in instructions] == [
        "MOV", "IMAD", "HGMMA", "BRA", "BRA", "EXIT", "SYNCS", "BRA"]
    assert instructions[2]["op"] == "HGMMA.64x64x16.F32.BF16"  # the predicate dropped
    assert labels == {"L_x_1": 1, "L_x_2": 5, "L_x_3": 6}


def test_loops_are_backward_branches_before_the_last_exit(sass):
    instructions, labels = sass.parse(LISTING)
    # The forward branch is no loop, and the retry path after EXIT branches back without being one.
    assert sass.loops(instructions, labels) == [(1, 3)]
    assert sass.mix(instructions[1:4]) == "IMAD 1, HGMMA 1, BRA 1"


def test_capabilities(sass):
    assert sass.parse_cc("90a") == (9, 0, "a") and sass.parse_cc("80") == (8, 0)
    with pytest.raises(argparse.ArgumentTypeError):
        sass.parse_cc("sm_90")


def test_a_given_nvdisasm_comes_first(sass, tmp_path, monkeypatch):
    given = tmp_path / "nvdisasm"
    given.write_text("")
    monkeypatch.setenv("NVDISASM", str(tmp_path / "missing"))
    assert sass.find_nvdisasm(str(given)) == str(given)
    monkeypatch.setenv("NVDISASM", str(given))
    assert sass.find_nvdisasm(str(tmp_path / "also-missing")) == str(given)
