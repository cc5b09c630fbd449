"""kernels/tc/decode_tiles.py: the shared-memory layout of the Hopper decodes, region by region,
against the sizes its docstring gives (DeepSeek's 576 / 512: 225 KiB with the reserve)."""

import pytest

from numba_flash.kernels.instructions import wgmma
from numba_flash.kernels.tc import decode_tiles


def test_deepseek_layout_is_225_kib():
    lay = decode_tiles.shared_layout(576, 512)
    assert decode_tiles.tile_cols(576, 512) == (576, 576)
    assert (lay.q, lay.k, lay.p) == (0, 64 * 576, 64 * 576 + 2 * 64 * 576)
    assert lay.bytes == 2 * (64 * 576 + 2 * 64 * 576 + 64 * 64) + wgmma.TILE_ALIGN
    assert lay.bytes == 225 * 1024


@pytest.mark.parametrize("head_dim, head_dim_v", [(576, 512), (48, 23), (64, 64), (128, 512)])
def test_the_staged_output_fits_below_p(head_dim, head_dim_v):
    """The epilogue stages O_i (float32, 64 x 2 VH) over Q and the cache tiles."""
    lay = decode_tiles.shared_layout(head_dim, head_dim_v)
    vh = decode_tiles.value_cols(head_dim_v)
    assert lay.stage == 0 and 64 * 2 * vh * 4 <= 2 * lay.p
    qw, kw = decode_tiles.tile_cols(head_dim, head_dim_v)
    assert qw % 64 == 0 and kw >= max(qw, 2 * vh) and vh % 64 == 0
