"""The problem a call poses, as its validation found it: one description that the registry
chooses a kernel by and that each kernel's spec derives its compile-time options from.

``Attention`` is a forward or backward call (a dense batch, or packed sequences behind varlen
offsets; the paged K/V, the masks, the score modifiers and the FP8 descales are its optional
fields), ``Decode`` a paged decode: FlashMLA's, or, with V in a cache of its own, the attention
of ``flash_attn_with_kvcache``. Both hold the adapted arrays (``arrays.Tensor``) and the checked numbers; the sizes
every consumer reads are properties of the arrays, so nothing is stored twice.

An optional field left at ``None`` is off, and an option that is off costs nothing: the kernels
of a problem without it are the plain ones. A field set to anything else is an option, and
``options()`` names the options a problem carries; the registry gives such a problem only to a
kernel that declares it honours every one (``registry.Entry.honours``). A new option is
therefore one field here, one check in ``validate.py``, and the kernels that honour it.
"""

from typing import NamedTuple, Optional

from ..runtime.arrays import Tensor, rows_16_byte_aligned


class Attention(NamedTuple):
    """One attention call: q (B, Sq, Hq, D), k and v (B, Sk, Hk, D), the softmax scale and
    causality (bottom-right), and the options below. Varlen: q, k, v are the packed rows seen as
    (B, total, H, D) with a batch stride of 0 (``arrays.batched``), each sequence's rows found
    from ``cu_seqlens_q`` / ``cu_seqlens_k`` (and ``seqused_k``) by the kernels; ``max_seqlen``
    holds the bounds the grids are sized by."""

    q: Tensor
    k: Tensor
    v: Tensor
    scale: float
    causal: bool
    window: Optional[tuple] = None        # (left, right) keys around the diagonal
    softcap: Optional[float] = None       # scores through softcap * tanh(s / softcap)
    alibi_slopes: Optional[Tensor] = None  # (Hq,) or (B, Hq) float32
    sink: Optional[Tensor] = None         # (Hq,) learned logit added to every row's sum
    cu_seqlens_q: Optional[Tensor] = None  # (B + 1,) int32 offsets of packed sequences
    cu_seqlens_k: Optional[Tensor] = None
    block_table: Optional[Tensor] = None  # (B, pages) int32: K and V in pages
    descale: Optional[tuple] = None       # FP8: (q, k, v) float32 descales per (B, Hk)
    seqused_k: Optional[Tensor] = None    # (B,) int32: the keys each sequence uses
    max_seqlen: Optional[tuple] = None    # varlen: (max_seqlen_q, max_seqlen_k)
    out_fmt: Optional[str] = None         # FP8: the output's 16-bit format

    OPTIONS = ("window", "softcap", "alibi_slopes", "sink", "cu_seqlens_q", "cu_seqlens_k",
               "block_table", "descale", "seqused_k")

    def options(self):
        """The options this problem carries (the names of its fields that are not None)."""
        return frozenset(name for name in self.OPTIONS if getattr(self, name) is not None)

    @property
    def fmt(self):
        return self.q.fmt

    @property
    def head_dim(self):
        return self.q.shape[3]

    def aligned(self, *others):
        """Whether q, k, v (and ``others``) may be copied in 16-byte chunks of their rows, as
        the tensor-core kernels copy them."""
        return rows_16_byte_aligned(self.q, self.k, self.v, *others)


class Decode(NamedTuple):
    """One paged decode: q (b, s_q, h_q, d), the cache (pages, page_size, h_kv, d) whose first
    ``head_dim_v`` columns are V (MLA) unless ``v_cache`` holds V, the block table and lengths,
    the tile scheduler's plan (None when the call plans itself), the scale and causality (for
    s_q > 1), and the options below."""

    q: Tensor
    k_cache: Tensor
    block_table: Tensor
    cache_seqlens: Tensor
    head_dim_v: int
    scale: float
    causal: bool
    metadata: Optional[Tensor] = None
    num_splits: Optional[Tensor] = None
    indices: Optional[Tensor] = None      # sparse attention: the cache slots each query reads
    attn_sink: Optional[Tensor] = None    # (h_q,) learned logit added to every row's sum
    fp8_cache: Optional[bool] = None      # the cache holds FP8 values with their scales
    v_cache: Optional[Tensor] = None      # V's own cache, shaped like k_cache (ordinary attention)
    key_start: Optional[Tensor] = None    # (b,) int32: cache position of each sequence's key 0
    window: Optional[tuple] = None        # (left, right) keys around each token's diagonal
    softcap: Optional[float] = None       # scores through softcap * tanh(s / softcap)
    alibi_slopes: Optional[Tensor] = None  # (b, h_q) float32
    cache_descale: Optional[tuple] = None  # float8_e4m3fn caches: (k_descale, v_descale) (b, h_kv)

    OPTIONS = ("indices", "attn_sink", "fp8_cache", "v_cache", "key_start", "window", "softcap",
               "alibi_slopes", "cache_descale")
    options, fmt, head_dim = Attention.options, Attention.fmt, Attention.head_dim  # q's, as there

    @property
    def q_rows(self):
        """The packed query rows of one kv head: s_q * h_q / h_kv."""
        _, s_q, h_q, _ = self.q.shape
        return s_q * (h_q // self.k_cache.shape[2])

    @property
    def masked(self):
        """Causal with more than one query token (one token sees every key anyway)."""
        return self.causal and self.q.shape[1] > 1

    @property
    def page(self):
        return self.k_cache.shape[1]

    @property
    def cache_aligned(self):
        """Whether cache rows may be copied in 16-byte chunks (FP8 ones: of 16 elements, which
        the head dims must then be multiples of)."""
        if self.cache_descale is not None and (self.head_dim % 16 or self.head_dim_v % 16):
            return False
        if self.v_cache is not None:
            return rows_16_byte_aligned(self.k_cache, self.v_cache)
        return rows_16_byte_aligned(self.k_cache)

    @property
    def aligned(self):
        """Whether q and the cache rows may be copied in 16-byte chunks."""
        return rows_16_byte_aligned(self.k_cache, self.q)
