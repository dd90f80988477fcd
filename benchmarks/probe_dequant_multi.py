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
from dequant_probe_case import SHAPES, Case, write_json

from fastnf4.bench.harness import copy_bandwidth


@triton.jit
def _load(p_packed, p_absmax, p_ncode, p_nabsmax, p_offset, o_row, n_bytes, n_blocks, live,
          BLOCKSIZE: tl.constexpr, NESTED: tl.constexpr, COLS: tl.constexpr):
    o_bytes = o_row[:, None] + tl.arange(0, COLS)[None, :]
    o_blk = o_row // (BLOCKSIZE // 2)
    m_blk = (o_blk < n_blocks) & live
    if NESTED:
        b_q = tl.load(p_absmax + o_blk, mask=m_blk, other=0).to(tl.int32)
        b_scale2 = tl.load(p_nabsmax + o_blk // 256, mask=m_blk, other=0.0)
        b_absmax = tl.load(p_ncode + b_q) * b_scale2 + tl.load(p_offset)
    else:
        b_absmax = tl.load(p_absmax + o_blk, mask=m_blk, other=0.0)
    b_packed = tl.load(p_packed + o_bytes, mask=(o_bytes < n_bytes) & live, other=0, eviction_policy="evict_first")
    return b_packed, b_absmax


@triton.jit
def _decode_store(p_code, p_out, b_packed, b_absmax, o_row, numel, ROWS: tl.constexpr, COLS: tl.constexpr):
    b_hi = tl.load(p_code + (b_packed >> 4).to(tl.int32)) * b_absmax[:, None]
    b_lo = tl.load(p_code + (b_packed & 15).to(tl.int32)) * b_absmax[:, None]
    b_val = tl.reshape(tl.join(b_hi, b_lo), (ROWS, 2 * COLS))
    o_out = 2 * o_row[:, None] + tl.arange(0, 2 * COLS)[None, :]
    tl.store(p_out + o_out, b_val.to(p_out.dtype.element_ty), mask=o_out < numel, cache_modifier=".cs")


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
    a_packed, a_absmax = _load(p_packed, p_absmax, p_ncode, p_nabsmax, p_offset, o_row, n_bytes, n_blocks, True,
                               BLOCKSIZE, NESTED, COLS)
    if DEPTH == 2:
        b_packed, b_absmax = _load(p_packed, p_absmax, p_ncode, p_nabsmax, p_offset, o_row + STEP, n_bytes,
                                   n_blocks, T > 1, BLOCKSIZE, NESTED, COLS)
    for t in tl.static_range(T):
        if DEPTH == 1:
            n_packed, n_absmax = _load(p_packed, p_absmax, p_ncode, p_nabsmax, p_offset, o_row + STEP, n_bytes,
                                       n_blocks, t + 1 < T, BLOCKSIZE, NESTED, COLS)
        else:
            n_packed, n_absmax = _load(p_packed, p_absmax, p_ncode, p_nabsmax, p_offset, o_row + 2 * STEP,
                                       n_bytes, n_blocks, t + 2 < T, BLOCKSIZE, NESTED, COLS)
        _decode_store(p_code, p_out, a_packed, a_absmax, o_row, numel, ROWS, COLS)
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
    copy = copy_bandwidth()
    print(f"copy {copy['GBps']:.0f} GB/s", flush=True)
    rows = []
    for (n, k) in SHAPES:
        for nested in (False, True):
            c = Case(n, k, nested)
            row, line = dict(N=n, K=k, nested=nested, bytes=c.moved), c.label()
            for rnd in range(2):
                row[f"prod_us_{rnd}"] = us = c.time_us(lambda i: c.prod[i](c.outs[i]))
                line += f" | prod {c.pct(us, copy):5.1f}"
                for name, (tile, tiles, depth, warps) in VARIANTS.items():
                    def call(i, tile=tile, tiles=tiles, depth=depth, warps=warps):
                        c.launch(_multi, i, tile * tiles, warps, rows=tile // 32, T=tiles, DEPTH=depth)

                    row[f"{name}_ok"] = ok = c.exact(lambda: call(0))
                    row[f"{name}_us_{rnd}"] = us = c.time_us(call)
                    line += f" {name} {c.pct(us, copy):5.1f}{'' if ok else '!'}"
            rows.append(row)
            print(line, flush=True)
            c.close()
    write_json(rows, copy)


if __name__ == "__main__":
    main()
