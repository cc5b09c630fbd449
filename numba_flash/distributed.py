"""Context parallelism: attention over a sequence split across the ranks of a
``torch.distributed`` group, with numba_flash's forward and backward as the per-block kernels.

    from numba_flash.distributed import ring_flash_attn_func
    out = ring_flash_attn_func(q, k, v, causal=True)   # q, k, v: this rank's shard, (B, S, H, D)

The idea (ring attention). Each rank holds a shard of the sequence: its queries and its keys and
values. Attention of the local queries against the whole sequence is the merge of their
attention against each rank's K/V block, and a merge needs only each part's output and its lse:

    lse = log(sum_b exp(lse_b)),    out = sum_b exp(lse_b - lse) out_b

(the chapter's split-KV combine, ``kernels/simt/combine.py``, here in fp32 torch). So the K/V
blocks travel around the ring: at step s rank r holds the block of rank ``r - s``, computes its
local queries against it with ``api.flash_attn_fwd`` (which returns lse) while the next block is
already on its way (``torch.distributed.batch_isend_irecv`` started before the kernels; NCCL runs
it on its own stream, gloo in its own threads), and merges. After W steps every rank holds its
queries' attention over the whole sequence.

The backward needs no merge: given the merged ``out`` and ``lse``, ``flash_attn_bwd`` of one block
yields that block's exact share of dq, dk and dv (P = exp(S - lse) is the global probability,
D_i = rowsum(dO * O) the global one). dq stays on the rank; the sum of dK/dV of a block travels
around the ring one step behind the block, each rank adding its share, and arrives back at the
owner after W steps (one more hop than the K/V, which need not return); it too is in flight
while the next step's kernels run.

Positions. A rank's shard is ``layout="contiguous"`` (rank r holds chunk r of W) or
``layout="zigzag"`` (chunks r and 2W - 1 - r of 2W, concatenated: causal work is then the same on
every rank, since early chunks see few keys and late ones many). Each (query chunk, key chunk)
pair is a band of visible offsets ``j - i`` between ``Q0 - K0 - left`` and ``Q0 - K0 + right``
(global starts Q0, K0; causal is right = 0); ``band_call`` turns it into the rows and keys that
can see each other and the (left, right) window of flash-attn's bottom-right convention that
masks the rest. Pairs with no visible key are skipped, whole: under causal masking a rank
computes only the chunks at or before its own.

Packed sequences (``llama3_flash_attn_varlen_func``, the Llama 3 recipe that
ring-flash-attention also follows). A rank holds an equal, contiguous run of the packed token
stream, which cuts sequences anywhere; K/V are all-gathered (every rank then holds every key)
and one ``flash_attn_varlen_fwd`` computes the local queries: each local piece of a sequence
attends the sequence's keys from its first up to the piece's last query (causal; bottom-right
alignment then puts every query at its global position), its key range given by the sequence's
start in ``cu_seqlens_k`` and its length in ``seqused_k``. The backward's dK/dV of the gathered
keys are summed back onto their owners (reduce-scatter; all-reduce on gloo, which has none).

Limits: q, k, v on one device per rank, the same shapes on every rank (S even for zigzag); GQA
(Hk dividing Hq); any dtype the kernels take. The merge and the dq/dk/dv sums are fp32. Import
this module explicitly: it imports torch (the package itself does not).
"""

import torch
import torch.distributed as dist

from . import api

LAYOUTS = ("zigzag", "contiguous")


def chunks(rank, world, seqlen, layout):
    """[(local start, global start, length)] of the chunks of rank ``rank``'s shard of ``seqlen``
    local rows."""
    if layout == "contiguous":
        return [(0, rank * seqlen, seqlen)]
    c = seqlen // 2
    return [(0, rank * c, c), (c, (2 * world - 1 - rank) * c, c)]


def band_call(q0, sq, k0, sk, left, right):
    """The block of queries at global rows ``q0 .. q0 + sq`` against keys at ``k0 .. k0 + sk``,
    where query i sees key j iff ``-left <= (k0 + j) - (q0 + i) <= right`` (-1: unbounded), as a
    flash-attn call: ``(rows, keys, (left', right'))`` with ``rows``, ``keys`` the (start, end)
    ranges that see something and the window in flash-attn's bottom-right convention over those
    ranges (``(-1, 0)``: causal), or None when no pair is visible."""
    lo = q0 - k0 - left if left >= 0 else None    # j - i >= lo
    hi = q0 - k0 + right if right >= 0 else None  # j - i <= hi
    ka = 0 if lo is None else max(0, lo)
    kb = sk if hi is None else min(sk, hi + sq)
    if ka >= kb:
        return None
    qa = 0 if hi is None else max(0, ka - hi)
    qb = sq if lo is None else min(sq, kb - lo)
    if qa >= qb:
        return None
    rows, keys = qb - qa, kb - ka
    diag = keys - rows
    # Over the ranges, j' - i' lies in [lo - ka + qa, hi - ka + qa]; flash-attn's window is
    # relative to the bottom-right diagonal. A side that binds no pair is unbounded.
    new_left = -1 if lo is None else diag - (lo - ka + qa)
    new_right = -1 if hi is None else (hi - ka + qa) - diag
    if new_left >= rows - 1 + diag:
        new_left = -1
    if new_right >= keys - 1 - diag:
        new_right = -1
    return (qa, qb), (ka, kb), (new_left, new_right)


def _blocks(rank, src, world, sq, sk, left, right, layout):
    """The flash-attn calls of rank ``rank``'s queries against rank ``src``'s keys:
    [(query rows, key rows, window)] in local coordinates of the two shards."""
    calls = []
    for qs, q0, qn in chunks(rank, world, sq, layout):
        for ks, k0, kn in chunks(src, world, sk, layout):
            call = band_call(q0, qn, k0, kn, left, right)
            if call is not None:
                (qa, qb), (ka, kb), window = call
                calls.append(((qs + qa, qs + qb), (ks + ka, ks + kb), window))
    return calls


def _flash_args(window):
    """(causal, window_size) of a block's flash-attn call: causal where the window is exactly
    the causal one, so the plain causal kernel runs."""
    return (True, (-1, -1)) if window == (-1, 0) else (False, window)


class _Ring:
    """The ring of a process group: this rank, its neighbours' global ranks, the world size."""

    def __init__(self, group):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.world) \
            if group is not None else (self.rank + 1) % self.world
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.world) \
            if group is not None else (self.rank - 1) % self.world

    def pass_on(self, tensors):
        """Start sending ``tensors`` to the next rank and receiving as many from the previous
        one: ``(received, requests)``; the requests' ``wait`` completes both. Both sides are
        contiguous (NCCL sends and receives only those): a shard that is a strided view is
        sent as a copy."""
        received = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in tensors]
        ops = [dist.P2POp(dist.isend, t.contiguous(), self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, r, self.prev, self.group) for r in received]
        return received, dist.batch_isend_irecv(ops)


def _wait(requests):
    for r in requests:
        r.wait()


def _merge(out, lse, rows, o, l):
    """Merge a block's (o, l) into the fp32 accumulators over ``rows``. A row that saw no key
    has l = +inf (the kernels' marker): no weight."""
    a, b = rows
    l = torch.where(torch.isinf(l) & (l > 0), torch.full_like(l, float("-inf")), l)
    old = lse[:, :, a:b]
    new = torch.logaddexp(old, l)
    keep = torch.where(torch.isneginf(new), torch.zeros_like(new), torch.exp(old - new))
    take = torch.where(torch.isneginf(new), torch.zeros_like(new), torch.exp(l - new))
    out[:, a:b] = out[:, a:b] * keep.transpose(1, 2)[..., None] \
        + o.float() * take.transpose(1, 2)[..., None]
    lse[:, :, a:b] = new


def ring_forward(q, k, v, scale, left, right, ring, layout, backend="auto"):
    """``(out, lse)`` of the local queries against the whole sequence (fp32 merge; out in q's
    dtype, lse +inf where a row saw no key)."""
    b, sq, h, d = q.shape
    out = torch.zeros((b, sq, h, d), dtype=torch.float32, device=q.device)
    lse = torch.full((b, h, sq), float("-inf"), dtype=torch.float32, device=q.device)
    kv = (k, v)
    for step in range(ring.world):
        if step + 1 < ring.world:
            following, requests = ring.pass_on(kv)  # the next block travels during the kernels
        src = (ring.rank - step) % ring.world
        for (qa, qb), (ka, kb), window in _blocks(ring.rank, src, ring.world, sq, k.shape[1],
                                                  left, right, layout):
            causal, window = _flash_args(window)
            o, l = api.flash_attn_fwd(q[:, qa:qb], kv[0][:, ka:kb], kv[1][:, ka:kb],
                                      causal=causal, softmax_scale=scale, window_size=window,
                                      backend=backend)
            _merge(out, lse, (qa, qb), o, l)
        if step + 1 < ring.world:
            _wait(requests)
            kv = following
    lse = torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)
    return out.to(q.dtype), lse


def ring_backward(dout, q, k, v, out, lse, scale, left, right, ring, layout, backend="auto"):
    """``(dq, dk, dv)`` of this rank's shard: dq from every block against the local queries,
    dk and dv summed around the ring (fp32 sums, returned in the inputs' dtype).

    The sum of a block's dK/dV travels one rank per step, and never waits for the kernels: step
    s computes its block's share into a buffer of its own while the sum of the ranks before
    arrives, adds the two, and sends the result on during step s + 1's kernels. After the last
    step the sum of each rank's own block arrives at it."""
    sq, sk = q.shape[1], k.shape[1]
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kv, partial = (k, v), None  # partial: (received sums, their requests) from the last step
    for step in range(ring.world):
        if step + 1 < ring.world:
            following, requests = ring.pass_on(kv)
        src = (ring.rank - step) % ring.world
        dk = torch.zeros(k.shape, dtype=torch.float32, device=q.device)
        dv = torch.zeros(v.shape, dtype=torch.float32, device=q.device)
        for (qa, qb), (ka, kb), window in _blocks(ring.rank, src, ring.world, sq, sk, left,
                                                  right, layout):
            causal, window = _flash_args(window)
            g = api.flash_attn_bwd(dout[:, qa:qb], q[:, qa:qb], kv[0][:, ka:kb],
                                   kv[1][:, ka:kb], out[:, qa:qb],
                                   lse[:, :, qa:qb].contiguous(), causal=causal,
                                   softmax_scale=scale, window_size=window, backend=backend)
            dq[:, qa:qb] += g[0].float()
            dk[:, ka:kb] += g[1].float()
            dv[:, ka:kb] += g[2].float()
        if partial is not None:  # the ranks before this one added their shares of the block
            _wait(partial[1])
            dk += partial[0][0]
            dv += partial[0][1]
        if ring.world > 1:
            partial = ring.pass_on((dk, dv))
        if step + 1 < ring.world:
            _wait(requests)
            kv = following
    if partial is not None:
        _wait(partial[1])
        dk, dv = partial[0]
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, left, right, group, layout):
        ring = _Ring(group)
        out, lse = ring_forward(q, k, v, scale, left, right, ring, layout)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (scale, left, right, ring, layout)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(dout.contiguous(), q, k, v, out, lse, *ctx.args)
        return dq, dk, dv, None, None, None, None, None


def ring_flash_attn_func(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1),
                         group=None, layout="zigzag"):
    """Attention of this rank's shard of the queries over the whole sequence, whose shards the
    ranks of ``group`` (default: the world) hold; differentiable (torch autograd).

    q: (B, S, Hq, D), k, v: (B, S, Hk, D), this rank's rows of the sequence as ``layout`` deals
    them out (module docstring); ``causal``, ``softmax_scale`` and ``window_size`` as in
    ``flash_attn_func``, over global positions. Returns out (B, S, Hq, D) in q's dtype."""
    from . import validate

    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("group: ring_flash_attn_func needs an initialised torch.distributed "
                         "process group (torch.distributed.init_process_group)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name}: expected a 4-D torch tensor (B, S, H, D), got "
                             f"{getattr(t, 'shape', type(t).__name__)}")
    if k.shape[:2] != q.shape[:2] or v.shape != k.shape:
        raise ValueError(f"k, v: expected the shard's rows of q, {tuple(q.shape[:2])}, and one "
                         f"shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if layout == "zigzag" and q.shape[1] % 2:
        raise ValueError(f"q: the zigzag layout holds two chunks of equal length per rank, got "
                         f"{q.shape[1]} rows")
    # Every local check before the first message: a refusal on one rank must not leave the
    # others waiting for its K/V.
    validate.attention(q.detach(), k.detach(), v.detach(), causal, softmax_scale, window_size)
    left, right = (int(x) for x in window_size)
    if causal:
        right = 0
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    return _RingAttention.apply(q, k, v, scale, left, right, group, layout)


# ----------------------------------------------------------------------------- packed sequences

def local_pieces(cu_seqlens, start, end, causal):
    """The pieces of the packed sequences (``cu_seqlens``, a list) that rows ``start .. end``
    of the token stream hold, as a varlen call over those rows against all keys:
    ``(cu_q, cu_k, seqused_k, max_q, max_k)``, cu_q local to the rows. A piece of sequence
    ``[a, b)`` holding queries ``[qa, qb)`` sees keys ``a .. qb`` (causal) or ``a .. b``."""
    cu_q, cu_k, used = [0], [], []
    for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:]):
        qa, qb = max(a, start), min(b, end)
        if qa >= qb:
            continue
        cu_q.append(qb - start)
        cu_k.append(a)
        used.append((qb if causal else b) - a)
    cu_k.append(cu_seqlens[-1])
    max_q = max(b - a for a, b in zip(cu_q[:-1], cu_q[1:]))
    return cu_q, cu_k, used, max_q, max(used)


def _gather(t, group, world):
    parts = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for _ in range(world)]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.cat(parts, 0)


def _sum_back(t, group, world, rank):
    """The sum over ranks of ``t`` (the gathered rows' gradients), this rank's rows of it."""
    rows = t.shape[0] // world
    if dist.get_backend(group) == "gloo":
        dist.all_reduce(t, group=group)
        return t[rank * rows:(rank + 1) * rows]
    out = torch.empty_like(t[:rows])
    dist.reduce_scatter_tensor(out, t.contiguous(), group=group)
    return out


class _GatheredAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, pieces, scale, window, causal, group):
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        cu_q, cu_k, used, max_q, max_k = pieces
        dev = q.device
        calls = dict(cu_seqlens_q=torch.tensor(cu_q, dtype=torch.int32, device=dev),
                     cu_seqlens_k=torch.tensor(cu_k, dtype=torch.int32, device=dev),
                     max_seqlen_q=max_q, max_seqlen_k=max_k,
                     seqused_k=torch.tensor(used, dtype=torch.int32, device=dev))
        k_all, v_all = _gather(k, group, world), _gather(v, group, world)
        out, lse = api.flash_attn_varlen_fwd(q, k_all, v_all, softmax_scale=scale,
                                             causal=causal, window_size=window, **calls)
        ctx.save_for_backward(q, k_all, v_all, out, lse)
        ctx.args = (calls, scale, causal, window, group, world, rank)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k_all, v_all, out, lse = ctx.saved_tensors
        calls, scale, causal, window, group, world, rank = ctx.args
        # Keys no piece reads get no gradient from the kernel: the buffers start at zero.
        dk, dv = torch.zeros_like(k_all), torch.zeros_like(v_all)
        dq, dk, dv = api.flash_attn_varlen_bwd(
            dout.contiguous(), q, k_all, v_all, out, lse, softmax_scale=scale, causal=causal,
            window_size=window, dk=dk, dv=dv, **{n: calls[n] for n in (
                "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "seqused_k")})
        dk = _sum_back(dk.float(), group, world, rank).to(k_all.dtype)
        dv = _sum_back(dv.float(), group, world, rank).to(v_all.dtype)
        return dq, dk, dv, None, None, None, None, None


def llama3_flash_attn_varlen_func(q, k, v, cu_seqlens, causal=True, softmax_scale=None,
                                  window_size=(-1, -1), group=None):
    """Attention over packed sequences whose token stream the ranks of ``group`` split in equal
    contiguous runs (module docstring, "Packed sequences"); differentiable.

    q: (T / W, Hq, D), k, v: (T / W, Hk, D), this rank's rows of the stream; ``cu_seqlens``:
    the whole stream's (B + 1,) offsets, the same on every rank (a list, or an int32 tensor that
    is read on the host), ending at T. ``window_size`` only with ``causal``: a piece sees its
    sequence's keys up to its last query, so the window's bottom-right alignment is the global
    one only then. Returns out (T / W, Hq, D) in q's dtype."""
    from . import validate

    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("group: llama3_flash_attn_varlen_func needs an initialised "
                         "torch.distributed process group")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    cu = [int(x) for x in (cu_seqlens.tolist() if hasattr(cu_seqlens, "tolist")
                           else cu_seqlens)]
    rows = q.shape[0]
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != rows * world or \
            any(b < a for a, b in zip(cu[:-1], cu[1:])):
        raise ValueError(f"cu_seqlens: expected offsets from 0 up to the stream's {rows * world} "
                         f"tokens ({world} ranks of {rows}), got {cu}")
    if tuple(window_size) != (-1, -1) and not causal:
        raise ValueError("window_size: a window needs causal=True here (a piece sees its "
                         "sequence's keys up to its last query)")
    validate.attention(q.detach()[None], k.detach()[None], v.detach()[None], causal,
                       softmax_scale, window_size)
    pieces = local_pieces(cu, rank * rows, (rank + 1) * rows, causal)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    return _GatheredAttention.apply(q, k, v, pieces, scale, tuple(window_size), causal, group)
