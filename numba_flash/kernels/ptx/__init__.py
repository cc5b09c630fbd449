"""The GPU instructions the kernels use beyond what Numba offers, as inline PTX, one module per
concern: ``mma`` (mma.sync, ldmatrix), ``wgmma`` (Hopper's warpgroup MMA), ``memory``
(cp.async, addresses, 16-byte stores), ``tma`` (Hopper's TMA box copies and mbarriers),
``sync`` (warp shuffles, proxy fences), ``convert`` (16-bit <-> float32, packing, ex2, 32-bit
division).

Kernels never import these modules: ``kernels/instructions.py`` binds each name to this package
on a GPU, or to ``kernels/emulation`` (same module names, same functions, same signatures)
under Numba's CUDA simulator, which cannot run PTX.

Two modules here emit no instruction and serve both halves: ``layout`` (which lane holds which
element, where a tile element lives in shared memory, alignment and scratch sizes) and
``model`` (NumPy statements of what the instructions compute, for the emulations and tests).
``codegen`` holds the LLVM helpers the intrinsics share.
"""
