"""Which kernel computes ``x @ dequant(W).T + b``: (M, N, K, blocksize, dtype, GPU) -> a named path and plan.

Pure rules over the tuning tables (``tuning/h200.json``; GPUs of less bandwidth per SM cycle: ``tuning/h100.json``);
no Triton import (the Triton launches are ``kernel.linear``'s, imported when a Triton path runs). Paths and plans,
the first that applies wins (rule names: the tables' entries):

| path             | plan (kernel)                                         | M     | rule                        |
|------------------|-------------------------------------------------------|-------|-----------------------------|
| ``mma``          | ``decode_burst`` (gemv_mma.cu burst decode)           | 1-2   | ``burst``                   |
| ``mma``          | ``decode_pair`` / ``decode_pair_wide`` (pair columns) | 3-4   | ``pair_min_elems``          |
| ``wgmma``        | ``wgmma`` (wgmma.cu, sm_90a)                          | 3-512 | ``wgmma_rules``, ``wgmma_low_bw`` |
| ``mma``          | ``split`` (CUDA-core small weights)  | 1-2   | ``split_max_elems``, ``small_max_elems`` |
| ``mma``          | ``decode`` / ``decode_wide`` (16 / 20 warps) | 1-2   | ``wide_max_elems``, ``decode_cost`` |
| ``mma``          | ``gemm_m8`` / ``gemm_m16`` / ``gemm_m32``             | 3-32  | ``mma_rules``               |
| ``gemv``         | ``triton_gemv`` (``kernel.gemv_kernel``)              | 1-2   | ``triton_gemv``             |
| ``gemm``         | ``triton_gemm`` (``kernel.gemm_kernel``)              | 3-32  | ``triton_gemm``             |
| ``dequant+matmul`` | (fastnf4 dequantize + cuBLAS)                       | any   | everything else             |

The CUDA paths need their library built and the call supported (``gemv_mma.supports``, ``wgmma.supports``);
``gemv_mma.Prepared`` picks the ``mma`` plan (``gemv_mma.BUILDS``; ``small`` only when forced). The Triton paths
need a power-of-two group of >= 16 weights shared by K and the blocksize (``group_elems``).
"""
from __future__ import annotations

import functools

import torch

from . import gemv_mma, wgmma
from .tuning import DEFAULT, LOW_BW

# Note: tables by memory bandwidth per SM cycle (2 x memory clock x bus width / (SMs x SM clock)). H200 18.4 bytes,
# H100 SXM 12.8, A100 10.2-13.4, Ada / Ampere consumer parts 2-7: below 15 dequantize + cuBLAS, bound by bandwidth,
# loses more to the fused kernels, bound by the SMs (results/h100-probe-triton-paths-lowbw.json). Unknown bandwidth
# (a torch without the properties) and non-CUDA devices: the H200 table.
LOW_BANDWIDTH_BYTES_PER_SM_CYCLE = 15.0
_TABLES = {False: DEFAULT, True: LOW_BW}

MMA_RULES = tuple(tuple(rule) for rule in DEFAULT["mma_rules"])  # (largest M, smallest N, smallest N * K)
MMA_MAX_M = MMA_RULES[-1][0]
MAX_M = MMA_MAX_M  # above it only the wgmma bucket of M decides the path (``eager.m_key``)
GEMV_MAX_M = DEFAULT["triton_gemv"]["max_m"]
GEMV_M2_MAX_DQ_N = DEFAULT["triton_gemv"]["m2_max_dq_n"]
_ANY = 1 << 62  # a JSON null bound


def _bound(v):
    return _ANY if v is None else v


# per M bucket (largest M): the rules (smallest N * K, smallest N, largest N, largest K) of which any takes wgmma
WGMMA_RULES = tuple((top, tuple(tuple(_bound(v) for v in rule) for rule in rules))
                    for top, rules in DEFAULT["wgmma_rules"])
_LOW = LOW_BW["wgmma_low_bw"]
WGMMA_LOW_BW_512 = (_LOW["min_elems"], _LOW["min_n"], _LOW["min_k"])  # (smallest N * K, smallest N, or smallest K)
WGMMA_LOW_BW_M = (_LOW["above_m"], _LOW["max_m"])  # the M range of that rule: above the first, up to the second


@functools.cache
def _bytes_per_sm_cycle(index: int) -> float | None:
    p = torch.cuda.get_device_properties(index)
    mem_khz, bus_bits, sm_khz = (getattr(p, a, 0) for a in ("memory_clock_rate", "memory_bus_width", "clock_rate"))
    if not (mem_khz and bus_bits and sm_khz):
        return None
    return 2 * mem_khz * (bus_bits / 8) / (p.multi_processor_count * sm_khz)


def low_bandwidth(device: torch.device) -> bool:
    """Whether this GPU takes the low-bandwidth table (``tuning/h100.json``): less memory bandwidth per SM cycle
    than LOW_BANDWIDTH_BYTES_PER_SM_CYCLE (False where it is not known, and off CUDA)."""
    if device.type != "cuda":
        return False
    b = _bytes_per_sm_cycle(gemv_mma._index(device))
    return b is not None and b < LOW_BANDWIDTH_BYTES_PER_SM_CYCLE


def group_elems(k: int, blocksize: int) -> int:
    """G of the Triton kernels: the largest power of two up to 64 dividing both K and the blocksize (0 if below 16:
    they cannot run; dequantize + matmul takes the call)."""
    g = 64
    while g >= 16:
        if k % g == 0 and blocksize % g == 0:
            return g
        g //= 2
    return 0


def mma_wanted(m: int, n: int, k: int) -> bool:
    for largest_m, min_n, min_elems in MMA_RULES:
        if m <= largest_m:
            return n >= min_n and n * k >= min_elems
    return False


def wgmma_wanted(m: int, n: int, k: int, low_bw: bool = False) -> bool:
    low = _TABLES[low_bw]["wgmma_low_bw"]
    if low is not None and low["above_m"] < m <= low["max_m"] and n * k >= low["min_elems"] and (
            n >= low["min_n"] or k >= low["min_k"]):
        return True
    for largest_m, rules in WGMMA_RULES:
        if m <= largest_m:
            return any(n * k >= elems and lo <= n <= hi and k <= max_k for elems, lo, hi, max_k in rules)
    return False


def choose_path(m: int, n: int, k: int, blocksize: int, mma_ok: bool = False, wgmma_ok: bool = False,
                pair_ok: bool = False, low_bw: bool = False) -> str:
    """The path (table above) from the rules alone. ``mma_ok`` / ``wgmma_ok``: the kernels of gemv_mma.cu / wgmma.cu
    are wanted here (``mma_wanted``, ``wgmma_wanted``) and can run; ``pair_ok``: gemv_mma.cu's pair-column decode
    kernel is (M 3-4, ``gemv_mma.pair_wanted``), which then comes first; ``low_bw``: the GPU is ``low_bandwidth``."""
    if pair_ok:
        return "mma"
    if wgmma_ok and wgmma_wanted(m, n, k, low_bw):
        return "wgmma"
    if mma_ok and mma_wanted(m, n, k):
        return "mma"
    if group_elems(k, blocksize) == 0:
        return "dequant+matmul"
    if m == 1 or (m <= GEMV_MAX_M and n > GEMV_M2_MAX_DQ_N):
        return "gemv"
    gemm = _TABLES[low_bw]["triton_gemm"]
    if (m <= gemm["max_m"] and n >= gemm["min_n"]) or (m <= gemm["wide_max_m"] and n >= gemm["wide_min_n"]):
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
    """[M, N] result on the current stream by ``pick_path``'s path; ``path`` forces one (benchmarks, tests).
    ``manual_bf16``: running under Triton's CPU interpreter (exact bf16 rounding done with integers)."""
    if path is None:
        path = pick_path(x2d, packed, blocksize, n, k, nested_code is not None, nested_blocksize, manual_bf16,
                         absmax)
    w = (packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset, nested_blocksize)
    if path == "mma":
        return gemv_mma.launch(x2d, *w, bias)
    if path == "wgmma":
        return wgmma.launch(x2d, *w, bias)
    if path == "dequant+matmul":
        from ..dequantize import kernel as dq_kernel

        wd = torch.empty(n * k, dtype=x2d.dtype, device=x2d.device)
        dq_kernel.launch(packed, absmax, code, wd, blocksize, n * k, nested_code, nested_absmax, offset,
                         nested_blocksize, manual_bf16=manual_bf16)
        return torch.nn.functional.linear(x2d, wd.view(n, k), bias)
    if path not in ("gemv", "gemm"):
        raise ValueError(f"linear_triton: unknown path {path!r}")
    if group_elems(k, blocksize) == 0:  # (the dispatcher never picks them then)
        raise ValueError(f"linear_triton: the Triton {path} needs a power of two >= 16 dividing both K ({k}) and the "
                         f"blocksize ({blocksize}); dequant+matmul takes any shape")
    from . import kernel

    return kernel.linear(x2d, *w, bias, path, manual_bf16)
