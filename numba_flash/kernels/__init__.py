"""CUDA kernels: ``simt`` (CUDA cores, readable), ``tc`` (tensor cores), ``naive`` (baseline)."""
