"""Host side of ``probe_dequant_cuda.cu`` (an experiment, not used by the package: NOTES.md session 14), launched
through ctypes.

``Prepared`` mirrors ``kernel.Prepared`` (arguments worked out once per weight, one launch per call, capturable in
a CUDA graph once the library is loaded); ``prepare`` returns None where the CUDA kernel cannot take a call
(no nvcc, not CUDA, misaligned pointers), and callers then use the Triton kernel.
"""
from __future__ import annotations

import ctypes
import functools
import os

import torch

from fastnf4 import _cuda, _triton

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe_dequant_cuda.cu")
_DTYPES = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}


class Params(ctypes.Structure):
    _fields_ = [
        ("packed", ctypes.c_void_p), ("absmax", ctypes.c_void_p), ("code", ctypes.c_void_p), ("out", ctypes.c_void_p),
        ("nested_code", ctypes.c_void_p), ("nested_absmax", ctypes.c_void_p), ("offset", ctypes.c_void_p),
        ("numel", ctypes.c_longlong), ("word_shift", ctypes.c_int), ("nested_shift", ctypes.c_int),
    ]


class Lib:
    """One compiled ``probe_dequant_cuda.cu`` (``extra``: nvcc flags, for experiments) on one device."""

    def __init__(self, lib: ctypes.CDLL, index: int):
        self.lib = lib
        self.sms = torch.cuda.get_device_properties(index).multi_processor_count
        lib.fastnf4_dequant.argtypes = [ctypes.POINTER(Params), ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                        ctypes.c_void_p, ctypes.c_int]
        lib.fastnf4_dequant.restype = ctypes.c_int
        lib.fastnf4_dequant_occupancy.argtypes = [ctypes.c_int, ctypes.c_int]
        lib.fastnf4_dequant_occupancy.restype = ctypes.c_int
        if lib.fastnf4_dequant_params_size() != ctypes.sizeof(Params):
            raise RuntimeError("probe_dequant_cuda.cu Params layout differs from the ctypes mirror")
        self.threads = lib.fastnf4_dequant_threads()
        self.window_words = lib.fastnf4_dequant_window_words()  # words per warp window
        # asking every kernel's occupancy loads the module now, never lazily inside a graph capture
        self.occupancy = {(d, n): lib.fastnf4_dequant_occupancy(d, n) for d in _DTYPES.values() for n in (0, 1)}


@functools.cache
def _lib(index: int, extra: tuple[str, ...] = ()) -> Lib | None:
    device = torch.device("cuda", index)
    if extra:
        arch = _cuda.device_arch(index)
        lib = ctypes.CDLL(_cuda.compile_source(SOURCE, arch, extra=extra))
    else:
        lib = _cuda.load(SOURCE, device)
    return Lib(lib, index) if lib is not None else None


def _log2(v: int) -> int:
    return v.bit_length() - 1


class Prepared:
    """Launches of the CUDA dequantize for one weight (``prepare`` checks that it can run)."""

    def __init__(self, lib: Lib, packed_u8, absmax, code, blocksize, numel, nested_code=None, nested_absmax=None,
                 offset=None, nested_blocksize=256, dtype=torch.bfloat16, grid: int | None = None,
                 pdl: bool | None = None):
        nested = nested_code is not None
        self.lib, self.numel, self.dt, self.nested = lib, numel, _DTYPES[dtype], int(nested)
        self.index = packed_u8.device.index
        occ = lib.occupancy[(self.dt, self.nested)]
        warps = lib.threads // 32
        windows = (numel // 8) // lib.window_words
        # a resident grid (each warp walks windows), never more blocks than windows need (at least one block:
        # the rest after the last whole window)
        self.grid = grid or max(1, min(lib.sms * occ, -(-windows // warps)))
        self.pdl = int(_triton.pdl(packed_u8.device, triton_kernel=False) if pdl is None else pdl)
        self.params = Params(
            packed=packed_u8.data_ptr(), absmax=absmax.data_ptr(), code=code.data_ptr(), out=None,
            nested_code=nested_code.data_ptr() if nested else None,
            nested_absmax=nested_absmax.data_ptr() if nested else None,
            offset=offset.data_ptr() if nested else None, numel=numel,
            word_shift=_log2(blocksize // 8), nested_shift=_log2(nested_blocksize),
        )

    def __call__(self, out: torch.Tensor) -> torch.Tensor:
        """Fill the flat ``out`` (``numel`` elements, 16-byte aligned) on the current stream."""
        if self.numel == 0:
            return out
        p = Params.from_buffer_copy(self.params)  # a copy per call: ctypes drops the GIL during the launch
        p.out = out.data_ptr()
        rc = self.lib.lib.fastnf4_dequant(ctypes.byref(p), self.dt, self.nested, self.grid,
                                          torch._C._cuda_getCurrentRawStream(self.index), self.pdl)
        if rc != 0:
            raise RuntimeError(f"CUDA dequantize launch failed (cudaError {rc})")
        return out


def lib_for(device: torch.device, extra: tuple[str, ...] = ()) -> Lib | None:
    if device.type != "cuda" or not _cuda.enabled() or not _triton.use_triton(device):
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _lib(index, extra)


def aligned(packed_u8: torch.Tensor, out: torch.Tensor | None = None) -> bool:
    """The kernel reads packed bytes as 4-byte words and writes 16-byte vectors."""
    return packed_u8.data_ptr() % 4 == 0 and (out is None or out.data_ptr() % 16 == 0)
