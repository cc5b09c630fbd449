"""Test helpers shared by the suite: device arrays, poisoning, and DESIGN.md's tolerance rules."""

import os

import ml_dtypes
import numpy as np

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"
DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}


def randn(rng, shape, fmt, scale=1.0):
    """Fresh random values in format ``fmt`` (a NumPy host array)."""
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(DTYPES[fmt])


def to_device(x):
    """Host array -> what the library accepts here: NumPy under the simulator, CuPy on a GPU
    (CuPy holds ml_dtypes.bfloat16 arrays; Numba's to_device refuses them)."""
    if SIMULATOR:
        return x
    import cupy

    return cupy.asarray(x)


def to_host(x):
    """Any supported array (NumPy, CuPy, Numba device array, torch) -> NumPy, keeping the dtype."""
    if type(x).__module__.startswith("torch"):
        import torch

        t = x.detach().cpu()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return t.numpy()
    if hasattr(x, "copy_to_host"):
        return x.copy_to_host()
    if type(x).__module__.startswith("cupy"):
        return x.get()
    return np.asarray(x)


def nan_like(x):
    """A device array shaped like the host array ``x`` and filled with NaN (poisoned output)."""
    return to_device(np.full(x.shape, np.nan, dtype=np.float32).astype(x.dtype))


def f64(x):
    return to_host(x).astype(np.float32).astype(np.float64)


def assert_close_rule(out, ref, lowp_ref, fmt, factor=2.0, what="out"):
    """DESIGN.md: max|out - ref| <= factor * max|lowp - ref| + 1e-5 for 16-bit inputs; 1e-4
    relative Frobenius error for float32."""
    out = f64(out)
    assert not np.isnan(out).any(), f"{what}: NaN (unwritten or invalid) elements"
    if fmt == "float32":
        err = np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)
        assert err <= 1e-4, f"{what}: relative error {err:.3g} > 1e-4"
    else:
        err = np.abs(out - ref).max()
        bound = factor * np.abs(lowp_ref - ref).max() + 1e-5
        assert err <= bound, f"{what}: max error {err:.3g} > {bound:.3g}"


def assert_lse(lse, ref):
    lse = to_host(lse)
    assert lse.dtype == np.float32
    assert np.array_equal(np.isposinf(lse), np.isposinf(ref)), "lse: +inf rows differ"
    fin = np.isfinite(ref)
    assert np.isfinite(lse[fin]).all(), "lse: non-finite values on rows that see keys"
    err = np.abs(lse[fin] - ref[fin]) / (1 + np.abs(ref[fin]))
    assert err.size == 0 or err.max() <= 2e-4, f"lse: error {err.max():.3g}"
