"""What the CUDA simulator runs in place of each module of ``kernels/ptx``: the same module
names, functions and signatures, in plain Python with the same per-thread results.

Numba's simulator runs every CUDA thread as a Python thread and cannot execute PTX. The
emulations keep the instructions' contracts: warp-collective ones exchange their inputs through
a shared ``scratch`` array between two barriers of the caller's warp (``sync.warp_sync``: every
thread of a warp calls them together, other warps may be elsewhere, the block is whole warps
and ``tid`` is the linear thread index), asynchronous ones
complete at issue, and alignment rules that fault on a GPU raise here. ``kernels/instructions.py``
chooses between the two packages once, at import time.
"""
