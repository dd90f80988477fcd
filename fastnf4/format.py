"""``NF4Weight``: one 4-bit quantized weight, bit-compatible with bitsandbytes.

Layout (bitsandbytes ``quantize_4bit``, the format of every bnb-4bit checkpoint; layout ``"bnb"``):

* the weight of ``shape`` is flattened row-major to ``numel`` elements;
* byte ``i`` of ``packed`` holds element ``2i`` in its high nibble and ``2i + 1`` in its low nibble
  (``ceil(numel / 2)`` bytes; an odd tail leaves the last low nibble as padding);
* ``value = code[nibble] * absmax[i // blocksize]`` in float32, rounded once to ``dtype``;
* with double quantization ("nested"), ``absmax`` holds uint8 codes and
  ``absmax_f32[j] = nested_code[absmax[j]] * nested_absmax[j // nested_blocksize] + offset``
  (a float32 product, then a float32 sum: two roundings, no fused multiply-add) when ``nested_dtype`` is float32.
  With ``nested_dtype`` T = float16/bfloat16 (bitsandbytes' ``state2.dtype``), bitsandbytes' ``dequantize_4bit``
  rounds each step to T: ``p = T(nested_code[q] * nested_absmax[j // nb])``, ``s = T(float(p) + float(T(offset)))``,
  ``absmax_f32 = float(s)`` (see :class:`NestedStats`).

fastnf4's own weights may hold the same packed bytes in a second order, layout ``"fastnf4"`` (the tensor-core
kernels' fragment order: :mod:`fastnf4.layouts`), in a 3-D uint8 ``packed`` ``[N/16, K/64, 512]``; the statistics
stay as above. ``NF4Weight.layout`` says which; ``to_bnb``, ``state_dict`` and every saver write the bnb order.

Checkpoint keys (what transformers writes for a bnb-4bit ``Linear4bit``; ``prefix`` is the module path):
``weight``, ``weight.absmax``, ``weight.quant_map``, ``weight.nested_absmax``, ``weight.nested_quant_map``
and ``weight.quant_state.bitsandbytes__<quant_type>``, a uint8 tensor holding JSON of the non-tensor fields.
"""
from __future__ import annotations

import dataclasses
import json
import math
import operator
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from .codebooks import BLOCKSIZES, NESTED_BLOCKSIZE, QUANT_TYPES, is_standard_code, kernel_code
from ._plans import forget as _forget_launches

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_TENSOR_FIELDS = ("packed", "absmax", "code", "nested_absmax", "nested_code", "offset")
_FIELD_NAMES = frozenset(("packed", "absmax", "code", "blocksize", "shape", "dtype", "quant_type", "nested_absmax",
                          "nested_code", "offset", "nested_blocksize", "nested_stats"))
_DTYPE_BY_NAME = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
_NAME_BY_DTYPE = {v: k for k, v in _DTYPE_BY_NAME.items()}
_MAX_JSON_BYTES = 1 << 20  # a quant_state JSON is a few hundred bytes


def _dtype_from_name(name: Any, what: str) -> torch.dtype:
    key = name.removeprefix("torch.") if isinstance(name, str) else None
    if key not in _DTYPE_BY_NAME:
        raise ValueError(f"{what}: unsupported dtype {_short(name)}; expected one of {sorted(_DTYPE_BY_NAME)}")
    return _DTYPE_BY_NAME[key]


def _tracing(t: torch.Tensor) -> bool:
    """Inside a torch.compile trace or a CUDA-graph capture on ``t``'s GPU: no host copy is traceable / legal there."""
    return torch.compiler.is_compiling() or (t.is_cuda and torch.cuda.is_current_stream_capturing())


def _check_tensor(t: Any, name: str, dtype: torch.dtype, numel: int | None, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the packed weight is on {device}")
    if numel is not None and t.numel() != numel:
        raise ValueError(f"{name} has {t.numel()} elements, expected {numel}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


@dataclass(frozen=True, eq=False)
class NestedStats:
    """bitsandbytes' double-quant statistics exactly as read, for a weight whose ``nested_dtype`` (bitsandbytes'
    ``state2.dtype``) or ``nested_absmax`` is not float32. :meth:`decode` gives the float32 absmax the kernels use."""

    absmax: torch.Tensor  # uint8 [nblocks]
    nested_absmax: torch.Tensor  # float32, float16 or bfloat16 [ceil(nblocks / nested_blocksize)]
    nested_code: torch.Tensor  # float32 [256]
    offset: torch.Tensor  # one value, in the dtype it came in (float32 from a checkpoint)
    nested_blocksize: int = NESTED_BLOCKSIZE
    nested_dtype: torch.dtype = torch.float32  # the dtype bitsandbytes decodes the statistics into

    def check(self, nblocks: int, device: torch.device) -> None:
        """Raise ``ValueError``/``TypeError`` naming the first field that does not fit ``nblocks`` blocks on ``device``."""
        _check_blocksize(self.nested_blocksize, "nested_blocksize")
        if self.nested_dtype not in FLOAT_DTYPES:
            raise TypeError(f"nested_dtype must be one of {FLOAT_DTYPES}, got {self.nested_dtype!r}")
        _check_tensor(self.absmax, "absmax", torch.uint8, nblocks, device)
        n2 = -(-nblocks // self.nested_blocksize)
        if isinstance(self.nested_absmax, torch.Tensor) and self.nested_absmax.dtype not in FLOAT_DTYPES:
            raise TypeError(f"nested_absmax must be float32, float16 or bfloat16, got {self.nested_absmax.dtype}")
        _check_tensor(self.nested_absmax, "nested_absmax", getattr(self.nested_absmax, "dtype", None), n2, device)
        _check_tensor(self.nested_code, "nested_code (nested_quant_map)", torch.float32, 256, device)
        if not isinstance(self.offset, torch.Tensor) or not self.offset.is_floating_point():
            raise TypeError(f"offset must be a floating-point tensor, got {_kind(self.offset)}")
        if self.offset.numel() != 1 or self.offset.device != device:
            raise ValueError(f"offset must hold one value on {device}, got shape {tuple(self.offset.shape)} on "
                             f"{self.offset.device}")

    def decode(self) -> torch.Tensor:
        """float32 ``[nblocks]`` absmax, as bitsandbytes' ``dequantize_4bit`` computes it: ``dequantize_blockwise`` into
        ``nested_dtype`` (a float32 product rounded once), ``absmax += offset`` in that dtype (torch rounds the offset
        to it first, then adds in float32 and rounds), then ``.float()``. The same ops on every device."""
        t = self.nested_dtype
        n = self.absmax.numel()
        block = torch.arange(n, device=self.absmax.device) // self.nested_blocksize
        scaled = (self.nested_code[self.absmax.long()] * self.nested_absmax.float()[block]).to(t)
        return (scaled.float() + self.offset.reshape(()).to(t).float()).to(t).float()

    def map_tensors(self, fn) -> "NestedStats":
        return dataclasses.replace(self, absmax=fn(self.absmax), nested_absmax=fn(self.nested_absmax),
                                   nested_code=fn(self.nested_code), offset=fn(self.offset))


def _kind(v: Any) -> str:
    return f"a tensor of {v.dtype}" if isinstance(v, torch.Tensor) else type(v).__name__


@dataclass(eq=False)
class NF4Weight:
    """A 4-bit (NF4 or FP4) quantized weight, bit-compatible with bitsandbytes.

    Build one with :func:`fastnf4.quantize`, :meth:`from_bnb` or :meth:`from_state_dict`; turn it back
    into a dense tensor with :func:`fastnf4.dequantize`.

    Double-quant statistics in another dtype than float32 (bitsandbytes' ``nested_dtype`` / ``state2.dtype`` float16 or
    bfloat16, which bitsandbytes writes for a ``Linear4bit`` saved after an inference forward on an AVX512-BF16 CPU, or a
    float16/bfloat16 ``nested_absmax``) are decoded once, when the weight is built, into a float32 ``absmax``
    (``nested_stats.decode()``): the kernels then see a plain weight (``nested_absmax``, ``nested_code`` and ``offset``
    are None) and give bit for bit bitsandbytes' ``F.dequantize_4bit``, which rounds the statistics to nested_dtype.
    ``nested_stats`` keeps the statistics as read, so :meth:`state_dict` and :meth:`to_bnb` give them back unchanged
    (nested_dtype included). ``fastnf4.linear`` multiplies by that same dequantized weight (as bitsandbytes'
    ``MatMul4Bit`` backward does); bitsandbytes' own ``gemm_4bit`` op (``matmul_4bit`` without gradients) instead
    decodes the statistics in float32 whatever nested_dtype says, so for such a weight its forward differs slightly.
    float32 statistics keep the nested form, where both ways agree.

    ``layout`` (one of ``fastnf4.LAYOUTS``) is the order of the packed bytes, read from ``packed``'s shape: ``"bnb"``
    (``[ceil(numel/2), 1]``, bitsandbytes' order) or ``"fastnf4"`` (uint8 ``[N/16, K/64, 512]``, see
    :mod:`fastnf4.layouts`); :func:`fastnf4.repack` converts. The statistics are in bitsandbytes' layout in both.
    """

    packed: torch.Tensor  # uint8 [ceil(numel/2), 1] (or another quant_storage dtype viewing the same bytes); layout
    # "fastnf4": uint8 [N/16, K/64, 512]
    absmax: torch.Tensor | None  # float32 [nblocks]; uint8 [nblocks] when nested; None: decoded from nested_stats
    code: torch.Tensor  # float32 [16] ("quant_map")
    blocksize: int
    shape: torch.Size
    dtype: torch.dtype
    quant_type: str = "nf4"
    nested_absmax: torch.Tensor | None = None  # float32 [ceil(nblocks / nested_blocksize)]
    nested_code: torch.Tensor | None = None  # float32 [256] ("nested_quant_map")
    offset: torch.Tensor | None = None  # float32 0-dim, added after decoding the nested absmax
    nested_blocksize: int = NESTED_BLOCKSIZE
    nested_stats: NestedStats | None = None  # statistics as read, where absmax holds them decoded (see above)

    def __post_init__(self) -> None:
        self.shape = _shape(self.shape)
        if self.absmax is None and isinstance(self.nested_stats, NestedStats):
            self._validate_layout()
            self.nested_stats.check(self.nblocks, self.packed.device)
            self.absmax = self.nested_stats.decode()
        self.validate()
        object.__setattr__(self, "_built", True)
        # the kernels' code table on this weight's GPU now (64 bytes, once per device), so that a first fastnf4 call
        # with it may be inside a CUDA graph capture (no host-to-device copy is allowed there)
        if self.packed.is_cuda and not _tracing(self.packed):
            kernel_code(self.quant_type, self.packed.device)

    def __setattr__(self, name: str, value: Any) -> None:
        # launches cached for this weight (ops/matmul/eager.py) hold its tensors' addresses and its plan
        _forget_launches(self)
        if not self.__dict__.get("_built") or name not in _FIELD_NAMES:
            object.__setattr__(self, name, value)
            return
        # a field changed after construction: the weight is checked again as a whole, and the change undone if it
        # breaks it (a quant_type or code that does not match the packed bytes would otherwise decode silently wrong)
        old = self.__dict__[name]
        object.__setattr__(self, name, _shape(value) if name == "shape" else value)
        try:
            self.validate()
        except (TypeError, ValueError) as e:
            object.__setattr__(self, name, old)
            raise type(e)(f"NF4Weight.{name} = ... left an inconsistent weight ({e}); change several fields at "
                          "once with dataclasses.replace(q, ...)") from None

    # ----------------------------------------------------------------------------------- properties
    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nblocks(self) -> int:
        return -(-self.numel // self.blocksize)

    @property
    def nested(self) -> bool:
        """Double-quantized statistics (as bitsandbytes' ``QuantState.nested``), in the kernels' form or decoded."""
        return self.nested_absmax is not None or self.nested_stats is not None

    @property
    def device(self) -> torch.device:
        return self.packed.device

    @property
    def layout(self) -> str:
        """The order of the packed bytes: ``"bnb"`` or ``"fastnf4"`` (a 3-D ``packed``; :mod:`fastnf4.layouts`)."""
        return "fastnf4" if self.packed.dim() == 3 else "bnb"  # (layouts.layout_of, without importing it here)

    @property
    def packed_u8(self) -> torch.Tensor:
        """The packed bytes as a flat uint8 tensor (a view, whatever ``quant_storage`` was), in the weight's layout:
        bitsandbytes' byte order only where ``layout == "bnb"`` (:meth:`bnb_packed` gives that order always)."""
        return self.packed.reshape(-1).view(torch.uint8)

    @property
    def op_packed(self) -> torch.Tensor:
        """The packed tensor as the ``fastnf4::`` ops take it: the flat uint8 bytes in the bnb layout, the 3-D
        tensor itself in the fastnf4 layout (the ops read the layout from its dimensions)."""
        return self.packed if self.packed.dim() == 3 else self.packed_u8

    def bnb_packed(self, device: torch.device | str | None = None) -> torch.Tensor:
        """The packed bytes in bitsandbytes' order: ``packed`` itself in the bnb layout, a new uint8 ``[numel/2, 1]``
        tensor converted from the fastnf4 layout (on ``device`` when given: the 3-D tensor is moved there first, so a
        saver can convert on the CPU without a second copy on the GPU)."""
        if self.packed.dim() != 3:
            return self.packed
        from .layouts import to_bnb_order  # (imported where used: format imports only _plans and codebooks)

        return to_bnb_order(self.packed if device is None else self.packed.to(device))

    def validate(self) -> None:
        """Raise ``ValueError``/``TypeError`` naming the first inconsistency; never returns partial state."""
        self._validate_layout()
        self._validate_statistics()

    def _validate_layout(self) -> None:
        if not isinstance(self.quant_type, str) or self.quant_type not in QUANT_TYPES:
            raise ValueError(f"unknown quant_type {self.quant_type!r}; expected one of {QUANT_TYPES}")
        _check_blocksize(self.blocksize, "blocksize")
        if self.dtype not in FLOAT_DTYPES:
            raise TypeError(f"dtype must be one of {FLOAT_DTYPES}, got {self.dtype}")
        if not isinstance(self.shape, torch.Size):
            raise TypeError(f"shape must be a torch.Size or a sequence of ints, got {type(self.shape).__name__}")
        if any(int(s) < 0 for s in self.shape):
            raise ValueError(f"shape {tuple(self.shape)} has a negative dimension")
        if not isinstance(self.packed, torch.Tensor):
            raise TypeError(f"packed must be a torch.Tensor, got {type(self.packed).__name__}")
        if (self.packed.is_floating_point() and self.packed.dtype not in FLOAT_DTYPES) or self.packed.is_complex() or \
                self.packed.dtype == torch.bool:
            raise TypeError(f"packed has unsupported storage dtype {self.packed.dtype}")
        if not self.packed.is_contiguous():
            raise ValueError("packed must be contiguous")
        if self.packed.dim() == 3:
            from .layouts import check_packed3d

            check_packed3d(self.packed, self.shape)
        n_bytes = self.packed.numel() * self.packed.element_size()
        if n_bytes != (self.numel + 1) // 2:
            raise ValueError(
                f"packed holds {n_bytes} bytes but shape {tuple(self.shape)} needs {(self.numel + 1) // 2}"
                f" ({self.numel} 4-bit values)"
            )
        dev = self.packed.device
        _check_tensor(self.code, "code (quant_map)", torch.float32, 16, dev)
        # (not on the meta device, which has no values to compare)
        if not _tracing(self.code) and not self.code.is_meta and not is_standard_code(self.code, self.quant_type):
            raise ValueError(f"code (quant_map) is not the standard {self.quant_type} table; fastnf4 decodes with the "
                             "standard table (as bitsandbytes' kernels do), so custom 4-bit tables are not supported")

    def _validate_statistics(self) -> None:
        dev = self.packed.device
        parts = (self.nested_absmax, self.nested_code, self.offset)
        if any(p is None for p in parts) and any(p is not None for p in parts):
            raise ValueError("double quantization needs nested_absmax, nested_code and offset together")
        kernel_nested = self.nested_absmax is not None
        _check_tensor(self.absmax, "absmax", torch.uint8 if kernel_nested else torch.float32, self.nblocks, dev)
        if self.nested_stats is not None:
            if not isinstance(self.nested_stats, NestedStats):
                raise TypeError(f"nested_stats must be a NestedStats, got {type(self.nested_stats).__name__}")
            if kernel_nested:
                raise ValueError("nested_stats goes with a decoded float32 absmax, not with nested_absmax/nested_code/"
                                 "offset")
            self.nested_stats.check(self.nblocks, dev)
            # (not while tracing, nor on the meta device: no values there)
            if not _tracing(self.absmax) and not self.absmax.is_meta and not torch.equal(
                    self.absmax.view(torch.int32), self.nested_stats.decode().view(torch.int32)):
                raise ValueError("absmax does not match the double-quant statistics in nested_stats it must be decoded "
                                 "from (build the weight with absmax=None to decode them)")
        if kernel_nested:
            _check_blocksize(self.nested_blocksize, "nested_blocksize")
            n2 = -(-self.nblocks // self.nested_blocksize)
            _check_tensor(self.nested_absmax, "nested_absmax", torch.float32, n2, dev)
            _check_tensor(self.nested_code, "nested_code (nested_quant_map)", torch.float32, 256, dev)
            _check_tensor(self.offset, "offset", torch.float32, 1, dev)

    def check_code(self) -> "NF4Weight":
        """Raise unless ``code`` (the stored quant_map) is the standard table of ``quant_type``. Like
        bitsandbytes' CUDA kernels, fastnf4 decodes with the standard table, so a checkpoint with another
        table would otherwise be read silently wrong. Reads 64 bytes back to the host."""
        if not is_standard_code(self.code, self.quant_type):
            raise ValueError(f"quant_map is not the standard {self.quant_type} table; custom 4-bit tables are not supported")
        return self

    def map_tensors(self, fn) -> "NF4Weight":
        """A new NF4Weight with ``fn`` applied to every tensor (the non-tensor fields are kept)."""
        changes = {f: fn(getattr(self, f)) for f in _TENSOR_FIELDS if getattr(self, f) is not None}
        if self.nested_stats is not None:
            changes["nested_stats"] = self.nested_stats.map_tensors(fn)
        return dataclasses.replace(self, **changes)

    def to(self, device: torch.device | str) -> "NF4Weight":
        """This weight on ``device`` (a new NF4Weight; its tensors keep their dtypes)."""
        if isinstance(device, torch.dtype):
            raise TypeError(f"NF4Weight.to takes a device, got the dtype {device}: the 4-bit weight has no dtype to "
                            "cast (fastnf4.dequantize(q, dtype=...) gives a dense tensor in a dtype)")
        device = _device(device, "NF4Weight.to")
        return self.map_tensors(lambda t: t.to(device))

    def nbytes(self) -> int:
        """Bytes of packed data plus statistics (what a kernel must read to use this weight)."""
        tensors = (getattr(self, f) for f in _TENSOR_FIELDS)
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def __repr__(self) -> str:
        nested = ""
        if self.nested_stats is not None:
            nested = (f", nested(blocksize={self.nested_stats.nested_blocksize}, "
                      f"dtype={_NAME_BY_DTYPE[self.nested_stats.nested_dtype]}, decoded)")
        elif self.nested:
            nested = f", nested(blocksize={self.nested_blocksize})"
        layout = "" if self.layout == "bnb" else f", layout={self.layout!r}"
        return (
            f"NF4Weight(shape={tuple(self.shape)}, dtype={self.dtype}, quant_type={self.quant_type!r}, "
            f"blocksize={self.blocksize}{nested}{layout}, device={self.device})"
        )

    def _bnb_statistics(self) -> NestedStats | None:
        """The double-quant statistics in bitsandbytes' terms (as read, for a decoded weight), or None."""
        if self.nested_stats is not None:
            return self.nested_stats
        if self.nested_absmax is None:
            return None
        return NestedStats(absmax=self.absmax, nested_absmax=self.nested_absmax, nested_code=self.nested_code,
                           offset=self.offset, nested_blocksize=self.nested_blocksize, nested_dtype=torch.float32)

    # ------------------------------------------------------------------------------ bitsandbytes
    @classmethod
    def from_bnb(cls, packed: torch.Tensor, quant_state: Any) -> "NF4Weight":
        """Wrap bitsandbytes' ``(packed, QuantState)`` without copying any tensor; statistics whose ``state2.dtype`` or
        ``state2.absmax`` is not float32 are decoded into a new float32 absmax (see the class docstring)."""
        qs = quant_state
        missing = [a for a in ("absmax", "code", "blocksize", "shape", "dtype", "quant_type") if not hasattr(qs, a)]
        if missing:
            raise TypeError(f"from_bnb needs a bitsandbytes QuantState, got {type(qs).__name__} (no {', '.join(missing)})")
        if not isinstance(packed, torch.Tensor):
            raise TypeError(f"packed must be a torch.Tensor, got {type(packed).__name__}")
        _check_bnb_packed(packed, "from_bnb: packed")
        if getattr(qs, "packing_format_for_cpu", False) is True:
            raise ValueError("the QuantState is in bitsandbytes' CPU inference layout (packing_format_for_cpu: bytes "
                             "reordered, absmax transposed in bf16), which Linear4bit's forward makes on an AVX512-BF16 "
                             "CPU; read the layer's state_dict() (bitsandbytes converts it back) with "
                             "NF4Weight.from_state_dict")
        nested = getattr(qs, "nested", False)
        if isinstance(nested, torch.Tensor) or nested not in (True, False):
            raise TypeError(f"quant_state.nested must be a bool, got {_kind(nested)}")
        nested = bool(nested)
        state2 = getattr(qs, "state2", None)
        if nested and not all(hasattr(state2, a) for a in ("absmax", "code", "blocksize")):
            raise TypeError("the QuantState is nested (double quantization) but its state2 is missing or is not a "
                            f"QuantState (got {type(state2).__name__})")
        common = dict(packed=packed, code=qs.code, blocksize=int_field(qs.blocksize, "quant_state.blocksize"),
                      shape=_shape(qs.shape), dtype=qs.dtype, quant_type=qs.quant_type)
        if not nested:
            return cls(absmax=qs.absmax, **common)
        nested_blocksize = int_field(state2.blocksize, "quant_state.state2.blocksize")
        nested_dtype = getattr(state2, "dtype", None) or torch.float32  # (bitsandbytes' states always name it)
        if nested_dtype not in FLOAT_DTYPES:
            raise TypeError(f"quant_state.state2.dtype must be one of {FLOAT_DTYPES}, got {nested_dtype!r}")
        offset = _as_offset(qs.offset, packed.device)
        if nested_dtype == torch.float32 and getattr(state2.absmax, "dtype", None) == torch.float32:
            return cls(absmax=qs.absmax, nested_absmax=state2.absmax, nested_code=state2.code,
                       offset=offset.to(torch.float32), nested_blocksize=nested_blocksize, **common)
        stats = NestedStats(absmax=qs.absmax, nested_absmax=state2.absmax, nested_code=state2.code, offset=offset,
                            nested_blocksize=nested_blocksize, nested_dtype=nested_dtype)
        return cls(absmax=None, nested_stats=stats, **common)

    def to_bnb(self) -> tuple[torch.Tensor, Any]:
        """``(packed, bitsandbytes.functional.QuantState)`` sharing this weight's tensors (a decoded weight: the
        statistics as read, in their dtypes). The packed bytes are always in bitsandbytes' order: a weight in the
        fastnf4 layout gives a new uint8 ``[numel/2, 1]`` tensor converted back (:meth:`bnb_packed`)."""
        try:
            from bitsandbytes.functional import QuantState
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("NF4Weight.to_bnb needs bitsandbytes installed") from e
        stats = self._bnb_statistics()
        state2 = None
        if stats is not None:
            state2 = QuantState(
                absmax=stats.nested_absmax, code=stats.nested_code, blocksize=stats.nested_blocksize,
                dtype=stats.nested_dtype,
            )
        qs = QuantState(
            absmax=self.absmax if stats is None else stats.absmax, shape=self.shape, code=self.code,
            blocksize=self.blocksize, quant_type=self.quant_type, dtype=self.dtype,
            offset=None if stats is None else stats.offset, state2=state2,
        )
        return self.bnb_packed(), qs

    # ------------------------------------------------------------------------------- state dicts
    def _json_fields(self) -> dict[str, Any]:
        # Same fields, order and spelling as bitsandbytes' QuantState.as_dict(packed=True), so the
        # JSON bytes of a checkpoint we write are identical to the ones bitsandbytes writes.
        fields: dict[str, Any] = {
            "quant_type": self.quant_type,
            "blocksize": self.blocksize,
            "dtype": _NAME_BY_DTYPE[self.dtype],
            "shape": list(self.shape),
        }
        stats = self._bnb_statistics()
        if stats is not None:
            if stats.offset.is_meta:
                raise ValueError("state_dict needs the value of the double-quant offset, and this weight is on the meta "
                                 "device (no values); move it to a real device first")
            offset = float(stats.offset.item())
            if not math.isfinite(offset):
                # (such a weight decodes to NaN everywhere, and from_state_dict refuses the checkpoint)
                raise ValueError(f"the double-quant offset is {offset}: the weight decodes to NaN everywhere (its "
                                 "absmax had an Inf or NaN), so no checkpoint is written for it")
            fields.update(
                nested_blocksize=stats.nested_blocksize,
                nested_dtype=_NAME_BY_DTYPE[stats.nested_dtype],
                nested_offset=offset,
            )
        return fields

    def state_dict(self, prefix: str = "", packed_device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
        """Tensors under the key names transformers uses for a bnb-4bit ``Linear4bit`` at ``prefix``, always in the
        bnb layout: the packed bytes of a fastnf4-layout weight are converted back (a new tensor, on
        ``packed_device`` when given: :meth:`bnb_packed`)."""
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        stats = self._bnb_statistics()
        sd = {
            f"{prefix}weight": self.bnb_packed(packed_device),
            f"{prefix}weight.absmax": self.absmax if stats is None else stats.absmax,
            f"{prefix}weight.quant_map": self.code,
        }
        if stats is not None:
            sd[f"{prefix}weight.nested_absmax"] = stats.nested_absmax
            sd[f"{prefix}weight.nested_quant_map"] = stats.nested_code
        blob = json.dumps(self._json_fields()).encode("utf-8")
        sd[f"{prefix}weight.quant_state.bitsandbytes__{self.quant_type}"] = torch.tensor(
            list(blob), dtype=torch.uint8
        )
        return sd

    @classmethod
    def from_state_dict(
        cls, sd: Mapping[str, torch.Tensor], prefix: str = "", device: torch.device | str | None = None
    ) -> "NF4Weight":
        """Read the tensors :meth:`state_dict` (or transformers + bitsandbytes) wrote at ``prefix``."""
        if not isinstance(sd, Mapping):
            raise TypeError(f"from_state_dict takes a mapping of names to tensors, got {type(sd).__name__}")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        if device is not None:
            device = _device(device, "from_state_dict")
        key = f"{prefix}weight"
        if key not in sd:
            raise MissingKeyError(key)
        qs_keys = [k for k in sd if isinstance(k, str) and k.startswith(f"{key}.quant_state.bitsandbytes__")]
        if len(qs_keys) != 1:
            raise ValueError(f"expected exactly one '{key}.quant_state.bitsandbytes__<type>' entry, found {qs_keys}")
        blob = sd[qs_keys[0]]
        if not isinstance(blob, torch.Tensor) or blob.dtype != torch.uint8:
            raise TypeError(f"{qs_keys[0]} must be a uint8 tensor holding JSON")
        if blob.is_meta:
            raise ValueError(f"{qs_keys[0]} is on the meta device: its JSON has no bytes to read")
        if blob.numel() > _MAX_JSON_BYTES:
            raise ValueError(f"{qs_keys[0]} holds {blob.numel()} bytes; a quant_state JSON is a few hundred")
        try:
            fields = json.loads(bytes(blob.cpu().reshape(-1).tolist()).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{qs_keys[0]} does not hold valid JSON: {e}") from e
        except RecursionError:
            raise ValueError(f"{qs_keys[0]} does not hold a quant_state JSON (nested too deeply)") from None
        except ValueError as e:  # (e.g. an integer of more digits than Python converts)
            raise ValueError(f"{qs_keys[0]} does not hold valid JSON: {e}") from None
        if not isinstance(fields, dict):
            raise ValueError(f"{qs_keys[0]} must hold a JSON object")
        quant_type = fields.get("quant_type")
        if qs_keys[0].rsplit("__", 1)[1] != quant_type:
            raise ValueError(f"{qs_keys[0]} names a different quant_type than its JSON ({quant_type!r})")
        for f in ("blocksize", "dtype", "shape"):
            if f not in fields:
                raise ValueError(f"{qs_keys[0]} lacks the field {f!r}")
        shape = fields["shape"]
        if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in shape):
            raise ValueError(f"shape must be a list of ints, got {_short(shape)}")

        def get(full: str) -> torch.Tensor:
            if full not in sd:
                raise MissingKeyError(full)
            t = sd[full]
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{full} must be a tensor, got {type(t).__name__}")
            return (t if device is None else t.to(device)).contiguous()

        packed = get(key)
        _check_bnb_packed(packed, key)
        common = dict(packed=packed, code=get(f"{key}.quant_map"), blocksize=fields["blocksize"], shape=_shape(shape),
                      dtype=_dtype_from_name(fields["dtype"], qs_keys[0]), quant_type=quant_type)
        if f"{key}.nested_absmax" not in sd:
            return cls(absmax=get(f"{key}.absmax"), **common)
        nested_dtype = _dtype_from_name(fields.get("nested_dtype", "float32"), f"{qs_keys[0]} nested_dtype")
        if "nested_offset" not in fields:
            raise ValueError(f"{qs_keys[0]} lacks the field 'nested_offset' (a double-quantized weight needs it)")
        # as bitsandbytes' QuantState.from_dict: torch.tensor(float(nested_offset)), a float32 scalar
        offset = torch.tensor(_offset_number(fields["nested_offset"]), dtype=torch.float32).to(packed.device)
        nested_absmax = get(f"{key}.nested_absmax")
        stats = dict(absmax=get(f"{key}.absmax"), nested_absmax=nested_absmax, nested_code=get(f"{key}.nested_quant_map"),
                     offset=offset, nested_blocksize=fields.get("nested_blocksize", NESTED_BLOCKSIZE))
        if nested_dtype == torch.float32 and nested_absmax.dtype == torch.float32:
            return cls(**stats, **common)
        return cls(absmax=None, nested_stats=NestedStats(**stats, nested_dtype=nested_dtype), **common)


class MissingKeyError(KeyError):
    """A tensor of the weight is missing from the state dict (``key``: its full name)."""

    def __init__(self, key: str):
        super().__init__(f"no {key!r} in the state dict")
        self.key = key


def _as_offset(offset: Any, device: torch.device) -> torch.Tensor:
    """A QuantState's offset as a 0-dim tensor on ``device``, in its own floating dtype (a number: float32, as
    bitsandbytes' QuantState.from_dict makes it)."""
    if isinstance(offset, torch.Tensor):
        if not offset.is_floating_point():
            raise TypeError(f"quant_state.offset must be a floating-point tensor, got {offset.dtype}")
        if offset.numel() != 1:
            raise ValueError(f"quant_state.offset must hold one value, got shape {tuple(offset.shape)}")
        if offset.is_meta != (device.type == "meta"):
            raise ValueError(f"quant_state.offset is on {offset.device} but the packed weight is on {device}")
        return offset.to(device=device).reshape(())
    if isinstance(offset, bool) or not isinstance(offset, (int, float)):
        raise TypeError(f"quant_state.offset must be a tensor or a number, got {type(offset).__name__}")
    try:
        return torch.tensor(float(offset), dtype=torch.float32, device=device)
    except OverflowError:
        raise ValueError(f"quant_state.offset {_short(offset)} is out of the float range") from None


def _offset_number(v: Any) -> float:
    """The JSON ``nested_offset`` as a float: a finite number, finite as float32 too (bitsandbytes reads it as a float32
    scalar; a NaN or Inf offset would decode every value of the weight to NaN)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"nested_offset must be a number, got {_short(v)}")
    try:
        x = float(v)
    except OverflowError:
        raise ValueError(f"nested_offset {_short(v)} is out of the float range") from None
    if not math.isfinite(x) or not math.isfinite(torch.tensor(x, dtype=torch.float32).item()):
        raise ValueError(f"nested_offset must be finite (as a float32), got {_short(v)}")
    return x


def _check_bnb_packed(packed: torch.Tensor, what: str) -> None:
    """bitsandbytes' packed tensors are never 3-D (a 3-D one would be read as the fastnf4 layout)."""
    if packed.dim() == 3:
        raise ValueError(f"{what} has shape {tuple(packed.shape)}: bitsandbytes' packed weights are [numel/2, 1], "
                         "and a 3-D one would be read as the fastnf4 layout (checkpoints and QuantStates hold the bnb "
                         "layout; fastnf4.repack converts an NF4Weight)")


def _check_blocksize(value: Any, name: str) -> None:
    """A TypeError unless ``value`` is an int (not a bool), a ValueError unless it is one of ``BLOCKSIZES``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value not in BLOCKSIZES:
        raise ValueError(f"unsupported {name} {_short(value)}; expected one of {BLOCKSIZES}")


def _short(v: Any, limit: int = 80) -> str:
    """repr(v), cut to ``limit`` characters (a value read from a file may be huge)."""
    r = repr(v)
    return r if len(r) <= limit else f"{r[:limit]}... ({len(r)} characters)"


def _device(device: Any, what: str) -> torch.device:
    """``device`` as a torch.device that exists here, or a TypeError/ValueError naming it (torch raises RuntimeError or
    AssertionError for a device it does not have)."""
    if not isinstance(device, (torch.device, str, int)) or isinstance(device, bool):
        raise TypeError(f"{what} takes a device (a torch.device, str or int), got {type(device).__name__}")
    try:
        device = torch.device(device)
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as e:
        raise ValueError(f"{what}: device {device!r} is not available ({e})") from None
    return device


def _shape(v: Any) -> torch.Size:
    """``v`` as a torch.Size, or a TypeError/ValueError naming the shape (a bool or a float is not a size)."""
    if isinstance(v, torch.Size):
        return v
    if isinstance(v, (str, bytes, Mapping)) or (isinstance(v, torch.Tensor) and v.dim() != 1):
        raise TypeError(f"shape must be a sequence of ints, got {_kind(v)}")
    try:
        items = list(v)
    except TypeError:
        raise TypeError(f"shape must be a sequence of ints, got {_kind(v)}") from None
    dims = [int_field(d, "every entry of shape") for d in items]
    if any(not -2**63 <= d < 2**63 for d in dims):
        raise ValueError(f"shape {_short(dims)} has a dimension out of range")
    return torch.Size(dims)


def int_field(v: Any, name: str) -> int:
    """An integral argument or QuantState field (a Python, NumPy or one-element tensor integer) as an int; anything else
    (64.7, "64", True) is a TypeError naming it, not a silent truncation."""
    if isinstance(v, torch.Tensor) and v.numel() == 1 and not v.is_floating_point() and v.dtype != torch.bool:
        return int(v.item())
    if isinstance(v, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(v).__name__} {v!r}") from None
