"""``NF4Weight``: one 4-bit quantized weight in the exact layout bitsandbytes uses.

Layout (bitsandbytes ``quantize_4bit``, the format of every bnb-4bit checkpoint):

* the weight of ``shape`` is flattened row-major to ``numel`` elements;
* byte ``i`` of ``packed`` holds element ``2i`` in its high nibble and ``2i + 1`` in its low nibble
  (``ceil(numel / 2)`` bytes; an odd tail leaves the last low nibble as padding);
* ``value = code[nibble] * absmax[i // blocksize]`` in float32, rounded once to ``dtype``;
* with double quantization ("nested"), ``absmax`` holds uint8 codes and
  ``absmax_f32[j] = nested_code[absmax[j]] * nested_absmax[j // nested_blocksize] + offset``
  (a float32 product, then a float32 sum: two roundings, no fused multiply-add).

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
                          "nested_code", "offset", "nested_blocksize"))
_DTYPE_BY_NAME = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
_NAME_BY_DTYPE = {v: k for k, v in _DTYPE_BY_NAME.items()}


def _dtype_from_name(name: Any, what: str) -> torch.dtype:
    key = str(name).removeprefix("torch.")
    if key not in _DTYPE_BY_NAME:
        raise ValueError(f"{what}: unsupported dtype {name!r}; expected one of {sorted(_DTYPE_BY_NAME)}")
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


@dataclass(eq=False)
class NF4Weight:
    """A 4-bit (NF4 or FP4) quantized weight, bit-compatible with bitsandbytes.

    Build one with :func:`fastnf4.quantize`, :meth:`from_bnb` or :meth:`from_state_dict`; turn it back
    into a dense tensor with :func:`fastnf4.dequantize`.
    """

    packed: torch.Tensor  # uint8 [ceil(numel/2), 1] (or another quant_storage dtype viewing the same bytes)
    absmax: torch.Tensor  # float32 [nblocks]; uint8 [nblocks] when nested
    code: torch.Tensor  # float32 [16] ("quant_map")
    blocksize: int
    shape: torch.Size
    dtype: torch.dtype
    quant_type: str = "nf4"
    nested_absmax: torch.Tensor | None = None  # float32 [ceil(nblocks / nested_blocksize)]
    nested_code: torch.Tensor | None = None  # float32 [256] ("nested_quant_map")
    offset: torch.Tensor | None = None  # float32 0-dim, added after decoding the nested absmax
    nested_blocksize: int = NESTED_BLOCKSIZE

    def __post_init__(self) -> None:
        self.shape = torch.Size(self.shape)
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
        object.__setattr__(self, name, torch.Size(value) if name == "shape" else value)
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
        return self.nested_absmax is not None

    @property
    def device(self) -> torch.device:
        return self.packed.device

    @property
    def packed_u8(self) -> torch.Tensor:
        """The packed bytes as a flat uint8 tensor (a view, whatever ``quant_storage`` was)."""
        return self.packed.reshape(-1).view(torch.uint8)

    def validate(self) -> None:
        """Raise ``ValueError``/``TypeError`` naming the first inconsistency; never returns partial state."""
        if self.quant_type not in QUANT_TYPES:
            raise ValueError(f"unknown quant_type {self.quant_type!r}; expected one of {QUANT_TYPES}")
        if isinstance(self.blocksize, bool) or not isinstance(self.blocksize, int):
            raise TypeError(f"blocksize must be an int, got {type(self.blocksize).__name__}")
        if self.blocksize not in BLOCKSIZES:
            raise ValueError(f"unsupported blocksize {self.blocksize}; expected one of {BLOCKSIZES}")
        if self.dtype not in FLOAT_DTYPES:
            raise TypeError(f"dtype must be one of {FLOAT_DTYPES}, got {self.dtype}")
        if any(int(s) < 0 for s in self.shape):
            raise ValueError(f"shape {tuple(self.shape)} has a negative dimension")
        if not isinstance(self.packed, torch.Tensor):
            raise TypeError(f"packed must be a torch.Tensor, got {type(self.packed).__name__}")
        if self.packed.is_floating_point() and self.packed.dtype not in FLOAT_DTYPES:
            raise TypeError(f"packed has unsupported storage dtype {self.packed.dtype}")
        if not self.packed.is_contiguous():
            raise ValueError("packed must be contiguous")
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
        parts = (self.nested_absmax, self.nested_code, self.offset)
        if any(p is None for p in parts) and any(p is not None for p in parts):
            raise ValueError("double quantization needs nested_absmax, nested_code and offset together")
        absmax_dtype = torch.uint8 if self.nested else torch.float32
        _check_tensor(self.absmax, "absmax", absmax_dtype, self.nblocks, dev)
        if self.nested:
            if isinstance(self.nested_blocksize, bool) or not isinstance(self.nested_blocksize, int):
                raise TypeError(f"nested_blocksize must be an int, got {type(self.nested_blocksize).__name__}")
            if self.nested_blocksize not in BLOCKSIZES:
                raise ValueError(f"unsupported nested_blocksize {self.nested_blocksize}")
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
        return dataclasses.replace(self, **changes)

    def to(self, device: torch.device | str) -> "NF4Weight":
        """This weight on ``device`` (a new NF4Weight; its tensors keep their dtypes)."""
        if isinstance(device, torch.dtype):
            raise TypeError(f"NF4Weight.to takes a device, got the dtype {device}: the 4-bit weight has no dtype to "
                            "cast (fastnf4.dequantize(q, dtype=...) gives a dense tensor in a dtype)")
        return self.map_tensors(lambda t: t.to(device))

    def nbytes(self) -> int:
        """Bytes of packed data plus statistics (what a kernel must read to use this weight)."""
        tensors = (getattr(self, f) for f in _TENSOR_FIELDS)
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def __repr__(self) -> str:
        nested = f", nested(blocksize={self.nested_blocksize})" if self.nested else ""
        return (
            f"NF4Weight(shape={tuple(self.shape)}, dtype={self.dtype}, quant_type={self.quant_type!r}, "
            f"blocksize={self.blocksize}{nested}, device={self.device})"
        )

    # ------------------------------------------------------------------------------ bitsandbytes
    @classmethod
    def from_bnb(cls, packed: torch.Tensor, quant_state: Any) -> "NF4Weight":
        """Wrap bitsandbytes' ``(packed, QuantState)`` without copying any tensor."""
        qs = quant_state
        missing = [a for a in ("absmax", "code", "blocksize", "shape", "dtype", "quant_type") if not hasattr(qs, a)]
        if missing:
            raise TypeError(f"from_bnb needs a bitsandbytes QuantState, got {type(qs).__name__} (no {', '.join(missing)})")
        if not isinstance(packed, torch.Tensor):
            raise TypeError(f"packed must be a torch.Tensor, got {type(packed).__name__}")
        nested = bool(getattr(qs, "nested", False))
        state2 = getattr(qs, "state2", None)
        if nested and not all(hasattr(state2, a) for a in ("absmax", "code", "blocksize")):
            raise TypeError("the QuantState is nested (double quantization) but its state2 is missing or is not a "
                            f"QuantState (got {type(state2).__name__})")
        return cls(
            packed=packed, absmax=qs.absmax, code=qs.code, blocksize=int_field(qs.blocksize, "quant_state.blocksize"),
            shape=torch.Size(qs.shape), dtype=qs.dtype, quant_type=qs.quant_type,
            nested_absmax=state2.absmax if nested else None,
            nested_code=state2.code if nested else None,
            offset=_as_offset(qs.offset, packed.device) if nested else None,
            nested_blocksize=int_field(state2.blocksize, "quant_state.state2.blocksize") if nested else NESTED_BLOCKSIZE,
        )

    def to_bnb(self) -> tuple[torch.Tensor, Any]:
        """``(packed, bitsandbytes.functional.QuantState)`` sharing this weight's tensors."""
        try:
            from bitsandbytes.functional import QuantState
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("NF4Weight.to_bnb needs bitsandbytes installed") from e
        state2 = None
        if self.nested:
            state2 = QuantState(
                absmax=self.nested_absmax, code=self.nested_code, blocksize=self.nested_blocksize,
                dtype=torch.float32,
            )
        qs = QuantState(
            absmax=self.absmax, shape=self.shape, code=self.code, blocksize=self.blocksize,
            quant_type=self.quant_type, dtype=self.dtype, offset=self.offset, state2=state2,
        )
        return self.packed, qs

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
        if self.nested:
            if self.offset.is_meta:
                raise ValueError("state_dict needs the value of the double-quant offset, and this weight is on the meta "
                                 "device (no values); move it to a real device first")
            fields.update(
                nested_blocksize=self.nested_blocksize,
                nested_dtype="float32",
                nested_offset=float(self.offset.item()),
            )
        return fields

    def state_dict(self, prefix: str = "") -> dict[str, torch.Tensor]:
        """Tensors under the key names transformers uses for a bnb-4bit ``Linear4bit`` at ``prefix``."""
        sd = {
            f"{prefix}weight": self.packed,
            f"{prefix}weight.absmax": self.absmax,
            f"{prefix}weight.quant_map": self.code,
        }
        if self.nested:
            sd[f"{prefix}weight.nested_absmax"] = self.nested_absmax
            sd[f"{prefix}weight.nested_quant_map"] = self.nested_code
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
        key = f"{prefix}weight"
        if key not in sd:
            raise MissingKeyError(key)
        qs_keys = [k for k in sd if k.startswith(f"{key}.quant_state.bitsandbytes__")]
        if len(qs_keys) != 1:
            raise ValueError(f"expected exactly one '{key}.quant_state.bitsandbytes__<type>' entry, found {qs_keys}")
        blob = sd[qs_keys[0]]
        if not isinstance(blob, torch.Tensor) or blob.dtype != torch.uint8:
            raise TypeError(f"{qs_keys[0]} must be a uint8 tensor holding JSON")
        try:
            fields = json.loads(bytes(blob.cpu().reshape(-1).tolist()).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{qs_keys[0]} does not hold valid JSON: {e}") from e
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
            raise ValueError(f"shape must be a list of ints, got {shape!r}")

        def get(full: str) -> torch.Tensor:
            if full not in sd:
                raise MissingKeyError(full)
            t = sd[full]
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{full} must be a tensor, got {type(t).__name__}")
            return t if device is None else t.to(device)

        packed = get(key)
        nested = f"{key}.nested_absmax" in sd
        offset = None
        if nested:
            if fields.get("nested_dtype", "float32") != "float32":
                raise ValueError(f"nested_dtype {fields.get('nested_dtype')!r} is not supported (float32 only)")
            if "nested_offset" not in fields:
                raise ValueError(f"{qs_keys[0]} lacks the field 'nested_offset' (a double-quantized weight needs it)")
            if not isinstance(fields["nested_offset"], (int, float)) or isinstance(fields["nested_offset"], bool):
                raise ValueError(f"nested_offset must be a number, got {fields['nested_offset']!r}")
            offset = torch.tensor(float(fields["nested_offset"]), dtype=torch.float32, device=packed.device)
        return cls(
            packed=packed.contiguous(), absmax=get(f"{key}.absmax").contiguous(),
            code=get(f"{key}.quant_map").contiguous(),
            blocksize=fields["blocksize"], shape=torch.Size(shape),
            dtype=_dtype_from_name(fields["dtype"], qs_keys[0]), quant_type=quant_type,
            nested_absmax=get(f"{key}.nested_absmax").contiguous() if nested else None,
            nested_code=get(f"{key}.nested_quant_map").contiguous() if nested else None,
            offset=offset, nested_blocksize=fields.get("nested_blocksize", NESTED_BLOCKSIZE) if nested else NESTED_BLOCKSIZE,
        )


class MissingKeyError(KeyError):
    """A tensor of the weight is missing from the state dict (``key``: its full name)."""

    def __init__(self, key: str):
        super().__init__(f"no {key!r} in the state dict")
        self.key = key


def _as_offset(offset: Any, device: torch.device) -> torch.Tensor:
    if isinstance(offset, torch.Tensor):
        if offset.numel() != 1:
            raise ValueError(f"quant_state.offset must hold one value, got shape {tuple(offset.shape)}")
        return offset.to(device=device, dtype=torch.float32).reshape(())
    if isinstance(offset, bool) or not isinstance(offset, (int, float)):
        raise TypeError(f"quant_state.offset must be a tensor or a number, got {type(offset).__name__}")
    return torch.tensor(float(offset), dtype=torch.float32, device=device)


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
