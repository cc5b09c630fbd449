"""Place each pair of accesses that compute-sanitizer's racecheck reports in the machine code the
process ran, with the barriers around them, so that each pair can be read as a race or as two
accesses a barrier orders.

    compute-sanitizer --tool racecheck --print-limit 1000 python bench/every_kernel.py \\
        > racecheck.txt
    python tools/racecheck_pairs.py racecheck.txt \\
        --spec tc.mla_decode_seesaw '[1, 192, 64, false, "bfloat16", true, true]'

Racecheck names each access by kernel and byte offset from the kernel's first instruction
(``kernel(...)+0x6a30``: nvdisasm's offsets). The name's ABI tag (``[abi:v876,cw51c...]``)
tells the specializations the process compiled apart (``v876``, Numba's count) but does not say
which configuration each was (the hash token encodes the kernel's closure alone).
Each ``--spec MODULE CONFIG`` (as ``tools/sass.py`` takes them) builds one candidate
specialization with the toolkit of this machine, which must be the one the sanitized process
used (on the GPU machine, run it there); a token's pairs are placed in the one candidate whose
instruction at every reported offset is a shared-memory access. For every pair it prints both
instructions, the barrier instructions (``BAR.SYNC``, ``BAR.ARV``, ``BAR.RED``, ``SYNCS``
waits) between them in program order, and the last barrier before and the first after each.
Program order is not yet proof of order (both sides of a branch, loop iterations): the lines
are the material of that reading (docs/design.md, "The seesaw under racecheck").
"""

import argparse
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

_FIRST = re.compile(r"Race reported between (Read|Write) access at (.+)\+0x([0-9a-f]+)\s*$")
_SECOND = re.compile(r"and (Read|Write) access at (.+)\+0x([0-9a-f]+)(?: \[(\d+) hazards?\])?")
_TOKEN = re.compile(r"\[abi:(v\d+,[0-9A-Za-z_]+)\]")
BARRIERS = ("BAR.", "SYNCS.PHASECHK", "SYNCS.ARRIVE")
# The instruction families that touch shared memory: a reported offset lands on one of them.
SHARED_ACCESS = {"LDS", "STS", "LDSM", "STSM", "ATOMS", "LDGSTS", "UTMALDG", "UTMASTG", "UBLKCP",
                 "HGMMA", "SYNCS", "UTMAPF", "ATOM", "RED", "LD", "ST"}


def hazard_pairs(report):
    """``[(kernel_tag, (kind, offset), (kind, offset), hazards)]`` of a racecheck report: each
    "Race reported between" access with each "and ... access" line that follows it."""
    pairs, first = [], None
    for line in report.splitlines():
        line = line.replace("=========", "").strip()
        m = _FIRST.search(line)
        if m:
            token = _TOKEN.search(m.group(2))
            first = (token.group(1) if token else m.group(2), (m.group(1), int(m.group(3), 16)))
            continue
        m = _SECOND.search(line)
        if m and first is not None:
            pairs.append((first[0], first[1], (m.group(1), int(m.group(3), 16)),
                          int(m.group(4) or 1)))
        elif not line:
            first = None
    return pairs


def matching(listings, offsets):
    """The listings in which every reported offset starts a shared-memory access: the kernel's
    hash token encodes its closure alone, so the cubins of one kernel for other argument types
    or compile options hold the same name, but only the one the process ran has those accesses
    at those offsets."""
    def fits(instructions):
        at = {i["offset"]: i["family"] for i in instructions}
        return all(at.get(off) in SHARED_ACCESS for off in offsets)
    return [listing for listing in listings if fits(listing)]


def barriers_between(instructions, lo, hi):
    """The barrier instructions with offsets in [lo, hi)."""
    return [i for i in instructions if lo <= i["offset"] < hi and i["op"].startswith(BARRIERS)]


def describe(instructions, pair):
    """Lines that place one pair: both instructions, the barriers between them in program
    order, and the last barrier before each."""
    _, (kind_a, a), (kind_b, b), hazards = pair
    at = {i["offset"]: i for i in instructions}
    lines = [f"{kind_a} +0x{a:x}: {at[a]['text'] if a in at else '?'}",
             f"{kind_b} +0x{b:x}: {at[b]['text'] if b in at else '?'}   [{hazards} hazards]"]
    lo, hi = min(a, b), max(a, b)
    between = barriers_between(instructions, lo, hi)
    lines.append("  barriers between: " + ("; ".join(
        f"+0x{i['offset']:x} {i['text']}" for i in between) or "none"))
    end = instructions[-1]["offset"] + 1 if instructions else 0
    for off in (a, b):
        before = barriers_between(instructions, 0, off)
        after = barriers_between(instructions, off + 1, end)
        if before:
            lines.append(f"  last barrier before +0x{off:x}: +0x{before[-1]['offset']:x} "
                         f"{before[-1]['text']}")
        if after:
            lines.append(f"  first barrier after +0x{off:x}: +0x{after[0]['offset']:x} "
                         f"{after[0]['text']}")
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("report", help="racecheck's output (a file)")
    p.add_argument("--spec", nargs=2, action="append", default=[], metavar=("MODULE", "CONFIG"),
                   help="a candidate specialization, as tools/sass.py takes it (repeatable)")
    p.add_argument("--cc", type=None, default="90a", help="80, 90 or 90a (default)")
    p.add_argument("--nvdisasm", default=None)
    args = p.parse_args(argv)
    import sass

    nvdisasm = sass.find_nvdisasm(args.nvdisasm)
    if nvdisasm is None:
        p.error("no nvdisasm found (see tools/sass.py --help for where it is looked for)")
    pairs = hazard_pairs(pathlib.Path(args.report).read_text(errors="replace"))
    print(f"{len(pairs)} reported pairs, {sum(h for *_, h in pairs)} hazards")
    if not pairs:
        return 0
    candidates = [sass.parse(sass.build(module, json.loads(config), None,
                                        sass.parse_cc(args.cc), nvdisasm)[0])[0]
                  for module, config in args.spec]
    listings = {}
    for token in dict.fromkeys(pair[0] for pair in pairs):
        offsets = {off for t, (_, a), (_, b), _ in pairs if t == token for off in (a, b)}
        found = matching(candidates, offsets)
        texts = {tuple(i["text"] for i in f if i["offset"] in offsets) for f in found}
        if len(texts) != 1:
            print(f"kernel {token[:48]}...: {len(found)} of the {len(candidates)} --spec builds "
                  "have shared-memory accesses at every reported offset, not one; pass the "
                  "specializations the process ran, built with its toolkit")
            continue
        listings[token] = found[0]
    for pair in pairs:
        if pair[0] in listings:
            print("\n".join(describe(listings[pair[0]], pair)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
