"""Dequantize on the mid-size and small shapes: cache hints and tiles, all with PDL (graph timing, bf16 out).

Variants of the production kernel's body (same arithmetic; checked bitwise against it on poisoned outputs):
streaming (``.cs``) or evict-first stores, evict-first loads of the packed bytes, and tiles of 1-8 KiB.
usage: python benchmarks/probe_dequant_hints.py [JSON]
"""
from __future__ import annotations

import json
import sys

import torch
import triton
import triton.language as tl

from fastnf4.bench.common import clone_weight, make_weight
from fastnf4.bench.harness import copy_bandwidth, rotation_count, time_graph
from fastnf4.codebooks import kernel_code
from fastnf4.ops.dequantize import kernel as K


@triton.jit
def _variant(p_packed, p_absmax, p_code, p_out, p_ncode, p_nabsmax, p_offset, n_bytes, numel, n_blocks,
             BLOCKSIZE: tl.constexpr, NESTED: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr,
             STORE: tl.constexpr, LOAD_EF: tl.constexpr, STATS: tl.constexpr = 0):
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    o_row = pid * (ROWS * COLS) + tl.arange(0, ROWS) * COLS
    o_bytes = o_row[:, None] + tl.arange(0, COLS)[None, :]
    o_blk = o_row // (BLOCKSIZE // 2)
    m_blk = o_blk < n_blocks
    if NESTED:
        if STATS == 1:
            b_q = tl.load(p_absmax + o_blk, mask=m_blk, other=0, eviction_policy="evict_first").to(tl.int32)
        elif STATS == 2:
            b_q = tl.load(p_absmax + o_blk, mask=m_blk, other=0, eviction_policy="evict_last").to(tl.int32)
        else:
            b_q = tl.load(p_absmax + o_blk, mask=m_blk, other=0).to(tl.int32)
        b_scale2 = tl.load(p_nabsmax + o_blk // 256, mask=m_blk, other=0.0)
        b_absmax = tl.load(p_ncode + b_q) * b_scale2 + tl.load(p_offset)
    else:
        if STATS == 1:
            b_absmax = tl.load(p_absmax + o_blk, mask=m_blk, other=0.0, eviction_policy="evict_first")
        elif STATS == 2:
            b_absmax = tl.load(p_absmax + o_blk, mask=m_blk, other=0.0, eviction_policy="evict_last")
        else:
            b_absmax = tl.load(p_absmax + o_blk, mask=m_blk, other=0.0)
    if LOAD_EF == 1:
        b_packed = tl.load(p_packed + o_bytes, mask=o_bytes < n_bytes, other=0, eviction_policy="evict_first")
    elif LOAD_EF == 2:
        b_packed = tl.load(p_packed + o_bytes, mask=o_bytes < n_bytes, other=0, cache_modifier=".cg",
                           eviction_policy="evict_first")
    elif LOAD_EF == 3:
        b_packed = tl.load(p_packed + o_bytes, mask=o_bytes < n_bytes, other=0, cache_modifier=".cg")
    elif LOAD_EF == 4:
        b_packed = tl.load(p_packed + o_bytes, mask=o_bytes < n_bytes, other=0, cache_modifier=".cs")
    else:
        b_packed = tl.load(p_packed + o_bytes, mask=o_bytes < n_bytes, other=0)
    b_hi = tl.load(p_code + (b_packed >> 4).to(tl.int32)) * b_absmax[:, None]
    b_lo = tl.load(p_code + (b_packed & 15).to(tl.int32)) * b_absmax[:, None]
    b_val = tl.reshape(tl.join(b_hi, b_lo), (ROWS, 2 * COLS))
    o_out = 2 * o_row[:, None] + tl.arange(0, 2 * COLS)[None, :]
    v = b_val.to(p_out.dtype.element_ty)
    if STORE == 1:
        tl.store(p_out + o_out, v, mask=o_out < numel, cache_modifier=".cs")
    elif STORE == 2:
        tl.store(p_out + o_out, v, mask=o_out < numel, eviction_policy="evict_first")
    elif STORE == 3:
        tl.store(p_out + o_out, v, mask=o_out < numel, cache_modifier=".cs", eviction_policy="evict_first")
    elif STORE == 4:
        tl.store(p_out + o_out, v, mask=o_out < numel, cache_modifier=".wt")
    elif STORE == 5:
        tl.store(p_out + o_out, v, mask=o_out < numel, cache_modifier=".cg")
    else:
        tl.store(p_out + o_out, v, mask=o_out < numel)


VARIANTS = {  # name: (tile bytes, warps, store, load, statistics loads)
    "cs+ef_1k2": (1024, 2, 1, 1, 0),
    "cs+cs_1k2": (1024, 2, 1, 4, 0),
    "cs+ef+sEF": (1024, 2, 1, 1, 1),
    "cs+ef+sEL": (1024, 2, 1, 1, 2),
    "cs+cs+sEL": (1024, 2, 1, 4, 2),
    "ef+ef+sEL": (1024, 2, 2, 1, 2),
}
SHAPES = [(8192, 5120), (10240, 5120), (8192, 5376), (2048, 5376), (1024, 5120), (25600, 5120)]


def main() -> None:
    copy = copy_bandwidth()
    rows = []
    for (n, k) in SHAPES:
        for nested in (False, True):
            q, _ = make_weight(n, k, nested, 64, seed=n + k)
            moved = q.nbytes() + q.numel * 2
            reps = rotation_count(moved)
            qs = [q] + [clone_weight(q) for _ in range(reps - 1)]
            outs = [torch.empty(q.numel, dtype=torch.bfloat16, device="cuda") for _ in range(reps)]
            code = kernel_code("nf4", q.device)
            ref = torch.empty_like(outs[0])
            K.Prepared(q.packed_u8, q.absmax, code, 64, q.numel, q.nested_code, q.nested_absmax, q.offset)(ref)
            n_bytes = (q.numel + 1) // 2
            row = dict(N=n, K=k, nested=nested, bytes=moved)
            line = f"{n:6d}x{k:<6d} n{int(nested)} {moved / 1e6:5.0f} MB"
            prod = [K.Prepared(w.packed_u8, w.absmax, code, 64, w.numel, w.nested_code, w.nested_absmax, w.offset)
                    for w in qs]
            t = time_graph([lambda i=i: prod[i](outs[i]) for i in range(reps)])
            row["prod_pct"] = 100 * moved / t["median_us"] / 1e3 / copy["GBps"]
            line += f" prod {row['prod_pct']:5.1f}"
            for name, (tile, warps, store, ld_ef, stats) in VARIANTS.items():
                cols = 32
                grid = (triton.cdiv(n_bytes, tile),)

                def call(i, tile=tile, warps=warps, store=store, ld_ef=ld_ef, stats=stats, grid=grid):
                    w = qs[i]
                    nc = w.nested_code if nested else code
                    _variant[grid](w.packed_u8, w.absmax, code, outs[i], nc, w.nested_absmax if nested else w.absmax,
                                   w.offset if nested else code, n_bytes, w.numel, w.absmax.numel(),
                                   BLOCKSIZE=64, NESTED=nested, ROWS=tile // cols, COLS=cols, STORE=store,
                                   LOAD_EF=ld_ef, STATS=stats, num_warps=warps, enable_fp_fusion=False, launch_pdl=True)

                outs[0].fill_(float("nan"))
                try:
                    call(0)
                except Exception as e:  # noqa: BLE001 - a hint combination ptxas rejects
                    line += f" {name} ({type(e).__name__})"
                    continue
                ok = torch.equal(outs[0].view(torch.int16), ref.view(torch.int16))
                t = time_graph([lambda i=i: call(i) for i in range(reps)])
                pct = 100 * moved / t["median_us"] / 1e3 / copy["GBps"]
                row[f"{name}_pct"], row[f"{name}_ok"] = pct, ok
                line += f" {name} {pct:5.1f}{'' if ok else '!'}"
            rows.append(row)
            print(line, flush=True)
            del qs, outs, prod
            torch.cuda.empty_cache()
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({"copy": copy, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
