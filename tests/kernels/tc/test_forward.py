"""Tensor-core forward against the float64 reference (simulator: emulated mma.sync, tiny shapes)."""

import numpy as np
import pytest

from helpers import SIMULATOR, assert_compiles_clean, check_forward

CASES_SIM = [
    (1, 5, 7, 2, 1, 16, False, "float16"),
    (1, 20, 33, 2, 1, 24, True, "bfloat16"),    # ragged tiles, padded head dim (24 -> 32)
    (1, 33, 9, 1, 1, 8, True, "float16"),       # Sq > Sk: rows with no key; Q spans two warps
    (1, 3, 70, 1, 1, 40, False, "bfloat16"),    # Sk spans two KV tiles: the double buffer turns
]
CASES_GPU = [
    (2, 1000, 1000, 8, 2, 64, False, "float16"),
    (2, 1000, 1000, 8, 2, 64, True, "bfloat16"),
    (1, 777, 1531, 4, 4, 128, True, "float16"),
    (1, 1531, 777, 4, 1, 128, True, "bfloat16"),
    (3, 257, 513, 6, 3, 72, False, "bfloat16"),
    (1, 300, 300, 2, 1, 256, True, "float16"),
    (1, 1, 4097, 2, 2, 96, False, "float16"),
    (1, 129, 129, 2, 2, 8, True, "bfloat16"),
    (1, 4096, 4096, 2, 1, 200, True, "float16"),
]
CASES = CASES_SIM if SIMULATOR else CASES_GPU


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_forward_matches_reference(case):
    check_forward(np.random.default_rng(), *case, backend="tc")


def test_large_logits_stay_finite():
    B, S, H, D = (1, 9, 1, 16) if SIMULATOR else (1, 600, 2, 64)
    check_forward(np.random.default_rng(), B, S, S, H, H, D, True, "bfloat16", backend="tc",
                  scale=8.0, softmax_scale=1.0)


def test_every_specialization_compiles_to_mma_without_spills():
    configs = [("tc", d, causal, fmt) for d in (64, 128, 256) for causal in (False, True)
               for fmt in ("float16", "bfloat16")] + [("tc", 8, True, "float16")]
    assert_compiles_clean("numba_flash.launch:forward_spec", configs,
                          must_contain=("mma.sync.aligned.m16n8k16", "ldmatrix", "cp.async"))
