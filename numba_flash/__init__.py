"""numba_flash: exact FlashAttention and FlashMLA-style paged decode in pure-Python numba.cuda.

The public API (docs/api.md) is what this module exports; everything else is internal. The
names are resolved lazily, so importing the package does not import Numba: ``python -m
numba_flash`` and the test suite can still choose Numba's CUDA simulator when there is no GPU.
"""

# NumPy 2.5 removed ``np.row_stack`` (an alias of ``np.vstack``), and numba-cuda 0.30, its last
# release, still registers an overload of it when its CUDA target first loads, so every kernel
# compile would fail with AttributeError. Put the alias back before that happens, only where it
# is missing (NumPy < 2.5 keeps its own); Numba itself is still not imported here.
import numpy as _np

if not hasattr(_np, "row_stack"):
    _np.row_stack = _np.vstack

__version__ = "0.1.0"
__all__ = ["flash_attn_fwd", "flash_attn_bwd", "flash_attn_func", "flash_attn_varlen_fwd",
           "flash_attn_varlen_bwd", "flash_attn_varlen_func", "get_mla_metadata",
           "flash_mla_with_kvcache", "flash_attn_with_kvcache", "hadamard_rotate", "quantize_fp8",
           "check_errors", "warmup"]


def __getattr__(name):
    if name == "warmup":
        from .precompile import warmup

        return warmup
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'numba_flash' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
