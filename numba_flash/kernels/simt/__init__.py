"""CUDA-core kernels: the textbook versions of every algorithm in the project."""
