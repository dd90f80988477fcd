"""Reference blockwise quantization in plain PyTorch, emulating bitsandbytes' CUDA arithmetic step by step.

bitsandbytes compiles its kernels with ``--use_fast_math``; what that means for these kernels (read off
the sm_90 SASS of bitsandbytes 0.50.2):

* subnormal float32 inputs and products are flushed to zero (``.FTZ``);
* absmax = max over the block of ``|x|`` with ``fmaxf`` seeded with ``-FLT_MAX``: NaN never enters, a block
  of only NaN gives ``-FLT_MAX``; elements past the end of the tensor count as 0.0;
* the scale is ``rcp.approx.ftz.f32(absmax)`` (an approximate reciprocal) and ``x`` is multiplied by it;
* 4-bit codes count the thresholds that ``x * scale`` strictly exceeds (NaN -> code 0);
* 8-bit codes come from a fixed 7-step binary search over the 256-entry map, then the nearer of two
  neighbours, ties to the even pivot.

``reciprocal`` is pluggable: :func:`rcp_approx_ftz` (default) reproduces the hardware reciprocal where its
result is known (IEEE division plus the table of mantissas where the hardware differs, when available),
``ieee_reciprocal_ftz`` is what Triton's CPU interpreter computes.
"""
from __future__ import annotations

import functools
import os

import torch

from ...codebooks import FP4_MAGNITUDE, FP4_THRESHOLDS, NF4_THRESHOLDS

FLT_MIN = 2.0**-126
FLT_MAX = float(torch.finfo(torch.float32).max)


def ftz(x: torch.Tensor) -> torch.Tensor:
    """Flush float32 subnormals to a zero of the same sign (NaN and infinities pass through)."""
    return torch.where(x.abs() < FLT_MIN, x * 0.0, x)


def ieee_reciprocal_ftz(a: torch.Tensor) -> torch.Tensor:
    """Correctly rounded 1/a with flush-to-zero of a subnormal input and of a subnormal result."""
    return ftz(1.0 / ftz(a))


RCP_TABLE = os.path.join(os.path.dirname(__file__), "rcp_approx_exceptions.safetensors")


@functools.cache
def _rcp_exceptions() -> tuple[torch.Tensor, torch.Tensor] | None:
    """Two bitmaps over the 2**23 mantissas: where the GPU's rcp.approx differs from the correctly rounded
    reciprocal, and whether it is then one ulp larger (else one ulp smaller). Measured once on an H200 by
    tools/rcp_table.py, shipped as data (2 MiB) at RCP_TABLE (the tool points it at a new measurement)."""
    path = RCP_TABLE
    if not os.path.exists(path):
        return None
    from safetensors.torch import load_file

    t = load_file(path)
    return t["differs"], t["plus_one"]


def _bit(bitmap: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return (bitmap[index >> 3].long() >> (index & 7)) & 1


def rcp_approx_ftz(a: torch.Tensor) -> torch.Tensor:
    """Emulation of PTX ``rcp.approx.ftz.f32``: the IEEE reciprocal with flush-to-zero, moved by one ulp
    where the measured table says the hardware differs (normal inputs with a normal result)."""
    r = ieee_reciprocal_ftz(a)
    table = _rcp_exceptions()
    if table is None:
        return r
    differs, plus_one = (t.to(a.device) for t in table)
    mant = a.contiguous().view(torch.int32).long() & 0x7FFFFF
    normal = (r.abs() >= FLT_MIN) & torch.isfinite(r) & (a.abs() >= FLT_MIN)
    step = torch.where(_bit(plus_one, mant) == 1, 1, -1) * _bit(differs, mant) * normal.long()
    return (r.contiguous().view(torch.int32).long() + step).to(torch.int32).view(torch.float32)  # ulp steps on |r|


def _blocks(x: torch.Tensor, blocksize: int, fill: float = 0.0) -> torch.Tensor:
    n = x.numel()
    nb = -(-n // blocksize)
    padded = torch.full((nb * blocksize,), fill, dtype=torch.float32, device=x.device)
    padded[:n] = x.reshape(-1)
    return padded.view(nb, blocksize)


def _absmax(xb: torch.Tensor) -> torch.Tensor:
    a = xb.abs()
    return torch.where(torch.isnan(a), torch.full_like(a, -FLT_MAX), a).amax(dim=1)


def code_4bit(xn: torch.Tensor, quant_type: str) -> torch.Tensor:
    """Codes (int64) of normalised values, as bitsandbytes' dQuantizeNF4 / dQuantizeFP4 trees choose them."""
    if quant_type == "nf4":
        return sum((xn > t).long() for t in NF4_THRESHOLDS)
    rank = sum((xn.abs() > t).long() for t in FP4_THRESHOLDS)
    magnitude = torch.tensor(FP4_MAGNITUDE, device=xn.device)[rank]
    return magnitude + 8 * (xn < 0).long()


def quantize_4bit(x: torch.Tensor, blocksize: int, quant_type: str = "nf4", reciprocal=rcp_approx_ftz):
    """``(packed uint8 [ceil(n/2)], absmax float32 [ceil(n/blocksize)])`` for the flat tensor ``x``."""
    n = x.numel()
    xb = ftz(_blocks(x.float(), blocksize))
    absmax = _absmax(xb)
    xn = ftz(xb * reciprocal(absmax)[:, None])
    codes = code_4bit(xn, quant_type).reshape(-1)[: 2 * ((n + 1) // 2)].to(torch.uint8)
    packed = (codes[0::2] << 4) | codes[1::2]
    return packed, absmax


def search_8bit(xn: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    """bitsandbytes' dQuantize<0>: 7 halving steps from pivot 127, then the nearer neighbour."""
    pivot = torch.full_like(xn, 127, dtype=torch.long)
    lower_p, upper_p = torch.zeros_like(pivot), torch.full_like(pivot, 255)
    lower, upper = torch.full_like(xn, -1.0), torch.full_like(xn, 1.0)
    val = code[pivot]
    for step in (64, 32, 16, 8, 4, 2, 1):
        gt = xn > val
        lower_p, lower = torch.where(gt, pivot, lower_p), torch.where(gt, val, lower)
        upper_p, upper = torch.where(gt, upper_p, pivot), torch.where(gt, upper, val)
        pivot = torch.where(gt, pivot + step, pivot - step)
        val = code[pivot]
    upper = torch.where(upper_p == 255, code[255], upper)
    lower = torch.where(lower_p == 0, code[0], lower)
    mid_up = ftz(ftz(upper + val) * 0.5)
    mid_low = ftz(ftz(lower + val) * 0.5)
    up = torch.where(xn > mid_up, upper_p, pivot)
    down = torch.where(xn < mid_low, lower_p, pivot)
    return torch.where(xn > val, up, down)


def quantize_8bit(x: torch.Tensor, offset: torch.Tensor, code: torch.Tensor, blocksize: int,
                  reciprocal=rcp_approx_ftz):
    """Blockwise 8-bit quantization of ``x - offset``: ``(uint8 [n], absmax float32 [ceil(n/blocksize)])``."""
    n = x.numel()
    xb = ftz(_blocks(x.float().reshape(-1) - offset, blocksize))
    absmax = _absmax(xb)
    xn = ftz(xb * reciprocal(absmax)[:, None])
    q = search_8bit(xn, code).reshape(-1)[:n].to(torch.uint8)
    return q, absmax
