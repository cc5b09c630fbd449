"""The runtime: where kernels run, how they are compiled, cached and launched. It knows no kernel."""
