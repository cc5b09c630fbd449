"""Tensor-core kernels (mma.sync through inline PTX, see ``ptx.py``)."""
