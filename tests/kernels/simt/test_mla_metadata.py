"""The device planner (kernels/simt/mla_metadata.py) against the host reference
``scheduler.plan_mla``: FlashMLA's worked cases, lengths around the block edges, length-0
requests, batches larger than the planner's shared window, many and few parts."""

import numpy as np
import pytest

import numba_flash as nf
from numba_flash import scheduler
from numba_flash.kernels.simt import mla_metadata
from helpers import SIMULATOR, assert_compiles_clean, to_device, to_host

EDGES = [0, 1, 63, 64, 65, 127, 128, 129, 4096, 4097]


def check(seqlens, q_rows, h_kv, num_sms):
    seqlens = np.asarray(seqlens, np.int32)
    metadata = nf.get_mla_metadata(to_device(seqlens), q_rows, h_kv, num_sms=num_sms)
    for got, want in zip(metadata, scheduler.plan_mla(seqlens, q_rows, h_kv, num_sms)):
        np.testing.assert_array_equal(to_host(got), want)


@pytest.mark.parametrize("seqlens, q_rows, num_sms", [
    ([4096] * 128, 128, 132),            # 66 parts, two requests each, two idle
    ([1000, 10, 0, 300], 128, 132),      # one block per piece, 43 idle parts
    ([0, 0, 5], 16, 8),                  # a part that ends on a length-0 request
    ([65537, 1, 0], 1, 132),             # one long request cut over many parts
])
def test_worked_cases(seqlens, q_rows, num_sms):
    check(seqlens, q_rows, 1, num_sms)


@pytest.mark.parametrize("num_sms, h_kv", [(1, 1), (7, 1), (132, 2), (264, 1)])
def test_random_batches(num_sms, h_kv, rng):
    for b in (1, 3, 17, 130):
        seqlens = np.where(rng.random(b) < 0.3, rng.choice(EDGES, b),
                           rng.integers(0, 20000, b)).astype(np.int32)
        check(seqlens, int(rng.choice([1, 16, 65, 128])), h_kv, num_sms)


def test_batches_longer_than_the_shared_window(rng):
    b = mla_metadata.CHUNK + 100 if SIMULATOR else 3 * mla_metadata.CHUNK + 5
    check(rng.integers(0, 300, b).astype(np.int32), 64, 1, 132)


def test_compiles_without_spills():
    assert_compiles_clean("simt.mla_metadata", [((), None)])
