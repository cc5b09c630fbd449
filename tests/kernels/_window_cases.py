"""The mask and score-modifier cases every forward family runs (simt/test_forward.py,
tc/test_forward.py, tc/test_forward_wgmma.py) against the float64 reference written from
flash-attn's definitions: sliding windows, (B, Sq, Sk, Hq, Hk, D, causal, fmt, window_size),
masked by ``reference.window_mask``; softcaps, (B, Sq, Sk, Hq, Hk, D, causal, fmt, softcap,
scale), the inputs times ``scale`` so that the cap bites (large logits: tanh saturates); ALiBi
and learnable sinks, alone and with the others (``modifier_options``)."""

import numpy as np

from helpers import SIMULATOR

CASES_SIM = [
    (1, 20, 33, 2, 1, 16, False, "float16", (4, 2)),     # both sides, Sk > Sq, GQA
    (1, 33, 9, 1, 1, 16, True, "bfloat16", (3, -1)),     # causal + left; rows that see no key
    (1, 5, 70, 1, 1, 16, False, "float16", (10, -1)),    # left only: the first tiles skipped
    (1, 7, 7, 1, 1, 16, False, "bfloat16", (0, 0)),      # the diagonal alone
    (1, 6, 6, 1, 1, 16, False, "float16", (100, 100)),   # wider than the sequence: no window
    (1, 9, 40, 1, 1, 16, False, "bfloat16", (-1, 3)),    # right only, not causal
]
CASES_GPU = [
    (2, 1000, 1000, 8, 2, 64, True, "bfloat16", (256, -1)),
    (1, 777, 1531, 4, 4, 128, False, "float16", (100, 50)),
    (1, 4096, 4096, 2, 1, 128, True, "float16", (1024, 0)),
    (1, 300, 300, 2, 1, 256, False, "bfloat16", (0, 0)),
]
CASES = CASES_SIM if SIMULATOR else CASES_GPU


def case_id(case):
    return "-".join(map(str, case[:-1])) + f"-w{case[-1][0]},{case[-1][1]}"


SOFTCAP_CASES_SIM = [
    (1, 20, 33, 2, 1, 16, True, "bfloat16", 5.0, 1.0),
    (1, 9, 40, 1, 1, 16, False, "float16", 2.0, 4.0),    # logits ~ 16x the cap
]
SOFTCAP_CASES_GPU = [
    (2, 1000, 1000, 8, 2, 64, True, "bfloat16", 30.0, 4.0),
    (1, 777, 1531, 4, 4, 128, False, "float16", 50.0, 1.0),
]
SOFTCAP_CASES = SOFTCAP_CASES_SIM if SIMULATOR else SOFTCAP_CASES_GPU


def softcap_id(case):
    return "-".join(map(str, case[:-2])) + f"-cap{case[-2]}x{case[-1]}"


# ALiBi and sinks, (B, Sq, Sk, Hq, Hk, D, causal, fmt, options): ``modifier_options`` draws
# the slopes ((Hq,), or (B, Hq) with "batched") and the sinks; "all" adds a window and a cap.
MODIFIER_CASES_SIM = [
    (2, 20, 33, 2, 1, 16, False, "float16", "alibi"),
    (2, 33, 20, 2, 2, 16, True, "bfloat16", "alibi batched"),  # Sq > Sk: distances both ways
    (1, 9, 40, 2, 1, 16, False, "bfloat16", "sink"),
    (1, 33, 9, 1, 1, 16, True, "float16", "sink"),  # rows that see no key: out 0, lse = sink
    (1, 20, 45, 2, 1, 16, True, "bfloat16", "all"),
]
MODIFIER_CASES_GPU = [
    (2, 1000, 1000, 8, 2, 64, True, "bfloat16", "alibi"),
    (2, 777, 1531, 4, 4, 128, False, "float16", "alibi batched"),
    (1, 1531, 777, 4, 1, 128, True, "bfloat16", "sink"),
    (1, 1000, 1000, 8, 2, 128, True, "float16", "all"),
]
MODIFIER_CASES = MODIFIER_CASES_SIM if SIMULATOR else MODIFIER_CASES_GPU


def modifier_id(case):
    return "-".join(map(str, case[:-1])) + "-" + case[-1].replace(" ", "-")


def modifier_options(rng, case):
    """The keyword arguments of ``case``'s options (host float32 arrays), as flash-attn takes
    them: slopes like ALiBi's geometric ones (up to 0.5, one of them 0), sinks around the
    scores' own size."""
    B, Hq, name = case[0], case[3], case[-1]
    options = {}
    if "alibi" in name or name == "all":
        shape = (B, Hq) if "batched" in name else (Hq,)
        slopes = (0.5 ** rng.integers(1, 8, shape)).astype(np.float32)
        slopes.reshape(-1)[0] = 0.0
        options["alibi_slopes"] = slopes
    if "sink" in name or name == "all":
        options["learnable_sink"] = (2 * rng.standard_normal(Hq)).astype(np.float32)
    if name == "all":
        options.update(window_size=(7, 3), softcap=4.0)
    return options
