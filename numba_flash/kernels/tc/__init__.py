"""Tensor-core kernels (mma.sync and Hopper's wgmma through inline PTX, see ``kernels/ptx``)."""
