"""``warmup``: the kernels of a list of call configurations compiled ahead of time, by running
each call once on the smallest inputs of its shape (so exactly the kernels a real call picks are
compiled, and stored in the persistent cache, runtime/cache.py)."""

import numpy as np

from . import validate
# api first: it turns a missing CUDA runtime library, which Numba's import raises, into its
# CudaSetupError
from .api import (flash_attn_bwd, flash_attn_fwd, flash_attn_varlen_bwd, flash_attn_varlen_fwd,
                  flash_attn_with_kvcache, flash_mla_with_kvcache)
from numba import cuda  # noqa: E402
from .runtime import arrays, device
from .runtime.arrays import FLOAT_FORMATS
from .runtime.device import SIMULATOR

WARMUP_CALLS = ("flash_attn_fwd", "flash_attn_func", "flash_attn_bwd", "flash_attn_varlen_fwd",
                "flash_attn_varlen_func", "flash_attn_varlen_bwd", "flash_mla_with_kvcache",
                "flash_attn_with_kvcache")


def warmup(configs):
    """Compile ahead of time the kernels of each configuration in ``configs`` (and, with the
    persistent cache on, store them for later processes), so that no later call of that
    configuration pays a compile (``flash_attn_func`` warms the forward only: name
    ``flash_attn_bwd`` too for a training step).

    A configuration is a dict naming the ``call`` and the values that decide its kernels:
    ``head_dim``, ``dtype`` (a name, NumPy or torch dtype), ``causal`` (default False) and
    ``backend`` (default ``"auto"``) for ``flash_attn_fwd`` / ``flash_attn_func`` /
    ``flash_attn_bwd`` and their varlen forms (``flash_attn_varlen_fwd`` / ``_func`` /
    ``_bwd``, whose kernels are compiled apart; the forward ones take ``paged``, a bool, default
    False, for K and V behind a block table); for ``flash_mla_with_kvcache`` also
    ``head_dim_v``, ``s_q`` (default 1),
    ``num_heads_q`` and ``num_heads_k`` (it compiles the planner and the combine too); for
    ``flash_attn_with_kvcache`` ``s_q``, ``num_heads_q``, ``num_heads_k`` and what decides its
    kernels besides: ``paged``, ``leftpad`` (bools, default False) and ``rotary`` (None,
    ``"interleaved"`` or ``"neox"``). Each is run
    once on the smallest inputs of its shape, contiguous, on the current device, so that exactly
    the kernels a real call picks get compiled. Bad configurations raise what the call raises
    (``ValueError`` / ``TypeError`` naming the argument), or ``ValueError`` naming the key.
    """
    device.current()  # before the inputs are made: without a driver, CudaSetupError
    for i, config in enumerate(configs):
        where = f"configs[{i}]"
        if not isinstance(config, dict):
            raise TypeError(f"{where}: expected a dict, got {type(config).__name__}")
        config = dict(config)
        call = config.pop("call", None)
        if call not in WARMUP_CALLS:
            raise ValueError(f"{where}: 'call' must be one of {WARMUP_CALLS}, got {call!r}")
        fmt = _warmup_format(config.pop("dtype", None), where)
        options = dict(causal=config.pop("causal", False), backend=config.pop("backend", "auto"))
        d = validate.positive_int(config.pop("head_dim", None), f"{where}['head_dim']")
        if call == "flash_mla_with_kvcache":
            s_q = validate.positive_int(config.pop("s_q", 1), f"{where}['s_q']")
            h_q = validate.positive_int(config.pop("num_heads_q", None), f"{where}['num_heads_q']")
            h_kv = validate.positive_int(config.pop("num_heads_k", None), f"{where}['num_heads_k']")
            dv = config.pop("head_dim_v", None)
            _refuse_extra_keys(config, where)
            flash_mla_with_kvcache(_zeros((1, s_q, h_q, d), fmt), _zeros((1, 1, h_kv, d), fmt),
                                   _zeros((1, 1), "int32"), _zeros((1,), "int32"), dv, **options)
            continue
        if call == "flash_attn_with_kvcache":
            _warmup_kvcache(config, where, fmt, d, options)
            continue
        if call in ("flash_attn_varlen_fwd", "flash_attn_varlen_func") and \
                config.pop("paged", False):  # k, v one page of one row: never read
            options["block_table"] = _zeros((1, 1), "int32")
        _refuse_extra_keys(config, where)
        if call.startswith("flash_attn_varlen"):  # one empty sequence: the kernels all the same
            q = _zeros((1, 1, d), fmt)
            k, v = (_zeros((1, 1, 1, d) if "block_table" in options else (1, 1, d), fmt)
                    for _ in range(2))
            cu = _zeros((2,), "int32")
            if call == "flash_attn_varlen_bwd":
                flash_attn_varlen_bwd(_zeros((1, 1, d), fmt), q, k, v, _zeros((1, 1, d), fmt),
                                      _zeros((1, 1), "float32"), cu, cu, 1, 1, **options)
            else:
                flash_attn_varlen_fwd(q, k, v, cu, cu, 1, 1, **options)
            continue
        q, k, v = (_zeros((1, 1, 1, d), fmt) for _ in range(3))  # heads do not decide the code
        if call == "flash_attn_bwd":
            flash_attn_bwd(_zeros((1, 1, 1, d), fmt), q, k, v, _zeros((1, 1, 1, d), fmt),
                           _zeros((1, 1, 1), "float32"), **options)
        else:
            flash_attn_fwd(q, k, v, **options)


def _warmup_kvcache(config, where, fmt, d, options):
    """One step of ``flash_attn_with_kvcache`` (one new key into a one-position cache) with the
    options of ``config`` that decide its kernels."""
    s_q = validate.positive_int(config.pop("s_q", 1), f"{where}['s_q']")
    h_q = validate.positive_int(config.pop("num_heads_q", None), f"{where}['num_heads_q']")
    h_kv = validate.positive_int(config.pop("num_heads_k", None), f"{where}['num_heads_k']")
    rotary = config.pop("rotary", None)
    if rotary not in (None, "interleaved", "neox"):
        raise ValueError(f"{where}['rotary']: expected None, 'interleaved' or 'neox', got "
                         f"{rotary!r}")
    kw = {}
    if config.pop("paged", False):
        kw["block_table"] = _zeros((1, 1), "int32")
    if config.pop("leftpad", False):
        kw["cache_leftpad"] = _zeros((1,), "int32")
    if rotary:
        kw.update(rotary_cos=_zeros((1, d // 2), fmt), rotary_sin=_zeros((1, d // 2), fmt),
                  rotary_interleaved=rotary == "interleaved")
    _refuse_extra_keys(config, where)
    k, v = (_zeros((1, 1, h_kv, d), fmt) for _ in range(2))
    flash_attn_with_kvcache(_zeros((1, s_q, h_q, d), fmt), _zeros((1, 1, h_kv, d), fmt),
                            _zeros((1, 1, h_kv, d), fmt), k, v, cache_seqlens=0, **kw, **options)


def _warmup_format(dtype, where):
    fmt = str(dtype).replace("torch.", "")
    if fmt not in FLOAT_FORMATS and dtype is not None:
        try:
            fmt = np.dtype(dtype).name
        except TypeError:
            pass
    if fmt not in FLOAT_FORMATS:
        raise TypeError(f"{where}['dtype']: expected one of {FLOAT_FORMATS}, got {dtype!r}")
    return fmt


def _refuse_extra_keys(config, where):
    if config:
        raise ValueError(f"{where}: unknown keys {sorted(config)}")


def _zeros(shape, fmt):
    """Zeros on the current device (NumPy under the simulator); bfloat16 through its bits, which
    Numba's to_device does not take as ml_dtypes values."""
    host = np.zeros(shape, arrays.numpy_dtype(fmt))
    if SIMULATOR:
        return host
    if fmt == "bfloat16":
        return cuda.to_device(host.view(np.uint16)).view(host.dtype)
    return cuda.to_device(host)
