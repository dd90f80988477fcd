"""Reference NF4 linear layer: dequantize, then a dense matmul (any device)."""
from __future__ import annotations

import torch

from ..dequantize import naive as dq


def linear(x2d, packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset, nested_blocksize, bias):
    """``x2d [M, K] @ W[N, K].T + bias`` with W dequantized to ``x2d.dtype`` exactly as ``dequantize`` does."""
    w = dq.dequantize(packed, absmax, code, blocksize, n * k, x2d.dtype, nested_code, nested_absmax, offset,
                      nested_blocksize).view(n, k)
    return torch.nn.functional.linear(x2d, w, bias)
