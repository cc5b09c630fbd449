"""numba_flash: exact FlashAttention and FlashMLA-style paged decode in pure-Python numba.cuda.

The public API (shared/API.md) is what this module exports; everything else is internal.
"""

from .api import flash_attn_fwd, flash_attn_func

__all__ = ["flash_attn_fwd", "flash_attn_func"]
__version__ = "0.1.0"
