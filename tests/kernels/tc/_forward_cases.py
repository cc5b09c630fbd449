"""What both tc forward kernels (forward_mma.py, forward_wgmma.py) are tested on: (B, Sq, Sk, Hq, Hk,
D, causal, fmt) cases and checks of the online softmax and the epilogue; test_forward.py and
test_forward_wgmma.py run them with their kernel selected."""

import numpy as np

from helpers import (DTYPES, SIMULATOR, assert_close_rule, assert_lse, check_forward, nan_like,
                     randn, to_device, to_host)

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


def planned_for_family(family):
    """A ``device.plan_for`` block in which the tc backend runs ``family``'s kernel ("mma" or
    "wgmma"): the real device (or the simulator's) with the compute capability that family
    rule gives it; a Hopper runs the mma.sync kernel compiled for sm_80."""
    import dataclasses

    from numba_flash.runtime import device

    cc = (9, 0) if family == "wgmma" else (8, 0)
    return device.plan_for(dataclasses.replace(device.current(), cc=cc))


def check_large_logits(rng):
    """Scores around 8x the usual scale: exp2 of the differences stays finite."""
    B, S, H, D = (1, 9, 1, 16) if SIMULATOR else (1, 600, 2, 64)
    check_forward(rng, B, S, S, H, H, D, True, "bfloat16", backend="tc",
                  scale=8.0, softmax_scale=1.0)


def check_growing_row_maxima(rng, causal):
    """Scores that rise from key tile to key tile by far more than the lazy-rescale threshold
    (2^8 in P): m_i must move, and O_i and l_i be rescaled, on every tile; and a last tile that
    falls back leaves them alone."""
    import numba_flash as nf
    from numba_flash import reference as ref

    Sq, Sk, D = (5, 140, 16) if SIMULATOR else (300, 1000, 64)
    fmt = "float16"
    q = np.abs(randn(rng, (1, Sq, 1, D), fmt)) + DTYPES[fmt](1)
    ramp = np.linspace(0.0, 12.0, Sk)  # the score of key j grows ~ j: 12 * sum(q) at the end
    ramp[-Sk // 8:] = 0.0
    k = (randn(rng, (1, Sk, 1, D), fmt, 0.1) + ramp[None, :, None, None]).astype(DTYPES[fmt])
    v = randn(rng, (1, Sk, 1, D), fmt)
    out = nan_like(q)
    o, lse = nf.flash_attn_fwd(to_device(q), to_device(k), to_device(v), causal=causal,
                               softmax_scale=1.0 / D, backend="tc", out=out)
    ro, rl = ref.attention_fwd_ref(q, k, v, causal, 1.0 / D)
    assert_close_rule(o, ro, ref.attention_lowp(q, k, v, causal, 1.0 / D), fmt)
    assert_lse(lse, rl)


def check_output_view_off_16_byte_alignment(rng):
    """The epilogue stores 16-byte chunks of output rows where the rows are 16-byte aligned
    (every other test) and each chunk as eight 16-bit stores where they are not: here an
    ``out=`` view starting 8 bytes into each row of a wider buffer. The columns outside the view
    stay untouched."""
    import numba_flash as nf
    from numba_flash import reference as ref

    offset = 4
    B, S, H, D = (1, 6, 1, 16) if SIMULATOR else (2, 300, 4, 64)
    fmt = "float16"
    q, k, v = (randn(rng, (B, S, H, D), fmt) for _ in range(3))
    wide = nan_like(np.empty((B, S, H, D + 8), DTYPES[fmt]))
    o, lse = nf.flash_attn_fwd(to_device(q), to_device(k), to_device(v), backend="tc",
                               out=wide[..., offset:offset + D])
    ro, rl = ref.attention_fwd_ref(q, k, v, False, None)
    assert_close_rule(o, ro, ref.attention_lowp(q, k, v, False, None), fmt)
    assert_lse(lse, rl)
    host = to_host(wide).astype(np.float32)
    assert np.isnan(host[..., :offset]).all() and np.isnan(host[..., offset + D:]).all()
