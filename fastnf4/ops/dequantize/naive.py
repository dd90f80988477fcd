"""Reference 4-bit dequantization in plain PyTorch (any device).

Bit-exact with bitsandbytes' CUDA ``dequantize_4bit`` by construction: each value is
``code[nibble] * absmax[block]`` computed in float32 and rounded once to the output dtype
(PyTorch's float32 -> bf16/fp16 casts round to nearest even, as the CUDA kernel's stores do).
"""
from __future__ import annotations

import torch


def decode_absmax(
    absmax: torch.Tensor,
    nested_code: torch.Tensor | None,
    nested_absmax: torch.Tensor | None,
    offset: torch.Tensor | None,
    nested_blocksize: int,
) -> torch.Tensor:
    """float32 absmax; with double quantization ``nested_code[q] * nested_absmax[j // nb] + offset``."""
    if nested_code is None:
        return absmax
    n = absmax.numel()
    scale = nested_absmax.repeat_interleave(nested_blocksize)[:n]
    prod = nested_code[absmax.long()] * scale  # float32 product, rounded
    return prod + offset  # then a float32 sum, rounded: two steps as bitsandbytes does them


def unpack_nibbles(packed_u8: torch.Tensor, numel: int) -> torch.Tensor:
    """int64 codes in element order: high nibble of byte i is element 2i, low nibble element 2i+1."""
    b = packed_u8.reshape(-1)
    return torch.stack((b >> 4, b & 15), dim=1).reshape(-1)[:numel].long()


def dequantize(
    packed_u8: torch.Tensor,
    absmax: torch.Tensor,
    code: torch.Tensor,
    blocksize: int,
    numel: int,
    dtype: torch.dtype,
    nested_code: torch.Tensor | None = None,
    nested_absmax: torch.Tensor | None = None,
    offset: torch.Tensor | None = None,
    nested_blocksize: int = 256,
) -> torch.Tensor:
    """Flat ``[numel]`` tensor of ``dtype``."""
    scale = decode_absmax(absmax, nested_code, nested_absmax, offset, nested_blocksize)
    values = code[unpack_nibbles(packed_u8, numel)]
    nblocks = scale.numel()
    padded = torch.zeros(nblocks * blocksize, dtype=torch.float32, device=values.device)
    padded[:numel] = values
    out = (padded.view(nblocks, blocksize) * scale.view(nblocks, 1)).view(-1)[:numel]
    return out.to(dtype)
