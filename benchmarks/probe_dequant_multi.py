"""Dequantize with several tiles per program, the next tile's loads issued before the current tile is decoded.

probe_dequant_bound.py found that an *empty* kernel with the production grid (one 1 KiB tile per 2-warp program)
already costs 82-87% of the k/v shapes' budget and 97-99% of the mid shapes' in ``bench dequant``'s timing,
while a store-only kernel with 4 KiB tiles has room to spare: the number of programs is a cost of its own.
Bigger tiles in one step need more registers (fewer resident warps), so here a program walks T consecutive
1 KiB tiles, and its loads run DEPTH tiles ahead of the decode (register double buffering written out).
Same arithmetic as the production kernel; checked bitwise against it on poisoned outputs.
usage: python benchmarks/probe_dequant_multi.py [JSON]
"""
from __future__ import annotations

import triton
import triton.language as tl
from dequant_probe_case import decode_store, load_tile, sweep, write_json


@triton.jit
def _multi(p_packed, p_absmax, p_code, p_out, p_ncode, p_nabsmax, p_offset, n_bytes, numel, n_blocks,
           BLOCKSIZE: tl.constexpr, NESTED: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr,
           T: tl.constexpr, DEPTH: tl.constexpr, PDL: tl.constexpr = True):
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    o_row = pid * (T * ROWS * COLS) + tl.arange(0, ROWS) * COLS
    STEP: tl.constexpr = ROWS * COLS
    a_packed, a_absmax = load_tile(p_packed, p_absmax, p_ncode, p_nabsmax, p_offset, o_row, n_bytes, n_blocks, True,
                                   BLOCKSIZE, NESTED, COLS)
    if DEPTH == 2:
        b_packed, b_absmax = load_tile(p_packed, p_absmax, p_ncode, p_nabsmax, p_offset, o_row + STEP, n_bytes,
                                       n_blocks, T > 1, BLOCKSIZE, NESTED, COLS)
    for t in tl.static_range(T):
        if DEPTH == 1:
            n_packed, n_absmax = load_tile(p_packed, p_absmax, p_ncode, p_nabsmax, p_offset, o_row + STEP,
                                           n_bytes, n_blocks, t + 1 < T, BLOCKSIZE, NESTED, COLS)
        else:
            n_packed, n_absmax = load_tile(p_packed, p_absmax, p_ncode, p_nabsmax, p_offset, o_row + 2 * STEP,
                                           n_bytes, n_blocks, t + 2 < T, BLOCKSIZE, NESTED, COLS)
        decode_store(p_code, p_out, a_packed, a_absmax, o_row, numel, ROWS, COLS)
        o_row += STEP
        if DEPTH == 1:
            a_packed, a_absmax = n_packed, n_absmax
        else:
            a_packed, a_absmax = b_packed, b_absmax
            b_packed, b_absmax = n_packed, n_absmax


VARIANTS = {  # name: (packed bytes per tile, tiles per program, depth, warps)
    "t2": (1024, 2, 1, 2), "t4": (1024, 4, 1, 2), "t8": (1024, 8, 1, 2), "t4d2": (1024, 4, 2, 2),
    "t8d2": (1024, 8, 2, 2), "t4w4": (2048, 4, 1, 4), "t16": (1024, 16, 1, 2),
}


def main() -> None:
    write_json(*sweep({name: (lambda c, i, tile=tile, tiles=tiles, depth=depth, warps=warps:
                              c.launch(_multi, i, tile * tiles, warps, rows=tile // 32, T=tiles, DEPTH=depth))
                       for name, (tile, tiles, depth, warps) in VARIANTS.items()}))


if __name__ == "__main__":
    main()
