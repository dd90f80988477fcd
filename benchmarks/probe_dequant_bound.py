"""What the dequantize's bench timing allows on the small and mid shapes: kernels that do part of its work.

Every kernel here has the production kernel's grid, tile and launch (2 warps, 1 KiB of packed bytes per program,
PDL with ``gdc_wait`` first), and each row is timed as ``bench dequant`` times it (``time_graph``: 20 calls per
graph, buffers rotated past L2). All percentages count the *dequantize's* bytes (packed + statistics + output)
against the copy bandwidth of the same run, so a kernel that does less than the dequantize and still stays under
a target shows that the target cannot be met by a dequantize timed this way.
  empty:   gdc_wait + launch_dependents, nothing else (launch and block scheduling of the grid)
  write:   the output tile stored (zeros, ``.cs``) with no load at all
  read:    packed bytes and statistics loaded, nothing stored (a store behind a never-true test keeps the loads)
  prod:    the production launch (``K.Prepared``)
  trig_end / no_trig: the production body with ``launch_dependents`` after the stores, or never called
  write_4k: the output stored by 4 KiB-of-packed tiles at 4 warps
``--launch`` times only the empty kernel at several grid sizes, with and without PDL (the fixed cost of one call
in this timing).
usage: python benchmarks/probe_dequant_bound.py [--launch] [JSON]
"""
from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl
from dequant_probe_case import decode_store, load_tile, sweep, write_json

from fastnf4.bench.harness import time_graph


@triton.jit
def _part(p_packed, p_absmax, p_code, p_out, p_ncode, p_nabsmax, p_offset, n_bytes, numel, n_blocks,
          BLOCKSIZE: tl.constexpr, NESTED: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr,
          MODE: tl.constexpr, TRIG: tl.constexpr):
    # MODE 0 empty, 1 write, 2 read, 3 the full dequantize; TRIG 0 at the start, 1 after the stores, 2 never
    tl.extra.cuda.gdc_wait()
    if TRIG == 0:
        tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    o_row = pid * (ROWS * COLS) + tl.arange(0, ROWS) * COLS
    o_out = 2 * o_row[:, None] + tl.arange(0, 2 * COLS)[None, :]
    if MODE == 1:
        tl.store(p_out + o_out, tl.zeros((ROWS, 2 * COLS), p_out.dtype.element_ty), mask=o_out < numel,
                 cache_modifier=".cs")
    if MODE >= 2:
        b_packed, b_absmax = load_tile(p_packed, p_absmax, p_ncode, p_nabsmax, p_offset, o_row, n_bytes, n_blocks,
                                       True, BLOCKSIZE, NESTED, COLS)
        if MODE == 2:
            s = tl.sum(tl.sum(b_packed.to(tl.int32), 1) + b_absmax.to(tl.int32), 0)
            if s == -12345:  # never: the packed sum is >= 0 and |absmax| < 2^31 for these weights
                tl.store(p_out + pid, s.to(p_out.dtype.element_ty))
        else:
            decode_store(p_code, p_out, b_packed, b_absmax, o_row, numel, ROWS, COLS)
    if TRIG == 1:
        tl.extra.cuda.gdc_launch_dependents()


VARIANTS = {  # name: (mode, trigger, packed bytes per program, warps)
    "empty": (0, 0, 1024, 2), "write": (1, 0, 1024, 2), "write_4k": (1, 0, 4096, 4), "read": (2, 0, 1024, 2),
    "full": (3, 0, 1024, 2), "trig_end": (3, 1, 1024, 2), "no_trig": (3, 2, 1024, 2),
    "full_2k4": (3, 0, 2048, 4), "full_2k2": (3, 0, 2048, 2), "full_4k8": (3, 0, 4096, 8), "full_4k4": (3, 0, 4096, 4),
}


@triton.jit
def _empty(p, WAIT: tl.constexpr, TRIG: tl.constexpr):
    if WAIT:
        tl.extra.cuda.gdc_wait()
    if TRIG:
        tl.extra.cuda.gdc_launch_dependents()


def launch_costs() -> list:
    """Per-call microseconds of an empty kernel, 20 per graph, for grids of 1 to 104k two-warp programs."""
    buf = torch.empty(16, device="cuda")
    rows = []
    kinds = {"plain": (False, False, False), "pdl_launch": (True, False, False), "wait": (True, True, False),
             "trig": (True, False, True), "wait_trig": (True, True, True)}  # (launch_pdl, gdc_wait, trigger)
    for warps in (2, 4, 8):
        for grid in (1, 132, 2560, 5120, 20480, 104000):
            row = dict(grid=grid, warps=warps)
            line = f"empty kernel, {warps} warps, grid {grid:6d}:"
            for name, (pdl, wait, trig) in kinds.items():
                t = time_graph([lambda: _empty[(grid,)](buf, WAIT=wait, TRIG=trig, num_warps=warps, launch_pdl=pdl)])
                row[f"{name}_us"] = t["median_us"]
                line += f" {name} {t['median_us']:7.2f}"
            rows.append(row)
            print(line + " us", flush=True)
    return rows


def main() -> None:
    if "--launch" in sys.argv:
        sys.argv.remove("--launch")
        write_json([], None, empty_kernel=launch_costs())
        return
    rows, copy = sweep({name: (lambda c, i, mode=mode, trig=trig, tile=tile, warps=warps:
                               c.launch(_part, i, tile, warps, MODE=mode, TRIG=trig))
                        for name, (mode, trig, tile, warps) in VARIANTS.items()},
                       exact={name for name, v in VARIANTS.items() if v[0] == 3},
                       note="; % of copy counting the dequantize's bytes")
    write_json(rows, copy)


if __name__ == "__main__":
    main()
