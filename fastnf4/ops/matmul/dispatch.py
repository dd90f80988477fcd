"""Which kernel computes ``x @ dequant(W).T + b`` for a given M (rows of x).

Thresholds measured on the H200 (benchmarks/results/h200-matmul.json, NOTES.md):

| M                         | path                                                            |
|---------------------------|-----------------------------------------------------------------|
| 1 .. 2 (CUDA build there) | burst decode kernel of ``gemv_mma.cu`` (small persistent blocks,|
|                           | loads into registers) on weights of 8-24M elements with N >=    |
|                           | 2048, K % 256 == 0, blocksize >= 64 (``gemv_mma.burst_wanted``: |
|                           | the Gemma q / o / k+v projections), ahead of the rules below    |
| 3 .. 4 (CUDA build there) | decode kernel of ``gemv_mma.cu`` with pair columns (one column  |
|                           | group holds 4 x rows) on weights of >= 4M elements where        |
|                           | blocksize >= 64 and K % 64 == 0 (``gemv_mma.pair_wanted``)      |
| 3 .. 512 (sm_90, CUDA     | warpgroup tensor-core kernel of ``wgmma.cu`` on the weights     |
| build there)              | where it beat the GEMM kernel (M <= 32) or dequantize + cuBLAS  |
|                           | (``wgmma_wanted``; none at M 257-384; more at M 353-512 on GPUs |
|                           | of less bandwidth per SM cycle than the H200: ``low_bandwidth``)|
| 1 .. 32 (CUDA build there)| tensor-core kernels of ``gemv_mma.cu`` (decode kernel M <= 2,   |
|                           | GEMM kernel 2 < M <= 32), K % 32 == 0; at M 3-4 only weights of |
|                           | >= 6M elements, at M 5-8 >= 10M, then N >= 4096 (M <= 16) /     |
|                           | N >= 8192 (M <= 32): ``MMA_RULES``; at M = 1 the                |
|                           | weights of <= 16M elements (k/v) take its CUDA-core split       |
|                           | small-weight kernel (``gemv_mma.SPLIT_MAX_ELEMS``), at          |
|                           | M = 2 those of <= 9M its two-row build                          |
|                           | (``gemv_mma.SMALL_MAX_ELEMS``), and at M <= 2 those of <= 96M   |
|                           | elements (and larger ones, ``gemv_mma.wide_above_max``) its     |
|                           | decode kernel with 20 warps x 4 stages (``WIDE_MAX_ELEMS``);    |
|                           | the decode kernels' split-K parts are summed inside a block or  |
|                           | a cluster of two where ``gemv_mma.local_plan`` finds a plan     |
| 1, and 2 where N > 4096   | fused Triton GEMV (``gemv_kernel``)                             |
| 3 .. 16, N >= 8192        | fused tensor-core GEMM (``gemm_kernel``)                        |
| 17 .. 32, N >= 28672      | the same (on GPUs of less bandwidth per SM cycle than the H200: |
|                           | M 3-32 where N >= 8192, ``low_bandwidth``)                      |
| otherwise                 | fastnf4 dequantize + cuBLAS                                     |

The CUDA kernels (quick runs on 5 model shapes, NOTES.md "Session 4"): the decode kernel (M <= 2) is 1.2-1.7x
bf16 cuBLAS on the large weights at M = 1; the GEMM kernel (2 < M <= 32, session 4) is 1.1-1.5x bf16 cuBLAS at
M = 8 on the weights of 50 MB and more, about even at M = 16 and 0.65-0.95x at M = 32, and 1.6-4x faster than
fastnf4 dequantize + cuBLAS there (the Triton GEMM was slower than both), so it takes all of 5..32.

The Triton paths below remain for builds without the CUDA kernels (no nvcc, FASTNF4_CUDA=0, too little shared
memory):
From the H200 runs (benchmarks/results/h200-matmul*.json): at M = 8-16 the fused GEMM beats dequantize +
cuBLAS on the wide weights (Gemma gate_up 191 vs 264 us, gate+up 99 vs 137 us, qkv 51 vs 55 us) and loses on
narrow or deep ones (down 195 vs 138 us, o 35 vs 27 us, k+v); at M = 32-64 its untuned larger tiles lose
more often than they win; at M >= 128 dequantize + cuBLAS is as fast or faster. The GEMV decodes every weight
once per step for all M rows but its cost grows with M; at M = 4 it is slower than dequantize + cuBLAS.

Shapes the fused kernels do not cover (K without a power-of-two factor of 16 shared with the blocksize)
take dequantize + matmul at every M.
"""
from __future__ import annotations

import functools

import torch

from ..dequantize import kernel as dq_kernel
from . import gemv_mma, kernel, wgmma

# CUDA tensor-core kernels (gemv_mma.cu) where they are built, the shape fits and they win. Above M = 8 the GEMM
# kernel needs N >= 4096 / 8192: it loses to dequantize + cuBLAS on narrower weights (H200: k+v at M = 16 18-21 vs
# 13-17 us; q/o with N <= 5376 at M = 32 35-67 vs 27-56 us). At M 3-8 it also needs a smallest N * K, set between
# the measured sizes: Qwen k+v (5.2M elements) loses at M = 4 and 8 (H200 / H100 at M = 8: 15.0 vs 11.6 / 15.5 vs
# 12.3 us), Gemma k+v (11M) wins (13.4 vs 16.2 / 14.2 vs 17.0 at M = 4). results/h200-matmul.json,
# results/h100-matmul.json; NOTES.md "GEMM kernel, M 3-32".
MMA_RULES = ((2, 0, 0), (4, 0, 6 * 2**20), (8, 0, 10 * 2**20), (16, 4096, 0), (32, 8192, 0))
# (largest M, smallest N, smallest N * K)
MMA_MAX_M = MMA_RULES[-1][0]
GEMV_MAX_M = 2
# At M = 2 the Triton GEMV (1.3-1.5x its M = 1 time) loses to dequantize + cuBLAS on weights of N <= 4096 (H200,
# CUDA kernels off: Gemma k+v 20.6 vs 16.4 us; results/h200-probe-triton-paths.json); they take dequantize + cuBLAS
GEMV_M2_MAX_DQ_N = 4096
FUSED_GEMM_MAX_M = 16
FUSED_GEMM_MIN_N = 8192
# ... and at M 17-32 on the widest weights: with the CUDA kernels off, the Triton GEMM at M = 32 beats dequantize +
# cuBLAS on every weight of N >= 28672 on the H200 and H100 and loses on all narrower ones on the H200 (us, H200 /
# H100: Llama gate_up 478 vs 527 / 465 vs 741; Qwen gate+up, N = 25600, 158 vs 153 on the H200;
# results/h200-probe-triton-paths.json, results/h100-probe-triton-paths.json). Its time is the same on both GPUs
# while dequantize + cuBLAS follows their bandwidth, so GPUs with less bandwidth than the H200 can only favour it more.
FUSED_GEMM_WIDE_MAX_M = 32
FUSED_GEMM_WIDE_MIN_N = 28672
# GPUs with less memory bandwidth per SM cycle than the H200 (2 x memory clock x bus width / (SMs x SM clock): H200
# 18.4 bytes, H100 SXM 12.8 from their torch properties; A100 10.2-13.4, Ada / Ampere consumer parts 2-7 by their
# specifications) take the Triton GEMM at every M <= 32 where N >= 8192: its time is set by the SMs, dequantize +
# cuBLAS's by the bandwidth. On the H100 it takes 0.44-0.93 of dequantize + cuBLAS's time on all of those at M 4-32
# and no pick is slower than dequantize + cuBLAS (results/h100-probe-triton-paths.json, -lowbw.json). Unknown
# bandwidth (a torch without the properties): the H200 rules above.
LOW_BANDWIDTH_BYTES_PER_SM_CYCLE = 15.0


@functools.cache
def _sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.cache
def _bytes_per_sm_cycle(index: int) -> float | None:
    p = torch.cuda.get_device_properties(index)
    mem_khz, bus_bits, sm_khz = (getattr(p, a, 0) for a in ("memory_clock_rate", "memory_bus_width", "clock_rate"))
    if not (mem_khz and bus_bits and sm_khz):
        return None
    return 2 * mem_khz * (bus_bits / 8) / (p.multi_processor_count * sm_khz)


def low_bandwidth(device: torch.device) -> bool:
    """Whether this GPU has less memory bandwidth per SM cycle than LOW_BANDWIDTH_BYTES_PER_SM_CYCLE (False where it
    is not known, and off CUDA)."""
    if device.type != "cuda":
        return False
    b = _bytes_per_sm_cycle(gemv_mma._index(device))
    return b is not None and b < LOW_BANDWIDTH_BYTES_PER_SM_CYCLE


def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: small grids keep the CPU tests quick but still exercise split-K
    return _sms(gemv_mma._index(device))


def mma_wanted(m: int, n: int, k: int) -> bool:
    for largest_m, min_n, min_elems in MMA_RULES:
        if m <= largest_m:
            return n >= min_n and n * k >= min_elems
    return False


# wgmma.cu (Hopper) for 2 < M <= 512 on the weights where it beats dequantize + cuBLAS (and, at M <= 32, the GEMM
# kernel) on the H200. Interleaved graph timing, us, wgmma vs the other path:
# - M 3-32: every weight of >= 20M elements. M 17-32: ahead on all 17 model weights of >= 20M (closest: Llama down
#   112.7 vs 119.0 at M = 24; results/h200-probe-wgmma-small-fast.json). M 9-16: ahead on all 17 (Llama q+o 28.9 vs
#   31.7; results/h200-probe-small-m-dispatch.json). M 3-8: at most 2.8% behind (Qwen down at M = 4, 48.4 vs 47.1)
#   except Llama gate_up (N = 57344), which the wide-weight tail plan (wgmma.WIDE_TAIL_PARTS) wins too (133.6 vs
#   146.4 at M = 8; results/h200-probe-small-m-48.json, h200-probe-wgmma-bm8.json, h200-probe-wgmma-wide-tail.json).
# - M 33-128: every weight of >= 20M elements, with the one-wave split-K plan (wgmma.plan): 1.20-1.85x dequantize +
#   cuBLAS at M 65-128 on all 17 weights of >= 8 MB (Qwen q 35.6 vs 56.0; results/h200-probe-wgmma-mid-onewave.json);
#   at M = 64 Gemma q / o (22M) 24.1 / 21.3 vs 32.2 / 28.4 (results/h200-probe-wgmma-dispatch.json).
# - M 129-256: every weight of >= 20M elements (all 17 ahead at M = 256, Llama qkv 106.9 vs 115.0;
#   results/h200-probe-wgmma-dispatch.json), down to M = 136 (0.99-1.47x; results/h200-probe-wgmma-m129-480.json).
#   The tail plan (whole tiles first, the last ones split to fill the last wave) wins Gemma gate+up (115M, 168 row
#   tiles: 126.1 vs 160.1 at M = 256; results/h200-probe-wgmma-tail.json).
# - M 257-384: none. The kernel's time is flat over M 257-512 (BM 256: two x tiles, one plan) while cuBLAS's falls
#   with M: dequantize + cuBLAS / wgmma on the M = 512 rule's 7 weights is 0.72-0.94 at M = 288, 0.93-1.02 at 384,
#   1.04-1.16 at 448-512 (results/h200-probe-wgmma-m257-512.json, -m129-480.json).
# - M 385-512: N = 8192 from 20M elements and N >= 40960 from 200M (M = 512: Llama q+o 118.4 vs 137.0, Llama gate_up
#   904.9 vs 983.0; behind on Qwen o 109.7 vs 85.9 and Gemma q / o / gate+up; results/h200-probe-wgmma-dispatch.json).
# - Narrow weights (N <= 2048, the k+v projections): from 5M elements up to M = 32; at M 33-64 only N <= 1024 (64-row
#   x tiles: Gemma's N = 2048 lost, 18.1 vs 16.9 in bench matmul); from 8M at M 65-128 (Llama / Gemma 15.0 / 16.9 vs
#   16.1 / 19.6 at M = 128); behind from M = 256 (results/h200-probe-wgmma-kv.json).
# - M <= 2: the decode kernel of gemv_mma.cu everywhere; above M = 512 dequantize + cuBLAS.
#
# The table: per M bucket (largest M), the rules (smallest N * K elements, smallest N, largest N, largest K)
# under any of which a weight takes the wgmma kernel; at M <= 2 and above M = 512 none.
_ANY = 1 << 62
WGMMA_RULES = (
    (2, ()),
    (8, ((20 * 2**20, 0, _ANY, _ANY), (5 * 2**20, 0, 2048, _ANY))),
    (16, ((20 * 2**20, 0, _ANY, _ANY), (5 * 2**20, 0, 2048, _ANY))),
    (32, ((20 * 2**20, 0, _ANY, _ANY), (5 * 2**20, 0, 2048, _ANY))),
    (64, ((20 * 2**20, 0, _ANY, _ANY), (5 * 2**20, 0, 1024, _ANY))),
    (128, ((20 * 2**20, 0, _ANY, _ANY), (8 * 2**20, 0, 2048, _ANY))),
    (256, ((20 * 2**20, 0, _ANY, _ANY),)),
    (384, ()),
    (512, ((20 * 2**20, 8192, 8192, _ANY), (200 * 2**20, 40960, _ANY, _ANY))),
)


# On GPUs with less memory bandwidth per SM cycle than the H200 (``low_bandwidth``) dequantize + cuBLAS loses more:
# at M 353-512 the wgmma kernel also takes every weight of >= 20M elements with N >= 8192 or K >= 16384. H100, M =
# 512, us, wgmma vs dequantize + cuBLAS: ahead on 15 of the 17 model weights (Llama qkv 160.3 vs 190.8; Gemma q 48.0
# vs 51.3, N 4096 and K 5376, not taken), behind on Qwen o 108.4 vs 96.7 and Gemma o 56.0 vs 52.8 (N <= 5376 and K
# <= 8192; results/h100-probe-wgmma-m256-512.json). The lower bound: dequantize + cuBLAS / wgmma on those 14 weights
# is 0.84-1.08 at M = 288, 0.89-1.14 at 320, 0.96-1.19 at 352, 0.95-1.18 at 384 (results/h100-probe-wgmma-m288-448.json,
# -m320-352.json).
WGMMA_LOW_BW_512 = (20 * 2**20, 8192, 16384)  # (smallest N * K, smallest N, or smallest K) at WGMMA_LOW_BW_M
WGMMA_LOW_BW_M = (352, 512)  # the M range of that rule: above the first, up to the second


def wgmma_wanted(m: int, n: int, k: int, low_bw: bool = False) -> bool:
    elems, min_n, min_k = WGMMA_LOW_BW_512
    lo, hi = WGMMA_LOW_BW_M
    if low_bw and lo < m <= hi and n * k >= elems and (n >= min_n or k >= min_k):
        return True
    for largest_m, rules in WGMMA_RULES:
        if m <= largest_m:
            return any(n * k >= elems and lo <= n <= hi and k <= max_k for elems, lo, hi, max_k in rules)
    return False


def choose_path(m: int, n: int, k: int, blocksize: int, mma_ok: bool = False, wgmma_ok: bool = False,
                pair_ok: bool = False, low_bw: bool = False) -> str:
    """``mma_ok`` / ``wgmma_ok``: the kernels of gemv_mma.cu / wgmma.cu are wanted here (``mma_wanted``,
    ``wgmma_wanted``) and can run; ``pair_ok``: gemv_mma.cu's pair-column decode kernel is (M 3-4,
    ``gemv_mma.pair_wanted``), which then comes first; ``low_bw``: the GPU is ``low_bandwidth``."""
    if pair_ok:
        return "mma"
    if wgmma_ok and wgmma_wanted(m, n, k, low_bw):
        return "wgmma"
    if mma_ok and mma_wanted(m, n, k):
        return "mma"
    if kernel.group_elems(k, blocksize) == 0:
        return "dequant+matmul"
    if m == 1 or (m <= GEMV_MAX_M and n > GEMV_M2_MAX_DQ_N):
        return "gemv"
    max_m = FUSED_GEMM_WIDE_MAX_M if low_bw else FUSED_GEMM_MAX_M
    if (m <= max_m and n >= FUSED_GEMM_MIN_N) or (m <= FUSED_GEMM_WIDE_MAX_M and n >= FUSED_GEMM_WIDE_MIN_N):
        return "gemm"
    return "dequant+matmul"


def pick_path(x2d, packed, blocksize: int, n: int, k: int, nested: bool, nested_blocksize: int,
              manual_bf16: bool = False, absmax: torch.Tensor | None = None) -> str:
    """The path ``linear_triton`` takes for this call (the CUDA kernels only where built and supported; ``absmax``:
    the call's statistics, for ``wgmma.supports``)."""
    m = x2d.shape[0]
    pair = not manual_bf16 and gemv_mma.pair_wanted(m, n, k, blocksize)
    mma = not manual_bf16 and mma_wanted(m, n, k)
    supported = (mma or pair) and gemv_mma.supports(x2d, packed, blocksize, n, k, nested, nested_blocksize)
    pair_ok = pair and supported and gemv_mma.pair_resident(x2d, nested)
    mma_ok = mma and supported
    low_bw = low_bandwidth(x2d.device)
    wgmma_ok = (not manual_bf16 and wgmma_wanted(m, n, k, low_bw)
                and wgmma.supports(x2d, packed, blocksize, n, k, nested, nested_blocksize, absmax))
    return choose_path(m, n, k, blocksize, mma_ok, wgmma_ok, pair_ok, low_bw)


def linear_triton(x2d, packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset, nested_blocksize,
                  bias, path: str | None = None, manual_bf16: bool = False):
    # manual_bf16: running under Triton's CPU interpreter (exact bf16 rounding done with integers)
    """[M, N] result on the current stream; ``path`` forces a kernel (benchmarks, tests)."""
    m = x2d.shape[0]
    if path is None:
        path = pick_path(x2d, packed, blocksize, n, k, nested_code is not None, nested_blocksize, manual_bf16,
                         absmax)
    w = (packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset, nested_blocksize)
    if path == "mma":
        return gemv_mma.launch(x2d, *w, bias)
    if path == "wgmma":
        return wgmma.launch(x2d, *w, bias)
    if path == "dequant+matmul":
        wd = torch.empty(n * k, dtype=x2d.dtype, device=x2d.device)
        dq_kernel.launch(packed, absmax, code, wd, blocksize, n * k, nested_code, nested_absmax, offset,
                         nested_blocksize, manual_bf16=manual_bf16)
        return torch.nn.functional.linear(x2d, wd.view(n, k), bias)
    if path not in ("gemv", "gemm"):
        raise ValueError(f"linear_triton: unknown path {path!r}")
    if kernel.group_elems(k, blocksize) == 0:  # (the dispatcher never picks them then)
        raise ValueError(f"linear_triton: the Triton {path} needs a power of two >= 16 dividing both K ({k}) and the "
                         f"blocksize ({blocksize}); dequant+matmul takes any shape")
    sms = num_sms(x2d.device)
    if path == "gemv":
        block_n, ng, split_k = kernel.gemv_plan(m, n, k, blocksize, sms)
        y = torch.empty(split_k, m, n, dtype=torch.float32, device=x2d.device) if split_k > 1 else \
            torch.empty(m, n, dtype=x2d.dtype, device=x2d.device)
        kernel.launch_gemv(x2d, *w, bias if split_k == 1 else None, y, block_n, ng, split_k, interpret=manual_bf16)
    else:
        config, split_k = kernel.gemm_plan(m, n, k, blocksize, sms)
        y = torch.empty(split_k, m, n, dtype=torch.float32, device=x2d.device) if split_k > 1 else \
            torch.empty(m, n, dtype=x2d.dtype, device=x2d.device)
        kernel.launch_gemm(x2d, *w, bias if split_k == 1 else None, y, config, split_k, interpret=manual_bf16)
    return kernel.add_parts(y, bias, x2d.dtype, interpret=manual_bf16) if split_k > 1 else y
