"""The persistent compile cache: compiled kernels on disk, so that a new process skips Numba's
front end, NVVM and the linker for every configuration an earlier one compiled.

An entry is found by a key over everything that decides the code (``key``): the kernel spec's
name, its code key and tiles, the argument types, the compile options, the compute capability,
the versions of the toolchain (numba-cuda, Numba, llvmlite, NVVM, nvJitLink, the CUDA bindings)
and a digest of the sources that kernels are made of (the package's ``kernels`` and ``runtime``
directories). It holds Numba's code library as Numba's own pickling reduces it
(``CUDACodeLibrary._reduce_states``: the LLVM IR, the PTX NVVM wrote and the cubin the linker
made of it), so a loaded entry rebuilds the same kind of library the compile path builds
(``_rebuild``), and ``launcher.Kernel`` loads its cached cubin instead of linking.

A file is a magic line, the SHA-256 of the payload and the payload. One that does not check
out (cut short, corrupted, of another format) is ignored with a warning and replaced by a fresh
compile. Writes go to a temporary file in the cache directory, then ``os.replace``: readers see
a whole entry or none, however many processes fill the cache at once (two that compile the same
kernel write equivalent entries; the last rename wins).

The directory is ``NUMBA_FLASH_CACHE_DIR``, else ``numba_flash`` in the user's cache directory
(``%LOCALAPPDATA%``, ``~/Library/Caches``, else ``$XDG_CACHE_HOME`` or ``~/.cache``).
``NUMBA_FLASH_CACHE=0`` switches the cache off. Messages go to ``logging.getLogger(
"numba_flash")``.
"""

import hashlib
import logging
import os
import pathlib
import pickle
import sys
import tempfile
from functools import lru_cache

log = logging.getLogger("numba_flash")

MAGIC = b"numba_flash kernel cache 1\n"
SUFFIX = ".nfk"
DIR_ENV, SWITCH_ENV = "NUMBA_FLASH_CACHE_DIR", "NUMBA_FLASH_CACHE"
_PACKAGE = pathlib.Path(__file__).resolve().parent.parent
SOURCE_DIRS = (_PACKAGE / "kernels", _PACKAGE / "runtime")


def enabled():
    """False when ``NUMBA_FLASH_CACHE`` is ``0`` (or ``false``, ``no``, ``off``)."""
    return os.environ.get(SWITCH_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def directory():
    """Where entries live: ``NUMBA_FLASH_CACHE_DIR``, else the user's cache directory."""
    override = os.environ.get(DIR_ENV, "").strip()
    if override:
        return pathlib.Path(override).expanduser()
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        base = pathlib.Path(os.environ["LOCALAPPDATA"])
    elif sys.platform == "darwin":
        base = pathlib.Path.home() / "Library" / "Caches"
    else:
        base = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    return base / "numba_flash"


@lru_cache(maxsize=None)
def toolchain():
    """The versions of what turns a kernel's Python into a cubin."""
    from importlib.metadata import PackageNotFoundError, version

    from cuda.bindings import nvjitlink
    from numba.cuda.cudadrv import nvvm

    def installed(name):
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    packages = tuple((name, installed(name))
                     for name in ("numba-cuda", "numba", "llvmlite", "cuda-bindings"))
    compiler = nvvm.NVVM()
    return packages + (("nvvm", (compiler.get_version(), compiler.get_ir_version())),
                       ("nvjitlink", tuple(nvjitlink.version())))


def sources_digest(directories=SOURCE_DIRS):
    """SHA-256 over the paths and contents of every ``.py`` file under ``directories``."""
    digest = hashlib.sha256()
    for root in directories:
        root = pathlib.Path(root)
        for path in sorted(root.rglob("*.py")):
            digest.update(path.relative_to(root.parent).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


@lru_cache(maxsize=None)
def _package_sources():
    return sources_digest()


def key(name, code_key, tiles, argument_types, options, cc):
    """The hex key of a kernel: its spec's ``name``, ``code_key`` and ``tiles``, its argument
    types, compile ``options`` and compute capability, the toolchain and the sources."""
    options = {k: sorted(v) if isinstance(v, (set, frozenset)) else v
               for k, v in sorted(options.items())}
    parts = (("name", name), ("code", repr(code_key)), ("tiles", repr(tiles)),
             ("arguments", tuple(str(t) for t in argument_types)), ("options", repr(options)),
             ("cc", tuple(cc)), ("toolchain", toolchain()), ("sources", _package_sources()))
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def path_of(entry):
    return directory() / (entry + SUFFIX)


def store(entry, library, cc):
    """Write ``library`` (compiled for ``cc``, which is linked to a cubin first) as ``entry``.
    A directory that cannot be written is reported, and the process goes on uncached."""
    # What the first launch links (the cubin is the point), under the key Numba's launch looks
    # it up by: ``CUDACodeLibrary._ensure_cc`` adds the "a" of sm_90a (wgmma) from 9.0 on.
    library.get_cubin(cc=tuple(cc) if len(cc) == 3 else
                      (cc[0], cc[1], "a" if tuple(cc) >= (9, 0) else ""))
    state = library._reduce_states()
    state["cubin_cache"] = {c: bytes(obj.code) for c, obj in state["cubin_cache"].items()}
    payload = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        write_atomically(path_of(entry), MAGIC + hashlib.sha256(payload).digest() + payload)
    except OSError as e:
        log.warning("numba_flash: cannot write the compile cache (%s); set %s to a writable "
                    "directory or %s=0", e, DIR_ENV, SWITCH_ENV)
        return
    log.debug("numba_flash: cached %s in %s", library.name, path_of(entry))


def write_atomically(path, data):
    """Write ``data`` to ``path`` through a temporary file in its directory and ``os.replace``,
    so that no reader sees part of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def read(entry):
    """The payload of ``entry``'s file, or None when there is none or it does not check out
    (warned about: it is then overwritten by a fresh compile)."""
    path = path_of(entry)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        log.warning("numba_flash: cannot read %s (%s); compiling", path, e)
        return None
    head = len(MAGIC) + hashlib.sha256().digest_size
    payload = data[head:]
    if data[:len(MAGIC)] != MAGIC or data[len(MAGIC):head] != hashlib.sha256(payload).digest():
        log.warning("numba_flash: ignoring %s: not a whole cache entry; compiling", path)
        return None
    return payload


def load(entry):
    """The code library cached as ``entry``, rebuilt as Numba's pickling rebuilds it, or None."""
    payload = read(entry)
    if payload is None:
        return None
    from cuda.core import ObjectCode
    from numba.cuda.codegen import CUDACodeLibrary

    try:  # a whole entry another Numba could not read back (the checksum cannot see that)
        state = pickle.loads(payload)
        state["cubin_cache"] = {c: ObjectCode.from_cubin(code, name=state["name"])
                                for c, code in state["cubin_cache"].items()}
        library = CUDACodeLibrary._rebuild(**state)
    except Exception as e:
        log.warning("numba_flash: cannot rebuild %s (%s: %s); compiling", path_of(entry),
                    type(e).__name__, e)
        return None
    log.debug("numba_flash: loaded %s from %s", library.name, path_of(entry))
    return library
