"""Building weights for benchmarks: random bf16 on the GPU, quantized by bitsandbytes when it is
installed (so both libraries read the very same bytes) and by fastnf4 otherwise."""
from __future__ import annotations

import torch

import fastnf4
from fastnf4.bench.harness import bnb_version


def bnb_functional():
    if bnb_version() is None:
        return None
    import bitsandbytes.functional as F

    return F


def make_weight(n: int, k: int, nested: bool, blocksize: int = 64, dtype=torch.bfloat16, seed: int = 0):
    """(NF4Weight, bitsandbytes (packed, QuantState) or None) for a fresh random [n, k] weight."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(n, k, dtype=dtype, device="cuda", generator=g)
    F = bnb_functional()
    if F is not None:
        packed, qs = F.quantize_4bit(w, blocksize=blocksize, compress_statistics=nested, quant_type="nf4")
        return fastnf4.NF4Weight.from_bnb(packed, qs), (packed, qs)
    return fastnf4.quantize(w, blocksize=blocksize, double_quant=nested), None


def clone_weight(q: fastnf4.NF4Weight) -> fastnf4.NF4Weight:
    """Same contents at new addresses (for rotating past the L2)."""
    return q.map_tensors(torch.Tensor.clone)
