"""Code tables of the 4-bit and 8-bit formats that bitsandbytes writes.

The values are facts of the format, not of any implementation: a checkpoint stores the 4-bit table as
``weight.quant_map`` and the 8-bit table of double quantization as ``weight.nested_quant_map``.

* NF4 (QLoRA, Dettmers et al. 2023, arXiv 2305.14314): 16 quantiles of N(0, 1) scaled to [-1, 1], as float32.
* FP4: the bitsandbytes 1-sign/2-exponent/1-mantissa table, normalised by its largest magnitude (12).
* The "dynamic" 8-bit map (Dettmers 2015, arXiv 1511.04561) used for the nested absmax statistics.

Quantizers choose a code by comparing against decision thresholds. bitsandbytes' CUDA kernel compares
``x > t`` against float literals (midpoints of neighbouring codes written with 16 significant digits and
rounded by the compiler straight to float32). Four of the NF4 ones round differently if read as a Python
float first, so the thresholds are kept here as float32 bit patterns, as they appear in the compiled
kernel (sm_90 SASS of libbitsandbytes_cuda130.so, bitsandbytes 0.50.2).
"""
from __future__ import annotations

import functools
import struct
import weakref

import torch

QUANT_TYPES = ("nf4", "fp4")
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
NESTED_BLOCKSIZE = 256  # bitsandbytes quantizes the fp32 absmax with 8-bit blocks of 256

_NF4 = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)
# code index -> value in units of 1/12 (sign in bit 3, then exponent and mantissa); code 8 is +0.0 in
# bitsandbytes' Python table (a checkpoint's quant_map) but -0.0 in its CUDA kernels (see kernel_code)
_FP4_TWELFTHS = (0.0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0, 0.0, -0.0625, -8.0, -12.0, -4.0, -6.0, -2.0, -3.0)


def _outside_inference_mode(fn, *args):
    """``fn(*args)`` as a normal tensor even when called under ``torch.inference_mode()``: the cached tables outlive
    the call, and an inference tensor in the cache would break every later call that autograd records (a table saved
    for backward: "Inference tensors cannot be saved for backward"). Under a trace (``torch.compile``) there is no
    inference mode to leave, and Dynamo cannot trace the question."""
    if not torch.compiler.is_compiling() and torch.is_inference_mode_enabled():
        with torch.inference_mode(False):
            return fn(*args)
    return fn(*args)


def _constant(fn):
    """Cache ``fn``'s table per arguments, plain tensors only: a table first asked for under a FakeTensorMode (a
    trace, a patched op reached with fake tensors) comes out fake and must not stay for the real calls after it."""
    cache: dict = {}

    @functools.wraps(fn)
    def get(*args):
        if args in cache:
            return cache[args]
        t = _outside_inference_mode(fn, *args)
        if type(t) is torch.Tensor:
            cache[args] = t
        return t
    return get


@_constant
def _code_cpu(quant_type: str) -> torch.Tensor:
    if quant_type == "nf4":
        return torch.tensor(_NF4, dtype=torch.float32)
    if quant_type == "fp4":
        return torch.tensor(_FP4_TWELFTHS, dtype=torch.float32) / 12.0
    raise ValueError(f"unknown quant_type {quant_type!r}; expected one of {QUANT_TYPES}")


_device_cache: dict[tuple[str, torch.device], torch.Tensor] = {}


def _on_device(name: str, make, device) -> torch.Tensor:
    # One copy per device, made on first use; callers get a device-side clone, which is legal inside
    # CUDA-graph capture (a host-to-device copy is not).
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (name, device)
    if key not in _device_cache:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"fastnf4 copies its {name} table to {device} on the first use there, and a CUDA graph "
                               "capture does not allow that host-to-device copy: make one fastnf4 call on this device "
                               "(or build its NF4Weight there) before capturing")
        t = _outside_inference_mode(lambda: make().to(device))
        if type(t) is not torch.Tensor:  # (made under a FakeTensorMode: not kept, as in _constant)
            return t
        _device_cache[key] = t
    return _device_cache[key]


def is_kernel_code(t: torch.Tensor) -> bool:
    """Whether ``t`` is one of the cached ``kernel_code`` tables (constants: no kernel ever writes them, so a
    kernel may read them before waiting for the previous kernel; see ``_triton.pdl``)."""
    return any(k[0].startswith("kernel-") and v.data_ptr() == t.data_ptr() and v.device == t.device
               for k, v in _device_cache.items())


# the tables code_4bit handed out (fresh tensors), by quant type: NF4Weight's check of its ``code`` skips these
# (comparing any other table's values reads it back to the host)
# (by id: a tensor's == is elementwise, so tensors cannot be dictionary keys of their own)
_HANDED_OUT: dict[int, tuple[weakref.ref, str]] = {}


def code_4bit(quant_type: str = "nf4", device: torch.device | str = "cpu") -> torch.Tensor:
    """The 16-entry float32 table of ``quant_type`` on ``device`` (a fresh tensor each call; a normal tensor even under
    ``torch.inference_mode()``, so that its version counter tells ``is_standard_code`` whether it was written to)."""
    t = _outside_inference_mode(lambda: _on_device(quant_type, lambda: _code_cpu(quant_type), device).clone())
    if not torch.compiler.is_compiling():  # (a traced tensor has no identity to keep; NF4Weight skips the check there)
        key = id(t)
        _HANDED_OUT[key] = (weakref.ref(t, lambda _, key=key: _HANDED_OUT.pop(key, None)), quant_type)
    return t


def is_standard_code(t: torch.Tensor, quant_type: str) -> bool:
    """Whether ``t`` holds the standard table of ``quant_type`` (the one bitsandbytes' kernels and fastnf4's decode
    with, whatever a checkpoint's quant_map says). A table ``code_4bit`` handed out counts without a look at its
    values (unless it was written to since); any other is compared (a device-to-host copy of 64 bytes)."""
    entry = _HANDED_OUT.get(id(t))
    if entry is not None and entry[0]() is t and entry[1] == quant_type and not t.is_inference() and t._version == 0:
        return True
    return torch.equal(t.detach().cpu(), _code_cpu(quant_type))


def _f32(hex_bits: str) -> float:
    return struct.unpack(">f", bytes.fromhex(hex_bits))[0]


# code = number of thresholds t with x > t (strict); NaN compares false everywhere -> code 0
NF4_THRESHOLDS = tuple(_f32(h) for h in (
    "bf591cd9", "bf1c5270", "beeb8480", "beadea76", "be703cec", "be0d38bc", "bd3a7871", "3d22faff",
    "3df64863", "3e5067e0", "3e9582d4", "3ec753f9", "3f006d03", "3f248daf", "3f5c89d9",
))
# FP4: sign bit 8 when x < 0; magnitude bits FP4_MAGNITUDE[number of thresholds t with |x| > t]
FP4_THRESHOLDS = tuple(_f32(h) for h in (
    "3b2aaab9", "3db00000", "3e555555", "3e955555", "3ed55556", "3f155550", "3f555555",
))
FP4_MAGNITUDE = (0, 1, 6, 7, 4, 5, 2, 3)


@_constant
def _kernel_code_cpu(quant_type: str) -> torch.Tensor:
    code = _code_cpu(quant_type).clone()
    if quant_type == "fp4":
        code[8] = -0.0  # bitsandbytes' CUDA table applies the sign bit to zero as well
    return code


def kernel_code(quant_type: str, device: torch.device) -> torch.Tensor:
    """The table the dequantize kernels use, as bitsandbytes' CUDA kernels do: the canonical table of
    ``quant_type`` (a checkpoint's ``quant_map`` is checked against it, not used), with FP4's code 8 as -0.0.
    Cached per device; the first call on a device copies 64 bytes to it (do it before graph capture)."""
    return _on_device(f"kernel-{quant_type}", lambda: _kernel_code_cpu(quant_type), device)


@_constant
def _dynamic_map_cpu() -> torch.Tensor:
    # Signed dynamic map, 8 bits, up to 7 exponent bits: for exponent e = 0..6 the fraction range
    # [0.1, 1] is cut into 2**e intervals whose midpoints are scaled by 10**(e - 6), with both signs;
    # one extra interval at the largest exponent; then 0 and 1.0. Sorted ascending, 256 entries.
    values: list[float] = []
    max_exp, non_sign = 7, 7
    for e in range(max_exp):
        edges = torch.linspace(0.1, 1, 2 ** (e + non_sign - max_exp) + 1, dtype=torch.float32)
        mids = (edges[:-1] + edges[1:]) / 2.0
        scale = 10 ** (-(max_exp - 1) + e)
        values += (scale * mids).tolist()
        values += (-scale * mids).tolist()
    extra = 2 ** (non_sign - max_exp) - 1  # = 0 for the signed 8-bit map
    if extra > 0:  # kept for the general definition; never taken with these parameters
        raise AssertionError("unreachable for the signed 8-bit map")
    values += [0.0, 1.0]
    values.sort()
    assert len(values) == 256
    return torch.tensor(values, dtype=torch.float32)


def dynamic_map(device: torch.device | str = "cpu") -> torch.Tensor:
    """The 256-entry signed "dynamic" 8-bit map bitsandbytes uses for nested statistics (a fresh tensor)."""
    return _on_device("dynamic", _dynamic_map_cpu, device).clone()
