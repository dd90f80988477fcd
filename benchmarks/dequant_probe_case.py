"""Shared set-up of the dequantize probes (probe_dequant_*.py): one weight shape, copies rotated past L2 as
``bench dequant`` rotates them, bf16 outputs, the production kernel's result and launches, and a launcher for a
probe's kernel variant with the production kernel's argument list. Imported by the probes (run from the repository
root as ``python benchmarks/probe_....py``), not by the package."""
from __future__ import annotations

import json
import sys

import torch
import triton
import triton.language as tl

from fastnf4.bench.common import clone_weight, make_weight
from fastnf4.bench.harness import copy_bandwidth, environment, rotation_count, time_graph
from fastnf4.codebooks import kernel_code
from fastnf4.ops.dequantize import kernel as K

# Qwen k/v, Llama k/v, Gemma k/v, Gemma q, Qwen q, Gemma qkv, Qwen qkv, Qwen gate+up
SHAPES = [(1024, 5120), (1024, 8192), (2048, 5376), (4096, 5376), (8192, 5120), (8192, 5376), (10240, 5120),
          (25600, 5120)]


@triton.jit
def load_tile(p_packed, p_absmax, p_ncode, p_nabsmax, p_offset, o_row, n_bytes, n_blocks, live,
          BLOCKSIZE: tl.constexpr, NESTED: tl.constexpr, COLS: tl.constexpr):
    """The production kernel's loads for the rows at ``o_row`` (``live``: load at all): packed bytes, absmax."""
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
def decode_store(p_code, p_out, b_packed, b_absmax, o_row, numel, ROWS: tl.constexpr, COLS: tl.constexpr):
    """The production kernel's decode and streaming store of those rows."""
    b_hi = tl.load(p_code + (b_packed >> 4).to(tl.int32)) * b_absmax[:, None]
    b_lo = tl.load(p_code + (b_packed & 15).to(tl.int32)) * b_absmax[:, None]
    b_val = tl.reshape(tl.join(b_hi, b_lo), (ROWS, 2 * COLS))
    o_out = 2 * o_row[:, None] + tl.arange(0, 2 * COLS)[None, :]
    tl.store(p_out + o_out, b_val.to(p_out.dtype.element_ty), mask=o_out < numel, cache_modifier=".cs")


class Case:
    """Weight ``n x k`` (blocksize 64, double quant ``nested``) and ``reps`` rotated copies with their outputs."""

    def __init__(self, n: int, k: int, nested: bool):
        q, _ = make_weight(n, k, nested, 64, seed=n + k)
        self.n, self.k, self.nested = n, k, nested
        self.moved = q.nbytes() + q.numel * 2  # bytes a bf16 dequantize reads and writes
        self.reps = rotation_count(self.moved)
        self.qs = [q] + [clone_weight(q) for _ in range(self.reps - 1)]
        self.outs = [torch.empty(q.numel, dtype=torch.bfloat16, device="cuda") for _ in range(self.reps)]
        self.code = kernel_code("nf4", q.device)
        self.n_bytes = (q.numel + 1) // 2
        self.prod = [K.Prepared(w.packed_u8, w.absmax, self.code, 64, w.numel, w.nested_code, w.nested_absmax,
                                w.offset) for w in self.qs]
        self.ref = torch.empty_like(self.outs[0])
        self.prod[0](self.ref)

    def label(self) -> str:
        return f"{self.n:6d}x{self.k:<6d} n{int(self.nested)} {self.moved / 1e6:5.0f} MB"

    def launch(self, kernel, i: int, tile: int, warps: int, rows: int | None = None, **constexprs):
        """``kernel`` on copy ``i`` with the production kernel's arguments, ``tile`` packed bytes per program as
        rows of 32 bytes (``rows`` of them per step when a program walks several steps), PDL launch."""
        w = self.qs[i]
        grid = (triton.cdiv(self.n_bytes, tile),)
        kernel[grid](w.packed_u8, w.absmax, self.code, self.outs[i], w.nested_code if self.nested else self.code,
                     w.nested_absmax if self.nested else w.absmax, w.offset if self.nested else self.code,
                     self.n_bytes, w.numel, w.absmax.numel(), BLOCKSIZE=64, NESTED=self.nested, ROWS=rows or tile // 32,
                     COLS=32, num_warps=warps, enable_fp_fusion=False, launch_pdl=True, **constexprs)

    def exact(self, call) -> bool:
        """``call()`` fills copy 0's output (poisoned first) bitwise as the production kernel does."""
        self.outs[0].fill_(float("nan"))
        call()
        return torch.equal(self.outs[0].view(torch.int16), self.ref.view(torch.int16))

    def time_us(self, call_i) -> float:
        """Graph-timed median of ``call_i(i)`` rotating over the copies."""
        return time_graph([lambda i=i: call_i(i) for i in range(self.reps)])["median_us"]

    def pct(self, us: float, copy: dict) -> float:
        return 100 * self.moved / us / 1e3 / copy["GBps"]

    def close(self):
        del self.qs, self.outs, self.prod
        torch.cuda.empty_cache()


def sweep(variants: dict, exact: set | None = None, rounds: int = 2, note: str = "") -> tuple[list, dict]:
    """Every shape of SHAPES, double quant off and on: the production launch, then each variant
    (``name -> launch(case, i)``), ``rounds`` times in that order; the variants named in ``exact`` (default: all)
    are first checked bitwise against the production result ("!" after the figure when not). Prints one line
    per case (% of the same-run copy bandwidth counting the dequantize's bytes); returns (rows, copy)."""
    copy = copy_bandwidth()
    print(f"copy {copy['GBps']:.0f} GB/s{note}", flush=True)
    rows = []
    for (n, k) in SHAPES:
        for nested in (False, True):
            c = Case(n, k, nested)
            row, line = dict(N=n, K=k, nested=nested, bytes=c.moved), c.label()
            for rnd in range(rounds):
                row[f"prod_us_{rnd}"] = us = c.time_us(lambda i: c.prod[i](c.outs[i]))
                line += f" | prod {c.pct(us, copy):5.1f}"
                for name, launch in variants.items():
                    def call(i, launch=launch):
                        launch(c, i)

                    ok = True
                    if exact is None or name in exact:
                        row[f"{name}_ok"] = ok = c.exact(lambda: call(0))
                    row[f"{name}_us_{rnd}"] = us = c.time_us(call)
                    line += f" {name} {c.pct(us, copy):5.1f}{'' if ok else '!'}"
            rows.append(row)
            print(line, flush=True)
            c.close()
    return rows, copy


def write_json(rows: list, copy: dict | None = None, **extra) -> None:
    """The probe's rows (with the environment and the same-run copy bandwidth) to the path in argv[1], if any."""
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({"env": environment(), "copy": copy, "rows": rows, **extra}, f, indent=1)
