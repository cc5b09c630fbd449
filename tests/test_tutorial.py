"""Every chapter script of docs/tutorial runs (tiny shapes under the simulator, real ones on a
GPU), writes its figures where ``--out`` says (by default to a new temporary folder, never over
the committed figures), and computes what its page says: kernels against the float64 reference
by the tolerance rule of docs/design.md, and each chapter's own claim."""

import pathlib
import runpy
import tempfile

import numpy as np
import pytest

from numba_flash import reference, scheduler
from helpers import assert_close_rule, assert_lse
from kernels._decode_cases import mla_lowp

TUTORIAL = pathlib.Path(__file__).resolve().parents[1] / "docs" / "tutorial"
FIGURES = {
    "01_standard_attention": ["01_intensity.png"],
    "02_online_softmax": ["02_online_softmax.png"],
    "03_minimal_flash": ["03_shared_memory.png"],
    "04_simt_forward": ["04_banks_and_causal_tiles.png"],
    "05_backward": ["05_recomputed_p.png"],
    "06_tensor_cores": ["06_mma_fragments.png", "06_swizzle.png"],
    "07_paged_mla": ["07_schedule.png"],
}


def run_chapter(name, out, monkeypatch):
    """``main(["--out", out])`` of docs/tutorial/<name>.py; its figures must be there after."""
    monkeypatch.syspath_prepend(str(TUTORIAL))
    result = runpy.run_path(str(TUTORIAL / f"{name}.py"))["main"](["--out", str(out)])
    check_figures(name, out)
    return result


def check_figures(name, out):
    for figure in FIGURES[name]:
        assert (out / figure).stat().st_size > 10_000, f"{figure}: missing or empty"


def test_every_script_and_figure_is_listed():
    scripts = {p.stem for p in TUTORIAL.glob("[0-9][0-9]_*.py")}
    assert scripts == set(FIGURES)
    committed = {p.name for p in (TUTORIAL / "figures").glob("*.png")}
    assert committed == {f for figures in FIGURES.values() for f in figures}


def check_forward(r, causal, fmt="float16"):
    q, k, v = r["q"], r["k"], r["v"]
    assert_close_rule(r["out"], r["ref"], reference.attention_lowp(q, k, v, causal), fmt)
    if "lse" in r:
        assert_lse(r["lse"], r["ref_lse"])


def test_01_standard_attention(tmp_path, monkeypatch):
    r = run_chapter("01_standard_attention", tmp_path, monkeypatch)
    check_forward(r, False)
    # Memory-bound: below the machine balance; the flash forward far above it.
    assert r["intensity"]["naive"][-1] < r["balance"] < r["intensity"]["flash"][-1]
    n = r["ns"][-1]
    assert r["measured"]["naive", n][0] > 100 * r["measured"]["flash", n][0]


def test_02_online_softmax(tmp_path, monkeypatch):
    r = run_chapter("02_online_softmax", tmp_path, monkeypatch)
    assert r["worst"] < 1e-12  # the invariant after every block
    alphas = [s[4] for s in r["states"]]
    assert min(alphas) < 1e-2 and max(alphas) == 1.0  # some blocks rescale, some do not
    assert r["kernel_err"] < 1e-6 and r["lse_err"] < 1e-5


def test_03_minimal_flash_by_default_leaves_the_committed_figures(tmp_path, monkeypatch):
    """The page's "Run it" line, without ``--out``: the figures go to a new folder under the
    temporary directory (here tmp_path), and the committed ones stay as they were."""
    from numba_flash.kernels.simt import forward_rowwise as rw

    committed = {p.name: p.read_bytes() for p in (TUTORIAL / "figures").glob("*.png")}
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.syspath_prepend(str(TUTORIAL))
    r = runpy.run_path(str(TUTORIAL / "03_minimal_flash.py"))["main"]([])
    (out,) = tmp_path.glob("numba_flash_tutorial_*")
    check_figures("03_minimal_flash", out)
    assert {p.name: p.read_bytes() for p in (TUTORIAL / "figures").glob("*.png")} == committed
    check_forward(r, True)
    for d, parts in r["budget"].items():
        assert sum(parts) == rw.SPEC.choose(rw.SPEC.Config(d, False, "float16"), None).shared_bytes


def test_04_simt_forward(tmp_path, monkeypatch):
    from numba_flash.kernels.simt import forward

    r = run_chapter("04_simt_forward", tmp_path, monkeypatch)
    check_forward(r, True)
    for qk, pv, row_qk, row_pv in r["traffic"].values():
        assert qk < row_qk / 2 and pv < row_pv  # micro-tiles reuse every word they read
    assert r["ways"] == {"nopad": 4, "pad": 1}
    # The causal tile map against the diagonal: tile (i, j) runs iff its first key is visible
    # to the tile's last row, and is masked iff its last key is past the tile's first row.
    bm, bn = forward.TILES[0][1]
    i, j = np.indices(r["state"].shape)
    runs = j * bn <= (i + 1) * bm - 1
    masked = runs & ((j + 1) * bn - 1 > i * bm)
    np.testing.assert_array_equal(r["state"], np.where(masked, 2, np.where(runs, 1, 0)))
    assert r["counts"]["skipped"] > 0


def test_05_backward(tmp_path, monkeypatch):
    r = run_chapter("05_backward", tmp_path, monkeypatch)
    assert r["p_err"] < 1e-5 and r["d_err"] < 1e-2
    for name, g, ref, lowp in zip(("dq", "dk", "dv"), r["grads"], r["ref"], r["lowp"]):
        assert_close_rule(g, ref, lowp, "float16", factor=3.0, what=name)
    assert r["same"] and r["differ"] > 0


def test_06_tensor_cores(tmp_path, monkeypatch):
    r = run_chapter("06_tensor_cores", tmp_path, monkeypatch)
    assert r["ldmatrix_ok"] and r["descriptor_ok"] and r["swizzled_ways"] == 1
    # Every element has one owner; each lane holds 8 of A and 4 of C; lane 0 starts at (0, 0).
    assert (np.bincount(r["a_lane"].ravel(), minlength=32) == 8).all()
    assert (np.bincount(r["c_lane"].ravel(), minlength=32) == 4).all()
    assert r["a_lane"][0, 0] == r["c_lane"][0, 0] == 0
    for row in r["slot"]:
        assert sorted(row) == list(range(8))
    assert r["tc"]  # at least one tensor-core family ran
    lowp = reference.attention_lowp(r["q"], r["k"], r["v"], True)
    for family, out in r["tc"].items():
        assert_close_rule(out, r["ref"], lowp, "float16", what=family)


@pytest.mark.slow  # it compiles for over a minute on a fresh GPU machine
def test_07_paged_mla(tmp_path, monkeypatch):
    r = run_chapter("07_paged_mla", tmp_path, monkeypatch)
    q, k_cache, table, seqlens = r["inputs"]
    assert_close_rule(r["out"], r["ref"], mla_lowp(q, k_cache, table, seqlens, r["dv"], False),
                      "float16")
    assert_lse(r["lse"], r["ref_lse"])
    assert r["combine_err"] < 1e-12 and r["n_split"] >= 2 and r["plan_same"]
    # The figure's plan covers every block of every request exactly once.
    covered = np.zeros(len(r["fig_lens"]), int)
    for row in r["fig_meta"]:
        for req, lo, hi, _, _ in scheduler.part_pieces(row, r["fig_lens"], r["fig_splits"]):
            covered[req] += hi - lo
    np.testing.assert_array_equal(covered, scheduler.num_blocks(r["fig_lens"]))
