"""(B, Sq, Sk, Hq, Hk, D, causal, fmt) cases both tc forward kernels are tested on."""

from helpers import SIMULATOR

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
