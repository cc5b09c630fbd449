"""runtime/cache.py: keys, atomic writes, entries that do not check out, the switch, and a real
compile (NVVM and nvJitLink run without a GPU) round-tripped through the cache files in a child
process on the real CUDA target; on a GPU, the first call of a cached configuration in a new
process."""

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from numba_flash.runtime import cache
from helpers import SIMULATOR

KEY_ARGS = dict(name="kernels.x:flash", code_key=("cfg", 64), tiles=("tiles", 64, 64),
                argument_types=("array(float32, 1d, A)", "int32"),
                options={"fastmath": {"contract", "afn"}, "max_registers": 128}, cc=(9, 0))


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.DIR_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_key_changes_with_every_input_that_decides_the_code(monkeypatch):
    monkeypatch.setattr(cache, "toolchain", lambda: (("numba-cuda", "0.30.4"),))
    monkeypatch.setattr(cache, "_package_sources", lambda: "digest-1")
    base = cache.key(**KEY_ARGS)
    assert cache.key(**KEY_ARGS) == base
    assert cache.key(**dict(KEY_ARGS, options={"max_registers": 128,
                                               "fastmath": {"afn", "contract"}})) == base
    changed = dict(name="kernels.x:other", code_key=("cfg", 128), tiles=("tiles", 64, 32),
                   argument_types=("array(float16, 1d, A)", "int32"),
                   options={"fastmath": {"contract"}, "max_registers": 128}, cc=(8, 0))
    keys = {base}
    for name, value in changed.items():
        keys.add(cache.key(**dict(KEY_ARGS, **{name: value})))
    monkeypatch.setattr(cache, "toolchain", lambda: (("numba-cuda", "0.30.5"),))
    keys.add(cache.key(**KEY_ARGS))
    monkeypatch.setattr(cache, "_package_sources", lambda: "digest-2")
    keys.add(cache.key(**KEY_ARGS))
    assert len(keys) == len(changed) + 3


def test_the_sources_digest_follows_every_byte_and_file_name(tmp_path):
    root = tmp_path / "kernels"
    (root / "tc").mkdir(parents=True)
    (root / "a.py").write_text("x = 1\n")
    (root / "tc" / "b.py").write_text("y = 2\n")
    (root / "notes.txt").write_text("not code")
    first = cache.sources_digest([root])
    (root / "notes.txt").write_text("other")
    assert cache.sources_digest([root]) == first
    (root / "tc" / "b.py").write_text("y = 3\n")
    second = cache.sources_digest([root])
    (root / "tc" / "b.py").rename(root / "tc" / "c.py")
    assert len({first, second, cache.sources_digest([root])}) == 3


def test_the_package_sources_cover_the_kernels_and_the_runtime():
    assert {d.name for d in cache.SOURCE_DIRS} == {"kernels", "runtime"}
    assert all((d / "__init__.py").exists() for d in cache.SOURCE_DIRS)


def test_the_directory_is_the_override_else_the_users_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.DIR_ENV, str(tmp_path / "here"))
    assert cache.directory() == tmp_path / "here"
    monkeypatch.delenv(cache.DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform not in ("win32", "darwin"):
        assert cache.directory() == tmp_path / "xdg" / "numba_flash"


@pytest.mark.parametrize("value, on", [("1", True), ("0", False), ("off", False),
                                       ("false", False), ("yes", True)])
def test_the_switch(value, on, monkeypatch):
    monkeypatch.setenv(cache.SWITCH_ENV, value)
    assert cache.enabled() is on


def _entry_bytes(payload):
    import hashlib

    return cache.MAGIC + hashlib.sha256(payload).digest() + payload


def test_an_atomic_write_leaves_the_old_file_whole_when_it_fails(cache_dir, monkeypatch):
    path = cache.path_of("k")
    cache.write_atomically(path, b"old")

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        cache.write_atomically(path, b"new")
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in cache_dir.iterdir()) == [path.name]  # no temporary left


def test_writers_racing_on_one_entry_leave_a_whole_one(cache_dir):
    payloads = [bytes([i]) * 200_000 for i in range(8)]
    threads = [threading.Thread(target=cache.write_atomically,
                                args=(cache.path_of("k"), _entry_bytes(p))) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.read("k") in payloads
    assert [p.name for p in cache_dir.iterdir()] == ["k" + cache.SUFFIX]


@pytest.mark.parametrize("damage", ["cut short", "flipped byte", "other format", "empty"])
def test_an_entry_that_does_not_check_out_is_ignored_with_a_warning(damage, cache_dir, caplog):
    whole = _entry_bytes(b"payload" * 100)
    bad = {"cut short": whole[:-10], "flipped byte": whole[:-1] + b"\x00",
           "other format": b"numba_flash kernel cache 0\n" + whole[len(cache.MAGIC):],
           "empty": b""}[damage]
    cache.write_atomically(cache.path_of("k"), bad)
    with caplog.at_level(logging.WARNING, logger="numba_flash"):
        assert cache.read("k") is None
    assert "not a whole cache entry" in caplog.text
    cache.write_atomically(cache.path_of("k"), whole)
    assert cache.read("k") == b"payload" * 100


UNREADABLE = textwrap.dedent("""
    import hashlib, logging, pickle, sys
    from numba_flash.runtime import cache

    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("numba_flash").addHandler(handler)
    for payload in (b"not a pickle", pickle.dumps({"name": "x"})):
        data = cache.MAGIC + hashlib.sha256(payload).digest() + payload
        cache.write_atomically(cache.path_of("k"), data)
        assert cache.load("k") is None
    print(sum("cannot rebuild" in line for line in records))
""")


def test_a_whole_entry_that_cannot_be_rebuilt_is_ignored_with_a_warning(tmp_path):
    """The checksum holds, but the payload is no library this Numba can rebuild (not a pickle,
    or a pickle of something else): None and a warning, so the call compiles instead."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0", NUMBA_FLASH_CACHE_DIR=str(tmp_path))
    run = subprocess.run([sys.executable, "-c", UNREADABLE], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "2"


def test_a_missing_entry_is_none_without_a_warning(cache_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="numba_flash"):
        assert cache.read("absent") is None
    assert caplog.text == ""


# A real compile on the CUDA target (no GPU needed): a tiny kernel and the planner kernel of the
# MLA decode through KernelSpec.compiled, each compiled, stored, then loaded from the files with
# the compile path switched off; then a cut-short file recompiled and the switch honoured.
ROUND_TRIP = textwrap.dedent("""
    import json, logging, os, pathlib, sys
    from numba import cuda, types
    from numba_flash.runtime import cache, compiler, device
    from numba_flash.kernels.simt import mla_metadata

    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("numba_flash").addHandler(handler)
    logging.getLogger("numba_flash").setLevel(logging.DEBUG)
    folder = pathlib.Path(os.environ["NUMBA_FLASH_CACHE_DIR"])
    cc = (9, 0)

    def double(a):
        i = cuda.grid(1)
        if i < a.shape[0]:
            a[i] = a[i] * 2.0

    signature = (types.float32[::1],)
    key = ("test:double", "code", "tiles")
    compiled = compiler.compile_kernel(double, signature, 4096, cc, key=key)
    files = sorted(p.name for p in folder.iterdir())
    real_library = compiler.kernel_library
    compiler.kernel_library = None  # from here, a compile would fail: loads only
    loaded = compiler.compile_kernel(double, signature, 4096, cc, key=key)
    spec = mla_metadata.SPEC
    hopper = device.Device(cc=cc, sms=132, shared_per_block=227 * 1024)
    compiler.kernel_library = real_library
    planner, _ = spec.compiled(spec.Config(), hopper)
    spec.forget()
    compiler.kernel_library = None
    planner_loaded, _ = spec.compiled(spec.Config(), hopper)

    def same(a, b):
        return dict(
            library_type=type(a.library) is type(b.library),
            rebuilt=a.library is not b.library,
            entry=a.library._entry_name == b.library._entry_name,
            ptx=a.library.get_asm_strs(cc=cc) == b.library.get_asm_strs(cc=cc),
            cubin=bytes(a.library.get_cubin(cc=cc).code) == bytes(b.library.get_cubin(cc=cc).code),
            cubin_type=type(a.library.get_cubin(cc=cc)) is type(b.library.get_cubin(cc=cc)),
            shared=a.shared_bytes == b.shared_bytes,
            parameters=a.parameters.format.format == b.parameters.format.format
            and a.parameters.types == b.parameters.types)

    entry = cache.key(*key, compiler.argument_types(signature), compiler.COMPILE_OPTIONS, cc)
    path = cache.path_of(entry)
    path.write_bytes(path.read_bytes()[:100])
    compiler.kernel_library = real_library
    recompiled = compiler.compile_kernel(double, signature, 4096, cc, key=key)
    whole_again = cache.read(entry) is not None
    os.environ["NUMBA_FLASH_CACHE"] = "0"
    before = len(list(folder.iterdir()))
    compiler.compile_kernel(double, signature, 4096, cc, key=("test:double", "other", "tiles"))
    print(json.dumps(dict(files=files, kernel=same(compiled, loaded),
                          planner=same(planner, planner_loaded),
                          recompiled=recompiled.library.get_asm_strs(cc=cc) != [],
                          whole_again=whole_again,
                          off_wrote=len(list(folder.iterdir())) - before, log=records)))
""")


def test_a_real_compile_round_trips_through_the_cache_files(tmp_path):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0", NUMBA_FLASH_CACHE_DIR=str(tmp_path),
               NUMBA_FLASH_CACHE="1")
    run = subprocess.run([sys.executable, "-c", ROUND_TRIP], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(result["files"]) == 1 and result["files"][0].endswith(cache.SUFFIX)
    for what in ("kernel", "planner"):
        assert all(result[what].values()), (what, result[what])
    assert result["recompiled"] and result["whole_again"] and result["off_wrote"] == 0
    log = result["log"]
    assert sum("compiled test:double for sm_90" in line for line in log) == 3  # not the load
    assert any("loaded" in line for line in log)
    assert any("not a whole cache entry" in line for line in log)


FIRST_CALL = textwrap.dedent("""
    import json, logging, sys
    import numpy as np
    import numba_flash as nf
    from numba import cuda

    class Lines(logging.Handler):
        lines = []
        def emit(self, record):
            self.lines.append(record.getMessage())

    logger = logging.getLogger("numba_flash")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(Lines())
    q = cuda.to_device(np.zeros((1, 128, 8, 128), np.float16))
    if sys.argv[1] == "warm":
        nf.warmup([dict(call="flash_attn_fwd", head_dim=128, dtype="float16", causal=True)])
    out, lse = nf.flash_attn_fwd(q, q, q, causal=True)
    cuda.synchronize()
    print(json.dumps(dict(log=Lines.lines, finite=bool(np.isfinite(out.copy_to_host()).all()))))
""")


@pytest.mark.skipif(SIMULATOR, reason="compiles and loads for a GPU")
def test_a_new_process_loads_a_cached_configuration_without_compiling(tmp_path):
    """The second process's first call finds every kernel it launches in the cache (what makes
    that call fast: bench/first_call.py times it)."""
    env = dict(os.environ, NUMBA_FLASH_CACHE_DIR=str(tmp_path), NUMBA_FLASH_CACHE="1")
    logs = []
    for mode in ("warm", "cached"):  # fill the cache, then a new process
        run = subprocess.run([sys.executable, "-c", FIRST_CALL, mode], env=env,
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        result = json.loads(run.stdout.strip().splitlines()[-1])
        assert result["finite"]
        logs.append(result["log"])
    warm, cached = logs
    assert any(" compiled " in line for line in warm), warm
    assert not any(" compiled " in line for line in cached), cached
    assert any(" loaded " in line for line in cached), cached


HOPPER_ENTRY = textwrap.dedent("""
    import json, pickle
    from numba_flash.runtime import cache, compiler, ptxcheck

    pyfunc, signature, options = ptxcheck.spec_build("numba_flash.kernels.tc.forward_wgmma",
                                                     [64, False, "float16"], [64, 64, 4, 0])
    key = ("test:wgmma", "code", "tiles")
    compiler.compile_kernel(pyfunc, signature, 0, (9, 0), options, key=key)
    entry = cache.key(*key, compiler.argument_types(signature), options, (9, 0))
    state = pickle.loads(cache.path_of(entry).read_bytes()[len(cache.MAGIC) + 32:])
    print(json.dumps(sorted(map(list, state["cubin_cache"]))))
""")


def test_a_hopper_entry_holds_the_sm_90a_cubin_a_launch_looks_up(tmp_path):
    """wgmma exists on sm_90a only: the entry of a kernel built for compute capability 9.0 is
    linked for (9, 0, "a"), the key Numba's launch asks for (sm_90 would not assemble)."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0", NUMBA_FLASH_CACHE_DIR=str(tmp_path),
               NUMBA_FLASH_CACHE="1")
    run = subprocess.run([sys.executable, "-c", HOPPER_ENTRY], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == [[9, 0, "a"]]
