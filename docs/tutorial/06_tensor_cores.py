"""Chapter 6: tensor cores from Python, mma.sync fragments, ldmatrix, and wgmma's swizzle.

The figures are drawn from the layout code the kernels and their simulator emulations run:
``kernels/ptx/model.py`` (what mma.sync and ldmatrix do, lane by lane), ``kernels/ptx/layout.py``
(``ldmatrix_a_rowcol``, ``tile_offset``, ``make_descriptor``). Then both tensor-core forwards run
(on the simulator, emulated instruction by instruction) against the float64 reference.
"""

import numpy as np

import _tutorial

BANK_GROUPS = 8  # 16-byte chunks of one 128-byte shared-memory row: 32 banks of 4 bytes


def tags(values):
    """float16 bit patterns of small integers (exact): a value that says where it came from."""
    return np.asarray(values, np.float16).view(np.uint16).astype(np.uint32)


def fragment_owners():
    """Lane and register half of every element of mma.sync's A (16x16) and C (16x8) tiles, read
    back from the NumPy model of the instruction."""
    from numba_flash.kernels.ptx import model

    lanes, halves = np.arange(32)[:, None], np.arange(8)[None, :]
    h = tags(lanes * 8 + halves)  # a0..a7 of each lane, two per 32-bit register
    a = model.warp_a_tile(h[:, 0::2] | (h[:, 1::2] << 16), "float16").astype(int)
    # C: with A = I, D = B; give B[r][c] the value 8 r + c and read which one each c_i gets.
    b = np.arange(128, dtype=np.float64).reshape(16, 8)
    c_owner = np.zeros((16, 8), int)
    c_reg = np.zeros((16, 8), int)
    for lane in range(32):
        for i, val in enumerate(model.lane_mma(np.eye(16), b, np.zeros(4), lane)):
            c_owner.flat[int(val)], c_reg.flat[int(val)] = lane, i
    return a // 8, a % 8, c_owner, c_reg


def main(argv=None):
    args = _tutorial.start(__doc__, argv)
    from numba_flash.kernels.ptx import layout, model

    # 1. mma.sync.m16n8k16: who holds what.
    a_lane, a_half, c_lane, c_reg = fragment_owners()
    print("mma.sync A fragment (16x16), lane:register-half of row 0 and row 8:")
    print("  row 0:", " ".join(f"{l}:{r}" for l, r in zip(a_lane[0], a_half[0])))
    print("  row 8:", " ".join(f"{l}:{r}" for l, r in zip(a_lane[8], a_half[8])))
    print("C fragment (16x8): lane 5 holds",
          sorted((int(r), int(c)) for r, c in zip(*np.nonzero(c_lane == 5))))

    # 2. ldmatrix.x4: lane l gives the address of one 8-element row; the warp gets the A fragment.
    rowcol = [layout.ldmatrix_a_rowcol.py_func(lane) for lane in range(32)]
    tile = tags(np.arange(256)).astype(np.uint16)  # a row-major 16x16 tile, element e = e
    offsets = np.array([16 * r + c for r, c in rowcol])
    regs = model.emulate_ldmatrix(tile, offsets, 4, False)
    loaded = model.warp_a_tile(regs, "float16")
    ldmatrix_ok = bool(np.array_equal(loaded, np.arange(256.0).reshape(16, 16)))
    print(f"ldmatrix.x4 with ldmatrix_a_rowcol addresses delivers the A fragment: {ldmatrix_ok}")

    # 3. The 128-byte swizzle: where the 16-byte chunk c of row r lands, and who conflicts.
    rows = 64
    slot = np.array([[(layout.tile_offset.py_func(r, 8 * c, rows) % layout.BLOCK_COLS) // 8
                      for c in range(8)] for r in range(8)])
    column_read = slot[:, 0]  # 8 rows of one chunk column: what ldmatrix / wgmma read together
    swizzled_ways = int(np.bincount(column_read, minlength=BANK_GROUPS).max())
    print("\n128-byte swizzle, physical chunk of (row, chunk) for rows 0-7:")
    for r in range(8):
        print(f"  row {r}: " + " ".join(str(x) for x in slot[r]))
    print(f"8 rows of chunk 0 in {len(set(column_read))} different bank groups: {swizzled_ways}-way"
          f" (unswizzled 128-byte rows: all in group 0, {BANK_GROUPS}-way)")

    # 4. The descriptor the kernels build names that layout: the hardware's view (the model's
    #    read_operand, XOR of address bits 4-6 with bits 7-9) gives the logical tile back.
    logical = np.arange(rows * 16, dtype=np.float64).reshape(rows, 16)
    flat = np.zeros(rows * layout.BLOCK_COLS, np.uint16)
    for r in range(rows):
        for c in range(16):
            flat[layout.tile_offset.py_func(r, c, rows)] = tags(logical[r, c])
    descriptor = layout.make_descriptor(lambda smem, offset: 2 * offset).py_func
    seen = model.read_operand(flat, descriptor(flat, 0, 0, layout.SBO), rows, "float16", False)
    descriptor_ok = bool(np.array_equal(seen, logical))
    print(f"wgmma K-major operand through the descriptor equals the tile stored by tile_offset: "
          f"{descriptor_ok}")

    # 5. Both tensor-core forwards: wgmma on a Hopper, mma.sync on sm_80 (planned for it).
    import numba_flash as nf
    from numba_flash import backends, reference
    from numba_flash.runtime import device

    B, S, H, D = (1, 20, 1, 16) if args.simulator else (2, 2048, 8, 128)
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((B, S, H, D)).astype(np.float16) for _ in range(3))
    ref, ref_lse = reference.attention_fwd_ref(q, k, v, True)
    results = {}
    ampere = device.Device(cc=(8, 0), sms=108, shared_per_block=163 * 1024)
    for dev in (None, ampere):  # None: the device itself
        if dev is None and tuple(device.current().cc[:2]) != (9, 0):
            continue  # wgmma exists on a Hopper only
        with device.plan_for(dev or device.current()):
            family = backends.tc_family(device.current().cc)
            out, lse = nf.flash_attn_fwd(*(_tutorial.device_array(x, args.simulator)
                                           for x in (q, k, v)), causal=True, backend="tc")
        out = _tutorial.host(out)
        results[family] = out
        print(f"tc forward, {family} family, B={B} S={S} H={H} D={D} causal: max |out - ref| = "
              f"{np.abs(out.astype(np.float64) - ref).max():.2e}")
    for name, label in (("attention_fwd.csv", "wgmma"), ("attention_fwd_52d767d_repeats3.csv",
                                                         "mma.sync")):
        rows_ = [r for r in _tutorial.read_csv(name) if r["provider"] == "nf-tc"]
        tf = [float(r["tflops"]) for r in rows_]
        print(f"nf-tc {label} forward on the H200: {min(tf):.0f}-{max(tf):.0f} TFLOP/s ({name})")

    plt = _tutorial.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.6), gridspec_kw=dict(width_ratios=(2, 1, 2)))
    for ax, owner, reg, title in ((axes[0], a_lane, a_half, "A 16x16: lane (register half)"),
                                  (axes[1], c_lane, c_reg, "C/D 16x8: lane (c_i)")):
        ax.imshow(owner, cmap="tab20b", vmin=0, vmax=31)
        for (r, c), lane in np.ndenumerate(owner):
            ax.text(c, r, f"{lane}\n{reg[r, c]}", ha="center", va="center", fontsize=6.5)
        ax.set(title=title, xlabel="column", ylabel="row", xticks=range(owner.shape[1]),
               yticks=range(16))
    ax = axes[2]
    ax.imshow(np.zeros((16, 16)), cmap="Greys", vmin=0, vmax=1)
    for lane, (r, c) in enumerate(rowcol):
        ax.add_patch(plt.Rectangle((c - 0.5, r - 0.5), 8, 1, fill=False, lw=1,
                                   color=plt.cm.tab20b(lane / 31)))
        ax.text(c + 3.5, r, f"lane {lane}", ha="center", va="center", fontsize=7)
    ax.set(title="ldmatrix.x4: the 8-element row each lane addresses",
           xlabel="column", ylabel="row", xticks=range(0, 16, 8), yticks=range(16))
    _tutorial.save(fig, args, "06_mma_fragments.png")

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    placed = np.zeros((8, 8), int)  # placed[r, physical slot] = logical chunk
    for r in range(8):
        placed[r, slot[r]] = np.arange(8)
    a1.imshow(placed, cmap="tab10", vmin=0, vmax=9)
    for (r, s), c in np.ndenumerate(placed):
        a1.text(s, r, str(c), ha="center", va="center", color="white", fontsize=10)
    a1.set(title="128-byte swizzle: logical chunk at each 16-byte slot",
           xlabel="physical 16-byte slot (banks 4s .. 4s+3)", ylabel="row (mod 8)")
    a2.bar(range(8), np.bincount(column_read, minlength=8), color="tab:blue", label="swizzled")
    a2.bar(range(8), [8] + [0] * 7, color="tab:red", alpha=0.35, label="plain 128-byte rows")
    a2.set(title="8 rows of chunk 0: accesses per bank group", xlabel="bank group",
           ylabel="accesses (= cycles)")
    a2.legend(fontsize=8)
    _tutorial.save(fig, args, "06_swizzle.png")
    return dict(a_lane=a_lane, c_lane=c_lane, ldmatrix_ok=ldmatrix_ok, descriptor_ok=descriptor_ok,
                swizzled_ways=swizzled_ways, slot=slot, q=q, k=k, v=v, ref=ref, tc=results)


if __name__ == "__main__":
    main()
