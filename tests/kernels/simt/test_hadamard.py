"""The random Hadamard rotation (kernels/simt/hadamard.py, ``nf.hadamard_rotate``) against the
rotation matrix written out in float64 (random signs, then Sylvester's Hadamard matrix over each
block, scaled to be orthogonal): every format, 3-D and 4-D inputs, head dims that are one block,
several blocks, or odd; q k^T unchanged under one seed; outliers spread; refusals that write
nothing."""

import numpy as np
import pytest

import numba_flash as nf
from helpers import (SIMULATOR, assert_compiles_clean, later_samples, nan_like, randn,
                     to_device, to_host)
from numba_flash.kernels.simt import hadamard

SHAPES = [((2, 3, 2, 128), "float32"), ((5, 2, 96), "float16"), ((1, 4, 3, 40), "bfloat16"),
          ((3, 1, 24), "float32"), ((1, 1, 1, 7), "float32")]
if not SIMULATOR:
    SHAPES += [((4, 1000, 8, 128), "bfloat16"), ((3000, 4, 256), "float16"),
               ((2, 500, 4, 576), "bfloat16")]
TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def sylvester(n):
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def rotation(d, seed):
    """The float64 matrix M with rotate(x) = x M."""
    n = hadamard.block_size(d)
    return np.diag(hadamard.signs(d, seed)) @ np.kron(np.eye(d // n), sylvester(n)) / np.sqrt(n)


@pytest.mark.parametrize("shape, fmt", SHAPES, ids=lambda c: str(c))
def test_rotation_is_the_matrix(shape, fmt, rng):
    x = randn(rng, shape, fmt)
    out = nan_like(x)
    got = nf.hadamard_rotate(to_device(x), seed=11, out=out)
    assert got is out
    want = x.astype(np.float64) @ rotation(shape[-1], 11)
    err = np.abs(to_host(got).astype(np.float64) - want).max()
    assert err <= TOLERANCE[fmt] * max(1.0, np.abs(want).max()), err


def test_one_seed_keeps_scores_and_spreads_outliers(rng):
    """q and k rotated with one seed give the same q k^T; another seed rotates differently; a
    row whose energy sits in one channel comes out spread over the block (no element above
    1 / sqrt(n) of the row's norm, up to rounding)."""
    q, k = (randn(rng, (1, 6, 2, 64), "float32") for _ in range(2))
    q[0, 0, 0] = 0.0
    q[0, 0, 0, 5] = 100.0  # an outlier channel
    rq, rk = (to_host(nf.hadamard_rotate(to_device(x), seed=4)) for x in (q, k))
    scores = np.einsum("bshd,bthd->bhst", q.astype(np.float64), k.astype(np.float64))
    rotated = np.einsum("bshd,bthd->bhst", rq.astype(np.float64), rk.astype(np.float64))
    np.testing.assert_allclose(rotated, scores, atol=1e-3)
    assert np.abs(rq[0, 0, 0]).max() <= 100.0 / 8 * (1 + 1e-6)
    assert not np.allclose(to_host(nf.hadamard_rotate(to_device(q), seed=5)), rq)


def test_refusals_write_nothing(rng):
    x = randn(rng, (1, 4, 2, 16), "float32")
    out = nan_like(x)
    for kwargs, err, match in (
            (dict(seed=-1), ValueError, "seed"), (dict(seed=2 ** 31), ValueError, "seed"),
            (dict(seed=1.5), ValueError, "seed"), (dict(seed=True), ValueError, "seed"),
            (dict(out=nan_like(x[:, :2])), ValueError, "out")):
        with pytest.raises(err, match=match):
            nf.hadamard_rotate(to_device(x), out=kwargs.pop("out", out), **kwargs)
    with pytest.raises(ValueError, match="x: expected"):
        nf.hadamard_rotate(to_device(x[0, 0]))
    with pytest.raises(TypeError, match="x"):
        nf.hadamard_rotate(to_device(x.astype(np.float64)))
    assert np.isnan(to_host(out)).all()


def test_an_output_over_its_input_is_refused(rng):
    x = to_device(randn(rng, (1, 4, 2, 16), "float32"))
    with pytest.raises(ValueError, match="overlaps"):
        nf.hadamard_rotate(x, out=x)


def test_every_specialization_compiles_without_spills():
    assert_compiles_clean("simt.hadamard", later_samples(hadamard.SPEC))
