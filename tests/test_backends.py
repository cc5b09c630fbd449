"""backends.py: the backend a call asked for, resolved on its device and inputs, and the kernels
the registry gives it (tensor-core family by compute capability, the 16-byte rule of the
tensor-core forward and backward)."""

import dataclasses

import numpy as np
import pytest

from numba_flash import backends
from numba_flash.kernels.simt import backward as simt_backward
from numba_flash.kernels.simt import forward as simt_forward
from numba_flash.kernels.problem import Attention
from numba_flash.kernels.tc import backward_wgmma, forward_mma, forward_wgmma_ws
from numba_flash.runtime import arrays
from numba_flash.runtime.device import SIMULATED

from helpers import to_device

AMPERE = dataclasses.replace(SIMULATED, cc=(8, 0), sms=108, shared_per_block=163 * 1024)
TURING = dataclasses.replace(SIMULATED, cc=(7, 5))


def adapted(shape, offset=0, name="q"):
    """A float16 (B, S, H, D) view ``offset`` elements into rows one element wider when offset
    is 1 (its rows then start 2 bytes off 16)."""
    wide = to_device(np.zeros(shape[:-1] + (shape[-1] + offset,), np.float16))
    return arrays.adapt(wide[..., offset:], name)


def problem(q, k, v):
    return Attention(q, k, v, 0.125, False)


@pytest.fixture
def on_a_gpu(monkeypatch):
    """The rule as on a GPU: the simulator, which emulates the tensor cores, takes them on any
    device it plays."""
    monkeypatch.setattr(backends, "SIMULATOR", False)


def test_auto_takes_the_tensor_cores_for_16_bit_inputs_from_compute_capability_8(on_a_gpu):
    for fmt in ("float16", "bfloat16"):
        assert backends.resolve_backend("auto", fmt, AMPERE) == "tc"
        assert backends.resolve_backend("auto", fmt, TURING) == "simt"
    assert backends.resolve_backend("auto", "float32", SIMULATED) == "simt"
    assert backends.resolve_backend("simt", "float16", SIMULATED) == "simt"


@pytest.mark.parametrize("backend, fmt, dev, words", [
    ("tc", "float32", SIMULATED, "float16 or bfloat16"),
    ("tc", "float16", TURING, "compute capability >= 8.0"),
    ("cuda", "float16", SIMULATED, "expected one of"),
])
def test_a_backend_that_cannot_run_is_refused_with_the_reason(backend, fmt, dev, words,
                                                             on_a_gpu):
    with pytest.raises(ValueError, match=words):
        backends.resolve_backend(backend, fmt, dev)


def test_hopper_runs_the_wgmma_forward_and_every_other_gpu_the_mma_one():
    assert backends.tc_family((9, 0)) == "wgmma"
    assert {backends.tc_family(cc) for cc in ((8, 0), (8, 6), (8, 9), (10, 0), (12, 0))} == {"mma"}
    assert backends.forward_spec("tc", SIMULATED) is forward_wgmma_ws.SPEC
    assert backends.forward_spec("tc", AMPERE) is forward_mma.SPEC


def test_views_off_16_bytes_take_the_cuda_cores_under_auto_and_are_refused_under_tc():
    shape = (1, 8, 2, 64)
    q, k, v = adapted(shape), adapted(shape, name="k"), adapted(shape, name="v")
    assert backends.forward("auto", problem(q, k, v), SIMULATED) is forward_wgmma_ws.SPEC
    skewed = adapted(shape, offset=1)
    assert backends.forward("auto", problem(skewed, k, v), SIMULATED) is simt_forward.SPEC
    with pytest.raises(ValueError, match="'tc' forward copies q, k and v in 16-byte chunks"):
        backends.forward("tc", problem(skewed, k, v), SIMULATED)


def test_the_backward_checks_out_only_where_its_dq_kernel_copies_it():
    """The wgmma dQ kernel computes D_i from ``out`` (copied in 16-byte chunks); a skewed
    ``out`` sends ``auto`` to the CUDA-core pair, and ``tc`` names every array it copies."""
    shape = (1, 8, 2, 64)
    q, k, v, dout = (adapted(shape, name=n) for n in ("q", "k", "v", "dout"))
    out = adapted(shape, name="out")
    pair = (backward_wgmma.DKDV, backward_wgmma.DQ)
    assert backward_wgmma.DQ.writes_delta
    assert backends.backward("auto", problem(q, k, v), dout, out, SIMULATED) == pair
    skewed = adapted(shape, offset=1, name="out")
    assert backends.backward("auto", problem(q, k, v), dout, skewed, SIMULATED) == (
        simt_backward.DKDV, simt_backward.DQ)
    with pytest.raises(ValueError, match="'tc' backward copies q, k, v, dout and out"):
        backends.backward("tc", problem(q, k, v), dout, skewed, SIMULATED)
