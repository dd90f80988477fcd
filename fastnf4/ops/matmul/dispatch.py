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

# CUDA tensor-core kernels (gemv_mma.cu) where they are built, the shape fits and they win: above M = 8 the GEMM
# kernel loses to dequantize + cuBLAS on narrow weights (H200, bench matmul of 5bc03c5, NOTES.md session 4: k+v
# at M = 16 18-21 vs 13-17 us; q/o with N <= 5376 at M = 32 35-67 vs 27-56 us). At M 3-8 it also loses on the
# smallest weights (bench matmul at 859d953 on the H200 and at 18182d0 on an H100, NOTES.md session 24; us, GEMM
# kernel vs dequantize + cuBLAS, H200 / H100): Qwen k+v (5.2M elements) at M = 4 12.7 vs 11.5 / 13.2 vs 12.2, at
# M = 8 15.0 vs 11.6 / 15.5 vs 12.3; Llama k+v (8.4M) at M = 4 13.8 vs 14.1 / 14.3 vs 14.7 but at M = 8 16.2 vs
# 13.7 / 16.6 vs 14.7; Gemma k+v (11M) 13.4 vs 16.2 / 14.2 vs 17.0 at M = 4, 15.7 vs 15.8 / 16.5 vs 16.9 at M = 8.
# So from M = 3 a smallest weight size too (the thresholds between the measured sizes).
MMA_RULES = ((2, 0, 0), (4, 0, 6 * 2**20), (8, 0, 10 * 2**20), (16, 4096, 0), (32, 8192, 0))
# (largest M, smallest N, smallest N * K)
MMA_MAX_M = MMA_RULES[-1][0]
GEMV_MAX_M = 2
# At M = 2 the Triton GEMV (about 1.3-1.5x its M = 1 time) lost to dequantize + cuBLAS on the weights of N <= 4096
# (H200, session 31, benchmarks/probe_triton_paths.py with the CUDA kernels off: Gemma k+v 20.6 vs 16.4 us, Gemma q
# 31.4 vs 27.6, Qwen / Llama k+v 12.7 / 15.4 vs 11.4 / 14.2); they take dequantize + cuBLAS there
GEMV_M2_MAX_DQ_N = 4096
FUSED_GEMM_MAX_M = 16
FUSED_GEMM_MIN_N = 8192
# ... and at M 17-32 on the widest weights: with the CUDA kernels off, the Triton GEMM at M = 32 beat dequantize +
# cuBLAS on every weight of N >= 28672 on both GPUs measured, and lost on all narrower ones on the H200 (us, H200 /
# H100: Llama gate+up 255 vs 270 / 250 vs 376, Llama gate_up 478 vs 527 / 465 vs 741, Qwen gate_up 294 vs 299 /
# 291 vs 421, Gemma gate_up 248 vs 266 / 244 vs 372; Qwen gate+up (N = 25600) 158 vs 153 on the H200; session 34,
# benchmarks/probe_triton_paths.py, results/h200-probe-triton-paths.json, h100-probe-triton-paths.json). Its time is
# the same on both GPUs while dequantize + cuBLAS follows their bandwidth, so GPUs with less bandwidth than the H200
# (all Ampere / Ada parts) can only favour it more.
FUSED_GEMM_WIDE_MAX_M = 32
FUSED_GEMM_WIDE_MIN_N = 28672
# GPUs with less memory bandwidth per SM cycle than the H200 (2 x memory clock x bus width / (SMs x SM clock): H200
# 18.4 bytes and H100 SXM 12.8 as their torch properties give them; A100 10.2-13.4 and the Ada / Ampere consumer parts
# 2-7 by their specifications) take the Triton GEMM at every M <= 32 where N >= 8192: on the H100 it beat dequantize
# + cuBLAS on all of those at M 4-32 (0.44-0.93 of its time), since its time is set by the SMs and dequantize +
# cuBLAS's by the bandwidth (session 34: results/h100-probe-triton-paths.json, and -lowbw.json after the change: no
# pick slower than dequantize + cuBLAS). Unknown bandwidth (a torch without the properties): the H200 rules above.
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


# wgmma.cu (Hopper) for 32 < M <= 512 on the weights where it beat fastnf4 dequantize + cuBLAS on the H200 (the
# table: WGMMA_RULES below). Since session 11's one-wave split-K plan (wgmma.plan)
# every weight from 20M elements takes it at M 65-128 (probe_wgmma.py --mid at 8cb3bd6,
# results/h200-probe-wgmma-mid-onewave.json, against dequantize + cuBLAS in the same process: all 17 model weights of
# >= 8 MB, 1.20-1.85x, e.g. Qwen q 35.6 vs 56.0 us, Gemma o 24.8 vs 29.8). At M 129-256 (BM 256, 132 slots) the same
# probe had all 17 ahead (1.01-1.56x), but in bench matmul at a0e04cf Llama qkv lost (135.7 vs 118.7 us) and Gemma
# gate+up tied (164.0 vs 163.0): weights of 67-131 row tiles neither split K nor fill the GPU. So at M 129-256:
# the weights of <= 66 row tiles (N <= 8448: they split K) from 20M elements (Llama q+o 71.0 vs 93.3, Qwen down
# 145.6 vs 193.4, Gemma down 118.9 vs 167.7, Gemma o 34.3 vs 34.8 in that bench), plus, as before, the big (>= 200M,
# N >= 8192) and the wide (N >= 16384, >= 120M then: not Gemma gate+up, 115M) ones. Before the one-wave plan (sessions
# 8-10: results/h200-probe-wgmma-mid.json, -m512.json) the weights under 64M elements lost at M = 128. M 33-64 kept
# its session-9 rule (Gemma q / o, 22M, lost there) until session 26 (below). At M = 512 only Llama's gate_up
# (470M) won in both runs of session 9 (by 11-15%; the 230-260M weights by -1 to +13%); above, dequantize + cuBLAS.
# Session 15's tail plan (wgmma.plan: whole tiles first, the last ones split to fill the last wave;
# benchmarks/probe_wgmma_tail.py, results/h200-probe-wgmma-tail.json, interleaved graph timing) made Gemma gate+up
# (115M, 168 row tiles) at M = 256 126.1 us against dequantize + cuBLAS 160.1 (the one-wave plan: 164.9), so the wide
# rule starts at 110M now. At M = 512 the tail plan brought the wgmma kernel level with dequantize + cuBLAS on most
# weights of >= 50M (Llama qkv 167.5 vs 168.2, Qwen gate+up 265.2 vs 275.4, Qwen gate_up 542.1 vs 549.0, Gemma
# gate_up 483.8 vs 486.2) but not ahead by enough to move the M = 512 rule (Gemma down 254.7 vs 234.9).
#
# M = 9-32 (x rows per block 16 / 32, which decode with rounded codes: wgmma.cu kFastMaxBM): the wgmma kernel's time
# hardly moves with M there (decode-bound), the GEMM kernel's grows with its variant (M <= 8 / 16 / 32, so M = 16
# stands for 9-16 and M = 24 / 32 for 17-32). benchmarks/probe_wgmma.py --small at c06ecc0 built with kFastMaxBM = 64
# (BM 16 / 32 decode as the default build does now)
# (results/h200-probe-wgmma-small-fast.json, graph timing, us, wgmma vs GEMM kernel):
# - M 17-32: wgmma won on all 17 weights of >= 20M elements (closest: Llama down 112.7 vs 119.0 at M 24, Llama qkv
#   49.4 vs 56.3, Gemma down 65.3 vs 70.4; widest: Qwen gate_up 118.8 vs 240.3 at M 32).
# - M 9-16: since session 17 every weight of >= 20M elements, as at M 17-32. benchmarks/probe_small_m_plans.py --all
#   at fd82be3 (results/h200-probe-small-m-dispatch.json; both kernels with their own plans, interleaved graph timing
#   with cuBLAS, M = 16): wgmma won on all 17 weights, also on the ones the GEMM kernel had kept before: Llama q+o 28.9
#   vs 31.7 us, Llama qkv 37.1 vs 42.2, Qwen q / qkv 20.2 / 25.3 vs 24.4 / 30.5 (cuBLAS 22.4 / 28.0), Gemma qkv 23.0
#   vs 25.5, Llama down 82.3 vs 85.9, Gemma down 44.5 vs 52.5. (Session 10-11's probe, before the one-wave split plan
#   and the split sum as a programmatic dependent, had the GEMM kernel ahead on N = 8192-10240 and the deep downs.)
# - M 3-8: since session 18 (wgmma.cu's trimmed BM 16 / 32 steps, 10-14% faster at M = 16) every weight of >= 20M
#   elements with N <= 51200. benchmarks/probe_small_m_plans.py --all --m 4,8 at 0e313c3
#   (results/h200-probe-small-m-48.json; both kernels with their own plans, interleaved graph timing, us, wgmma vs
#   GEMM kernel at M 4 / 8): wgmma ahead on Qwen gate_up 90.7 / 90.7 vs 92.8 / 101.9, Gemma down 37.3 / 37.9 vs
#   39.7 / 41.4, Qwen q 18.2 / 18.3 vs 19.7 / 20.3, Llama qkv 31.3 / 31.6 vs 32.4 / 33.6 and the narrow ones as before;
#   within 1.5% at M = 4 and ahead at M = 8 on Llama q+o / down, Qwen down (48.4 vs 47.1 at M = 4, the largest loss),
#   Gemma gate+up / gate_up; behind on Llama gate_up (N = 57344: 147.8 / 148.3 vs 140.6 / 145.9), which keeps the
#   GEMM kernel. (Session 12's probe_wgmma.py --tiny had the GEMM kernel ahead on all but Qwen o, Gemma q / o and Llama
#   gate+up.) Later in session 18 the wgmma kernel got an 8-row x variant (BM 8, 3-5.5% faster than BM 16 at M 4-8:
#   benchmarks/probe_wgmma_bm8.py, results/h200-probe-wgmma-bm8.json); against it the GEMM kernel still won Llama
#   gate_up at M = 4 (141.2 vs 143.8 us) and lost it at M = 8 (146.4 vs 144.0), and with the wide-weight tail plan
#   (wgmma.WIDE_TAIL_PARTS, 133.6 us at M = 8) the wgmma kernel takes that weight too: every weight of >= 20M
#   elements at M 3-8, as at M 9-32.
# - M <= 2: the decode kernel of gemv_mma.cu everywhere.
#
# Session 26 re-measured M 33-512 (benchmarks/probe_wgmma.py --ms 64,256,512 at 7aa81eb, every provider's replays
# interleaved, results/h200-probe-wgmma-dispatch.json; us, the best wgmma block size against dequantize + cuBLAS):
# - M = 64: Gemma q / o (22M) now win too (24.1 / 21.3 vs 32.2 / 28.4): every weight from 20M elements, as at M 65-128.
# - M = 256: all 17, also the qkv projections of N = 10240 the rule had left out (Llama 106.9 vs 115.0, Qwen 68.6 vs
#   75.7): every weight from 20M elements.
# - M = 512: ahead on the N = 8192 weights (Llama q+o 118.4 vs 137.0, Llama down 451.8 vs 500.2, Qwen q 79.8 vs 86.4,
#   Gemma qkv 74.3 vs 87.2) and the gate_up projections (Llama 904.9 vs 983.0, Qwen 526.0 vs 560.8, Gemma 470.0 vs
#   500.8); within 5% either way on the qkv of N = 10240, Qwen down, Qwen / Llama gate+up; behind on Qwen o (109.7 vs
#   85.9), Gemma q / o / gate+up (48.2 / 56.5 / 260.7 vs 45.7 / 46.7 / 243.0). So N = 8192 from 20M elements and N >=
#   40960 from 200M.
# - The k+v projections (5-11M elements, N = 1024 / 2048; probe_wgmma.py --kv --ms 4,8,16,32,64,128,256,512 at
#   054b21a, results/h200-probe-wgmma-kv.json): the wgmma kernel ahead of both dequantize + cuBLAS and the GEMM kernel
#   at M 4-64 on all three (Llama 9.7-12.6 us against 13.8-15.0 / 13.3-33.8; Qwen 8.8-11.4 against 11.5-12.0; Gemma
#   12.4-15.6 against 15.6-16.9 / 13.1-33.3) and at M = 128 on Llama / Gemma (15.0 / 16.9 against 16.1 / 19.6, Qwen
#   13.9 against 12.8); behind from M = 256. So narrow weights (N <= 2048) from 5M elements up to M = 32 and from 8M
#   at M 65-128 (at M 4-16 Llama's is even level with cuBLAS: 9.7-9.9 against 9.7-9.9 us); at M 33-64 only N <= 1024:
#   there the kernel runs 64-row x tiles, with which Gemma's (N = 2048) lost in the bench at 7c21521 (18.1 against
#   16.9 us; the probe's 15.6 was with 128-row tiles).
#
# Session 36: session 26 measured the M 257-512 bucket at M = 512 only, but the wgmma kernel's time is flat over the
# bucket (BM 256: two x tiles at any M there, the same plan) while cuBLAS's falls with M. probe_wgmma.py --ms
# 288,384,512 and --ms 136,160,192,224,416,448,480 at 2cbf92e (results/h200-probe-wgmma-m257-512.json,
# -m129-480.json; dequantize + cuBLAS / wgmma time, the 7 weights the M = 512 rule takes): M = 288 0.72-0.94 (Llama
# gate_up 929 vs 667 us), M = 384 0.93-1.02, M = 416 1.03-1.10, M 448-512 1.04-1.16. So M 257-384 is a bucket of its
# own with no wgmma rule. The H100 (low_bandwidth; results/h100-probe-wgmma-m288-448.json) crosses lower: M = 288
# 0.84-1.08 on its rule's weights (Llama gate_up 951 vs 795), M = 384 0.95-1.18: its rule (below) starts at M = 353.
# At M 129-256 (BM 256, one x tile) the kernel stays ahead down to M = 136 (0.99-1.47; Qwen qkv 71.4 vs 70.9 us the
# closest).
#
# The table of both: per M bucket (largest M), the rules (smallest N * K elements, smallest N, largest N, largest K)
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
# at M 353-512 (M 257-512 until session 36) the wgmma kernel also takes every weight of >= 20M elements with N >= 8192
# or K >= 16384. The lower bound: H100, session 36 (probe_wgmma.py --ms 288,384,448 and --ms 320,352 at 729567b,
# results/h100-probe-wgmma-m288-448.json, -m320-352.json; dequantize + cuBLAS / wgmma on those 14 weights): M = 288
# 0.84-1.08, M = 320 0.89-1.14 (Llama gate_up 827 vs 929 us; three rows higher where dequantize + cuBLAS and cuBLAS
# read slow in that round), M = 352 0.96-1.19 (Gemma gate+up the one behind, as at 384: 0.95; at 512 it is ahead),
# M = 384 0.95-1.18. The rule itself: H100, session 34 (probe_wgmma.py --ms 256,512,
# results/h100-probe-wgmma-m256-512.json; us at M = 512, wgmma vs dequantize + cuBLAS): ahead on 15 of the 17 model
# weights, of those the rules above leave out Llama gate+up 483.1 vs 543.2, Llama qkv 160.3 vs 190.8, Qwen gate+up
# 266.5 vs 311.8, Qwen qkv 105.8 vs 120.8, Qwen down 303.5 vs 312.0, Gemma gate+up 253.5 vs 269.5, Gemma down 254.5
# vs 273.4 and Gemma q 48.0 vs 51.3 (N 4096, K 5376: not taken); behind on Qwen o 108.4 vs 96.7 and Gemma o 56.0 vs
# 52.8 (N <= 5376 and K <= 8192).
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
