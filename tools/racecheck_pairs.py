"""Place each pair of accesses that compute-sanitizer's racecheck reports in the machine code the
process ran, with the barriers around them, so that each pair can be read as a race or as two
accesses a barrier orders.

    NUMBA_FLASH_CACHE_DIR=/tmp/nfc compute-sanitizer --tool racecheck --print-limit 1000 \\
        python bench/every_kernel.py > racecheck.txt
    NUMBA_FLASH_CACHE_DIR=/tmp/nfc python tools/racecheck_pairs.py racecheck.txt

Racecheck names each access by kernel and byte offset (``kernel(...)+0x6c20``). The cubin that
offset belongs to is the one the process loaded: numba_flash's compile cache
(``runtime/cache.py``) holds it, under the same mangled name, whose hash token
(``cw51c...``, the closure and arguments) racecheck prints inside ``[abi:...]``. This tool finds
that cubin in the cache, disassembles it with ``nvdisasm`` (found as ``tools/sass.py`` finds it)
and prints, for every reported pair, both instructions and every barrier instruction
(``BAR.SYNC``, ``BAR.ARV``, ``BAR.RED``, ``SYNCS`` waits) between them in program order, and the
last one before each. A barrier between the two in program order is not yet proof of order
(loops and branches): the pairs it prints are the material of that reading
(docs/design.md, "The seesaw under racecheck").
"""

import argparse
import pathlib
import pickle
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

_FIRST = re.compile(r"Race reported between (Read|Write) access at (.+)\+0x([0-9a-f]+)\s*$")
_SECOND = re.compile(r"and (Read|Write) access at (.+)\+0x([0-9a-f]+)(?: \[(\d+) hazards?\])?")
_TOKEN = re.compile(r"\[abi:v\d+,([0-9A-Za-z_]+)\]")
BARRIERS = ("BAR.", "SYNCS.PHASECHK", "SYNCS.ARRIVE")
# The instruction families that touch shared memory: a reported offset lands on one of them.
SHARED_ACCESS = {"LDS", "STS", "LDSM", "STSM", "ATOMS", "LDGSTS", "UTMALDG", "UTMASTG", "UBLKCP",
                 "HGMMA", "SYNCS", "UTMAPF", "ATOM", "RED", "LD", "ST"}


def hazard_pairs(report):
    """``[(kernel_token, (kind, offset), (kind, offset), hazards)]`` of a racecheck report: each
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


def cached_cubins(token):
    """The cubins in the compile cache whose symbols hold ``token``."""
    from numba_flash.runtime import cache

    found = []
    for path in sorted(cache.directory().glob("*" + cache.SUFFIX)):
        payload = cache.read(path.name[:-len(cache.SUFFIX)])
        if payload is None:
            continue
        for code in pickle.loads(payload)["cubin_cache"].values():
            if token.encode() in bytes(code):
                found.append(bytes(code))
    return found


def disassemble(cubin, nvdisasm):
    """The parsed SASS (``tools/sass.py``) of one cubin."""
    import sass

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        listing = subprocess.run([nvdisasm, "-c", f.name], check=True, capture_output=True,
                                 text=True).stdout
    return sass.parse(listing)[0]


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
    for off in (a, b):
        before = barriers_between(instructions, 0, off)
        if before:
            lines.append(f"  last barrier before +0x{off:x}: +0x{before[-1]['offset']:x} "
                         f"{before[-1]['text']}")
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("report", help="racecheck's output (a file)")
    p.add_argument("--nvdisasm", default=None)
    args = p.parse_args(argv)
    import sass

    nvdisasm = sass.find_nvdisasm(args.nvdisasm)
    if nvdisasm is None:
        p.error("no nvdisasm found (see tools/sass.py --help for where it is looked for)")
    pairs = hazard_pairs(pathlib.Path(args.report).read_text(errors="replace"))
    print(f"{len(pairs)} reported pairs, {sum(h for *_, h in pairs)} hazards")
    listings = {}
    for token in dict.fromkeys(pair[0] for pair in pairs):
        offsets = {off for t, (_, a), (_, b), _ in pairs if t == token for off in (a, b)}
        found = matching([disassemble(c, nvdisasm) for c in cached_cubins(token)], offsets)
        texts = {tuple(i["text"] for i in f if i["offset"] in offsets) for f in found}
        if len(texts) != 1:
            print(f"kernel {token[:40]}...: {len(found)} cached cubins hold its name with "
                  "shared-memory accesses at every reported offset, not one; run with the cache "
                  "directory the sanitized process used")
            continue
        listings[token] = found[0]
    for pair in pairs:
        if pair[0] in listings:
            print("\n".join(describe(listings[pair[0]], pair)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
