"""What a kernel module declares to the runtime, and the cache of compiled kernels.

Every kernel module holds its factory and a ``SPEC``: an instance of a ``KernelSpec`` subclass
that says, in one place,

- ``Config``: the values of a call that decide the code (a NamedTuple: head dim, causal,
  storage format, ...), and ``config(problem)``: those values of a call's problem description
  (``kernels/problem.py``), where the kernel reads one;
- its tile table, ``entry(config, device)`` (the entry a device runs) and ``tiles(config,
  entry)`` (an entry as ``Tiles``: sizes, threads, dynamic shared bytes, register cap);
- ``make(config, tiles)``: the Python kernel function, ``signature(config)``: its argument
  types, ``unroll_loops``, ``lto`` and the tiles' register cap: its compile options;
- ``grid(config, tiles, problem)`` and ``arguments(config, problem)``: how a launch follows from
  the problem, a dict of the adapted arrays (``arrays.Tensor``) and numbers the API passes;
  ``dependent(config)``: whether it is launched as a programmatic dependent of the kernel before
  it (``launcher``).
  ``prepare`` checks the tiles against the device and the grid against CUDA's limits before
  anything is launched;
- ``samples()``: the specializations the checks without a GPU compile (``Sample``: PTX hashes in
  ``tools/ptx_hashes.py``, the registry's compile test), the cheapest first.

The runtime compiles each (code, tiles, compute capability) once: ``compiled`` caches by
``code_key(config, tiles)`` (the config, unless a kernel's code depends on less of it), the
tiles and the device's compute capability, so two GPUs of different architectures in one
process each get their own build, and a forced tile entry (tests, the tile tuner) is a
different key rather than a stale cache. The same key, with the spec's name, finds the kernel
in the persistent cache of ``cache.py`` when an earlier process compiled it.
"""

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple, Optional

from . import launcher
from .compiler import compile_kernel, compile_options


@dataclass(frozen=True)
class Tiles:
    """One kernel configuration: tile sizes, threads per block and dynamic shared bytes."""

    BLOCK_M: int
    BLOCK_N: int
    threads: int
    shared_bytes: int
    max_registers: int = 0  # a per-thread register cap (0: the compiler's choice)


SM80, SM90, SM90A = (8, 0), (9, 0), (9, 0, "a")  # compute capabilities as ptxcheck takes them


class Sample(NamedTuple):
    """A specialization the checks without a GPU compile: ``label`` names it (``tools/ptx_hashes``
    keys it as the label and ``sm_<cc>``), ``config`` holds the spec's ``Config`` fields,
    ``entry`` a tile entry (None: the table's for ``device``, a ``Device`` or None) and ``ccs`` the
    compute capabilities it is built for."""

    label: str
    config: tuple
    entry: Optional[tuple] = None
    device: object = None
    ccs: tuple = (SM80, SM90)


class KernelSpec:
    """A kernel's contract with the runtime (see the module docstring); subclasses implement the
    methods that raise ``NotImplementedError``."""

    name = None            # the kernel function's name, as profilers show it
    unroll_loops = False   # mark every constant-trip loop for full unrolling (compiler.py)
    lto = False            # assemble as a whole program (compiler.py: setmaxnreg needs it)

    def __init__(self):
        self._forced = None
        self._tiles = {}
        self._kernels = {}
        self._plans = {}  # (config, device, forced entry) -> (kernel, tiles)
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- declared by each kernel

    def config(self, problem):
        """The ``Config`` of a call's problem description (``kernels/problem.py``)."""
        raise NotImplementedError

    def entry(self, config, device):
        """The tile-table entry ``config`` runs with on ``device``."""
        raise NotImplementedError

    def tiles(self, config, entry):
        """``entry`` (a tile-table entry) as ``Tiles`` for ``config``."""
        raise NotImplementedError

    def make(self, config, tiles):
        """The Python kernel function of ``config`` with ``tiles``."""
        raise NotImplementedError

    def signature(self, config):
        """The kernel's ``void(...)`` signature."""
        raise NotImplementedError

    def grid(self, config, tiles, problem):
        """The launch grid for ``problem``."""
        raise NotImplementedError

    def arguments(self, config, problem):
        """The launch arguments for ``problem``, in the signature's order."""
        raise NotImplementedError

    def code_key(self, config, tiles):
        """What besides the tiles decides the code (the whole config by default)."""
        return config

    def pointer_tail(self, config, problem, pointers):
        """The data pointers of the array arguments that close the signature and follow the
        inputs' addresses (a TMA kernel's tensor maps), for q, k, v at ``pointers``: a plan
        (``torch_plans``) that repeats a launch with new inputs asks for them each call.
        Default: none."""
        return ()

    def dependent(self, config):
        """Launched as a programmatic dependent of the kernel before it (default: no)."""
        return False

    def samples(self):
        """The ``Sample`` specializations the checks compile, the cheapest first (the one the
        registry's compile test builds)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- provided

    def options(self, tiles):
        return compile_options(tiles.max_registers, self.unroll_loops, self.lto)

    def choose(self, config, device):
        """The ``Tiles`` of ``config`` on ``device``: the forced entry, else the table's;
        ``ValueError`` (before anything is launched) when they need more shared memory per
        block than the device has."""
        key = (config, device, self._forced)
        tiles = self._tiles.get(key)
        if tiles is None:
            entry = self._forced if self._forced is not None else self.entry(config, device)
            tiles = self.tiles(config, entry)
            if device is not None and tiles.shared_bytes > (device.shared_per_block or 1 << 62):
                raise ValueError(
                    f"{self.name}: {config} needs {tiles.shared_bytes} bytes of shared memory "
                    f"per block, the device (compute capability {device.cc}) allows "
                    f"{device.shared_per_block}; use another backend or head dim")
            self._tiles[key] = tiles
        return tiles

    def build(self, config, entry=None, device=None):
        """``(pyfunc, signature, compile options)`` of ``config`` with tile entry ``entry``
        (default: the table's for ``device``): the form ``ptxcheck`` compiles."""
        tiles = self.tiles(config, entry) if entry is not None else self.choose(config, device)
        return self.make(config, tiles), self.signature(config), self.options(tiles)

    def compiled(self, config, device):
        """``(kernel, tiles)`` of ``config`` on ``device``, compiled on first use."""
        tiles = self.choose(config, device)
        key = (self.code_key(config, tiles), tiles, device.cc)
        kernel = self._kernels.get(key)
        if kernel is None:
            with self._lock:  # one compile per key, however many threads ask
                kernel = self._kernels.get(key)
                if kernel is None:
                    kernel = self._kernels[key] = compile_kernel(
                        self.make(config, tiles), self.signature(config), tiles.shared_bytes,
                        device.cc, self.options(tiles),
                        key=(f"{type(self).__module__}:{self.name}",) + key[:2])
        return kernel, tiles

    def prepare(self, config, problem, device):
        """``(tiles, grid)`` of a launch of ``config`` for ``problem``, checked: ``ValueError``
        when the tiles do not fit the device (``choose``) or the grid passes CUDA's limits. A
        call that launches several kernels prepares them all before the first launch."""
        tiles = self.choose(config, device)
        grid = self.grid(config, tiles, problem)
        launcher.check_grid(self.name, grid)
        return tiles, grid

    def launch(self, config, problem, stream, device):
        """Compile if needed, then launch ``config`` for ``problem`` on ``stream``. The kernel
        and tiles of (config, device, forced entry) are looked up once per call: a tiny call's
        host time is what a user of small shapes waits for."""
        key = (config, device, self._forced)
        plan = self._plans.get(key)
        if plan is None:
            self.prepare(config, problem, device)  # a refusal comes before a compile
            plan = self._plans[key] = self.compiled(config, device)
        kernel, tiles = plan
        grid = self.grid(config, tiles, problem)
        launcher.check_grid(self.name, grid)
        launcher.launch(kernel, grid, tiles.threads, stream, tiles.shared_bytes,
                        *self.arguments(config, problem), dependent=self.dependent(config))
        return tiles

    def forget(self):
        """Drop this spec's compiled kernels and plans (tests: to see what a call compiles)."""
        with self._lock:
            self._kernels.clear()
            self._plans.clear()

    @contextmanager
    def forcing(self, entry):
        """Run with tile entry ``entry`` instead of the table's (tests, the tile tuner; not
        thread-safe)."""
        previous, self._forced = self._forced, entry
        try:
            yield self
        finally:
            self._forced = previous


class FixedSpec(KernelSpec):
    """A kernel with one launch shape: ``THREADS`` threads per block, no tile table and no
    dynamic shared memory (the decode planner, the KV-cache append)."""

    THREADS = None

    def entry(self, config, device):
        return ()

    def tiles(self, config, entry):
        return Tiles(0, 0, self.THREADS, 0)
