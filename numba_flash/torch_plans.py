"""Forward plans for torch tensors: what the checks and the plan of the first forward call of a
signature decided, kept so that a later call pays only for its outputs and the launch (~20 us of
host time otherwise spent re-deciding it, on a 5 us tiny forward). torch is imported only where
a plan is made, for a call that passed torch tensors: the package itself never imports it."""

import functools

from .kernels import registry
from .runtime import arrays, device
from .runtime.device import SIMULATOR
from .runtime.launcher import PreparedLaunch

_plans = {}  # key of a forward call (``key``) -> its ForwardPlan
MAX_PLANS = 256


class ForwardPlan:
    """A checked, planned forward for one signature: the kernel's launch with every number in
    place, the outputs' shapes and dtype, and the forced tile entry it was planned under (a
    tuner or test that forces another one gets a new plan)."""

    def __init__(self, spec, launch, tail, out_shape, lse_shape, dtype, ordinal):
        import torch

        self.spec, self.forced, self.launch, self.tail = spec, spec._forced, launch, tail
        self.out_shape, self.lse_shape = out_shape, lse_shape
        self.dtype, self.ordinal, self.torch = dtype, ordinal, torch

    def __call__(self, pointers):
        """``(out, lse)`` for the inputs at ``pointers`` (q, k, v), or None when the plan does
        not apply any more."""
        if self.spec._forced is not self.forced:
            return None
        torch = self.torch
        o = torch.empty(self.out_shape, dtype=self.dtype, device=self.ordinal)
        lse = torch.empty(self.lse_shape, dtype=torch.float32, device=self.ordinal)
        self.launch(torch._C._cuda_getCurrentRawStream(self.ordinal), *pointers,
                    o.data_ptr(), lse.data_ptr(), tail=self.tail(pointers))
        return o, lse


def key(q, k, v, causal, softmax_scale, backend, out, stream):
    """``(key, pointers)`` of a forward call that a plan may serve (torch CUDA tensors, no
    ``out`` or ``stream``, hashable options), else ``(None, None)``. The key holds all that the
    checks and the plan read: the signatures, the options, the device, whether the pointers are
    16-byte aligned (which decides tc against simt under ``auto``), the registry entries set
    aside."""
    if SIMULATOR or out is not None or stream is not None or type(causal) is not bool \
            or not (softmax_scale is None or type(softmax_scale) is float) \
            or type(backend) is not str:
        return None, None
    signatures = arrays.torch_signature(q), arrays.torch_signature(k), arrays.torch_signature(v)
    if None in signatures:
        return None, None
    pointers = q.data_ptr(), k.data_ptr(), v.data_ptr()
    aligned = not (pointers[0] | pointers[1] | pointers[2]) & 15
    return (signatures, causal, softmax_scale, backend, aligned, device.current(),
            registry.set_aside()), pointers


def run(key, pointers):
    """``(out, lse)`` from the plan of ``key`` for the inputs at ``pointers``, or None when
    there is none or it does not apply any more."""
    plan = _plans.get(key)
    return None if plan is None else plan(pointers)


def remember(key, spec, config, problem, dev):
    """Keep the plan of a forward that just ran for later calls of its signature."""
    if len(_plans) >= MAX_PLANS:
        _plans.clear()
    kernel, tiles = spec.compiled(config, dev)
    launch = PreparedLaunch(kernel, spec.grid(config, tiles, problem), tiles.threads,
                            tiles.shared_bytes, *spec.arguments(config, problem))
    q, lse = problem["q"], problem["lse"]
    tail = functools.partial(spec.pointer_tail, config, problem)
    _plans[key] = ForwardPlan(spec, launch, tail, q.shape, lse.shape, q.obj.dtype, q.device)
