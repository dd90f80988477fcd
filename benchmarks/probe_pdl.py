"""Where the dequantize kernel's fixed cost goes, per model shape (graph timing, bf16 out, H200).

For every shape, double quant off and on, in one run:
  * ``fastnf4``       the production kernel
  * ``fastnf4_pdl``   the same kernel launched with programmatic dependent launch (``gdc_wait`` first)
  * ``nodecode``      the same grid, tiles, statistics reads and stores, no table lookup (code = nibble)
  * ``nodecode_pdl``  that with PDL
  * ``fill``          ``out.fill_`` alone: only the output bytes (80% of the dequantize traffic) written
All as % of the 2 GiB copy bandwidth, counting the dequantize's bytes (packed + statistics + output), so the
``nodecode`` and ``fill`` columns are ceilings for any kernel that has to move those bytes.

usage: python benchmarks/probe_pdl.py [JSON]
"""
from __future__ import annotations

import json
import sys

import torch
import triton
import triton.language as tl

import fastnf4
from fastnf4.bench.common import clone_weight, make_weight
from fastnf4.bench.harness import copy_bandwidth, environment, model_shapes, rotation_count, time_graph
from fastnf4.ops.dequantize import kernel as K


@triton.jit
def _nodecode(p_packed, p_absmax, p_out, n_bytes, numel, n_blocks,
              BLOCKSIZE: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    o_row = pid * (ROWS * COLS) + tl.arange(0, ROWS) * COLS
    o_bytes = o_row[:, None] + tl.arange(0, COLS)[None, :]
    o_blk = o_row // (BLOCKSIZE // 2)
    b_absmax = tl.load(p_absmax + o_blk, mask=o_blk < n_blocks, other=0.0)
    b_packed = tl.load(p_packed + o_bytes, mask=o_bytes < n_bytes, other=0)
    b_hi = (b_packed >> 4).to(tl.float32) * b_absmax[:, None]
    b_lo = (b_packed & 15).to(tl.float32) * b_absmax[:, None]
    b_val = tl.reshape(tl.join(b_hi, b_lo), (ROWS, 2 * COLS))
    o_out = 2 * o_row[:, None] + tl.arange(0, 2 * COLS)[None, :]
    tl.store(p_out + o_out, b_val.to(p_out.dtype.element_ty), mask=o_out < numel)


def _prepared(q, pdl: bool) -> K.Prepared:
    code = fastnf4.codebooks.kernel_code("nf4", q.device)
    return K.Prepared(q.packed_u8, q.absmax, code, q.blocksize, q.numel, q.nested_code, q.nested_absmax, q.offset,
                      pdl=pdl)


def main() -> None:
    copy = copy_bandwidth()
    dtype = torch.bfloat16
    seen, rows = set(), []
    for model, layer, n, k in model_shapes():
        if (n, k) in seen:
            continue
        seen.add((n, k))
        for nested in (False, True):
            q, _ = make_weight(n, k, nested, 64, seed=len(rows))
            moved = q.nbytes() + q.numel * 2
            reps = rotation_count(moved)
            qs = [q] + [clone_weight(q) for _ in range(reps - 1)]
            outs = [torch.empty(q.shape, dtype=dtype, device="cuda") for _ in range(reps)]
            plain = [_prepared(w, False) for w in qs]
            pdl = [_prepared(w, True) for w in qs]
            # correctness: PDL launch bitwise equal to the plain one, poisoned outputs
            ref = torch.full(q.shape, float("nan"), dtype=dtype, device="cuda")
            plain[0](ref.view(-1))
            outs[0].fill_(float("nan"))
            pdl[0](outs[0].view(-1))
            same = bool(torch.equal(ref.view(torch.int16), outs[0].view(torch.int16)))
            del ref
            n_bytes = (q.numel + 1) // 2
            rows_, cols_ = K.TILE_BYTES // 32, 32
            grid = (triton.cdiv(n_bytes, K.TILE_BYTES),)
            absf = [torch.rand(w.absmax.numel(), device="cuda") for w in qs]

            def nodecode(i, flag):
                _nodecode[grid](qs[i].packed_u8, absf[i], outs[i], n_bytes, q.numel, absf[i].numel(),
                                BLOCKSIZE=64, ROWS=rows_, COLS=cols_, PDL=flag, num_warps=K.NUM_WARPS,
                                **({"launch_pdl": True} if flag else {}))

            t = {
                "fastnf4": time_graph([lambda i=i: plain[i](outs[i].view(-1)) for i in range(reps)]),
                "fastnf4_pdl": time_graph([lambda i=i: pdl[i](outs[i].view(-1)) for i in range(reps)]),
                "nodecode": time_graph([lambda i=i: nodecode(i, False) for i in range(reps)]),
                "nodecode_pdl": time_graph([lambda i=i: nodecode(i, True) for i in range(reps)]),
                "fill": time_graph([lambda i=i: outs[i].fill_(1.0) for i in range(reps)]),
            }
            row = dict(model=model, layer=layer, N=n, K=k, nested=nested, bytes=moved, pdl_bitwise_equal=same)
            for name, v in t.items():
                row[f"{name}_us"] = v["median_us"]
                row[f"{name}_pct"] = 100 * moved / v["median_us"] / 1e3 / copy["GBps"]
            rows.append(row)
            print(f"{model[:6]:6} {layer[:8]:8} {n:6d}x{k:<6d} n{int(nested)} {moved / 1e6:6.0f} MB eq={int(same)} "
                  + " ".join(f"{name} {row[name + '_pct']:5.1f}%" for name in t), flush=True)
            del qs, outs, plain, pdl, absf
            torch.cuda.empty_cache()
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({"env": environment(), "copy": copy, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
