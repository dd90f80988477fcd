"""Where the dequantize signals its dependents, and what a same-traffic PyTorch kernel reaches in the same timing.

``griddepcontrol.launch_dependents`` lets the next PDL grid be scheduled once every program of this one has called
it *or exited*. The production kernel calls it at the start of every program, which doubles the block-launch cost
(0.61 -> 1.21 ns per block, ``probe_dequant_bound.py --launch``); never calling it loses the early launch of the
next grid. Here only the programs of the last ``W`` (the grid's tail) call it, so most programs launch at the
cheap rate and the next grid is still put on the GPU while this one drains.
  trig_W: the production body, ``launch_dependents`` only where ``pid >= programs - W``
  cast:   PyTorch's uint8 -> float32 cast of the packed bytes: reads ``n`` bytes and writes ``4 n``, the
          dequantize's traffic without its statistics, through PyTorch's vectorized elementwise kernel
Same timing as ``bench dequant`` (graph of 20 calls, copies rotated past L2), % of the same run's copy bandwidth
counting the dequantize's bytes (also for ``cast``, which moves slightly fewer).
usage: python benchmarks/probe_dequant_trigger.py [JSON]
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from dequant_probe_case import decode_store, load_tile, sweep, write_json


@triton.jit
def _tail_trigger(p_packed, p_absmax, p_code, p_out, p_ncode, p_nabsmax, p_offset, n_bytes, numel, n_blocks,
                  trig_from, BLOCKSIZE: tl.constexpr, NESTED: tl.constexpr, ROWS: tl.constexpr,
                  COLS: tl.constexpr):
    tl.extra.cuda.gdc_wait()
    pid = tl.program_id(0)
    if pid >= trig_from:
        tl.extra.cuda.gdc_launch_dependents()
    o_row = pid * (ROWS * COLS) + tl.arange(0, ROWS) * COLS
    b_packed, b_absmax = load_tile(p_packed, p_absmax, p_ncode, p_nabsmax, p_offset, o_row, n_bytes, n_blocks,
                                   True, BLOCKSIZE, NESTED, COLS)
    decode_store(p_code, p_out, b_packed, b_absmax, o_row, numel, ROWS, COLS)


def _trig(window: int):
    def launch(c, i):
        programs = triton.cdiv(c.n_bytes, 1024)
        c.launch(_tail_trigger, i, 1024, 2, trig_from=max(programs - window, 0))
    return launch


def _cast(c, i):
    w = c.qs[i]
    c.outs[i].view(-1)[: 2 * c.n_bytes].view(torch.float32).copy_(w.packed_u8.view(-1))


# 132 SMs x 32 two-warp programs = one full wave of resident programs; then 8, 2 per SM; 0 = nobody triggers
VARIANTS = {"trig_4224": _trig(4224), "trig_1056": _trig(1056), "trig_264": _trig(264), "trig_0": _trig(0),
            "cast": _cast}

if __name__ == "__main__":
    rows, copy = sweep(VARIANTS, exact={"trig_4224", "trig_1056", "trig_264", "trig_0"})
    write_json(rows, copy, variants=list(VARIANTS))
