"""Weight layouts: the order of the packed bytes of an :class:`~fastnf4.format.NF4Weight`.

``LAYOUTS = ("bnb", "fastnf4")``.

* ``"bnb"``: bitsandbytes' order, the format of every bnb-4bit checkpoint. The weight ``W [N, K]`` is flattened
  row-major; byte ``c`` of row ``r`` (flat byte ``r*K/2 + c``) holds element ``k = 2c`` in its high nibble and
  ``2c + 1`` in its low nibble. ``packed`` is ``[ceil(numel/2), 1]`` in any ``quant_storage`` dtype.
* ``"fastnf4"``: the same bytes (no nibble moves inside a byte) permuted into a uint8 tensor of shape
  ``[N/16, K/64, 512]``, the order the tensor-core kernels read. Tile ``(i, j)`` covers rows ``16i .. 16i+15`` and
  elements ``64j .. 64j+63`` (bnb byte columns ``32j .. 32j+31``). Inside a tile, lane ``l = 4g + t`` (``g = l // 4``
  in 0..7, ``t = l % 4``) owns the 16 contiguous bytes at ``16l``; its byte ``4s + e`` (``s`` = 0..3 the k step of
  the mma, ``e`` = 0..3) is the bnb byte of row ``16i + g + 8*(e % 2)``, byte column ``32j + 8t + 2s + e // 2``. Lane
  ``t`` thus holds elements ``64j + 16t .. 64j + 16t + 15`` of rows ``g`` and ``g + 8``: the A-operand fragments of
  ``mma.m16n8k16`` for four k steps, with the k order inside the tile permuted (step ``s``'s columns ``2t, 2t+1`` /
  ``2t+8, 2t+9`` are elements ``16t + 4s + 0, 1`` / ``+ 2, 3``) so that the same permutation of x is lane ``t``'s
  16 contiguous elements of each x row: one 16-byte load of weights and two of x per lane and tile.
  Only 2-D weights with ``N % 16 == 0`` and ``K % 64 == 0`` can take it.

The statistics (``absmax``, the nested ones) stay in bitsandbytes' layout in both. The layout is self-describing:
a packed tensor of 3 dimensions is the fastnf4 layout, any other the bnb one, so the ops' schemas are the same for
both. Both hold the same ``N*K/2`` bytes.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

LAYOUTS = ("bnb", "fastnf4")
TILE_N = 16  # rows of a tile
TILE_K = 64  # elements of a row in a tile (32 bytes)
TILE_BYTES = TILE_N * TILE_K // 2  # 512: 32 lanes x 16 bytes


def layout_of(packed: torch.Tensor) -> str:
    """The layout a packed tensor is in: ``"fastnf4"`` for a 3-D tensor, ``"bnb"`` otherwise."""
    return "fastnf4" if packed.dim() == 3 else "bnb"


def packed_shape(n: int, k: int) -> tuple[int, int, int]:
    """The shape of the packed tensor of an ``[n, k]`` weight in the fastnf4 layout."""
    return (n // TILE_N, k // TILE_K, TILE_BYTES)


def unfit_reason(shape: Any, layout: str) -> str | None:
    """Why a weight of ``shape`` cannot take ``layout`` (a known layout name), or None when it can."""
    if layout == "bnb":
        return None
    if len(shape) != 2:
        return f"the fastnf4 layout needs a 2-D weight [N, K], got shape {tuple(shape)}"
    n, k = shape
    if n % TILE_N or k % TILE_K:
        return (f"the fastnf4 layout needs N % {TILE_N} == 0 and K % {TILE_K} == 0, got shape {tuple(shape)} "
                f"(N % {TILE_N} = {n % TILE_N}, K % {TILE_K} = {k % TILE_K})")
    return None


def check_layout_name(layout: Any) -> str:
    """``layout`` if it is a name in ``LAYOUTS``; a TypeError / ValueError naming it otherwise."""
    if not isinstance(layout, str):
        raise TypeError(f"layout must be a str, one of {LAYOUTS}, got {type(layout).__name__}")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")
    return layout


def check_packed3d(packed: torch.Tensor, shape: Any) -> None:
    """Raise a ValueError / TypeError unless ``packed`` is the fastnf4-layout tensor of a weight of ``shape``."""
    reason = unfit_reason(shape, "fastnf4")
    if reason is not None:
        raise ValueError(f"packed is 3-D (the fastnf4 layout), but {reason}")
    n, k = shape
    if packed.dtype != torch.uint8:
        raise TypeError(f"a 3-D packed tensor (the fastnf4 layout) must be uint8, got {packed.dtype}")
    if tuple(packed.shape) != packed_shape(n, k):
        raise ValueError(f"a 3-D packed tensor (the fastnf4 layout) of a weight of shape {(n, k)} must have shape "
                         f"{packed_shape(n, k)}, got {tuple(packed.shape)}")


def check_packed3d_numel(packed: torch.Tensor, numel: int) -> None:
    """Raise a ValueError / TypeError unless ``packed`` is a fastnf4-layout tensor ``[N/16, K/64, 512]`` of ``numel``
    elements (the dequantize ops, which are not told N and K: the tensor's shape gives them)."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"a 3-D packed tensor (the fastnf4 layout) must be uint8, got {packed.dtype}")
    nt, kt, tile = packed.shape
    if tile != TILE_BYTES:
        raise ValueError(f"a 3-D packed tensor (the fastnf4 layout) must have shape [N/16, K/64, {TILE_BYTES}], got "
                         f"{tuple(packed.shape)}")
    if nt * TILE_N * kt * TILE_K != numel:
        raise ValueError(f"packed has shape {tuple(packed.shape)} (the fastnf4 layout of a [{nt * TILE_N}, "
                         f"{kt * TILE_K}] weight) but numel is {numel} (shape/packed size mismatch)")


def from_bnb_order(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """bitsandbytes' packed bytes of an ``[n, k]`` weight (``n*k/2`` bytes, any shape and quant_storage dtype,
    contiguous) -> a new uint8 ``[n/16, k/64, 512]`` tensor in the fastnf4 layout, on the same device."""
    old = packed.reshape(-1).view(torch.uint8)
    # dims of old: i (16-row tile), h (row half), g (row in half), j (64-element tile), t (16-element quarter), s (k
    # step), eh (byte of the step): row 16i + 8h + g, byte column 32j + 8t + 2s + eh
    return old.view(n // TILE_N, 2, 8, k // TILE_K, 4, 4, 2).permute(0, 3, 2, 4, 5, 6, 1).contiguous() \
        .view(packed_shape(n, k))


def to_bnb_order(packed3d: torch.Tensor) -> torch.Tensor:
    """A fastnf4-layout packed tensor ``[N/16, K/64, 512]`` -> a new uint8 ``[N*K/2, 1]`` tensor of bitsandbytes'
    packed bytes, on the same device. The one conversion the ops run before the kernels that read the bnb order
    (``fastnf4/_ops.py``: ``bnb_order``)."""
    nt, kt, _ = packed3d.shape
    return packed3d.view(nt, kt, 8, 4, 4, 2, 2).permute(0, 6, 2, 1, 3, 4, 5).contiguous() \
        .view(nt * kt * TILE_BYTES, 1)


def repack(q, layout: str):
    """``q`` (an :class:`~fastnf4.format.NF4Weight`) with its packed bytes in ``layout`` (one of ``LAYOUTS``): a new
    NF4Weight sharing every statistics tensor with ``q``, or ``q`` itself when it is in that layout already. Lossless:
    repacking back to ``"bnb"`` gives bitsandbytes' bytes bit for bit (as uint8 ``[numel/2, 1]``, whatever
    quant_storage dtype the weight came in). A ValueError for an unknown layout or a shape that cannot take it."""
    from .format import NF4Weight

    if not isinstance(q, NF4Weight):
        raise TypeError(f"repack takes an NF4Weight, got {type(q).__name__}")
    check_layout_name(layout)
    if q.layout == layout:
        return q
    reason = unfit_reason(q.shape, layout)
    if reason is not None:
        raise ValueError(f"cannot repack a weight of shape {tuple(q.shape)}: {reason}")
    if layout == "fastnf4":
        n, k = q.shape
        packed = from_bnb_order(q.packed, n, k)
    else:
        packed = to_bnb_order(q.packed)
    return dataclasses.replace(q, packed=packed)
