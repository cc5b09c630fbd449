"""Shared-memory layouts: one description per kernel, read by its spec and by its factory.

A kernel's dynamic shared memory is one array cut into regions (Q tile, K/V buffers, P tile,
scratch). ``SharedLayout`` lays named regions out one after another, in the element the kernel
indexes them with (``unit`` bytes: 2 for 16-bit tiles, 4 for float32 words), and answers both
questions asked of it: where each region starts (the factory's offsets, closed over as
compile-time constants, so they cost no instruction) and how many bytes a launch must ask for
(the spec's ``Tiles.shared_bytes``). A region may also lie over earlier ones (``over=``: a buffer
reused once its first contents are dead), which the layout checks fits.

The tensor-core kernels add a reserve of bytes (``reserve``) for aligning the base of their
tiles at run time (``wgmma.aligned_base``): the dynamic array starts only 16-byte aligned.
"""


class SharedLayout:
    """Regions of a dynamic shared array, in ``unit``-byte elements.

    ``SharedLayout(2, [("q", 4096), ("k", 8192)], reserve=1024)``: ``layout.q == 0``,
    ``layout.k == 4096``, ``layout.elements == 12288``, ``layout.bytes == 2 * 12288 + 1024``.
    A region given as ``(name, size, over)`` starts at region ``over`` and must end inside the
    regions laid out so far; it adds nothing to the size.
    """

    def __init__(self, unit, regions, reserve=0):
        self.unit, self.reserve = unit, reserve
        self.offsets, self.sizes, end = {}, {}, 0
        for name, size, *over in regions:
            if name in self.offsets:
                raise ValueError(f"region {name!r} laid out twice")
            if over:
                start = self.offsets[over[0]]
                if start + size > end:
                    raise ValueError(f"region {name!r} ({size}) does not fit over {over[0]!r}")
            else:
                start, end = end, end + size
            self.offsets[name], self.sizes[name] = start, size
        self.elements = end

    def __getattr__(self, name):
        try:
            return self.__dict__["offsets"][name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def bytes(self):
        """Dynamic shared memory a launch asks for: the regions and the alignment reserve."""
        return self.unit * self.elements + self.reserve
