"""Scratch: dequantize kernel variants timed side by side (bf16 out, blocksize 64, no nesting).
usage: python benchmarks/dequant_variants.py"""
import torch
import triton
import triton.language as tl

from fastnf4.bench.harness import copy_bandwidth, time_cuda
from fastnf4.codebooks import kernel_code
from fastnf4.ops.dequantize import naive


@triton.jit
def v_join2d(p_packed, p_absmax, p_code, p_out, n_bytes, numel, ROWS: tl.constexpr, COLS: tl.constexpr):
    # rows of COLS bytes (one absmax each); values interleaved with join+reshape, stored as a 2D tile
    pid = tl.program_id(0)
    o_row = pid * (ROWS * COLS) + tl.arange(0, ROWS) * COLS
    o_bytes = o_row[:, None] + tl.arange(0, COLS)[None, :]
    b = tl.load(p_packed + o_bytes, mask=o_bytes < n_bytes, other=0)
    am = tl.load(p_absmax + o_row // 32)
    hi = tl.load(p_code + (b >> 4).to(tl.int32)) * am[:, None]
    lo = tl.load(p_code + (b & 15).to(tl.int32)) * am[:, None]
    v = tl.reshape(tl.join(hi, lo), (ROWS, 2 * COLS)).to(tl.bfloat16)
    o_out = 2 * o_row[:, None] + tl.arange(0, 2 * COLS)[None, :]
    tl.store(p_out + o_out, v, mask=o_out < numel)


@triton.jit
def v_persist(p_packed, p_absmax, p_code, p_out, n_bytes, numel, n_tiles, ROWS: tl.constexpr, COLS: tl.constexpr,
              CS: tl.constexpr):
    # persistent: grid = a few programs per SM, each walks tiles pid, pid + nprog, ...
    for t in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        o_row = t * (ROWS * COLS) + tl.arange(0, ROWS) * COLS
        o_bytes = o_row[:, None] + tl.arange(0, COLS)[None, :]
        b = tl.load(p_packed + o_bytes, mask=o_bytes < n_bytes, other=0, eviction_policy="evict_first")
        am = tl.load(p_absmax + o_row // 32)
        hi = tl.load(p_code + (b >> 4).to(tl.int32)) * am[:, None]
        lo = tl.load(p_code + (b & 15).to(tl.int32)) * am[:, None]
        v = tl.reshape(tl.join(hi, lo), (ROWS, 2 * COLS)).to(tl.bfloat16)
        o_out = 2 * o_row[:, None] + tl.arange(0, 2 * COLS)[None, :]
        if CS:
            tl.store(p_out + o_out, v, mask=o_out < numel, cache_modifier=".cs")
        else:
            tl.store(p_out + o_out, v, mask=o_out < numel)


@triton.jit
def v_flat(p_packed, p_absmax, p_code, p_out, n_bytes, numel, BLOCK: tl.constexpr):
    # 1D tile of BLOCK bytes; absmax gathered per byte (cached), join+reshape to 2*BLOCK outputs
    pid = tl.program_id(0)
    o = pid * BLOCK + tl.arange(0, BLOCK)
    b = tl.load(p_packed + o, mask=o < n_bytes, other=0)
    am = tl.load(p_absmax + o // 32)
    hi = tl.load(p_code + (b >> 4).to(tl.int32)) * am
    lo = tl.load(p_code + (b & 15).to(tl.int32)) * am
    v = tl.reshape(tl.join(hi, lo), (2 * BLOCK,)).to(tl.bfloat16)
    o_out = 2 * pid * BLOCK + tl.arange(0, 2 * BLOCK)
    tl.store(p_out + o_out, v, mask=o_out < numel)


@triton.jit
def v_pair(p_packed, p_absmax, p_pair, p_out, n_bytes, numel, BLOCK: tl.constexpr):
    # one 8-byte lookup per byte in a 256-entry table of (code[hi], code[lo]) pairs
    pid = tl.program_id(0)
    o = pid * BLOCK + tl.arange(0, BLOCK)
    b = tl.load(p_packed + o, mask=o < n_bytes, other=0)
    am = tl.load(p_absmax + o // 32)
    pair = tl.load(p_pair + b.to(tl.int32))  # int64 = lo32: code[hi], hi32: code[lo]
    hi = (pair & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True) * am
    lo = (pair >> 32).to(tl.uint32).to(tl.float32, bitcast=True) * am
    v = tl.reshape(tl.join(hi, lo), (2 * BLOCK,)).to(tl.bfloat16)
    o_out = 2 * pid * BLOCK + tl.arange(0, 2 * BLOCK)
    tl.store(p_out + o_out, v, mask=o_out < numel)


@triton.jit
def v_copy(p_packed, p_out, n_bytes, numel, BLOCK: tl.constexpr):
    # no decode at all: bytes -> bf16 of the byte value; bounds what the memory path allows
    pid = tl.program_id(0)
    o = pid * BLOCK + tl.arange(0, BLOCK)
    b = tl.load(p_packed + o, mask=o < n_bytes, other=0).to(tl.float32)
    v = tl.reshape(tl.join(b, b), (2 * BLOCK,)).to(tl.bfloat16)
    o_out = 2 * pid * BLOCK + tl.arange(0, 2 * BLOCK)
    tl.store(p_out + o_out, v, mask=o_out < numel)


def time_graph(fn, reps, per_graph=20, replays=15):
    """Per-call time from a captured CUDA graph of per_graph calls over rotating buffers."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(3):
            fn(i % reps)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(per_graph):
            fn(i % reps)
    t = time_cuda([g.replay], iters=replays, warmup=2)
    return t["median_us"] / per_graph


def main():
    copy = copy_bandwidth()["GBps"]
    print(f"copy {copy:.0f} GB/s; sm clock now:", torch.cuda.clock_rate() if hasattr(torch.cuda, "clock_rate") else "?")
    code = kernel_code("nf4", torch.device("cuda"))
    pair = torch.stack([code.repeat_interleave(16), code.repeat(16)], 1).contiguous().view(torch.int64).reshape(-1)
    for n, k in ((1024, 5120), (4096, 5376), (8192, 8192), (57344, 8192)):
        numel = n * k
        reps = max(2, 400_000_000 // (numel * 5 // 2))
        packed = [torch.randint(0, 256, (numel // 2,), dtype=torch.uint8, device="cuda") for _ in range(reps)]
        absmax = [torch.rand(numel // 64, device="cuda") for _ in range(reps)]
        outs = [torch.empty(numel, dtype=torch.bfloat16, device="cuda") for _ in range(reps)]
        moved = numel // 2 + numel // 16 + numel * 2
        ref = naive.dequantize(packed[0], absmax[0], code, 64, numel, torch.bfloat16)
        variants = {}
        for rows, cols, w in ((64, 32, 4), (32, 32, 4)):
            variants[f"join2d r{rows}c{cols}w{w}"] = lambda i, rows=rows, cols=cols, w=w: v_join2d[(triton.cdiv(numel // 2, rows * cols),)](
                packed[i], absmax[i], code, outs[i], numel // 2, numel, ROWS=rows, COLS=cols, num_warps=w)
        for blk, w in ((1024, 4), (2048, 4)):
            variants[f"flat b{blk}w{w}"] = lambda i, blk=blk, w=w: v_flat[(triton.cdiv(numel // 2, blk),)](
                packed[i], absmax[i], code, outs[i], numel // 2, numel, BLOCK=blk, num_warps=w)
            if blk == 1024:
                variants[f"pair b{blk}w{w}"] = lambda i, blk=blk, w=w: v_pair[(triton.cdiv(numel // 2, blk),)](
                    packed[i], absmax[i], pair, outs[i], numel // 2, numel, BLOCK=blk, num_warps=w)
        ntiles = triton.cdiv(numel // 2, 2048)
        for ctas, cs in ((4, False), (8, False), (8, True), (16, False)):
            variants[f"persist r64c32 x{ctas} cs{int(cs)}"] = lambda i, ctas=ctas, cs=cs: v_persist[(min(ntiles, 132 * ctas),)](
                packed[i], absmax[i], code, outs[i], numel // 2, numel, ntiles, ROWS=64, COLS=32, CS=cs, num_warps=4)
        variants["torch copy_ (same bytes)"] = lambda i: outs[i].view(torch.uint8)[: moved // 2].copy_(outs[(i + 1) % reps].view(torch.uint8)[: moved // 2])
        variants["copy-like b2048w4"] = lambda i: v_copy[(triton.cdiv(numel // 2, 2048),)](
            packed[i], outs[i], numel // 2, numel, BLOCK=2048, num_warps=4)
        for name, fn in variants.items():
            outs[0].fill_(float("nan"))
            fn(0)
            ok = torch.equal(outs[0].view(torch.int16), ref.view(torch.int16)) if "copy" not in name else None
            t = time_cuda([lambda i=i: fn(i) for i in range(reps)])["median_us"]
            tg = time_graph(fn, reps)
            pct = lambda us: 100 * moved / us / 1e3 / copy  # noqa: E731
            print(f"{n}x{k} {name:26s} exact={ok} stream {t:7.1f} us {pct(t):5.1f}%  graph {tg:7.1f} us {pct(tg):5.1f}%", flush=True)


if __name__ == "__main__":
    main()
