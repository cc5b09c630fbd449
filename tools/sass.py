"""Disassemble one kernel specialization without a GPU and count its SASS instructions.

    python tools/sass.py tc.mla_decode_seesaw '[64, 576, 512, true, "bfloat16", true, true]'
    python tools/sass.py tc.backward_wgmma:DQ '[128, true, "float16"]' --entry '[128, 64]' --out /tmp/s

The kernel is built from its spec as tools/ptx_hashes.py builds it (``runtime.ptxcheck``'s
``spec_build``, in a child process with the simulator off), assembled for ``--cc`` by nvJitLink
(``ptxcheck.link_cubin``, the same assembly the register and spill checks read) and
disassembled by ``nvdisasm``: ``--nvdisasm``, ``$NVDISASM``, the PATH, ``$CUDA_HOME/bin`` or
the copy in Triton's wheel (``triton/backends/nvidia/bin``; ``pip download triton`` and unzip
it where no CUDA toolkit brings one).

It prints the instruction count, the most frequent opcode families, every loop (a branch back
to an earlier label, of at least ``--min-loop`` instructions: its first and last instruction
and its own mix) and, with
``--landmarks``, the barriers, mbarrier waits, TMA copies and warpgroup fences with their
positions, so the instruction stream a change leaves can be read before any GPU time is spent
(docs/perf-notes.md uses it). ``--out DIR`` keeps the PTX, the cubin and the SASS.
"""

import argparse
import collections
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_LABEL = re.compile(r"^\s*\.(L_x_\d+):")
_INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]+)\*/\s+(.*?)\s*;")
_TARGET = re.compile(r"`\(\.(L_x_\d+)\)")
LANDMARKS = ("BAR", "SYNCS", "UTMALDG", "WARPGROUP", "BRA.DIV")


def parse(sass):
    """``(instructions, labels)`` of ``nvdisasm -c`` output: each instruction a dict with its
    ``text``, ``op`` (the opcode with its modifiers, the predicate dropped), ``family`` (the
    opcode alone) and ``offset`` (bytes from the function's start, what compute-sanitizer
    prints after ``+0x``); ``labels`` maps a label to the index of the instruction it marks."""
    instructions, labels = [], {}
    for line in sass.splitlines():
        m = _LABEL.match(line)
        if m:
            labels[m.group(1)] = len(instructions)
            continue
        m = _INSTRUCTION.match(line)
        if m:
            words = m.group(2).split()
            op = words[1] if words[0].startswith("@") else words[0]
            instructions.append({"text": m.group(2), "op": op, "family": op.split(".")[0],
                                 "offset": int(m.group(1), 16)})
    return instructions, labels


def loops(instructions, labels):
    """``[(first, last)]``: every branch back to an earlier (or its own) label, as the index of
    the label's instruction and of the branch. Branches past the last ``EXIT`` are left out:
    ptxas puts the slow paths of waits there (an mbarrier try-wait that failed), and they
    branch back into the body without being loops of the kernel."""
    exits = [i for i, ins in enumerate(instructions) if ins["family"] == "EXIT"]
    end = exits[-1] if exits else len(instructions)
    found = []
    for i, ins in enumerate(instructions[:end]):
        if ins["family"] == "BRA":
            m = _TARGET.search(ins["text"])
            if m and labels.get(m.group(1), i + 1) <= i:
                found.append((labels[m.group(1)], i))
    return found


def mix(instructions, top=8):
    """The ``top`` most frequent opcode families, as ``"IMAD 40, LOP3 21, ..."``."""
    counts = collections.Counter(ins["family"] for ins in instructions)
    return ", ".join(f"{op} {n}" for op, n in counts.most_common(top))


def find_nvdisasm(given=None):
    """The first ``nvdisasm`` among the places the module docstring lists, or None."""
    candidates = [given, os.environ.get("NVDISASM"), shutil.which("nvdisasm")]
    if os.environ.get("CUDA_HOME"):
        candidates.append(os.path.join(os.environ["CUDA_HOME"], "bin", "nvdisasm"))
    try:
        import triton

        candidates.append(os.path.join(os.path.dirname(triton.__file__),
                                       "backends", "nvidia", "bin", "nvdisasm"))
    except ImportError:
        pass
    return next((c for c in candidates if c and os.path.isfile(c)), None)


def parse_cc(text):
    """``"90a"`` -> (9, 0, "a"), ``"80"`` -> (8, 0)."""
    m = re.fullmatch(r"(\d)(\d)(a?)", text)
    if not m:
        raise argparse.ArgumentTypeError(f"--cc: expected e.g. 80, 90 or 90a, not {text!r}")
    return (int(m.group(1)), int(m.group(2))) + ((m.group(3),) if m.group(3) else ())


def build(module, config, entry, cc, nvdisasm, out=None):
    """``(listing, report, folder)``: the ``nvdisasm -c`` listing of one spec's kernel (module
    under ``numba_flash.kernels``, its Config fields, its tile entry or None for the table's),
    the register and spill report, and the folder that keeps the PTX, cubin and SASS (``out``,
    else a new temporary one)."""
    from numba_flash.runtime import ptxcheck

    job = ("numba_flash.runtime.ptxcheck:spec_build", cc,
           (f"numba_flash.kernels.{module}", config, entry, None))
    ptx, report = ptxcheck.compile_reports_isolated([job])[0]
    out = pathlib.Path(out or tempfile.mkdtemp(prefix="sass-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernel.ptx").write_text(ptx)
    (out / "kernel.cubin").write_bytes(ptxcheck.link_cubin(ptx, cc=cc))
    sass = subprocess.run([nvdisasm, "-c", str(out / "kernel.cubin")], check=True,
                          capture_output=True, text=True).stdout
    (out / "kernel.sass").write_text(sass)
    return sass, report, out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("module", help="kernel spec under numba_flash.kernels, e.g. tc.mla_decode_seesaw"
                                  " (module:NAME for a module with several specs)")
    p.add_argument("config", help="the spec's Config fields as a JSON list")
    p.add_argument("--entry", default=None, help="tile entry as JSON (default: the table's)")
    p.add_argument("--cc", type=parse_cc, default=(9, 0, "a"), help="80, 90 or 90a (default)")
    p.add_argument("--nvdisasm", default=None)
    p.add_argument("--top", type=int, default=16, help="opcode families listed")
    p.add_argument("--min-loop", type=int, default=20,
                   help="shortest loop listed (mbarrier retry loops are a few instructions)")
    p.add_argument("--landmarks", action="store_true")
    p.add_argument("--out", default=None, help="keep kernel.ptx, kernel.cubin, kernel.sass here")
    args = p.parse_args(argv)
    nvdisasm = find_nvdisasm(args.nvdisasm)
    if nvdisasm is None:
        p.error("no nvdisasm found (see --help for where it is looked for)")

    sass, report, out = build(args.module, json.loads(args.config),
                              json.loads(args.entry) if args.entry else None, args.cc, nvdisasm,
                              args.out)
    instructions, labels = parse(sass)
    from numba_flash.runtime.ptxcheck import arch

    print(f"{args.module} {args.config} {arch(args.cc)}: "
          f"{len(instructions)} instructions, {report['registers']} registers, "
          f"{report['spill_stores']} bytes spilled; files in {out}")
    print("opcodes:", mix(instructions, args.top))
    for first, last in loops(instructions, labels):
        if last - first + 1 < args.min_loop:
            continue
        print(f"loop {first}-{last} ({last - first + 1}): "
              f"{mix(instructions[first:last + 1], 6)}")
    if args.landmarks:
        for i, ins in enumerate(instructions):
            if ins["op"].startswith(LANDMARKS) and not ins["op"].startswith("WARPGROUP.DEPBAR"):
                print(f"{i:6d} {ins['text']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
